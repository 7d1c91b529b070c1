"""Many targets in dependency order; a stop (Ctrl-C, the GPU worker gone) is returned as a value."""

from __future__ import annotations

from dataclasses import replace

from ..declare.graph import Target, build_order, dependencies
from ..errors import GpuError
from ..outputs.lockfile import pinned_binaries, update_lock
from ..outputs.report import rejudge
from ..records import Run, TargetResult
from .context import Context
from .plan import judge, target_key
from .signals import Interrupts


def run(ctx: Context, targets: list[Target] | None = None) -> Run:
    """Build `targets` (all by default) and their dependencies in order; each is judged first
    (plan.judge, the judge `plan` uses) and built only when a plain build should rebuild it."""
    results: list[TargetResult] = []
    failed: set[Target] = set()
    done: dict[Target, str] = {}
    try:
        pinned = pinned_binaries(ctx.kf)
        for t in build_order(ctx.kf, targets):
            done[t] = key = target_key(ctx, t, done)
            bad_deps = [d for d in dependencies(ctx.kf, t) if d in failed]
            if bad_deps:
                failed.add(t)
                results.append(TargetResult(t, "failed", f"dependency {bad_deps[0]} failed"))
                ctx.report("target_skip", target=t, reason=f"dependency {bad_deps[0]} failed")
                continue
            verdict = judge(ctx, t, key, pinned)
            if not verdict.rebuild and not ctx.force:
                missed = rejudge(ctx.kf, t, verdict.manifest)
                results.append(
                    TargetResult(
                        t, "up_to_date", verdict.basis, missed=missed, built=verdict.manifest
                    )
                )
                ctx.report("target_fresh", target=t, reason=verdict.basis)
                continue
            ctx.report("target_start", target=t, reason=verdict.basis)
            from .target import build_target  # the search, compiler, lessons: when one is stale

            with Interrupts() as irq:
                res, stop = build_target(ctx, t, key, verdict.basis, irq)
            if res is not None:
                failed.update([t] if res.status == "failed" else [])
                results.append(res)
            if stop is not None:
                return Run(results, stop)
    except (KeyboardInterrupt, GpuError) as exc:
        return Run(results, exc)
    return Run(results)


def build(ctx: Context, targets: list[Target] | None = None) -> list[TargetResult]:
    """run()'s results, for callers that want a stop raised (run() returns it with what finished)."""
    done = run(ctx, targets)
    if done.stop is not None:
        raise done.stop
    return done.results


def build_and_lock(ctx: Context, targets=None, locked: bool = False, note=lambda m: None) -> Run:
    """`ptxbuild build`: run() then record the lock of every target that finished, a stop or not;
    `locked`: reproduce what the lock pins instead (build_locked; the lock is not written)."""
    if locked:
        from .locked import build_locked

        try:
            return Run(build_locked(ctx, targets))
        except (KeyboardInterrupt, GpuError) as exc:
            return Run([], exc)
    done = run(ctx, targets)
    return replace(done, lock=update_lock(ctx.kf, done.results, note=note))
