"""The one freshness judge: is a target up to date, and why; used by plan, --explain and build."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from .. import keys
from ..declare.graph import Target, build_order, dependencies
from ..oploader import file_digests, load_op
from ..outputs import gates
from ..outputs.lockfile import LockError, check_entry, pinned_binaries, read_lock
from ..outputs.manifest import artifact_problem, target_dir
from .context import Context, hardware_for


def target_key(ctx: Context, t: Target, done: dict[Target, str]) -> str:
    spec, gpu = ctx.kf.ops[t.op], ctx.kf.gpus[t.gpu]
    op = load_op(spec.template, ctx.kf.root)
    deps = [done.get(d) or target_key(ctx, d, done) for d in dependencies(ctx.kf, t)]
    return keys.build_key(
        file_digests(op),
        spec.config(),
        gpu.as_dict(),
        ctx.toolchain.key(),
        deps,
        hardware_for(ctx, gpu),
    )


def explain(ctx: Context, t: Target, key: str) -> tuple[bool, str]:
    """(up to date?, why) for a target whose current build key is `key`: by the cache's last build, else by the lock
    (`build --locked` records no cache build; what it wrote is up to date while the lock entry holds)."""
    fresh, why = _by_cache(ctx, t, key)
    return (
        (True, "up to date (built from the lock)")
        if not fresh and _as_locked(ctx, t)
        else (fresh, why)
    )


def _by_cache(ctx: Context, t: Target, key: str) -> tuple[bool, str]:
    last = ctx.cache.last_build(str(t), ctx.kf.project)
    if last is None:
        return False, "never built"
    if last["status"] not in (
        "ok",
        "gates_failed",
    ):  # gates_failed: recorded before gates stopped being build inputs
        return False, f"last build {last['status']}"
    if last["key"] != key:
        old, new = json.loads(last["summary"]).get("inputs", {}), inputs(ctx, t)
        changed = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
        return False, "changed: " + (", ".join(changed) if changed else "build inputs")
    # build/<target>/ as this kernelfile names it (a copied project's cache names the original's)
    if why := artifact_problem(ctx.kf, t):
        return False, why
    return True, "up to date"


def _as_locked(ctx: Context, t: Target) -> bool:
    """build/ holds the kernels kernelfile.lock pins for `t`, its entry holds for today's inputs, and it was measured
    on hardware unless none of the target's GPU is here (a compile-only entry on that GPU is searched there)."""
    try:
        entry = read_lock(ctx.kf)["targets"].get(str(t))
        op = load_op(ctx.kf.ops[t.op].template, ctx.kf.root)
        check_entry(ctx.kf, ctx.toolchain.key(), t, entry, op)
        m = json.loads((target_dir(ctx.kf, t) / "manifest.json").read_text())
    except (LockError, OSError, ValueError, KeyError):
        return False
    return (
        not artifact_problem(ctx.kf, t)
        and (entry["measured_on_hardware"] or not hardware_for(ctx, ctx.kf.gpus[t.gpu]))
        and [d.get("binary") for d in m["dispatch"]] == [d["binary"] for d in entry["dispatch"]]
    )


def inputs(ctx: Context, t: Target) -> dict[str, str]:
    """Named digests of each input of a target's build key (for --explain)."""
    spec, gpu = ctx.kf.ops[t.op], ctx.kf.gpus[t.gpu]
    op = load_op(spec.template, ctx.kf.root)

    def d(v):
        return hashlib.sha256(json.dumps(v, sort_keys=True, default=str).encode()).hexdigest()[:12]

    out = {f"op file {name}": h[:12] for name, h in file_digests(op).items()}
    out.update(
        {
            "ops." + t.op: d(spec.config()),
            "gpus." + t.gpu: d(gpu.as_dict()),
            "toolchain": d(ctx.toolchain.key()),
            "hardware": d(hardware_for(ctx, gpu)),
        }
    )
    return out


@dataclass(frozen=True)
class Freshness:
    """The judge's verdict on one target. `fresh`: up to date, as plan and --explain say; `rebuild`:
    a plain build builds it again (not when only `build --locked` can put back what the lock pins);
    `basis`: the cache's or the lock's own answer, which a build records as its reason."""

    fresh: bool
    why: str
    rebuild: bool
    basis: str
    manifest: dict | None = None  # build/'s manifest of the target, where the cache calls it built


LOCK_DIFFERS = "build/ holds other kernels than the lock pins; run: ptxbuild build --locked"


def judge(
    ctx: Context, t: Target, key: str, pinned: dict[str, list[str]], stale_deps=()
) -> Freshness:
    """Up to date by the cache's last build (or the lock), build/ holding what the lock pins (`pinned`:
    lockfile.pinned_binaries), no dependency stale (`stale_deps`); a missed gate is said, not rebuilt."""
    fresh, why = explain(ctx, t, key)
    if not fresh:
        return Freshness(False, why, True, why)
    m = json.loads((target_dir(ctx.kf, t) / "manifest.json").read_text())
    if str(t) in pinned and pinned[str(t)] != [d.get("binary") for d in m["dispatch"]]:
        return Freshness(False, LOCK_DIFFERS, False, why, m)
    said = why
    if missed := gates.misses(ctx.kf.ops[t.op], m["dispatch"], m["measured_on_hardware"]):
        said += f"; {len(missed)} gate(s) of ops.{t.op}.gates missed"
    if stale_deps:
        return Freshness(False, f"dependency {stale_deps[0]} is stale", True, why, m)
    return Freshness(True, said, False, why, m)


def plan(ctx: Context, targets: list[Target] | None) -> list[tuple[Target, bool, str]]:
    """(target, up to date?, why) for plan / --explain, in build order (judge's verdicts)."""
    done: dict[Target, str] = {}
    verdicts: dict[Target, Freshness] = {}
    pinned = pinned_binaries(ctx.kf)
    for t in build_order(ctx.kf, targets):
        done[t] = key = target_key(ctx, t, done)
        stale = [d for d in dependencies(ctx.kf, t) if not verdicts[d].fresh]
        verdicts[t] = judge(ctx, t, key, pinned, stale)
    return [(t, v.fresh, v.why) for t, v in verdicts.items()]
