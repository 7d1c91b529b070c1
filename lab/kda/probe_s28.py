#!/usr/bin/env python3
"""Session 28 probe: the s27 prepare as persistent warps that load the next chunk-head's inputs while
they compute the current one (lab/kda/plan-session28.md), verified and timed by probe_s27.py's
harness (imported: same checks, same timing, same tables).

    python3 lab/kda/probe_s28.py --compile-only     # CPU: NVRTC registers / spills / smem, the loop's plan
    python3 lab/kda/probe_s28.py                    # GPU (one H200, < 110 s): verify, then time

Variants (all S27_FASTADDR; grid (warps, 1, 1), warp w takes chunk-heads w, w + warps, ...):
- x1p: S27_PIPE 2: the next chunk-head's q, k, a rows by 16-byte cp.async into a second shared buffer
  (IN, 12.8 KB) as soon as this one's are read out, its v rows right after U, its beta logit, A_log,
  dt_bias into registers; 29,504 B per warp, 7 warps per SM (launch bound 7: up to 255 registers).
- x1q: S27_PIPE 1: x1c's loads unchanged, plus an L2 prefetch (prefetch.global.L2) of every line of
  the next chunk-head's inputs; 16,704 B, 12 warps per SM as x1c.
- x1p5 / x1q5: the x1p / x1q binary on 5 warps, so that the small cases run several chunk-heads per
  warp (the loop, the buffer swaps, the cp.async group counts); verification only.
- x1pn / x1qn: as x1cn, every blob into 512 slots (no workspace traffic to HBM), timing only.
- x1pz: x1p with blob_mask 0: no workspace store at all (each store is under `if (blob_mask)`; the
  compiler may sink a store's own packing into it), timing only: compute + input loads alone.
x1c (run 2's control) is verified on probe_s27's SUBSET and timed. A variant whose binary failed any
case (its own or its 5-warp twin's) is not timed. ref.chunked and wsl.encode are memoised per case,
as probe_s27 memoises the other two references.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import probe_s27 as s27  # noqa: E402

from ptxbuild.problem import Launch  # noqa: E402

s26, kda, log = s27.s26, s27.kda, s27.log
SMS = 132  # H200
IN_BYTES = 2 * 16 * 136 * 2 + 16 * 32 * 8  # S27Warp::iqk + ia
PIPE_P = "#define S27_FASTADDR 1\n#define S27_PIPE 2\n"
PIPE_Q = "#define S27_FASTADDR 1\n#define S27_STAGEQK 1\n#define S27_PIPE 1\n"
# name -> (warps per SM it is bounded for, smem per warp, defines, grid in warps or 0: SMS x bound)
NEW = {
    "x1p": (7, s27.WARP_BYTES + IN_BYTES, PIPE_P, 0),
    "x1p5": (7, s27.WARP_BYTES + IN_BYTES, PIPE_P, 5),
    "x1pn": (7, s27.WARP_BYTES + IN_BYTES, PIPE_P, 0),
    "x1pz": (7, s27.WARP_BYTES + IN_BYTES, PIPE_P, 0),
    "x1q": (12, s27.WARP_BYTES, PIPE_Q, 0),
    "x1q5": (12, s27.WARP_BYTES, PIPE_Q, 5),
    "x1qn": (12, s27.WARP_BYTES, PIPE_Q, 0),
}
for _v, (_minb, _bytes, _defs, _) in NEW.items():
    s27.S27[_v] = (
        1,
        _minb,
        {"n": s27.NOSTORE_MASK, "z": 0}.get(_v[-1]),
        _defs + f"#define S27_WARP_BYTES {_bytes}\n",  # static_assert'ed against sizeof(S27Warp)
    )
# the binaries a failure excludes from timing: x1p5 is x1p's binary, x1pn and x1pz too
BINARY = {v: v.rstrip("5nz") for v in NEW}
CASES = {v: s27.SUBSET for v in ("x1c", "x1q", "x1q5", "x4", "x1s")}  # the others: all small cases


def grid_warps(problem, variant: str) -> int:
    d = kda.dims(problem)
    minb, _, _, cap = NEW[variant]
    return max(1, min(d["NC"] * d["HV"], cap or SMS * minb))


_launch_of = s27.launch_of


def launch_of(problem, variant: str) -> Launch:
    if variant not in NEW:
        return _launch_of(problem, variant)
    return Launch((grid_warps(problem, variant), 1, 1), (32, 1, 1), NEW[variant][1])


def make_built(bench, cp, device):
    """probe_s27's PrepBuilt, and for a persistent variant the blocks per SM the driver reports
    (cuOccupancyMaxActiveBlocksPerMultiprocessor, into .info): the grid is lowered to the resident
    warps if fewer fit than the launch bound says (a second partial wave would double the time)."""
    base = _make_built(bench, cp, device)

    class PrepBuilt(base):
        def __init__(self, params, problem, variant):
            super().__init__(params, problem, variant)
            if variant not in NEW or NEW[variant][3]:
                return
            try:
                from cuda.bindings import driver as cu

                fn = cu.CUfunction(getattr(self.lab, "kernel", self.lab).ptr)  # as device.launch
                err, n = cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(fn, 32, NEW[variant][1])
                if err != cu.CUresult.CUDA_SUCCESS:
                    raise RuntimeError(err.name)
                n = int(n)
            except Exception as exc:  # noqa: BLE001 - a diagnostic only: the static grid stays
                log(f"  {variant}: occupancy query failed ({type(exc).__name__}: {exc})")
                return
            self.info += f", {n} blocks/SM"
            if 1 <= n < NEW[variant][0]:
                d = kda.dims(problem)
                grid = (max(1, min(d["NC"] * d["HV"], SMS * n)), 1, 1)
                log(f"  {variant}: {n} blocks/SM resident, not {NEW[variant][0]}: grid {grid[0]}")
                self.lab_launch = dataclasses.replace(self.lab_launch, grid=grid)

    return PrepBuilt


_make_built = s27.make_built


def excluded(failed: set) -> set:
    bad = {BINARY.get(v, v) for v in failed}
    twin = {v for v in s27.S27 if v.endswith("n") and v[:-1] in failed}  # x1n, x1cn (probe_s27's)
    return failed | twin | {v for v in s27.S27 if BINARY.get(v, v) in bad}


def plan(main_v: str, others: list, big: bool):
    """main_v on every small case stage by stage and on BIG[:2] end to end; the others on the small
    cases of CASES (all of them where not listed)."""
    steps = []
    for j, c in enumerate(s27.SMALL):
        steps += [
            (j, c, v, True) for v in [main_v, *others] if j in CASES.get(v, range(len(s27.SMALL)))
        ]
    if big:
        steps += [(len(s27.SMALL) + i, c, main_v, False) for i, c in enumerate(s27.BIG[:2])]
    return steps


def check_pipe() -> int:
    """The loop's plan on the CPU: every chunk-head taken exactly once, and at every cp.async wait
    of x1p the group it needs complete ("wait_group 1": all but the newest one)."""
    bad = 0
    probs = [s26.problem_of(lens, H, kw) for lens, H, kw in s27.SMALL + s27.BIG]
    probs += [s26.problem_of(lens, H) for H, _, lens in s27.SCENARIOS]
    for problem in probs:
        d = kda.dims(problem)
        items = d["NC"] * d["HV"]
        for v in ("x1p", "x1p5", "x1q", "x1q5"):
            W = grid_warps(problem, v)
            seen = [it for w in range(W) for it in range(w, items, W)]
            bad += sorted(seen) != list(range(items))
            if v.startswith("x1p"):
                for w in range(W):
                    mine = list(range(w, items, W))
                    groups = [("in", mine[0]), ("v", mine[0])]  # the prologue's two commits
                    for n, it in enumerate(mine):
                        nxt = mine[n + 1] if n + 1 < len(mine) else None
                        bad += ("in", it) not in groups[:-1]  # phase A: wait_group 1
                        groups.append(("in", nxt))  # commit (empty where nxt is None)
                        bad += ("v", it) not in groups[:-1]  # step 7: wait_group 1
                        groups.append(("v", nxt))
    log(f"pipe plan: {len(probs)} problems x 4 variants: " + ("OK" if not bad else f"{bad} BAD"))
    return bad


def warps_per_sm(regs: int, smem_block: int, wpb: int = 1) -> int:
    warp_regs = math.ceil(regs * 32 / 256) * 256
    return wpb * min(65536 // (wpb * warp_regs), 233472 // (smem_block + 1024), 32)


def compile_only() -> int:
    """x1c, x1p, x1q on the scenario problems and the odd ones (GVA, no L2 norm), f16 and bf16
    operands: registers, spills, shared memory, warps per SM (must reach the launch bound)."""
    bad = check_pipe()
    for problem in s27.compile_problems():
        params = kda.default_params(problem)
        for op_dtype in ("f16", "bf16"):
            for name in ("x1c", "x1p", "x1q"):
                t0 = time.perf_counter()
                b = s26._compile(s27.kernel_of({**params, "op_dtype": op_dtype}, problem, name))
                wpb, minb, _, _ = s27.S27[name]
                smem = launch_of(problem, name).smem_bytes if name in NEW else wpb * s27.WARP_BYTES
                wps = warps_per_sm(b.registers, smem, wpb)
                ok = wps >= minb * wpb and b.spill_bytes <= 16 and b.local_bytes <= 16
                bad += not ok
                log(
                    f"{'OK  ' if ok else 'BAD '} {problem.shape} {dict(problem.options)} {op_dtype} {name}: "
                    f"{b.registers} regs, {b.spill_bytes} B spill, {b.local_bytes} B local, {smem} B smem/block, "
                    f"{wps} warps/SM ({time.perf_counter() - t0:.1f} s)"
                )
    log("compile-only: " + ("ALL OK" if not bad else f"{bad} BAD"))
    return 1 if bad else 0


def memo_refs() -> None:
    """ref.chunked and its CPU-built workspace (wsl.encode) once per case: verify makes both for every
    variant on the case ([1000] H64: ~7 s of numpy each time on a slow host)."""
    import kda_bench_gpu as bench

    chunked0, encode0, memo = bench.ref.chunked, bench.wsl.encode, {}

    def chunked(**args):
        # preprocess is memoised by probe_s27: one q array per case
        key = ("chunked", id(args["q"]))
        if key not in memo:
            memo[key] = (args["q"], chunked0(**args))
        return memo[key][1]

    def encode(ch, op_dtype="f16"):
        if not any(ch is r for _, r in memo.values()):  # not ours (workspace_batched's): as is
            return encode0(ch, op_dtype)
        key = ("encode", id(ch), op_dtype)
        if key not in memo:
            memo[key] = (ch, encode0(ch, op_dtype))
        return memo[key][1]

    bench.ref.chunked, bench.wsl.encode = chunked, encode


DEFAULTS = [
    "--main", "x1p", "--verify-also", "x1p5,x1c,x1q5", "--time", "x1c,x1p,x1pn,x1pz,x1q,x1qn",
    "--reps", "20", "--budget", "105", "--stop-at", "90", "--json", str(HERE / "probe_s28.json"),
]  # fmt: skip


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--compile-only" in argv:
        return compile_only()
    s27.launch_of, s27.excluded, s27.plan, s27.make_built = launch_of, excluded, plan, make_built
    if "--dry-run" not in argv:
        memo_refs()
    return s27.main(DEFAULTS + argv)  # later options win


if __name__ == "__main__":
    sys.exit(main())
