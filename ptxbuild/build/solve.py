"""One problem of a target: seeds, the search, the winner's playoff, memcheck and baselines."""

from __future__ import annotations

import functools
import json
import math
import time
from dataclasses import dataclass, field, replace

from ..declare.checks import declared_candidates
from ..records import DispatchEntry
from ..search.strategies import best, neighbours, run_search
from ..store import lessons
from . import beside, factory
from .context import Context
from .evaluate import Evaluator


@dataclass
class Solved:
    """What one problem gave its target: the chosen entry (params None: no valid candidate), the
    lessons it used and what memcheck said of its winner (measured builds)."""

    entry: DispatchEntry
    used: list = field(default_factory=list)
    memcheck: str | None = None
    edits: list = field(default_factory=list)  # edit lessons of proposed sources (build/factory.py)


def solve(ctx: Context, t, op, spec, problem, hw, pool, index: int, total: int, run_seeds=True):
    """Search `problem` of target `t` and pick its winner. `run_seeds`: this run's winners of
    earlier problems seed it too (a sequential build); spread builds (build/spread.py) seed each
    problem from the lessons alone, so that no problem depends on which finished first."""
    gpu, search = ctx.kf.gpus[t.gpu], spec.search
    ctx.report("problem_start", target=t, problem=problem, index=index, total=total)
    seeds, used = lessons.seeds(ctx.cache, op, problem, gpu, run=ctx.run if run_seeds else None)
    used_lessons = list(used)
    default = op.default_params(problem)
    mine = declared_candidates(
        spec, op, problem, default, note=lambda m: ctx.report("note", message=m)
    )
    # compile-only: measured evidence (lessons) before declared guesses; measured: all are timed
    seeds = (
        seeds + mine + [default] if hw is None else mine + lessons.order_seeds(seeds, used, default)
    )
    ev = Evaluator(ctx, t, op, problem, hw, pool)

    # configs a failure lesson covers leave the search space; seeds they cover are recorded as pruned
    def valid(c, p=problem, e=ev):
        return op.check(c, p) or lessons.prune_reason(e.rules, c)

    used_lessons += [
        {k: r[k] for k in ("lesson", "kind", "scope", "rule", "confidence")} for r in ev.rules
    ]
    searched = functools.partial(
        run_search, op.SPACE, ev, seconds=search["seconds"], valid=valid, rng_seed=search["seed"]
    )
    if hw is None:
        # compile-only: the first config that compiles within the limits, lessons and default first
        hist = []
        for cfg in dedupe(seeds):
            hist.append((cfg, ev([cfg])[0]))
            if math.isfinite(hist[-1][1]):
                break
        if not any(math.isfinite(s) for _, s in hist):
            budget = min(search["budget"], 16)
            hist += searched(strategy="exhaustive", budget=budget, seeds=(), batch=ctx.jobs)
    else:
        ev(
            [
                s
                for s in dedupe(seeds)
                if op.check(s, problem) is None and lessons.prune_reason(ev.rules, s)
            ]
        )
        hist = searched(
            strategy=search["strategy"],
            budget=search["budget"],
            seeds=seeds,
            batch=search_batch(ctx.jobs, search["budget"]),
        )
        top = best(hist)
        extra = (
            neighbours(top[0], op.SPACE, search.get("polish", ()), valid, [c for c, _ in hist])
            if top
            else []
        )
        hist += list(zip(extra, ev(extra))) if extra else []
    if factory.proposers_of(ctx, search)[0]:  # proposed sources, after the template's best
        hist += factory.propose(ctx, ev, problem, hist, search)
    edits = list(getattr(ev, "edits", []))
    winner = beside.playoff(ev, hist) if hw else best(hist)  # else: the first lowest finite score
    checked = None
    if hw and winner is not None:
        winner, checked = beside.memchecked(ctx, ev, op, problem, hist, winner)
    if winner is None:
        ctx.report("problem_fail", target=t, problem=problem, why=factory.rejected(ev))
        return Solved(
            DispatchEntry(problem.key(), problem.label(), None), used_lessons, checked, edits
        )
    cfg, ck = winner[0], tuple(sorted(winner[0].items()))  # ck: the config's key in ev's tables
    row, binary = ev.results[ck], ev.binaries[ck]
    lesson = None if hw else next((u for u in used if u["params"] == cfg), None)
    source = "measured" if hw else "declared" if cfg in mine else "lesson" if lesson else "default"
    entry = DispatchEntry(
        problem=problem.key(),
        label=problem.label(),
        params=cfg,
        binary=binary.digest,
        launch=op.launch(cfg, problem, gpu.sm_count).__dict__,
        registers=binary.registers,
        spill_bytes=binary.spill_bytes,
        p50_ms=winner[1] if hw else row.get("p50_ms"),
        floor_ms=op.bytes_moved(problem) / ((ctx.gpu.copy_tbps if hw else gpu.dram_tbps) * 1e9),
        source=source,
        lesson=lesson,
        compiled=binary,
    )
    if factory.proposers_of(ctx, search)[0]:
        entry = replace(entry, factory=factory.beside_template(ctx, ev, problem, hist, winner))
    t_base = time.perf_counter()
    if hw:
        entry = replace(
            entry,
            timed_at=ev.timed_at.get(ck),
            baselines=beside.baselines(ctx, op, problem, hw, (cfg, binary)),
            playoff=ev.bouts,
        )
    ctx.report(
        "problem_done",
        target=t,
        problem=problem,
        entry=entry,
        baseline_s=time.perf_counter() - t_base if hw else None,
    )
    return Solved(entry, used_lessons, checked, edits)


def search_batch(jobs: int, budget: int) -> int:
    """Configs compiled together per search step: enough to use the cores, few enough that an
    evolutionary search gets several generations out of its budget (a third of it, at least 4)."""
    return max(1, min(jobs, max(4, budget // 3)))


def dedupe(cfgs: list[dict]) -> list[dict]:
    first: dict[str, dict] = {}
    for c in cfgs:
        first.setdefault(json.dumps(c, sort_keys=True), c)
    return list(first.values())
