"""`ptxbuild build --locked` and `ptxbuild relock`: reproduce what kernelfile.lock pins, byte for byte.

A locked build renders exactly the locked configs, compiles them, and compares both digests with the lock; any drift
(kernelfile, op files, toolchain, PTX, cubin, or a failed verification on a GPU of the target's model) is a LockError
naming the target, the variant, expected and got, and nothing of that build is written.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import replace

from ..declare.graph import build_order
from ..oploader import changed_files, file_digests
from ..outputs.lockfile import (
    KERNEL_SOURCE_SUFFIXES,
    RELOCK_GPU,
    LockError,
    check_entry,
    entry_digest,
    lock_path,
    read_lock,
    sha256,
    write_lock,
)
from ..outputs.manifest import Built, pin_ptx, write_artifacts
from ..outputs.report import rejudge
from ..problem import Binary, Launch, Problem, canonical_json
from ..records import DispatchEntry, TargetResult, dispatch_of
from .context import hardware_for, target_op


def _reproduce(ctx, t, entry: dict, op, ptx_of: dict | None = None) -> list[DispatchEntry]:
    """Compile every locked config, compare digests, verify on a matching GPU; the chosen list for write_artifacts.
    `ptx_of` (relock, no GPU): dispatch index -> each config's PTX sha256; a PTX that alone differs is not refused."""
    gpu = ctx.kf.gpus[t.gpu]
    chosen = []
    for i, d in enumerate(dispatch_of(entry)):
        problem = Problem.make(**d.problem)
        want = entry["variants"].get(d.binary)
        if want is None:
            raise LockError(
                f"{t}: dispatch entry {d.label} names variant {d.binary[:16]} that the lock "
                f"does not list"
            )
        b = ctx.compile_fn(op.render(d.params, problem, gpu.arch), gpu.arch)
        got_ptx, got_cubin = sha256(b.ptx.encode()), b.digest
        name = f"{b.entry}-{d.binary[:12]} ({d.label}, {canonical_json(d.params)})"
        want_ptx = (
            d.ptx_sha256 or want["ptx_sha256"]
        )  # its own, where another config has this cubin
        if ptx_of is not None and got_cubin == d.binary == want["cubin_sha256"]:
            ptx_of[i] = got_ptx
        elif got_ptx != want_ptx:
            raise _drift(t, name, "PTX", want_ptx, got_ptx)
        if got_cubin != d.binary or got_cubin != want["cubin_sha256"]:
            raise _drift(t, name, "cubin", d.binary, got_cubin)
        b = Binary(**{**b.__dict__, "compiler": want.get("compiler", "")})
        chosen.append(replace(d, compiled=b))
    if ptx_of is None and hardware_for(ctx, gpu) is not None:
        for c in chosen:
            v = ctx.gpu.verify(str(op.FOLDER), c.params, Problem.make(**c.problem), c.compiled)
            if v.outcome.value != "ok":
                raise LockError(
                    f"{t}: variant {c.binary[:12]} ({c.label}) failed verification on this GPU: "
                    f"{v.outcome.value} {v.detail}; artifacts not written"
                )
    return chosen


def _drift(t, name: str, what: str, want: str, got: str) -> LockError:
    return LockError(
        f"{t}: variant {name}: {what} drift: expected sha256 {want}, got {got}; artifacts not written"
    )


