"""One target: seeds, the search over each problem, the winner's playoff and baselines, artifacts, record."""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

from .. import keys
from ..compile.compiler import compile_kernel
from ..declare.checks import check_declaration, problems_of
from ..declare.graph import Target
from ..gpu.session import GpuError
from ..outputs import gates
from ..outputs.environment import environment, utc_time
from ..outputs.manifest import Built, assemble, write_artifacts
from ..outputs.report import write_report
from ..records import BuildSummary, TargetResult
from ..store import learn
from ..store.lessons_io import shipped_among
from . import beside, spread
from .context import Context, hardware_for, remeasuring, target_op
from .plan import inputs
from .signals import Interrupts, compile_worker, stop_pool
from .solve import Solved, solve


def build_target(
    ctx: Context, t: Target, key: str, why: str, irq: Interrupts
) -> tuple[TargetResult | None, BaseException | None]:
    """Build `t` (signals held by `irq`): its result, and the stop that came while it built, if any
    (a target stopped before it finished has no result; its partial build is recorded, interrupted)."""
    spec, gpu = ctx.kf.ops[t.op], ctx.kf.gpus[t.gpu]
    op = target_op(ctx, t)
    hw = hardware_for(ctx, gpu)
    solved: list[Solved] = []  # the problems that finished, in problem order
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
    lanes = spread.lanes_for(ctx, hw)
    if lanes and len(lanes) < len(ctx.lanes):
        ctx.report(
            "note", message=f"{t}: {len(lanes)} of {len(ctx.lanes)} GPUs have its GPU's fingerprint"
        )
    try:
        if lanes:  # several GPUs (or --gpus 1): each problem on one of them, none seeding another
            solved, stop = spread.spread(
                ctx,
                lanes,
                probs,
                lambda c, i, p: solve(c, t, op, spec, p, hw, pool, i, len(probs), run_seeds=False),
                on_stop=lambda: pool and stop_pool(pool, True),
            )
            if stop is not None:
                raise stop
        for i, problem in enumerate([] if lanes else probs):
            solved.append(solve(ctx, t, op, spec, problem, hw, pool, i, len(probs)))
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
    chosen = [s.entry for s in solved]
    used_lessons = [u for s in solved for u in s.used]
    edits = [e for s in solved for e in s.edits]  # the edit lessons proposed sources taught
    bad = sum(c.params is None for c in chosen)  # problems without a valid candidate
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
        copy_tbps=(lanes[0] if lanes else ctx.gpu).copy_tbps if hw else None,
        lessons_used=used_lessons,
        lessons_shipped=shipped_among(ctx.cache, [u["lesson"] for u in used_lessons]),
        remeasured=bool(hw) and ctx.remeasure,
        problems_done=f"{len(chosen)}/{len(probs)}",
        remeasured_only=list(ctx.remeasure_only) if hw and ctx.remeasure else [],
        # timed_since is only set by a resumed --remeasure build (hardware present)
        timed_since=ctx.timed_since or (started if hw and ctx.remeasure else None),
        remeasure_resumed=ctx.timed_since is not None,
        protocol=keys.PROTOCOL_VERSION if hw else None,  # the protocol of every timing here
        memcheck=beside.memcheck_summary([s.memcheck for s in solved if s.memcheck])
        if hw
        else None,
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
    status = "interrupted" if interrupted else "failed" if bad else "ok"
    # the manifest's path from the kernelfile's folder: a copy of the project reads its own
    ctx.cache.add_build(
        summary, key, status, os.path.relpath(manifest, ctx.kf.root), ctx.kf.project
    )
    write_report(ctx.kf, ctx.cache, t)
    if gpu_failure is not None or interrupted:
        return None, gpu_failure or KeyboardInterrupt()
    reason = f"no valid candidate for {bad} problem(s)" if bad else why
    missed = tuple(summary.gates["failures"]) if summary.gates else ()
    res = TargetResult(t, "failed" if bad else "built", reason, bool(hw), manifest, missed, written)
    # a stop held while this finished target was saved: it stops the run, and the target is locked
    return res, KeyboardInterrupt() if irq.count else None


def resume_point(ctx: Context, t: Target) -> float | None:
    """When the last build of `t` was an interrupted --remeasure build, the time its timings began:
    a rerun with --remeasure keeps what that run timed and times only the rest."""
    last = ctx.cache.last_build(str(t), ctx.kf.project)
    if not last or last["status"] != "interrupted":
        return None
    summary = json.loads(last["summary"] or "{}")
    return summary.get("timed_since") if summary.get("remeasured") else None
