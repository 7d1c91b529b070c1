"""Lessons: what verified builds taught (best configs per scope, failure rules) and how seeds use them."""
from __future__ import annotations

import json
import math
import time

from .problem import Problem, digest


def _scope(gpu: str, arch: str, problem: dict) -> dict:
    return {"gpu": gpu, "arch": arch, "dtype": problem["dtype"], "shape": problem["shape"],
            "options": problem["options"]}


def _distance(scope: dict, gpu, problem: Problem) -> float:
    """How far a lesson's scope is from this problem: same GPU < same arch < same family; shape in log2."""
    d = 0.0 if scope.get("gpu") == gpu.name else (1.0 if scope.get("arch") == gpu.arch else 3.0)
    d += 0.0 if scope.get("dtype") == problem.dtype else 1.5
    d += 0.0 if scope.get("options") == problem.opts else 1.0
    shape = scope.get("shape") or []
    if len(shape) == len(problem.shape):
        d += 0.5 * sum(abs(math.log2(max(a, 1)) - math.log2(max(b, 1))) for a, b in zip(shape, problem.shape))
    else:
        d += 4.0
    return d


def seeds(cache, op, problem: Problem, gpu, run: str | None = None, limit: int = 4) -> tuple[list[dict], list[dict]]:
    """Configs to try first for `problem`, nearest scope first; and the lessons they came from."""
    rows = list(cache.db.query("select * from lessons where op = ? and kind = 'best' and retired = 0", [op.NAME]))
    cands = [(json.loads(r["scope"]), json.loads(r["rule"])["params"], r["id"]) for r in rows]
    if run:  # results of this run's earlier problems count before they become lessons
        for r in cache.db.query("select * from attempts where op = ? and run = ? and outcome = 'ok' and p50_ms is not null",
                                [op.NAME, run]):
            cands.append((_scope(r["gpu"], r["arch"], json.loads(r["problem"])), json.loads(r["params"]), f"run:{r['id']}"))
    cands.sort(key=lambda c: _distance(c[0], gpu, problem))
    out, used, seen = [], [], set()
    for scope, params, lid in cands:
        k = json.dumps(params, sort_keys=True)
        if k in seen or op.check(params, problem) is not None:
            continue
        seen.add(k)
        out.append(params)
        used.append({"lesson": lid, "scope": scope, "params": params,
                     "distance": round(_distance(scope, gpu, problem), 3)})
        if len(out) >= limit:
            break
    return out, used


def derive(cache, op, target, run: str) -> list[dict]:
    """Best measured config per problem of this run becomes a 'best' lesson (verified results only)."""
    best: dict[str, dict] = {}
    for r in cache.db.query("select * from attempts where target = ? and run = ? and outcome = 'ok' and p50_ms is not null",
                            [str(target), run]):
        if r["problem"] not in best or r["p50_ms"] < best[r["problem"]]["p50_ms"]:
            best[r["problem"]] = r
    produced = []
    for prob, r in best.items():
        scope = _scope(r["gpu"], r["arch"], json.loads(prob))
        lesson = {"id": digest("best", op.NAME, scope)[:16], "op": op.NAME, "kind": "best",
                  "scope": json.dumps(scope, sort_keys=True),
                  "rule": json.dumps({"params": json.loads(r["params"]), "p50_ms": r["p50_ms"]}, sort_keys=True),
                  "evidence": json.dumps([r["id"]]), "confidence": 1.0, "source": f"run {run}", "retired": 0,
                  "created": time.time()}
        cache.db["lessons"].upsert(lesson, pk="id")
        produced.append({"lesson": lesson["id"], "scope": scope, "params": json.loads(r["params"])})
    return produced
