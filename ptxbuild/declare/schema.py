"""The kernelfile's schema (pydantic, at this boundary only): raw TOML values -> validated models,
or every mistake explained, one line each naming its key path. Imported only where a kernelfile is
validated: a kernelfile the memo (memo.py) holds is not validated again, and pydantic not imported."""

from __future__ import annotations

import difflib
import math
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    ValidationError,
    field_validator,
)

from ..dtypes import ALIASES, DTYPES
from .catalog import ARCHES, did_you_mean, toml_key


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ProjectModel(_Strict):
    name: str = Field(min_length=1)
    cache: str = "cache/ptxbuild.sqlite"
    build_dir: str = "build"
    reports_dir: str = "reports"


class GpuModel(_Strict):
    arch: str | None = None
    model: str | None = None
    sm_count: int | None = Field(default=None, gt=0, strict=True)
    dram_tbps: float | None = Field(default=None, gt=0, strict=True)

    @field_validator("arch")
    @classmethod
    def _arch(cls, v):
        return v if v is None else _one_of("architecture", v, ARCHES)


class SearchModel(_Strict):
    strategy: Literal["auto", "exhaustive", "random", "evolutionary"] = "auto"
    budget: int = Field(default=64, gt=0, le=100_000, strict=True)
    seconds: float = Field(default=600.0, gt=0, strict=True)
    seed: int = Field(default=0, strict=True)
    # configs to try first, before lessons and the op's default: each names some of the op's parameters and is merged
    # over the op's default config per problem (skipped where the op rejects it). They count against the budget.
    candidates: list[dict[str, Any]] = []
    # after the search: the winner's neighbours along these parameters (each other value of each, one
    # at a time) are timed too, beyond the budget; a cheap fix for a coordinate the search left untried
    polish: list[str] = []
    # proposer commands (issue 31): each gets tasks and answers with candidate sources over the
    # proposer protocol (README.md), `rounds` rounds a problem after the template search
    proposers: list[str] = []
    rounds: int = Field(default=1, gt=0, le=1000, strict=True)


class GatesModel(_Strict):
    min_bandwidth_fraction: float | None = Field(default=None, gt=0, le=1.5, strict=True)
    max_time_ms: float | None = Field(default=None, gt=0, strict=True)
    min_speedup: float | None = Field(
        default=None, gt=0, strict=True
    )  # over the fastest baseline timed beside it
    # "every_round": a row misses min_speedup only if it does in every round of the baseline's window
    speedup_evidence: Literal["median", "every_round"] | None = None

    @field_validator("speedup_evidence")
    @classmethod
    def _evidence(cls, v, info):
        if v is not None and info.data.get("min_speedup") is None:
            raise ValueError(
                "judges min_speedup, which is not declared; add min_speedup = 1.0 (or remove this key)"
            )
        return (
            None if v == "median" else v
        )  # the default, written out: the same digest as leaving it out


def _shape(s: list[int]) -> list[int]:
    if not s or any(d <= 0 for d in s):
        raise ValueError(
            f"shape {s} must be a non-empty list of positive integers, e.g. [32768, 4096]"
        )
    if math.prod(s) >= 2**63:
        raise ValueError(
            f"shape {s} holds {math.prod(s)} elements, past 2^63 - 1: no signed 64-bit index reaches them"
        )
    return s


def _one_of(what: str, v: str, choices) -> str:
    """`v` where it is one of `choices`, else the ValueError naming the closest and all of them."""
    if v not in choices:
        raise ValueError(
            f"unknown {what} {v!r}{did_you_mean(v, choices)}; one of {', '.join(choices)}"
        )
    return v


Dtype = Annotated[str, AfterValidator(lambda d: _one_of("dtype", ALIASES.get(d, d), DTYPES))]
# no bool, string or float for a dimension (TOML's true, "64" and 64.0 passed as 1, 64 and 64)
Shape = Annotated[list[StrictInt], AfterValidator(_shape)]


class OpModel(_Strict):
    template: str | None = None
    dtypes: list[Dtype] = Field(min_length=1)
    shapes: list[Shape] = Field(min_length=1)
    options: dict[str, Any] = {}
    modes: list[dict[str, Any]] = Field(default_factory=lambda: [{}], min_length=1)
    gpus: list[str] | None = None
    metric: Literal["geomean_time", "max_time", "sum_time"] = "geomean_time"
    gates: GatesModel = GatesModel()
    search: SearchModel = SearchModel()
    depends: list[str] = []


class KernelfileModel(_Strict):
    project: ProjectModel
    gpus: dict[str, GpuModel] = {}
    ops: dict[str, OpModel] = Field(min_length=1)


def _key_path(loc) -> str:
    parts = [f"[{p}]" if isinstance(p, int) else f".{toml_key(p)}" for p in loc]
    return "".join(parts).removeprefix(".")


def _allowed_keys(loc) -> list[str]:
    """Field names valid at the parent of `loc` (for did-you-mean on unknown keys)."""
    model: Any = KernelfileModel
    named = {"gpus": GpuModel, "ops": OpModel}  # tables whose keys are user-chosen names
    parts = list(loc[:-1])
    while parts:
        part = parts.pop(0)
        if model is KernelfileModel and part in named:
            model = named[part]
            parts = parts[1:]  # skip the user's name (e.g. "rmsnorm")
            continue
        field = model.model_fields.get(part) if isinstance(part, str) else None
        ann = field.annotation if field else None
        model = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
        if model is None:
            return []
    return list(model.model_fields)


def _explain(err: dict) -> str:
    loc, kind = err["loc"], err["type"]
    where = _key_path(loc)
    if kind == "extra_forbidden":
        allowed = _allowed_keys(loc)
        return f"{where}: unknown key{did_you_mean(str(loc[-1]), allowed)}; allowed here: {', '.join(allowed)}"
    if kind == "missing":
        return f"{where}: required key is missing; add it"
    msg = err["msg"].removeprefix("Value error, ")
    got = err.get("input")
    got_txt = (
        f" (got {got!r})"
        if got is not None and not isinstance(got, dict | list) and repr(got) not in msg
        else ""
    )
    return f"{where}: {msg}{got_txt}"


def _model_errors(exc: ValidationError) -> list[str]:
    """Every error, each explained; a required key left out is not reported when a misspelling of it is
    (`dtype = [...]` is an unknown key that means dtypes, not a second error saying dtypes is missing)."""
    errs = exc.errors()
    meant = {
        (tuple(e["loc"][:-1]), m[0])
        for e in errs
        if e["type"] == "extra_forbidden"
        for m in [difflib.get_close_matches(str(e["loc"][-1]), _allowed_keys(e["loc"]), 1, 0.5)]
        if m
    }
    return [
        _explain(e)
        for e in errs
        if not (e["type"] == "missing" and (tuple(e["loc"][:-1]), e["loc"][-1]) in meant)
    ]


def validate(raw: dict) -> tuple[KernelfileModel | None, list[str]]:
    """(the validated kernelfile, []) or (None, every mistake, one line each)."""
    try:
        return KernelfileModel.model_validate(raw), []
    except ValidationError as exc:
        return None, _model_errors(exc)
