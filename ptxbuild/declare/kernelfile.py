"""Parse and validate kernelfile.toml (pydantic at this boundary only) into plain values."""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
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
from ..errors import ConfigError
from .catalog import ARCHES, CATALOG, Gpu, did_you_mean


class KernelfileError(ConfigError):
    """A mistake in kernelfile.toml: one line naming the key path and what to write instead."""


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
        if v is not None and v not in ARCHES:
            raise ValueError(
                f"unknown architecture {v!r}{did_you_mean(v, ARCHES)}; one of {', '.join(ARCHES)}"
            )
        return v


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


def _dtype(d: str) -> str:
    d = ALIASES.get(d, d)
    if d not in DTYPES:
        raise ValueError(
            f"unknown dtype {d!r}{did_you_mean(d, DTYPES)}; one of {', '.join(DTYPES)}"
        )
    return d


Dtype = Annotated[str, AfterValidator(_dtype)]
# no bool, string or float for a dimension (TOML's true, "64" and 64.0 passed as 1, 64 and 64)
Shape = Annotated[list[StrictInt], AfterValidator(_shape)]
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def name_problem(name: str) -> str | None:
    """Why an op or GPU name cannot name build/<op>@<gpu>/ and reports/ folders, or None."""
    if _NAME.fullmatch(name) and ".." not in name:
        return None
    return (
        f"not a usable name ({len(name)} characters): it names the folders build/<op>@<gpu>/ and "
        "reports/<op>@<gpu>/; use letters, digits, '_', '-' and '.', at most 64 characters, starting "
        "with a letter or digit"
    )


def _key(name: str) -> str:
    """A table name as TOML writes it: bare when it can be, else quoted."""
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else json.dumps(name)


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


@dataclass(frozen=True)
class OpSpec:
    name: str
    template: str
    dtypes: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    options: tuple[tuple[str, Any], ...]
    modes: tuple[tuple[tuple[str, Any], ...], ...]
    gpus: tuple[str, ...]
    metric: str
    gates: dict
    search: dict
    depends: tuple[str, ...]

    def config(self) -> dict:
        """Everything of this op's declaration that can change what gets built. The metric and gates judge a
        build and never change it: hashed as their defaults (the digests of locks written before), so editing
        them re-judges what is built and locked (gates.judge) instead of searching again."""
        return {
            "template": self.template,
            "dtypes": list(self.dtypes),
            "shapes": [list(s) for s in self.shapes],
            "options": dict(self.options),
            "modes": [dict(m) for m in self.modes],
            "metric": "geomean_time",
            "gates": {"min_bandwidth_fraction": None, "max_time_ms": None},
            "search": self.search,
            "depends": list(self.depends),
        }


@dataclass(frozen=True)
class Kernelfile:
    path: Path
    root: Path
    digest: str
    project: str
    cache_path: Path
    build_dir: Path
    reports_dir: Path
    gpus: dict[str, Gpu]
    ops: dict[str, OpSpec]


def _key_path(loc) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{_key(part)}" if out else _key(part))
    return out


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


def _fail(path: Path, errors: list[str]) -> None:
    if errors:
        raise KernelfileError("\n".join(f"{path.name}: {e}" for e in errors))


