"""Lessons: what verified builds taught (best configs, failure rules, sensitivities) and how a build uses them."""

from __future__ import annotations

import itertools
import json
import math
import time
from collections import defaultdict

from ..declare.catalog import CATALOG
from ..problem import Problem, digest, params_text

FAIL_OUTCOMES = (
    "compile_error",
    "spill",
    "resource",
    "wrong_result",
)  # what a failure rule can say
PRUNE_CONFIDENCE = 0.5  # a failure rule prunes only at or above this confidence
RETIRE_CONFIDENCE = 0.25  # below this a contradicted lesson is retired
NEAR_BEST = 1.02  # "as good as the best": within 2%
NEAR_MAX = 6  # near-best configs a 'best' lesson keeps besides its winner
LEVELS = ("same GPU", "same architecture", "same family", "other family")


def family_of(gpu_name: str, arch: str = "") -> str:
    g = CATALOG.get(gpu_name)
    return (
        g.family
        if g
        else {
            "sm_80": "ampere",
            "sm_86": "ampere",
            "sm_89": "ada",
            "sm_90": "hopper",
            "sm_90a": "hopper",
            "sm_100": "blackwell",
            "sm_100a": "blackwell",
        }.get(arch, "")
    )


def shape_bucket(shape) -> str:
    """The power of two at or above the row length N: problems in one bucket share their best configs."""
    return f"N<=2^{math.ceil(math.log2(max(int(shape[-1]), 1)))}" if shape else ""


def _scope(gpu: str, arch: str, problem: dict) -> dict:
    return {
        "gpu": gpu,
        "arch": arch,
        "family": family_of(gpu, arch),
        "dtype": problem["dtype"],
        "shape": problem["shape"],
        "bucket": shape_bucket(problem["shape"]),
        "options": problem["options"],
    }


def lesson_id(kind: str, op: str, scope: dict, rule: dict) -> str:
    """A lesson's identity: its kind, op, scope and the configuration it is about (not its numbers)."""
    what = {
        "best": rule.get("params"),
        "fails": rule.get("params"),
        "sensitivity": None,
        # a source edit (build/factory.py): the source it made (or the edit that did not apply)
        "edit": [rule.get("source"), rule.get("edit"), rule.get("params")],
    }[kind]
    return digest(kind, op, scope, what)[:16]


def level(scope: dict, gpu) -> int:
    """0 same GPU, 1 same architecture, 2 same family, 3 other."""
    if scope.get("gpu") == gpu.name:
        return 0
    if scope.get("arch") == gpu.arch:
        return 1
    family = scope.get("family") or family_of(scope.get("gpu", ""), scope.get("arch", ""))
    return 2 if family == gpu.family else 3


def _distance(scope: dict, gpu, problem: Problem) -> float:
    """How far a lesson's scope is from this problem: same GPU < same arch < same family; shape in log2."""
    d = (0.0, 1.0, 2.0, 3.0)[level(scope, gpu)]
    d += 0.0 if scope.get("dtype") == problem.dtype else 1.5
    d += 0.0 if scope.get("options") == problem.opts_json else 1.0
    shape = scope.get("shape") or []
    if len(shape) != len(problem.shape):
        return d + 4.0
    return d + 0.5 * sum(
        abs(math.log2(max(a, 1)) - math.log2(max(b, 1))) for a, b in zip(shape, problem.shape)
    )


def _row(
    op: str, kind: str, scope: dict, rule: dict, evidence: list, confidence: float, source: str
) -> dict:
    return {
        "id": lesson_id(kind, op, scope, rule),
        "op": op,
        "kind": kind,
        "scope": json.dumps(scope, sort_keys=True),
        "rule": json.dumps(rule, sort_keys=True),
        "evidence": json.dumps(evidence),
        "confidence": confidence,
        "source": source,
        "retired": 0,
        "created": time.time(),
    }


