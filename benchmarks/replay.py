"""Replay: run a search strategy against recorded measurements instead of a GPU (a flight recorder).

A recording (ptxbuild.search.replay, written by `ptxbuild record`) is JSONL: a header line, then one
line per distinct (op, GPU, problem, config) with its outcome, p50_ms and the seconds it cost.
`Replayer` answers a strategy's evaluate() from it: the recorded p50 for a recorded success, inf for
a recorded failure, and inf for a config never recorded (counted apart: a replay cannot know what it
would have done). Benchmark tooling (benchmarks/warmstart.py), kept out of the package.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ptxbuild.declare.catalog import CATALOG  # noqa: E402
from ptxbuild.problem import Problem  # noqa: E402
from ptxbuild.search.replay import FORMAT, export_recording  # noqa: E402
from ptxbuild.search.strategies import run_search  # noqa: E402
from ptxbuild.store import learn, lessons  # noqa: E402
from ptxbuild.store.cache import Cache  # noqa: E402

NEAR_BEST = lessons.NEAR_BEST


def _k(params: dict) -> str:
    return json.dumps(params, sort_keys=True)


@dataclass(frozen=True)
class Recording:
    header: dict
    rows: tuple[dict, ...]

    def problems(self, op: str, gpu: str | None = None) -> list[tuple[str, str, dict]]:
        """(gpu, arch, problem) with at least one measured success, in a stable order."""
        seen = {}
        for r in self.rows:
            if (
                r["op"] == op
                and (gpu is None or r["gpu"] == gpu)
                and r["outcome"] == "ok"
                and r.get("p50_ms")
            ):
                seen[(r["gpu"], _k(r["problem"]))] = (r["gpu"], r["arch"], r["problem"])
        return [
            seen[k]
            for k in sorted(
                seen,
                key=lambda k: (
                    k[0],
                    json.loads(k[1])["dtype"],
                    json.loads(k[1])["shape"][::-1],
                    k[1],
                ),
            )
        ]


def load_recording(path) -> Recording:
    """Read a recording; a SQLite cache file is converted on the fly (every op and GPU in it)."""
    path = Path(path)
    with open(path, "rb") as f:
        magic = f.read(16)
    if magic.startswith(b"SQLite format 3"):
        with tempfile.TemporaryDirectory() as tmp:
            export_recording(Cache(path), Path(tmp) / "rec.jsonl")
            return load_recording(Path(tmp) / "rec.jsonl")
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not lines or lines[0].get("format") != FORMAT:
        raise ValueError(
            f"{path}: not a ptxbuild recording (first line must have format {FORMAT!r})"
        )
    return Recording(lines[0], tuple(lines[1:]))


def gpu_of(rec: Recording, name: str):
    if name in CATALOG:
        return CATALOG[name]
    row = next(r for r in rec.rows if r["gpu"] == name)
    return SimpleNamespace(
        name=name,
        arch=row["arch"],
        family=row.get("family") or lessons.family_of(name, row["arch"]),
    )


def lessons_cache(rec: Recording, op: str, keep, extra_lessons: list | None = None):
    """An in-memory cache holding the lessons derived from the recorded rows `keep(row)` selects."""

    cache = Cache(":memory:")
    attempts = [
        {
            "id": i,
            "gpu": r["gpu"],
            "arch": r["arch"],
            "problem": json.dumps(r["problem"]),
            "params": json.dumps(r["params"], sort_keys=True),
            "outcome": r["outcome"],
            "p50_ms": r.get("p50_ms"),
        }
        for i, r in enumerate(rec.rows, 1)
        if r["op"] == op and keep(r)
    ]
    cache.put_lessons(
        learn.best_rows(op, attempts, "replay")
        + learn.fail_rows(op, attempts, "replay")
        + list(extra_lessons or [])
    )
    return cache


@dataclass
class Replayer:
    """evaluate() for one (op, GPU, problem) answered from the recording."""

    rec: Recording
    op: str
    gpu: str
    problem: dict
    table: dict = field(init=False)
    evaluations: int = 0
    unrecorded: int = 0
    seconds: float = 0.0

    def __post_init__(self):
        pk = _k(self.problem)
        self.table = {
            _k(r["params"]): r
            for r in self.rec.rows
            if r["op"] == self.op and r["gpu"] == self.gpu and _k(r["problem"]) == pk
        }
        costs = [r["seconds"] for r in self.table.values() if r.get("seconds")]
        self.unknown_cost_s = statistics.median(costs) if costs else 0.0

    def best_ms(self) -> float:
        return min(
            (r["p50_ms"] for r in self.table.values() if r["outcome"] == "ok" and r.get("p50_ms")),
            default=math.inf,
        )

    def score(self, cfg: dict) -> float:
        r = self.table.get(_k(cfg))
        self.evaluations += 1
        if r is None:
            self.unrecorded += 1
            self.seconds += self.unknown_cost_s
            return math.inf
        self.seconds += r.get("seconds") or 0.0
        return r["p50_ms"] if r["outcome"] == "ok" and r.get("p50_ms") else math.inf

    def __call__(self, group: list[dict]) -> list[float]:
        return [self.score(c) for c in group]


@dataclass(frozen=True)
class Run:
    evaluations: int | None  # evaluations until one within 2% of the best recorded (None: never)
    seconds: float | None  # recorded seconds those evaluations cost
    total: int  # evaluations made
    unrecorded: int  # evaluations of configs the recording does not have
    seeds_used: tuple = ()  # lesson ids of the seeds
    rules_used: tuple = ()  # failure lessons that pruned the space


MAX_PRODUCT = 100_000


class _Reached(Exception):
    pass


def replay_search(
    rec: Recording,
    op: str,
    gpu: str,
    problem: dict,
    *,
    strategy: str = "random",
    seeds: list[dict] = (),
    rules: list[dict] = (),
    rng_seed: int = 0,
    budget: int | None = None,
) -> Run:
    """Run `strategy` on the recorded candidates of one problem until a config within 2% of the best recorded
    one: seeds first; configs that `rules` (failure lessons) cover are pruned, never evaluated. The space is the
    recorded parameter values (so evolutionary moves mean something) restricted to recorded configs and seeds;
    past MAX_PRODUCT combinations it is the list of candidates (index space)."""
    rp = Replayer(rec, op, gpu, problem)
    cands = [r["params"] for r in rp.table.values()] + [s for s in seeds if _k(s) not in rp.table]
    names = sorted({k for c in cands for k in c})
    values = {n: sorted({_k(c.get(n)) for c in cands}) for n in names}
    allowed = {_k(c) for c in cands}
    if math.prod(len(v) for v in values.values()) <= MAX_PRODUCT:
        space = {n: [json.loads(v) for v in values[n]] for n in names}

        def to_cfg(c):
            return c
    else:
        space = {"_i": list(range(len(cands)))}
        index = {_k(c): i for i, c in enumerate(cands)}

        def to_cfg(c):
            return cands[c["_i"]]

        seeds = [{"_i": index[_k(s)]} for s in seeds]
    used_rules: set[str] = set()

    def valid(c):
        cfg = to_cfg(c)
        if _k(cfg) not in allowed:
            return "not recorded"
        why = lessons.prune_reason(list(rules), cfg)
        if why:
            used_rules.add(why.split(":")[0].removeprefix("lesson "))
        return why

    best = rp.best_ms()
    spent = [0.0]

    def evaluate(group):
        out = []
        for c in group:
            before = rp.seconds
            out.append(rp.score(to_cfg(c)))
            spent[0] += rp.seconds - before
            if out[-1] <= best * NEAR_BEST:
                raise _Reached
        return out

    try:
        run_search(
            space,
            evaluate,
            strategy=strategy,
            budget=budget or len(cands),
            seconds=1e9,
            valid=valid,
            seeds=seeds,
            rng_seed=rng_seed,
            batch=1,
        )
    except _Reached:
        return Run(
            rp.evaluations,
            round(spent[0], 6),
            rp.evaluations,
            rp.unrecorded,
            rules_used=tuple(sorted(used_rules)),
        )
    return Run(None, None, rp.evaluations, rp.unrecorded, rules_used=tuple(sorted(used_rules)))


def warm_start(
    cache, rec: Recording, op: str, gpu: str, problem: dict, limit: int = 4
) -> tuple[list, list, list]:
    """(seeds, the lessons they came from, failure rules) for a problem, from the lessons in `cache`."""
    g = gpu_of(rec, gpu)
    prob = Problem.make(**problem)
    shim = SimpleNamespace(NAME=op, SPACE={}, check=lambda params, p: None)  # configs as recorded
    seeds, used = lessons.seeds(cache, shim, prob, g, limit=limit)
    return seeds, used, lessons.failure_rules(cache, op, prob, g.arch)


def default_of(rec: Recording, op: str, problem: dict) -> dict | None:
    return (rec.header.get("defaults") or {}).get(op, {}).get(_k(problem))
