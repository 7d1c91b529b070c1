"""The pipeline's records, frozen and typed: a dispatch entry, a compiled variant, a target's manifest,
a build's summary, a target's result and a run's.

Each record's `to_json()` is the JSON object today's files hold (manifest.json, kernelfile.lock's
dispatch tables, the cache's build summaries, report.json), and `from_json()` reads one back:
`from_json(x).to_json() == x` for every file ptxbuild has written, older ones included. A key an
older writer left out reads as UNSET (falsy; distinct from a JSON null) and stays out; keys no field
names (another version's) are kept in `extra`, so a re-rendered report keeps them too.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Final, Literal, TypeVar

from .problem import Binary

Json = dict[str, Any]
R = TypeVar("R", bound="Record")


class Unset(enum.Enum):
    """The value of a field whose key the JSON does not hold (older writers left some out)."""

    UNSET = "unset"

    def __bool__(self) -> Literal[False]:
        return False

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Final = Unset.UNSET


def plain(value: Any) -> Any:
    """A field's value as JSON: records become objects, tuples lists."""
    if isinstance(value, Record):
        return value.to_json()
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def _json_names(record: Any) -> list[str]:
    """The fields a record's JSON holds: all but `extra` and those of metadata json=False."""
    return [f.name for f in fields(record) if f.name != "extra" and f.metadata.get("json", True)]


@dataclass(frozen=True)
class Record:
    """to_json / from_json over the dataclass's fields; a field with metadata json=False (a live
    object) is not part of the JSON."""

    extra: Mapping[str, Any] = field(default_factory=dict, kw_only=True, repr=False)

    def to_json(self) -> Json:
        out = {name: plain(getattr(self, name)) for name in _json_names(self)}
        return {**{k: v for k, v in out.items() if v is not UNSET}, **self.extra}

    @classmethod
    def from_json(cls: type[R], data: Mapping[str, Any]) -> R:
        names = set(_json_names(cls))
        known = {k: v for k, v in data.items() if k in names}
        return cls(**known, extra={k: v for k, v in data.items() if k not in names})


@dataclass(frozen=True)
class DispatchEntry(Record):
    """One problem's row of a dispatch table: its winning config and kernel (params None: no valid
    candidate, and nothing else is recorded), the numbers it was chosen by, and, measured on a GPU,
    when it was timed, its baselines and its playoff bouts."""

    problem: Json
    label: str
    params: Json | None
    binary: str | Unset = UNSET  # the variant's cubin sha256
    launch: Json | Unset = UNSET
    registers: int | Unset = UNSET
    spill_bytes: int | Unset = UNSET
    p50_ms: float | None | Unset = UNSET
    floor_ms: float | Unset = UNSET
    source: str | Unset = UNSET  # measured | declared | lesson | default
    lesson: Json | None | Unset = UNSET
    timed_at: float | None | Unset = UNSET
    baselines: Json | Unset = UNSET
    playoff: list[Json] | Unset = UNSET
    ptx_sha256: str | Unset = UNSET  # its own PTX, where its variant's cubin has another's
    factory: Json | Unset = UNSET  # proposed sources beside the template's (build/factory.py)
    compiled: Binary | None = field(default=None, metadata={"json": False}, compare=False)


@dataclass(frozen=True)
class Variant(Record):
    """One compiled kernel of a manifest (keyed there by its cubin's sha256) and its two files."""

    entry: str
    ptx: str
    cubin: str
    arch: str
    ptx_isa: str
    registers: int
    spill_bytes: int
    compiler: str
    ptx_sha256: str | Unset = UNSET


@dataclass(frozen=True)
class Manifest(Record):
    """build/<target>/manifest.json: what the runtime loads and the lock pins."""

    target: str
    op: str
    op_version: str
    template: str
    gpu: Json
    arch: str
    measured_on_hardware: bool
    kernelfile_digest: str
    toolchain: Json
    variants: dict[str, Variant]
    dispatch: tuple[DispatchEntry, ...]
    hardware: Json | None
    op_files: dict[str, str] | Unset = UNSET  # written since the runtime checks them
    incomplete: str | Unset = UNSET  # "built/declared" problems: an interrupted build
    coverage: Json | Unset = UNSET  # per entry, the shapes its kernel was verified on (coverage.py)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Manifest:
        record = super().from_json(data)  # a manifest without variants or dispatch: TypeError
        variants = {k: Variant.from_json(v) for k, v in data["variants"].items()}
        return replace(record, variants=variants, dispatch=dispatch_of(data))


def dispatch_of(data: Mapping[str, Any]) -> tuple[DispatchEntry, ...]:
    """The dispatch table of a manifest, a lock entry or a report (JSON) as records."""
    return tuple(DispatchEntry.from_json(d) for d in data.get("dispatch", ()))


@dataclass(frozen=True)
class BuildSummary(Record):
    """What a build of one target recorded in the cache (and its report shows): why it ran, where,
    with which inputs, lessons and timing protocol, and, once judged, its metric and gates. Keys
    added over time are UNSET in summaries written before them."""

    target: str
    arch: str
    why: str
    measured: bool
    hardware: Json | None
    kernelfile: str
    toolchain: Json
    run: str
    inputs: dict[str, str]
    command: str
    copy_tbps: float | None
    lessons_used: list[Json]
    problems_done: str | Unset = UNSET  # "built/declared"
    incomplete: str | None | Unset = UNSET  # as problems_done, for an interrupted build
    lessons_shipped: int | Unset = UNSET
    remeasured: bool | Unset = UNSET
    remeasured_only: list[str] | Unset = UNSET
    timed_since: float | None | Unset = UNSET
    remeasure_resumed: bool | Unset = UNSET
    protocol: int | None | Unset = UNSET  # keys.PROTOCOL_VERSION of its timings
    memcheck: str | None | Unset = UNSET
    environment: Json | Unset = UNSET
    report_manifest: Json | Unset = UNSET  # the manifest's dispatch and variants, for its report
    lessons_produced: list[Json] | Unset = UNSET
    metric: Json | Unset = UNSET  # gates.judge's, as the kernelfile says now
    gates: Json | Unset = UNSET


@dataclass(frozen=True)
class TargetResult:
    """What a build did with one target (`target`: a declare.graph.Target). `manifest`: the path of
    the manifest it wrote or found; `built`: that manifest, where this build holds it in memory."""

    target: Any
    status: str  # built | up_to_date | failed
    reason: str
    measured: bool = False
    manifest: Path | None = None
    missed: tuple[str, ...] = ()  # gate failures: built (and locked), but the bar is not met
    built: Manifest | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Run:
    """What a run of many targets did: each target's result, in build order, and the stop that ended
    it early (KeyboardInterrupt, or GpuError: the worker is gone), if one did; `results` hold the
    targets finished before it (they are locked all the same)."""

    results: list[TargetResult] = field(default_factory=list)
    stop: BaseException | None = None
    lock: Path | None = None  # the lock, where recording this run changed its text