def build_locked(ctx, targets=None) -> list[TargetResult]:
    """Rebuild exactly the locked artifacts (compile, compare, verify; no search); any drift leaves build/ as it was."""
    lock = read_lock(ctx.kf)
    order = [
        (t, lock["targets"].get(str(t)), target_op(ctx, t)) for t in build_order(ctx.kf, targets)
    ]
    for (
        t,
        entry,
        op,
    ) in order:  # every entry first: a missing or drifted one fails before anything compiles
        check_entry(ctx.kf, ctx.toolchain.key(), t, entry, op)
    plan = []
    for t, entry, op in order:
        ctx.report("target_start", target=t, reason="locked")
        plan.append((t, entry, op, _reproduce(ctx, t, entry, op)))
    results = []
    for t, entry, op, chosen in plan:
        how = Built(entry["measured_on_hardware"], entry["toolchain"], entry.get("hardware"))
        manifest, written = write_artifacts(ctx.kf, t, ctx.kf.gpus[t.gpu], op, chosen, how)
        results.append(
            TargetResult(
                t,
                "built",
                f"locked: {len(entry['variants'])} variant(s) reproduced",
                entry["measured_on_hardware"],
                manifest,
                rejudge(ctx.kf, t, written),
                written,
            )
        )
    return results


_LAUNCH_DEFAULTS = {
    f.name: json.loads(canonical_json(f.default))
    for f in dataclasses.fields(Launch)
    if f.default is not dataclasses.MISSING
}


def relock(ctx, targets=None) -> list[tuple[str, str]]:
    """Accept edits to an op's kernel sources that cannot change what a lock pins: for a target whose only
    drift is in kernel source files (same VERSION, declaration, GPU spec, toolchain, Python files), every
    locked config must compile to the locked PTX and cubin byte for byte with the same launch; then the op
    file digests are updated. With no source edit since the lock, a PTX that alone differs is recorded
    anew (see pin_ptx). No GPU. All targets are checked before the lock is written. Returns [(target, what)]."""
    entries = dict(read_lock(ctx.kf)["targets"])
    done = []
    for t in build_order(ctx.kf, targets):
        entry = entries.get(str(t))
        op = target_op(ctx, t)
        check_entry(ctx.kf, ctx.toolchain.key(), t, entry, op, op_files=False)
        files = file_digests(op)
        changed = changed_files(entry["op_files"], files)
        if host := [n for n in changed if not n.endswith(KERNEL_SOURCE_SUFFIXES)]:
            raise LockError(
                f"{t}: {', '.join(host)} changed since the lock: host code decides kernel arguments, "
                f"launches and outputs, which a recompile cannot check; {RELOCK_GPU.format(t=t)}"
            )
        gpu = ctx.kf.gpus[t.gpu]
        for d in entry["dispatch"]:
            now = json.loads(
                canonical_json(
                    op.launch(d["params"], Problem.make(**d["problem"]), gpu.sm_count).__dict__
                )
            )
            want = {
                **_LAUNCH_DEFAULTS,
                **d.get("launch", now),
            }  # fields added since: their defaults
            if now != want:
                raise LockError(
                    f"{t}: {d['label']}: launch drift: locked {canonical_json(want)}, now "
                    f"{canonical_json(now)}; rebuild unlocked to relock"
                )
        # no source edit since the lock: a PTX that alone differs was mis-recorded (cubins are what was verified)
        ptx_of: dict[int, str] = {}
        _reproduce(ctx, t, entry, op, None if changed else ptx_of)
        variants, dispatch = copy.deepcopy(entry["variants"]), copy.deepcopy(entry["dispatch"])
        if ptx_of:
            pin_ptx(dispatch, [ptx_of[i] for i in range(len(dispatch))], variants)
        fixed = sum(
            d.get("ptx_sha256", variants[d["binary"]]["ptx_sha256"])
            != o.get("ptx_sha256", entry["variants"][o["binary"]]["ptx_sha256"])
            for d, o in zip(dispatch, entry["dispatch"])
        )
        if not changed and not fixed:
            done.append((str(t), "unchanged"))
            continue
        entry = {**entry, "op_files": files, "variants": variants, "dispatch": dispatch}
        entries[str(t)] = {**entry, "entry_sha256": entry_digest(entry)}
        what = [f"edits to {', '.join(changed)}"] * bool(changed) + [
            f"{fixed} PTX recorded anew (same cubin)"
        ] * bool(fixed)
        done.append((str(t), f"{len(variants)} variant(s) reproduce after {'; '.join(what)}"))
    write_lock(lock_path(ctx.kf), entries)
    return done
