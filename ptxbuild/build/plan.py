"""The one freshness judge: is a target up to date, and why; used by plan, --explain and build."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from .. import keys
from ..declare.graph import Target, build_order, dependencies
from ..oploader import OpFiles, changed_files, file_digests, op_files
from ..outputs import gates
from ..outputs.lockfile import LockError, check_entry, pinned_binaries, read_lock
from ..outputs.manifest import built, target_dir
from ..records import Manifest
from .context import Context, hardware_for


def _files(ctx: Context, template: str) -> OpFiles:
    """oploader.op_files, once per template in a context (one command's snapshot of ops/)."""
    if template not in ctx.op_files:
        ctx.op_files[template] = op_files(template, ctx.kf.root)
    return ctx.op_files[template]


def target_key(ctx: Context, t: Target, done: dict[Target, str]) -> str:
    spec, gpu = ctx.kf.ops[t.op], ctx.kf.gpus[t.gpu]
    op = _files(ctx, spec.template)
    deps = [done.get(d) or target_key(ctx, d, done) for d in dependencies(ctx.kf, t)]
    return keys.build_key(
        file_digests(op),
        spec.config(),
        gpu.as_dict(),
        ctx.toolchain.key(),
        deps,
        hardware_for(ctx, gpu),
    )


def explain(ctx: Context, t: Target, key: str) -> tuple[bool, str, Manifest | None]:
    """(up to date?, why, build/'s manifest of it) for a target whose current build key is `key`: by
    the cache's last build, else by the lock (`build --locked` records no cache build; what it wrote
    is up to date while the lock entry holds). The manifest is read here, once, where it counts."""
    by_cache, why = _by_cache(ctx, t, key)
    entry = None if by_cache else _locked_entry(ctx, t)
    if not by_cache and entry is None:
        return False, why, None
    # build/<target>/ as this kernelfile names it (a copied project's cache names the original's)
    m, problem = built(ctx.kf, t)
    if by_cache:
        return (False, problem, m) if problem else (True, "up to date", m)
    pins = [d["binary"] for d in entry["dispatch"]]
    if m is not None and not problem and [d.binary for d in m.dispatch] == pins:
        return True, "up to date (built from the lock)", m
    return False, why, m


def _by_cache(ctx: Context, t: Target, key: str) -> tuple[bool, str]:
    """By the cache's last build alone (its status and key; build/ is explain's to look at)."""
    last = ctx.cache.last_build(str(t), ctx.kf.project)
    if last is None:
        return False, "never built"
    if last["status"] not in (
        "ok",
        "gates_failed",
    ):  # gates_failed: recorded before gates stopped being build inputs
        return False, f"last build {last['status']}"
    if last["key"] != key:
        changed = changed_files(json.loads(last["summary"]).get("inputs", {}), inputs(ctx, t))
        return False, "changed: " + (", ".join(changed) if changed else "build inputs")
    return True, "up to date"


def _locked_entry(ctx: Context, t: Target) -> dict | None:
    """The lock entry of `t` where it holds for today's inputs and was measured on hardware unless
    none of the target's GPU is here (a compile-only entry on that GPU is searched there); else None
    (at once where build/ holds no manifest of it: then no entry can make it up to date)."""
    if not (target_dir(ctx.kf, t) / "manifest.json").is_file():
        return None
    try:
        entry = read_lock(ctx.kf)["targets"].get(str(t))
        op = _files(ctx, ctx.kf.ops[t.op].template)
        check_entry(ctx.kf, ctx.toolchain.key(), t, entry, op)
    except (LockError, OSError, ValueError, KeyError):
        return None
    measured = entry["measured_on_hardware"] or not hardware_for(ctx, ctx.kf.gpus[t.gpu])
    return entry if measured else None


def inputs(ctx: Context, t: Target) -> dict[str, str]:
    """Named digests of each input of a target's build key (for --explain)."""
    spec, gpu = ctx.kf.ops[t.op], ctx.kf.gpus[t.gpu]
    op = _files(ctx, spec.template)

    def d(v):
        return hashlib.sha256(json.dumps(v, sort_keys=True, default=str).encode()).hexdigest()[:12]

    return {
        **{f"op file {name}": h[:12] for name, h in file_digests(op).items()},
        "ops." + t.op: d(spec.config()),
        "gpus." + t.gpu: d(gpu.as_dict()),
        "toolchain": d(ctx.toolchain.key()),
        "hardware": d(hardware_for(ctx, gpu)),
    }


@dataclass(frozen=True)
class Freshness:
    """The judge's verdict on one target. `fresh`: up to date, as plan and --explain say; `rebuild`:
    a plain build builds it again (not when only `build --locked` can put back what the lock pins);
    `basis`: the cache's or the lock's own answer, which a build records as its reason."""

    fresh: bool
    why: str
    rebuild: bool
    basis: str
    manifest: Manifest | None = None  # build/'s manifest of the target, where it is up to date


LOCK_DIFFERS = "build/ holds other kernels than the lock pins; run: ptxbuild build --locked"


def judge(
    ctx: Context, t: Target, key: str, pinned: dict[str, list[str]] | None = None, stale_deps=()
) -> Freshness:
    """Up to date by the cache's last build (or the lock), build/ holding what the lock pins (`pinned`:
    lockfile.pinned_binaries, read here where None: only a fresh target needs it), no dependency
    stale (`stale_deps`); a missed gate is said, not rebuilt."""
    fresh, why, m = explain(ctx, t, key)
    if not fresh or m is None:
        return Freshness(False, why, True, why)
    pinned = pinned_binaries(ctx.kf) if pinned is None else pinned
    if str(t) in pinned and pinned[str(t)] != [d.binary for d in m.dispatch]:
        return Freshness(False, LOCK_DIFFERS, False, why, m)
    said = why
    if missed := gates.misses(ctx.kf.ops[t.op], m.dispatch, m.measured_on_hardware):
        said += f"; {len(missed)} gate(s) of ops.{t.op}.gates missed"
    if stale_deps:
        return Freshness(False, f"dependency {stale_deps[0]} is stale", True, why, m)
    return Freshness(True, said, False, why, m)


def plan(ctx: Context, targets: list[Target] | None) -> list[tuple[Target, bool, str]]:
    """(target, up to date?, why) for plan / --explain, in build order (judge's verdicts)."""
    done: dict[Target, str] = {}
    verdicts: dict[Target, Freshness] = {}
    for t in build_order(ctx.kf, targets):
        done[t] = key = target_key(ctx, t, done)
        stale = [d for d in dependencies(ctx.kf, t) if not verdicts[d].fresh]
        verdicts[t] = judge(ctx, t, key, None, stale)
    return [(t, v.fresh, v.why) for t, v in verdicts.items()]
