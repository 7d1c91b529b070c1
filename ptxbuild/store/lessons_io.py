"""Lessons as JSONL, the form a model repository checks in: export, and a validating all-or-nothing import.

An import parses JSON only (no eval, no pickle, no op code is loaded), validates every record against
strict models with bounded sizes and values, and writes nothing unless every record is valid; then it
merges in one transaction, skipping lessons already present (same id), and keeps each record's provenance.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Annotated, Literal, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StringConstraints,
    ValidationError,
    model_validator,
)

from ..declare.catalog import ARCHES, CATALOG
from ..dtypes import DTYPES
from ..errors import ConfigError
from ..keys import installed_version
from ..oploader import shipped
from ..outcome import Outcome
from .lessons import FAIL_OUTCOMES, for_gpu, lesson_id

FORMAT = "ptxbuild-lesson/1"
MAX_FILE_BYTES = 8 * 1024 * 1024
MAX_LINE_BYTES = 64 * 1024
MAX_RECORDS = 20_000
MAX_NUMBER = 1e9  # no count, size or time in a lesson is larger

Ident = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")]
Name = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9_.-]{0,63}$")]
Word = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.+-]{0,64}$")]
Text = Annotated[str, StringConstraints(max_length=300, pattern=r"^[^\x00-\x1f\x7f]*$")]
Int = Annotated[StrictInt, Field(ge=-(2**40), le=2**40)]
Float = Annotated[StrictFloat, Field(ge=-MAX_NUMBER, le=MAX_NUMBER, allow_inf_nan=False)]
Scalar = Union[StrictBool, Int, Float, Word]
Params = Annotated[dict[Ident, Scalar], Field(max_length=64)]
Ms = Annotated[StrictFloat, Field(gt=0, le=1e6, allow_inf_nan=False)]  # a time in ms, or a ratio
AttemptId = Annotated[StrictInt, Field(ge=0, le=2**53)]
# a problem option: a scalar, unset, or a list of integers (KDA's segment lengths), bounded
OptionValue = Union[Scalar, None, Annotated[list[Int], Field(max_length=4096)]]
Shape = Annotated[
    list[Annotated[StrictInt, Field(ge=1, le=2**40)]], Field(min_length=1, max_length=8)
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Scope(_Strict):
    gpu: Name | None = None
    arch: Literal[ARCHES] | None = None  # type: ignore[valid-type]
    family: Annotated[str, StringConstraints(pattern=r"^[a-z]{0,32}$")] | None = None
    dtype: Literal[DTYPES]  # type: ignore[valid-type]
    shape: Shape | None = None
    bucket: Annotated[str, StringConstraints(pattern=r"^N<=2\^[0-9]{1,2}$")] | None = None
    options: Annotated[dict[Ident, OptionValue], Field(max_length=32)] = {}


class Rule(_Strict):
    params: Params
    p50_ms: Ms | None = None
    outcome: Literal[FAIL_OUTCOMES] | None = None  # type: ignore[valid-type]
    order: Annotated[list[Ident], Field(max_length=64)] | None = None
    near: Annotated[list[Params], Field(max_length=8)] | None = None
    # an `edit` lesson (a proposed source: build/factory.py): the edit, what it did, the evidence
    edit: Text | None = None
    verdict: Literal["helped", "hurt", "failed", "built"] | None = None
    result: Annotated[str, StringConstraints(pattern=r"^[a-z_]{1,32}$")] | None = None
    why: Text | None = None
    source: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{16}$")] | None = None
    ratio: Ms | None = None


class Evidence(_Strict):
    attempt: AttemptId | None = None
    against: Annotated[list[AttemptId], Field(max_length=20)] | None = None
    gpu: Name | None = None
    arch: Literal[ARCHES] | None = None  # type: ignore[valid-type]
    dtype: Literal[DTYPES] | None = None  # type: ignore[valid-type]
    shape: Shape | None = None
    params: Params | None = None
    outcome: Literal[tuple(o.value for o in Outcome)] | None = None  # type: ignore[valid-type]
    p50_ms: Ms | None = None


class Provenance(_Strict):
    source: Text  # where the lesson was learned: "run <id>" of a build
    project: Text = ""
    exported_by: Text = ""
    exported_at: Annotated[StrictFloat, Field(ge=0, le=1e10)] | None = None
    history: Annotated[list[Text], Field(max_length=20)] = []  # earlier imports, oldest first


class Record(_Strict):
    format: Literal[FORMAT]
    id: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{16}$")]
    op: Name
    kind: Literal["best", "fails", "sensitivity", "edit"]
    scope: Scope
    rule: Rule
    evidence: Annotated[list[Evidence], Field(max_length=200)]
    confidence: Annotated[StrictFloat, Field(ge=0, le=1, allow_inf_nan=False)]
    retired: StrictBool
    created: Annotated[StrictFloat, Field(ge=0, le=1e10)]
    provenance: Provenance

    @model_validator(mode="after")
    def _consistent(self):
        r = self.rule
        if self.kind == "best" and (r.p50_ms is None or r.outcome or r.order):
            raise ValueError("a 'best' rule has params, p50_ms and optionally near only")
        has = [f is not None for f in (r.edit, r.verdict, r.result, r.why, r.source, r.ratio)]
        if (not all(has[:2])) if self.kind == "edit" else any(has):  # "" and 0 are set, too
            raise ValueError("an 'edit' rule has edit and verdict; no other rule has edit fields")
        if self.kind == "edit" and (r.p50_ms or r.outcome or r.order):
            raise ValueError("an 'edit' rule has no p50_ms, outcome or order")
        if self.kind != "best" and r.near is not None:
            raise ValueError("only a 'best' rule has near-best configs (near)")
        if self.kind == "fails" and (
            r.outcome is None or r.p50_ms is not None or r.order or not r.params
        ):
            raise ValueError("a 'fails' rule has params and outcome only")
        if self.kind == "sensitivity" and (
            r.order is None
            or r.outcome
            or r.p50_ms is not None
            or any(not isinstance(v, float) or v < 0 for v in r.params.values())
        ):
            raise ValueError(
                "a 'sensitivity' rule has params (parameter -> relative slow-down >= 0) and order"
            )
        if self.id != lesson_id(self.kind, self.op, self.scope_dict(), self.rule_dict()):
            raise ValueError(f"id {self.id} does not match the lesson's kind, op, scope and rule")
        return self

    def scope_dict(self) -> dict:
        return self.scope.model_dump(exclude_unset=True)

    def rule_dict(self) -> dict:
        return self.rule.model_dump(exclude_unset=True)


class LessonsFileError(ConfigError):
    """A lessons file that cannot be imported; the message names the file, the line and the field."""


# -- export ------------------------------------------------------------------------------------
def _version() -> str:
    v = installed_version("ptxbuild")
    return f"ptxbuild {v}" if v is not None else "ptxbuild"


def _evidence(cache, ev: list) -> list[dict]:
    out = []
    for e in ev[:200]:
        a = None if isinstance(e, dict) else next(iter(cache.attempts(id=e)), None)
        if a is None:
            out.append(e if isinstance(e, dict) else {"attempt": e})
            continue
        p = json.loads(a["problem"])
        out.append(
            {
                "attempt": a["id"],
                **{k: a[k] for k in ("gpu", "arch", "outcome")},
                **{k: p[k] for k in ("dtype", "shape")},
                "params": json.loads(a["params"]),
                **({"p50_ms": a["p50_ms"]} if a["p50_ms"] else {}),
            }
        )
    return out


def _provenance(source: str, project: str, now: float) -> dict:
    if source.startswith("{"):  # imported earlier: keep its provenance, note the import
        stored = json.loads(source)
        prov, note = stored["provenance"], f"imported from {stored['imported_from']} "
        hist = prov.get("history", [])
        # a round trip through the same file (a GPU machine's) adds nothing
        if not (hist and hist[-1].startswith(note)):
            hist = hist + [note + f"at {stored['imported_at']:.0f}"]
        return {**prov, "history": hist[-20:]}
    return {"source": source, "project": project, "exported_by": _version(), "exported_at": now}


def export_lessons(
    cache,
    op: str | None = None,
    gpu: str | None = None,
    include_retired: bool = False,
    project: str = "",
) -> list[str]:
    """The lessons (of one op / one GPU) as validated JSONL lines, sorted by id."""
    now = round(time.time(), 3)
    lines = []
    for r in cache.lesson_rows(op, include_retired, "id"):
        scope = json.loads(r["scope"])
        # a GPU the catalog does not know has no architecture-wide rules here: its own lessons
        if gpu and not (
            for_gpu(scope, CATALOG[gpu]) if gpu in CATALOG else scope.get("gpu") == gpu
        ):
            continue
        rec = {
            "format": FORMAT,
            **{k: r[k] for k in ("id", "op", "kind")},
            "scope": scope,
            "rule": json.loads(r["rule"]),
            "evidence": _evidence(cache, json.loads(r["evidence"])),
            "confidence": float(r["confidence"]),
            "retired": bool(r["retired"]),
            "created": float(r["created"]),
            "provenance": _provenance(r["source"] or "", project, now),
        }
        Record.model_validate(rec)
        lines.append(json.dumps(rec, sort_keys=True, separators=(",", ":")))
    return lines


# -- import ------------------------------------------------------------------------------------
def _no_constant(name: str):
    raise ValueError(f"{name} is not a number a lesson can hold")


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > 16:
        raise ValueError(f"integer {text[:20]}... is too large")
    return int(text)


def _bounded_float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(f"number {text[:20]} is too large")
    return v


def _check_size(name: str, size: int) -> None:
    if size > MAX_FILE_BYTES:
        raise LessonsFileError(
            f"{name}: file is {size} bytes, over the {MAX_FILE_BYTES}-byte limit"
        )


def parse_lessons(data: bytes, name: str = "<lessons>") -> list[Record]:
    """Validate a whole JSONL file; raises LessonsFileError at the first bad line."""
    _check_size(name, len(data))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LessonsFileError(f"{name}: not UTF-8 text (byte {exc.start})") from None
    records = []
    for n, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        where = f"{name}:{n}"
        if len(line.encode()) > MAX_LINE_BYTES:
            raise LessonsFileError(f"{where}: line is over the {MAX_LINE_BYTES}-byte limit")
        if len(records) >= MAX_RECORDS:
            raise LessonsFileError(f"{where}: more than {MAX_RECORDS} lessons in one file")
        try:
            obj = json.loads(
                line,
                parse_constant=_no_constant,
                parse_int=_bounded_int,
                parse_float=_bounded_float,
            )
        except RecursionError:
            raise LessonsFileError(f"{where}: JSON nested too deeply") from None
        except ValueError as exc:
            raise LessonsFileError(
                f"{where}: not valid JSON: {str(exc).splitlines()[0][:200]}"
            ) from None
        if not isinstance(obj, dict):
            raise LessonsFileError(
                f"{where}: a lesson must be a JSON object, got {type(obj).__name__}"
            )
        try:
            records.append(Record.model_validate(obj))
        except ValidationError as exc:
            e = exc.errors()[0]
            loc = ".".join(str(p) for p in e["loc"]) or "record"
            raise LessonsFileError(
                f"{where}: {loc}: " + e["msg"].replace("\n", " ")[:200]
            ) from None
    return records


def import_lessons(cache, path: str | Path, origin: str | None = None) -> dict:
    """Validate every record of `path`, then merge them in one transaction: all or nothing. Returns counts:
    {"read", "added", "already_present", "duplicates_in_file"}. `origin`: what each lesson's source
    records it was imported from (default: the file's name)."""
    path = Path(path)
    try:
        _check_size(path.name, path.stat().st_size)  # before reading it
        data = path.read_bytes()
    except OSError as exc:
        raise LessonsFileError(f"{path}: cannot read: {exc.strerror}") from None
    records = parse_lessons(data, path.name)
    now = time.time()
    unique: dict[str, Record] = {}  # the first record of each id
    for rec in records:
        unique.setdefault(rec.id, rec)
    with cache.transaction():  # one transaction: a failure part-way leaves the cache as it was
        new = [rec for rec in unique.values() if not cache.has_lesson(rec.id)]
        cache.put_lessons(
            {
                **{k: getattr(rec, k) for k in ("id", "op", "kind", "confidence", "created")},
                "scope": json.dumps(rec.scope_dict(), sort_keys=True),
                "rule": json.dumps(rec.rule_dict(), sort_keys=True),
                "evidence": json.dumps([e.model_dump(exclude_none=True) for e in rec.evidence]),
                "source": json.dumps(
                    {
                        "provenance": rec.provenance.model_dump(),
                        "imported_from": origin or path.name,
                        "imported_at": now,
                    },
                    sort_keys=True,
                ),
                "retired": int(rec.retired),
            }
            for rec in new
        )
    return {
        "read": len(records),
        "added": len(new),
        "already_present": len(unique) - len(new),
        "duplicates_in_file": len(records) - len(unique),
    }


SHIPPED = "shipped with ptxbuild"  # how the source of a lesson from shipped_lessons() ends


def shipped_lessons() -> tuple[Path, str] | None:
    """(file, origin) of the lessons this ptxbuild ships (this repository's cache/lessons.jsonl)."""
    f = shipped("_lessons/lessons.jsonl", "cache/lessons.jsonl")
    return (
        None
        if f is None
        else (f, f"ptxbuild {installed_version('ptxbuild') or 'source'} ({SHIPPED})")
    )


def import_shared(cache, path: str | Path, shipped: bool = False) -> dict | None:
    """On a cache with no lessons yet, import the repository's checked-in lessons file (if any), else,
    with `shipped` (the kernelfile uses an op ptxbuild ships), the lessons ptxbuild ships: a model
    repository's first build starts from this repository's evidence. Returns import_lessons' counts
    plus "from" (the file's path, or the shipped lessons' origin)."""
    path = Path(path)
    if cache.lesson_count():
        return None
    if path.is_file():
        return {**import_lessons(cache, path), "from": str(path)}
    if not shipped or (own := shipped_lessons()) is None:
        return None
    return {**import_lessons(cache, own[0], origin=own[1]), "from": own[1]}


def shipped_among(cache, ids) -> int:
    """How many of the lessons `ids` came from the lessons ptxbuild ships (their source says so)."""
    return cache.count_lessons(sorted(set(ids)), f'%"imported_from": "%({SHIPPED})"%')