def lesson_record(r: dict, **more) -> dict:
    """A lesson row as a build reports it: its id (as "lesson"), kind, scope, `more`, confidence."""
    return {
        "lesson": r["id"],
        "kind": r["kind"],
        "scope": json.loads(r["scope"]),
        **more,
        "confidence": r["confidence"],
    }


# -- using lessons ------------------------------------------------------------------------------
def seeds(
    cache, op, problem: Problem, gpu, run: str | None = None, limit: int = 4
) -> tuple[list[dict], list[dict]]:
    """Configs to try first for `problem` and the lessons they came from: a lesson of this exact scope first; then
    configs by support, the sum over other scopes' 'best' lessons of confidence * 2^-distance for each lesson whose
    winner or near-best set (within 2%) holds the config. A config near-best on both neighbours (N/2 and 2N, or plain
    and residual) outranks one neighbour's winner: on the H200 recording single winners often did not transfer."""
    cands = []  # (scope, params, lesson id, confidence, near-best configs, created: newest first among equals)
    for r in cache.live_lessons(op.NAME, "best"):
        rule = json.loads(r["rule"])
        cands.append(
            (
                json.loads(r["scope"]),
                rule["params"],
                r["id"],
                r["confidence"],
                rule.get("near", []),
                r["created"],
            )
        )
    if run:  # the winners of this run's earlier problems count before they become lessons
        best: dict[str, dict] = {}
        for r in cache.attempts(op=op.NAME, run=run, outcome="ok"):
            if r["p50_ms"] is None:
                continue
            if r["problem"] not in best or r["p50_ms"] < best[r["problem"]]["p50_ms"]:
                best[r["problem"]] = r
        for r in best.values():
            cands.append(
                (
                    _scope(r["gpu"], r["arch"], json.loads(r["problem"])),
                    json.loads(r["params"]),
                    f"run:{r['id']}",
                    1.0,
                    [],
                    math.inf,
                )
            )
    support: dict[str, float] = defaultdict(float)
    origin: dict[
        str, tuple
    ] = {}  # config -> (distance, scope, lesson id, params, role) of its nearest lesson
    canon = {
        n: v[0] for n, v in op.SPACE.items()
    }  # a config stored before a parameter existed meant its first value
    for scope, params, lid, conf, near, _ in cands:
        d = _distance(scope, gpu, problem)
        for role, p in [("winner", {**canon, **params})] + [
            ("near-best", {**canon, **x}) for x in near
        ]:
            k = json.dumps(p, sort_keys=True)
            support[k] += conf * 2.0**-d if d > 0 else 0.0
            if k not in origin or d < origin[k][0]:
                origin[k] = (d, scope, lid, p, role)
    exact = list(
        dict.fromkeys(
            json.dumps({**canon, **c[1]}, sort_keys=True)
            for c in sorted(cands, key=lambda c: (-c[3], -c[5]))
            if _distance(c[0], gpu, problem) == 0
        )
    )  # this scope's winners
    ranked = exact + sorted(
        (k for k in origin if k not in exact), key=lambda k: (origin[k][0], -support[k], k)
    )
    # (config, *origin) of the ranked configs the op accepts (origin's params: 4th), checked lazily
    fits = ((k, *origin[k]) for k in ranked if op.check(origin[k][3], problem) is None)
    used = [
        {
            "lesson": lid,
            "kind": "best",
            "scope": scope,
            "params": params,
            "distance": round(d, 3),
            "level": LEVELS[level(scope, gpu)],
            "support": round(support[k], 3),
            "role": role,
        }
        for k, d, scope, lid, params, role in itertools.islice(fits, limit)
    ]
    return [u["params"] for u in used], used


def order_seeds(seeds: list[dict], used: list[dict], default: dict | None) -> list[dict]:
    """For a measured search: a lesson of this exact scope first, then the op's default, then the nearer-scope
    lessons (on the H200 rmsnorm recording the default beat other shapes' winners; see reports/warmstart/)."""
    exact = [s for s, u in zip(seeds, used) if u["distance"] == 0]
    return (
        exact
        + ([default] if default and default not in exact else [])
        + [s for s in seeds if s not in exact and s != default]
    )


