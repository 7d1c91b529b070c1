"""One target: seeds, the search over each problem, the winner's playoff and baselines, artifacts, record."""

from __future__ import annotations

import json
import math
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

from .. import keys
from ..compile.compiler import compile_kernel
from ..declare.checks import check_declaration, declared_candidates, problems_of
from ..declare.graph import Target
from ..gpu.session import GpuError
from ..oploader import load_op
from ..outputs import gates
from ..outputs.environment import environment, utc_time
from ..outputs.manifest import Built, assemble, write_artifacts
from ..outputs.report import write_report
from ..records import BuildSummary, DispatchEntry, TargetResult
from ..search.proposals import with_sources
from ..search.strategies import best, neighbours, run_search
from ..store import learn, lessons
from ..store.lessons_io import shipped_among
from . import beside, factory
from .context import Context, hardware_for, remeasuring
from .evaluate import Evaluator
from .plan import inputs
from .signals import Interrupts, compile_worker, stop_pool


def build_target(
    ctx: Context, t: Target, key: str, why: str, irq: Interrupts
) -> tuple[TargetResult | None, BaseException | None]:
    """Build `t` (signals held by `irq`): its result, and the stop that came while it built, if any
    (a target stopped before it finished has no result; its partial build is recorded, interrupted)."""
    spec, gpu = ctx.kf.ops[t.op], ctx.kf.gpus[t.gpu]
    op = with_sources(load_op(spec.template, ctx.kf.root), ctx.kf.root)
    hw = hardware_for(ctx, gpu)
    search = spec.search
    chosen: list[DispatchEntry] = []
    memchecks: list[str] = []  # per problem built on a GPU: what memcheck said of its winner
    used_lessons: list[dict] = []
    edits: list[dict] = []  # the edit lessons proposed sources taught (build/factory.py)
    probs = problems_of(spec)
    started = time.time()
    check_declaration(spec, op, gpu.sm_count)
    ctx.timed_since = resume_point(ctx, t) if hw and ctx.remeasure and ctx.resume else None
    if ctx.timed_since:
        ctx.report(
            "note",
            message=f"{t}: resuming an interrupted --remeasure build: timings made since "
            f"{utc_time(ctx.timed_since)} are kept",
        )
    if ctx.remeasure_only and hw and not any(remeasuring(ctx, p) for p in probs):
        ctx.report(
            "note",
            message=f"{t}: --remeasure-only {' / '.join(ctx.remeasure_only)} matches none of its "
            f"problems (labels look like {probs[0].label()}): every timing comes from the cache",
        )
    pool = (
        ProcessPoolExecutor(ctx.jobs, initializer=compile_worker, initargs=(os.getpid(),))
        if ctx.jobs > 1 and ctx.compile_fn is compile_kernel
        else None
    )
    interrupted, gpu_failure = False, None
    try:
        for i, problem in enumerate(probs):
            ctx.report("problem_start", target=t, problem=problem, index=i, total=len(probs))
            seeds, used = lessons.seeds(ctx.cache, op, problem, gpu, run=ctx.run)
            used_lessons += used
            default = op.default_params(problem)
            # compile-only: transferred lessons before the default; measured: see lessons.order_seeds
            seeds = seeds + [default] if hw is None else lessons.order_seeds(seeds, used, default)
            mine = declared_candidates(
                spec, op, problem, default, note=lambda m: ctx.report("note", message=m)
            )
            seeds = mine + seeds
            ev = Evaluator(ctx, t, op, problem, hw, pool)

            # configs a failure lesson covers leave the search space; seeds they cover are recorded as pruned
            def valid(c, p=problem, e=ev):
                return op.check(c, p) or lessons.prune_reason(e.rules, c)

            used_lessons += [
                {k: r[k] for k in ("lesson", "kind", "scope", "rule", "confidence")}
                for r in ev.rules
            ]
            if hw is None:
                # compile-only: the first config that compiles within the limits, lessons and default first
                hist = []
                for cfg in _dedupe(seeds):
                    hist.append((cfg, ev([cfg])[0]))
                    if math.isfinite(hist[-1][1]):
                        break
                if not any(math.isfinite(s) for _, s in hist):
                    hist += run_search(
                        op.SPACE,
                        ev,
                        strategy="exhaustive",
                        budget=min(search["budget"], 16),
                        seconds=search["seconds"],
                        valid=valid,
                        seeds=(),
                        rng_seed=search["seed"],
                        batch=ctx.jobs,
                    )
            else:
                ev(
                    [
                        s
                        for s in _dedupe(seeds)
                        if op.check(s, problem) is None and lessons.prune_reason(ev.rules, s)
                    ]
                )
                hist = run_search(
                    op.SPACE,
                    ev,
                    strategy=search["strategy"],
                    budget=search["budget"],
                    seconds=search["seconds"],
                    valid=valid,
                    seeds=seeds,
                    rng_seed=search["seed"],
                    batch=search_batch(ctx.jobs, search["budget"]),
                )
                top = best(hist)
                extra = (
                    neighbours(
                        top[0], op.SPACE, search.get("polish", ()), valid, [c for c, _ in hist]
                    )
                    if top
                    else []
                )
                hist += list(zip(extra, ev(extra))) if extra else []
            if factory.proposers_of(ctx, search)[0]:  # proposed sources, after the template's best
                hist += factory.propose(ctx, ev, problem, hist, search)
                edits += getattr(ev, "edits", [])
            winner = (
                beside.playoff(ev, hist) if hw else best(hist)
            )  # else: the first with the lowest finite score
            if hw and winner is not None:
                winner, checked = beside.memchecked(ctx, ev, op, problem, hist, winner)
                memchecks.append(checked)
            if winner is None:
                ctx.report("problem_fail", target=t, problem=problem, why=factory.rejected(ev))
                chosen.append(DispatchEntry(problem.key(), problem.label(), None))
                continue
            cfg, ck = (
                winner[0],
                tuple(sorted(winner[0].items())),
            )  # ck: the config's key in ev's tables
            row, binary = ev.results[ck], ev.binaries[ck]
            entry = DispatchEntry(
                problem=problem.key(),
                label=problem.label(),
                params=cfg,
                binary=binary.digest,
                launch=op.launch(cfg, problem, gpu.sm_count).__dict__,
                registers=binary.registers,
                spill_bytes=binary.spill_bytes,
                p50_ms=winner[1] if hw else row.get("p50_ms"),
                floor_ms=op.bytes_moved(problem)
                / ((ctx.gpu.copy_tbps if hw else gpu.dram_tbps) * 1e9),
                source="measured"
                if hw
                else (
                    "declared"
                    if cfg in mine
                    else "lesson"
                    if cfg in [u["params"] for u in used]
                    else "default"
                ),
                lesson=None if hw else next((u for u in used if u["params"] == cfg), None),
                compiled=binary,
            )
            if factory.proposers_of(ctx, search)[0]:
                entry = replace(
                    entry, factory=factory.beside_template(ctx, ev, problem, hist, winner)
                )
            t_base = time.perf_counter()
            if hw:
                entry = replace(
                    entry,
                    timed_at=ev.timed_at.get(ck),
                    baselines=beside.baselines(ctx, op, problem, hw, (cfg, binary)),
                    playoff=ev.bouts,
                )
            chosen.append(entry)
            ctx.report(
                "problem_done",
                target=t,
                problem=problem,
                entry=entry,
                baseline_s=time.perf_counter() - t_base if hw else None,
            )
    except KeyboardInterrupt:
        interrupted = True  # keep what finished: partial artifacts and report, marked interrupted
    except (
        GpuError
    ) as exc:  # the worker is gone for good: keep what finished the same way, then say so
        interrupted, gpu_failure = True, exc
    finally:
        irq.saving = True
        if pool:
            stop_pool(pool, interrupted)
    ok = all(c.params is not None for c in chosen) and not interrupted
    summary = BuildSummary(
        target=str(t),
        arch=gpu.arch,
        why=why,
        measured=bool(hw),
        hardware=hw,
        kernelfile=ctx.kf.digest,
        toolchain=ctx.toolchain.key(),
        run=ctx.run,
        inputs=inputs(ctx, t),
        command=ctx.command or f"ptxbuild build {t}",
        incomplete=f"{len(chosen)}/{len(probs)}" if interrupted else None,  # the manifest's too
        copy_tbps=ctx.gpu.copy_tbps if hw else None,
        lessons_used=used_lessons,
        lessons_shipped=shipped_among(ctx.cache, [u["lesson"] for u in used_lessons]),
        remeasured=bool(hw) and ctx.remeasure,
        problems_done=f"{len(chosen)}/{len(probs)}",
        remeasured_only=list(ctx.remeasure_only) if hw and ctx.remeasure else [],
        # timed_since is only set by a resumed --remeasure build (hardware present)
        timed_since=ctx.timed_since or (started if hw and ctx.remeasure else None),
        remeasure_resumed=ctx.timed_since is not None,
        protocol=keys.PROTOCOL_VERSION if hw else None,  # the protocol of every timing here
        memcheck=beside.memcheck_summary(memchecks) if hw else None,
        environment=environment(ctx.kf.root),  # where it ran: a report may be rewritten elsewhere
    )
    # a stop keeps a complete old set: build/<target>/ is the old complete set or the new one
    how = Built(bool(hw), summary.toolchain, hw, summary.incomplete or None)
    manifest, written = write_artifacts(ctx.kf, t, gpu, op, chosen, how, keep_complete=interrupted)
    m = written or assemble(ctx.kf, t, gpu, op, chosen, how)[0]
    # what the report needs travels with the cache (report.collect)
    report_manifest = {k: m.to_json()[k] for k in ("dispatch", "variants")}
    produced = learn.derive(
        ctx.cache,
        op,
        t,
        ctx.run,
        {
            json.dumps(c.problem, sort_keys=True): (c.params, c.p50_ms)
            for c in chosen
            if hw and c.params is not None
        },
        done={json.dumps(c.problem, sort_keys=True) for c in chosen},
    ) + [{**e, "confidence": 1.0 if hw else 0.5} for e in edits]
    summary = replace(
        summary,
        report_manifest=report_manifest,
        lessons_produced=produced,
        **gates.judge(spec, chosen, bool(hw)),
    )
    status = "interrupted" if interrupted else ("failed" if not ok else "ok")
    ctx.cache.add_build(
        str(t),
        key,
        ctx.kf.digest,
        status,
        bool(hw),
        os.path.relpath(
            manifest, ctx.kf.root
        ),  # from the kernelfile's folder: a copy reads its own
        summary.to_json(),
        ctx.kf.project,
    )
    write_report(ctx.kf, ctx.cache, t)
    if gpu_failure is not None or interrupted:
        return None, gpu_failure or KeyboardInterrupt()
    reason = (
        f"no valid candidate for {sum(c.params is None for c in chosen)} problem(s)"
        if not ok
        else None
    )
    res = TargetResult(
        t,
        "failed" if reason else "built",
        reason or why,
        bool(hw),
        manifest,
        tuple(summary.gates["failures"]) if summary.gates else (),
        written,
    )
    # a stop held while this finished target was saved: it stops the run, and the target is locked
    return res, KeyboardInterrupt() if irq.count else None


def search_batch(jobs: int, budget: int) -> int:
    """Configs compiled together per search step: enough to use the cores, few enough that an
    evolutionary search gets several generations out of its budget (a third of it, at least 4)."""
    return max(1, min(jobs, max(4, budget // 3)))


def resume_point(ctx: Context, t: Target) -> float | None:
    """When the last build of `t` was an interrupted --remeasure build, the time its timings began:
    a rerun with --remeasure keeps what that run timed and times only the rest."""
    last = ctx.cache.last_build(str(t), ctx.kf.project)
    if not last or last["status"] != "interrupted":
        return None
    summary = json.loads(last["summary"] or "{}")
    return summary.get("timed_since") if summary.get("remeasured") else None


def _dedupe(cfgs: list[dict]) -> list[dict]:
    first: dict[str, dict] = {}
    for c in cfgs:
        first.setdefault(json.dumps(c, sort_keys=True), c)
    return list(first.values())
