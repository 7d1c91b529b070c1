"""What a run teaches: best configs (with their near-best sets), failure rules and sensitive
parameters, derived from its attempts; lessons a run contradicts are weakened or retired."""

from __future__ import annotations

import itertools
import json
import math
from collections import defaultdict
from statistics import mean

from ..problem import SOURCE_PARAM, Problem
from .lessons import (
    FAIL_OUTCOMES,
    NEAR_BEST,
    NEAR_MAX,
    RETIRE_CONFIDENCE,
    _in_scope,
    _row,
    _scope,
    covers,
    family_of,
    lesson_record,
)


def best_rows(
    op: str, attempts: list[dict], source: str, winners: dict | None = None
) -> list[dict]:
    """The build's winner per (GPU, problem) (`winners`: problem JSON -> (params, p50_ms)), else the fastest
    verified, measured config, as a 'best' lesson row; its rule lists (near) up to NEAR_MAX others within 2%."""
    by_problem: dict[tuple, list[dict]] = defaultdict(list)
    for r in attempts:
        if r["outcome"] == "ok" and r.get("p50_ms") is not None:
            by_problem[(r["gpu"], r["problem"])].append(r)
    out = []
    for (gpu, prob), rs in sorted(by_problem.items()):
        rs, w = sorted(rs, key=lambda a: (a["p50_ms"], a["id"])), (winners or {}).get(prob)
        hit = next((a for a in rs if w and json.loads(a["params"]) == w[0]), None)
        (r, p50), near = ((hit, w[1]) if hit else (rs[0], rs[0]["p50_ms"])), []
        params = json.loads(r["params"])
        for a in rs:
            p = json.loads(a["params"])
            if a["p50_ms"] <= max(p50, r["p50_ms"]) * NEAR_BEST and p not in near and p != params:
                near.append(p)
        rule = {"params": params, "p50_ms": p50, **({"near": near[:NEAR_MAX]} if near else {})}
        out.append(
            _row(op, "best", _scope(gpu, r["arch"], json.loads(prob)), rule, [r["id"]], 1.0, source)
        )
    return out


def fail_rows(op: str, attempts: list[dict], source: str) -> list[dict]:
    """Failure rules: the smallest parameter sub-combination (1 or 2 parameters) that every tried config
    holding it failed with (at least two configs, no success), else the whole config on its shape."""
    pools: dict[tuple, list[dict]] = defaultdict(list)
    for r in attempts:
        if r["outcome"] == "ok" or r["outcome"] in FAIL_OUTCOMES:
            p = json.loads(r["problem"])
            pools[(r["arch"], p["dtype"], json.dumps(p["options"], sort_keys=True))].append(
                {**r, "_params": json.loads(r["params"]), "_shape": p["shape"]}
            )
    out: dict[str, tuple[dict, dict]] = {}  # lesson id -> (row, the params its rule holds)
    for (arch, dtype, opts), pool in sorted(pools.items()):
        fails = [a for a in pool if a["outcome"] in FAIL_OUTCOMES]
        ok_with, fail_with = (
            defaultdict(set),
            defaultdict(set),
        )  # (param, value) -> distinct configs that passed / failed
        for a in pool:
            key = json.dumps(a["_params"], sort_keys=True)
            for k, v in a["_params"].items():
                (ok_with if a["outcome"] == "ok" else fail_with)[(k, json.dumps(v))].add(key)
        rules: dict[str, tuple] = {}  # rule -> (params, shape or None)
        for f in fails:
            items = sorted((k, json.dumps(v)) for k, v in f["_params"].items())
            for size in (
                1,
                2,
            ):  # (support, sub-combination): no config holding it passed, two or more failed
                supports = (
                    (len(set.intersection(*(fail_with[kv] for kv in sub))), sub)
                    for sub in itertools.combinations(items, size)
                    if not set.intersection(*(ok_with[kv] for kv in sub))
                )
                good = [(n, sub) for n, sub in supports if n >= 2]
                if good:
                    rule, scope_shape = {k: json.loads(v) for k, v in max(good)[1]}, None
                    break
            else:  # no sub-combination: the whole config, on its shape
                rule, scope_shape = f["_params"], f["_shape"]
            rules.setdefault(json.dumps([rule, scope_shape], sort_keys=True), (rule, scope_shape))
        for rule, scope_shape in rules.values():
            ev = [
                a
                for a in fails
                if covers({"params": rule}, a["_params"])
                and (scope_shape is None or a["_shape"] == scope_shape)
            ]
            outcome = max(FAIL_OUTCOMES, key=lambda o: sum(a["outcome"] == o for a in ev))
            scope = {
                "arch": arch,
                "family": family_of("", arch),
                "dtype": dtype,
                "options": json.loads(opts),
                "shape": scope_shape,
            }
            n = len({(json.dumps(a["_params"], sort_keys=True), str(a["_shape"])) for a in ev})
            row = _row(
                op,
                "fails",
                scope,
                {"params": rule, "outcome": outcome},
                sorted(a["id"] for a in ev)[:200],
                round(n / (n + 1), 3),
                source,
            )
            out[row["id"]] = row, rule
    # a rule implied by a smaller rule of the same scope adds nothing
    return [
        r
        for r, p in out.values()
        if not any(
            o["scope"] == r["scope"] and covers({"params": q}, p) and len(q) < len(p)
            for o, q in out.values()
        )
    ]