def _in_scope(scope: dict, problem: Problem, arch: str) -> bool:
    return (
        scope.get("arch") == arch
        and scope.get("dtype") == problem.dtype
        and scope.get("options") == problem.opts_json
        and scope.get("shape") in (None, list(problem.shape))
    )


def covers(rule: dict, cfg: dict) -> bool:
    return all(k in cfg and cfg[k] == v for k, v in rule["params"].items())


def failure_rules(cache, op_name: str, problem: Problem, arch: str) -> list[dict]:
    """Failure rules that apply to `problem` on `arch` and are confident enough to prune."""
    rows = cache.live_lessons(op_name, "fails", PRUNE_CONFIDENCE)
    return [
        lesson_record(r, rule=json.loads(r["rule"]))
        for r in rows
        if _in_scope(json.loads(r["scope"]), problem, arch)
    ]


def prune_reason(rules: list[dict], cfg: dict) -> str | None:
    """Why a failure rule says `cfg` fails, or None."""
    for r in rules:
        if covers(r["rule"], cfg):
            p = params_text(r["rule"]["params"])
            return (
                f"lesson {r['lesson']}: {p} gives {r['rule']['outcome']} on {r['scope']['arch']} "
                f"(confidence {r['confidence']:.2f})"
            )
    return None


# -- reading lessons ----------------------------------------------------------------------------
def for_gpu(scope: dict, gpu) -> bool:
    """A lesson of `gpu` (a catalog Gpu), or an architecture-wide rule of its architecture."""
    g = scope.get("gpu")
    return g == gpu.name or g is None and scope.get("arch") == gpu.arch


def listing(cache, op: str | None = None, gpu=None, include_retired: bool = False) -> list[dict]:
    """Lessons as readable rows (id, op, kind, scope, rule, confidence, evidence, source), nearest first;
    `gpu` (a catalog Gpu) keeps lessons of that GPU and architecture-wide rules of its architecture."""
    out = []
    for r in cache.lesson_rows(op, include_retired, "op, kind, id"):
        scope, rule, ev = json.loads(r["scope"]), json.loads(r["rule"]), json.loads(r["evidence"])
        if gpu is not None and not for_gpu(scope, gpu):
            continue
        where_ = " ".join(
            str(x) for x in (scope.get("gpu") or scope.get("arch"), scope.get("dtype")) if x
        )
        if scope.get("shape"):
            where_ += " " + "x".join(map(str, scope["shape"]))
        elif r["kind"] == "fails":
            where_ += " all shapes"
        opts = ",".join(
            f"{k}={v}"
            for k, v in sorted((scope.get("options") or {}).items())
            if v not in (False, None, "")
        )
        params = params_text(rule.get("params", {}))
        what = (
            f"{params} -> {rule['p50_ms'] * 1000:.1f} us"
            if r["kind"] == "best"
            else f"{params} -> {rule['outcome']}"
            if r["kind"] == "fails"
            else f"{rule['edit']} ({params}) -> {rule['verdict']}"
            + (f" {rule['ratio']:.2f}x" if rule.get("ratio") else "")
            + (f": {rule['why']}" if rule.get("why") and rule["verdict"] == "failed" else "")
            if r["kind"] == "edit"
            else ", ".join(f"{k} {rule['params'][k] * 100:.0f}%" for k in rule["order"][:4])
        )
        src = r["source"] or ""
        if src.startswith("{"):
            s = json.loads(src)
            src = f"import {s['imported_from']} ({s['provenance']['source']})"
        out.append(
            {
                "id": r["id"],
                "op": r["op"],
                "kind": r["kind"],
                "scope": where_ + (f" {{{opts}}}" if opts else ""),
                "rule": what,
                "confidence": f"{r['confidence']:.2f}" + (" retired" if r["retired"] else ""),
                "evidence": str(sum(1 for e in ev if not (isinstance(e, dict) and "against" in e))),
                "source": src,
            }
        )
    return out