def parse(text: str, path: Path) -> Kernelfile:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise KernelfileError(f"{path.name}: not valid TOML: {exc}") from None
    try:
        model = KernelfileModel.model_validate(raw)
    except ValidationError as exc:
        _fail(path, _model_errors(exc))
    root = path.parent.resolve()
    errors = [
        f"{table}.{_key(n)}: {why}"
        for table, names in (("gpus", model.gpus), ("ops", model.ops))
        for n in names
        if (why := name_problem(n))
    ]
    for key in ("build_dir", "reports_dir"):
        if (root / getattr(model.project, key)).is_file():
            errors.append(
                f"project.{key}: {getattr(model.project, key)} is a file, not a folder; name a folder "
                "(ptxbuild writes into it) or move the file"
            )
    _fail(path, errors)
    gpus = _resolve_gpus(model, path.name)
    ops = {}
    for name, op in model.ops.items():
        targets = tuple(op.gpus) if op.gpus is not None else tuple(gpus)
        if not targets:
            errors.append(
                f"ops.{name}.gpus: empty, so nothing would be built; name at least one of "
                f"{', '.join(gpus)} (or leave the key out: every [gpus.*])"
            )
        errors += [
            f"ops.{name}.gpus[{i}]: unknown GPU {g!r}"
            f"{did_you_mean(g, gpus)}; declare [gpus.{g}] or use one of {', '.join(gpus)}"
            for i, g in enumerate(targets)
            if g not in gpus
        ]
        errors += [
            f"ops.{name}.depends[{i}]: unknown op {dep!r}"
            f"{did_you_mean(dep, model.ops)}; declare [ops.{dep}]"
            for i, dep in enumerate(op.depends)
            if dep not in model.ops
        ]
        template = op.template or name
        from ..oploader import op_dir, shipped_ops

        if not (op_dir(template, root) / "op.py").is_file():
            local, own = (
                sorted(p.parent.name for p in d.glob("[!_]*/op.py")) if d else []
                for d in (root / "ops", shipped_ops())
            )
            errors.append(
                f"ops.{name}.template: no op.py in {os.path.relpath(op_dir(template, root), root)}"
                f"{did_you_mean(template, local + own)}; ops/ holds: {', '.join(local) or 'none'}"
                + (f"; ptxbuild ships: {', '.join(own)}" if own else "")
            )
        ops[name] = OpSpec(
            name=name,
            template=template,
            dtypes=tuple(op.dtypes),
            shapes=tuple(tuple(s) for s in op.shapes),
            options=tuple(sorted(op.options.items())),
            modes=tuple(tuple(sorted(m.items())) for m in op.modes),
            gpus=targets,
            metric=op.metric,
            gates=op.gates.model_dump(
                exclude={
                    k for k in ("min_speedup", "speedup_evidence") if getattr(op.gates, k) is None
                }
            ),
            search=op.search.model_dump(
                exclude={
                    k for k in ("candidates", "polish", "proposers") if not getattr(op.search, k)
                }
                | ({"rounds"} if not op.search.proposers else set())
            ),
            depends=tuple(op.depends),
        )
    _fail(path, errors)
    from .graph import find_cycle

    if cycle := find_cycle({n: list(o.depends) for n, o in ops.items()}):
        raise KernelfileError(
            f"{path.name}: ops.{cycle[0]}.depends: dependency cycle {' -> '.join(cycle)}; "
            f"remove one of these dependencies"
        )
    return Kernelfile(
        path=path,
        root=root,
        digest=hashlib.sha256(text.encode()).hexdigest(),
        project=model.project.name,
        cache_path=root / model.project.cache,
        build_dir=root / model.project.build_dir,
        reports_dir=root / model.project.reports_dir,
        gpus=gpus,
        ops=ops,
    )


def _resolve_gpus(model: KernelfileModel, file: str) -> dict[str, Gpu]:
    if not model.gpus:
        return dict(CATALOG)
    out = {}
    for name, g in model.gpus.items():
        base = CATALOG.get(name)
        if base is None and g.arch is None:
            raise KernelfileError(
                f"{file}: gpus.{name}: unknown GPU{did_you_mean(name, CATALOG)}; "
                f'use a catalog name ({", ".join(CATALOG)}) or give arch = "sm_90a"'
            )
        if base is None:
            base = Gpu(
                name,
                g.model or name,
                g.arch,
                "custom",
                g.sm_count or 1,
                g.dram_tbps or 1.0,
                48 * 1024,
                1,
            )
        out[name] = Gpu(
            **{
                **base.as_dict(),
                **{k: v for k, v in g.model_dump().items() if v is not None},
                "name": name,
            }
        )
    return out


def load(path: str | Path = "kernelfile.toml") -> Kernelfile:
    p = Path(path)
    if not p.is_file():
        raise KernelfileError(
            f"{p}: no kernelfile here; create one (see README.md) or pass --kernelfile PATH"
        )
    try:
        text = p.read_bytes().decode()
    except UnicodeDecodeError as exc:
        line = exc.object[: exc.start].count(b"\n") + 1
        raise KernelfileError(
            f"{p.name}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}, line "
            f"{line}); save it as UTF-8"
        ) from None
    return parse(text, p)