def sensitivity_rows(op: str, attempts: list[dict], source: str) -> list[dict]:
    """Which parameters mattered: per parameter, how much slower the best config with the wrong value is."""
    groups: dict[tuple, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in attempts:
        if r["outcome"] == "ok" and r.get("p50_ms"):
            p = json.loads(r["problem"])
            groups[(r["gpu"], r["arch"], p["dtype"], json.dumps(p["options"], sort_keys=True))][
                r["problem"]
            ].append(r)
    out = []
    for (gpu, arch, dtype, opts), probs in sorted(groups.items()):
        spread: dict[str, list[float]] = defaultdict(list)
        ids = []
        for rows in probs.values():
            if len(rows) < 4:
                continue
            ids += [r["id"] for r in rows]
            cfgs = [(json.loads(r["params"]), r["p50_ms"]) for r in rows]
            for name in sorted({k for c, _ in cfgs for k in c}):
                by_value: dict[str, float] = {}
                for c, t in cfgs:
                    v = json.dumps(c.get(name))
                    by_value[v] = min(by_value.get(v, math.inf), t)
                if len(by_value) > 1:
                    spread[name].append(max(by_value.values()) / min(by_value.values()) - 1)
        if not spread:
            continue
        sens = {k: round(mean(v), 4) for k, v in spread.items()}
        scope = {
            "gpu": gpu,
            "arch": arch,
            "family": family_of(gpu, arch),
            "dtype": dtype,
            "options": json.loads(opts),
        }
        rule = {"params": sens, "order": sorted(sens, key=lambda k: -sens[k])}
        out.append(
            _row(
                op,
                "sensitivity",
                scope,
                rule,
                sorted(ids)[:200],
                round(len(ids) / (len(ids) + 10), 3),
                source,
            )
        )
    return out


def _weaken(cache, op: str, attempts: list[dict], fresh: dict[str, str], canon: dict) -> list[dict]:
    """Lessons contradicted by this run: a failure rule a config passed; a 'best' beaten by more than 2%, or
    measured again (those attempts are the evidence) in a run whose own best of that scope (`fresh`: id ->
    scope) is another lesson: one live best per scope; a near tie lives on in the new lesson's near list."""
    changed = []
    oks = [a for a in attempts if a["outcome"] == "ok"]
    for r in cache.live_lessons(op):
        if r["id"] in fresh or r["kind"] not in ("fails", "best"):  # sensitivities are not weakened
            continue
        scope, rule = json.loads(r["scope"]), json.loads(r["rule"])
        if r["kind"] == "fails":
            against = [
                a["id"]
                for a in oks
                if covers(rule, json.loads(a["params"]))
                and _in_scope(scope, Problem.make(**json.loads(a["problem"])), a["arch"])
            ]
        else:
            same = [
                a
                for a in oks
                if a["gpu"] == scope.get("gpu")
                and a.get("p50_ms")
                and _scope(a["gpu"], a["arch"], json.loads(a["problem"])) == scope
            ]
            mine = [a for a in same if json.loads(a["params"]) == {**canon, **rule["params"]}]
            low = min((a["p50_ms"] for a in mine), default=0.0)
            against = [a["id"] for a in same if a["p50_ms"] * NEAR_BEST < low] or [
                a["id"] for a in mine if r["scope"] in fresh.values()
            ]  # measured again, another lesson chosen
        if not against:
            continue
        conf = round(r["confidence"] * 0.5 ** min(len(against), 8), 4)
        retired = int(
            conf < RETIRE_CONFIDENCE or r["kind"] == "best"
        )  # a beaten best is superseded
        cache.update_lesson(
            r["id"],
            {
                "confidence": conf,
                "retired": retired,
                "evidence": json.dumps(json.loads(r["evidence"]) + [{"against": against[:20]}]),
            },
        )
        changed.append(
            {
                "lesson": r["id"],
                "kind": r["kind"],
                "confidence": conf,
                "retired": bool(retired),
                "against": against[:20],
            }
        )
    return changed


def derive(
    cache, op, target, run: str, winners: dict | None = None, done: set | None = None
) -> list[dict]:
    """Lessons from this run's verified attempts (failure rules also weigh earlier runs on the same architecture;
    `winners`: see best_rows); lessons this run contradicts are weakened or retired. `done`: the problems (key JSON)
    whose search finished: an unfinished one's few attempts derive no best or sensitivity (its failures count)."""
    name, canon = (
        op.NAME,
        {n: v[0] for n, v in op.SPACE.items()},
    )  # params stored before one existed: its first value

    def full(rows):  # template configs only: a proposed source's attempts teach `edit` lessons
        return [
            {**r, "params": json.dumps({**canon, **p})}
            for r in rows
            if SOURCE_PARAM not in (p := json.loads(r["params"]))
        ]

    mine = full(cache.run_attempts(str(target), run))
    if not mine:
        return []
    same_arch = full(cache.attempts(op=name, arch=mine[0]["arch"]))
    fin = [
        r
        for r in mine
        if done is None or json.dumps(json.loads(r["problem"]), sort_keys=True) in done
    ]
    rows = (
        best_rows(
            name,
            fin,
            f"run {run}",
            {k: ({**canon, **c}, p) for k, (c, p) in (winners or {}).items()},
        )
        + fail_rows(name, same_arch, f"run {run}")
        + sensitivity_rows(name, fin, f"run {run}")
    )
    with cache.transaction():  # a stop part-way keeps none of this run's lessons
        cache.put_lessons(rows)
        weakened = _weaken(
            cache,
            name,
            mine,
            {r["id"]: r["scope"] if r["kind"] == "best" else "" for r in rows},
            canon,
        )
    return [lesson_record(row, **json.loads(row["rule"])) for row in rows] + [
        {**w, "weakened": True} for w in weakened
    ]
