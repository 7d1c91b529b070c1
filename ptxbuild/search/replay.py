"""Recordings for offline replay: `ptxbuild record` writes a cache's attempts as JSONL, a header
line {"format", "spaces", "defaults", ...}, then one line per distinct (op, GPU, problem, config)
with its outcome, p50_ms and the seconds it cost. The replay itself (a search strategy answered from
a recording instead of a GPU) is benchmark tooling: benchmarks/replay.py, run by
benchmarks/warmstart.py.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from ..store import lessons

FORMAT = "ptxbuild-recording/1"


def _row(group: list) -> dict:
    """One row of a recording: the attempts of one config, merged."""
    a, outcomes = group[0], [x["outcome"] for x in group]
    p50s = [x["p50_ms"] for x in group if x["outcome"] == "ok" and x["p50_ms"] is not None]
    cost = max(sum(x[c] or 0.0 for c in ("compile_s", "verify_s", "measure_s")) for x in group)
    return {
        "op": a["op"],
        "gpu": a["gpu"],
        "arch": a["arch"],
        "family": lessons.family_of(a["gpu"], a["arch"]),
        "problem": json.loads(a["problem"]),
        "params": json.loads(a["params"]),
        "p50_ms": statistics.median(p50s) if p50s else None,
        "outcome": "ok" if "ok" in outcomes else max(outcomes, key=outcomes.count),  # ties: first
        "seconds": round(max(0.0, cost), 6),
        "attempts": [x["id"] for x in group][:20],
    }


def export_recording(
    cache,
    out,
    op: str | None = None,
    gpu: str | None = None,
    spaces: dict | None = None,
    defaults: dict | None = None,
) -> int:
    """Write the attempts of `cache` (one op / one GPU) as a recording; returns the number of rows. Repeated
    attempts of one config (forced rebuilds) merge: the median p50 of the successes and the largest cost in
    seconds (later attempts hit the cache). Invalid and pruned configs are left out."""
    groups: dict[tuple, list] = {}
    for a in cache.attempts(op=op, gpu=gpu):
        if a["outcome"] not in ("invalid", "pruned"):
            groups.setdefault((a["op"], a["gpu"], a["problem"], a["params"]), []).append(a)
    rows = [_row(group) for group in groups.values()]
    header = {
        "format": FORMAT,
        "spaces": spaces or {},
        "defaults": defaults or {},
        "rows": len(rows),
    }
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w") as f:
        f.writelines(json.dumps(r, sort_keys=True) + "\n" for r in [header, *rows])
    return len(rows)
