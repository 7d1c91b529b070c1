#!/usr/bin/env python3
"""Check wgmma's shared-memory operand layout and time it, before the recurrence is written with it.

ops/kda/NOTES.md plans a wgmma recurrence (S in registers as the A operand, the workspace's W, Qg
and Kd from shared memory as B). Its descriptor and canonical-layout rules were read from the PTX
ISA, never run here. This probe runs one warpgroup's `wgmma.mma_async.m64nNk16.f32.f16.f16`
(A: 64 x 16 f16 in registers, in the mma.m16n8k16 A-fragment order per warp; B: 16 x N f16 in shared
memory, no swizzle) for every combination of
  - core matrices K-major (8 rows of N, 16 contiguous bytes of K each; imm-trans-b 0) or MN-major
    (8 rows of K, 16 contiguous bytes of N; imm-trans-b 1),
  - the core matrices of one 8-wide K block adjacent ("kfirst") or those of one N block ("nfirst"),
  - the descriptor's leading byte offset taken as the K-direction stride or the N-direction one,
against numpy, and says which combinations are right (the layouts the recurrence may use). Then it
times chains of dependent wgmma (N = 32 and 128) on one warpgroup per SM with clock64.

    python3 lab/kda/wgmma_probe.py                # needs an sm_90 GPU, cupy, ptxbuild's compiler
    python3 lab/kda/wgmma_probe.py --compile-only # any machine: every variant compiles (nvrtc)
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from ptxbuild.problem import Kernel, Launch  # noqa: E402

NS = (16, 32, 128)
CORE = 128  # bytes of one 8 x 8 f16 core matrix


def strides(n: int, order: str) -> tuple[int, int]:
    """(bytes between K-adjacent core matrices, bytes between N-adjacent ones) of a 16 x n operand."""
    return (CORE, 2 * CORE) if order == "kfirst" else ((n // 8) * CORE, CORE)


def source(n: int, major: str, order: str, lbo_is: str, reps: int = 1) -> str:
    """One warpgroup: B (16 x n, K x N row-major in global) laid out in shared memory as asked, then
    `reps` dependent wgmma (the first with scale-d 0), D stored as float [64][n]."""
    jk, jn = strides(n, order)
    lbo, sbo = (jk, jn) if lbo_is == "k" else (jn, jk)
    en, ek = (16, 2) if major == "k" else (2, 16)  # bytes per step of n / k inside a core matrix
    nd = n // 2
    d_regs = ", ".join(f"%{i}" for i in range(nd))
    a_regs = ", ".join(f"%{nd + i}" for i in range(4))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(nd))
    wg = (
        f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.f16.f16 {{{d_regs}}}, {{{a_regs}}}, %{nd + 4}, "
        f"p, 1, 1, {1 if major == 'mn' else 0};"
    )
    return f"""
typedef unsigned int u32;
typedef unsigned short f16;   // raw halves: only moved, never computed on here
extern "C" __global__ void __launch_bounds__(128) wgmma_probe(const f16* A, const f16* B,
                                                               float* D, long long* cycles, int first) {{
  __shared__ __align__(128) f16 sB[16 * {n}];
  const int t = threadIdx.x, w = t >> 5, lane = t & 31;
  for (int i = t; i < 16 * {n}; i += 128) {{       // B[k][n] -> its place in the canonical layout
    const int k = i / {n}, c = i % {n};
    const int off = (c / 8) * {jn} + (k / 8) * {jk} + (c % 8) * {en} + (k % 8) * {ek};
    sB[off / 2] = B[i];
  }}
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");   // generic writes -> async proxy
  __syncthreads();
  const int r = 16 * w + (lane >> 2), c = 2 * (lane & 3);      // the m16n8k16 A fragment, per warp
  u32 a[4];
  const f16* A0 = A + r * 16 + c;
  a[0] = *(const u32*)(A0);
  a[1] = *(const u32*)(A0 + 8 * 16);
  a[2] = *(const u32*)(A0 + 8);
  a[3] = *(const u32*)(A0 + 8 * 16 + 8);
  const unsigned long long addr = (unsigned long long)(__cvta_generic_to_shared(sB));
  const unsigned long long desc = ((addr & 0x3FFFF) >> 4) | ((unsigned long long)({lbo} >> 4) << 16) |
                                  ((unsigned long long)({sbo} >> 4) << 32);
  float d[{nd}];
#pragma unroll
  for (int i = 0; i < {nd}; ++i) d[i] = 0.f;
  const long long t0 = clock64();
#pragma unroll 1
  for (int rep = 0; rep < {reps}; ++rep) {{
    const int scale = rep > 0 || !first;
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
    asm volatile("{{\\n .reg .pred p;\\n setp.ne.b32 p, %{nd + 5}, 0;\\n {wg}\\n}}"
                 : {outs}
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale));
  }}
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  const long long t1 = clock64();
#pragma unroll
  for (int j = 0; j < {n // 8}; ++j)                            // the m16n8 accumulator layout, per n-tile
#pragma unroll
    for (int q = 0; q < 4; ++q)
      D[(r + 8 * (q >> 1)) * {n} + 8 * j + c + (q & 1)] = d[4 * j + q];
  if (t == 0) cycles[blockIdx.x] = t1 - t0;
}}
"""


def variants():
    yield from itertools.product(NS, ("k", "mn"), ("kfirst", "nfirst"), ("k", "n"))


def compile_all(arch: str = "sm_90a") -> list[tuple]:
    from ptxbuild.compile.compiler import compile_kernel

    built = []
    for v in variants():
        b = compile_kernel(Kernel(source(*v), "wgmma_probe"), arch)
        built.append((v, b))
        print(f"n={v[0]:3d} {v[1]:>2}-major {v[2]:>6} lbo={v[3]}: {b.registers} registers, "
              f"{b.spill_bytes} B spilled", flush=True)  # fmt: skip
    return built


def stream():
    import cupy as cp

    return cp.cuda.get_current_stream()


def run(built) -> int:
    import cupy as cp

    from ptxbuild.gpu import device

    rng = np.random.default_rng(7)
    right = []
    for (n, major, order, lbo_is), b in built:
        A = rng.standard_normal((64, 16)).astype(np.float16)
        B = rng.standard_normal((16, n)).astype(np.float16)
        want = A.astype(np.float32) @ B.astype(np.float32)
        fn = device.load("wgmma_probe", b.cubin, b.ptx)
        dA, dB = cp.asarray(A), cp.asarray(B)
        dD, cyc = cp.zeros((64, n), cp.float32), cp.zeros(1, cp.int64)
        device.launch(fn, Launch((1, 1, 1), (128, 1, 1)), [dA, dB, dD, cyc, np.int32(1)], stream())
        err = float(np.abs(dD.get() - want).max())
        ok = err < 1e-2
        right += [(n, major, order, lbo_is)] if ok else []
        print(f"n={n:3d} {major:>2}-major {order:>6} lbo={lbo_is}: max |D - A B| = {err:.3g} "
              f"{'RIGHT' if ok else 'wrong'}", flush=True)  # fmt: skip
    print("right:", right)
    return 0 if right else 1


def time_chains(arch: str, reps: int = 1024) -> None:
    import cupy as cp

    from ptxbuild.compile.compiler import compile_kernel
    from ptxbuild.gpu import device

    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    for n in (32, 128):
        b = compile_kernel(Kernel(source(n, "k", "kfirst", "k", reps), "wgmma_probe"), arch)
        fn = device.load("wgmma_probe", b.cubin, b.ptx)
        dA, dB = cp.zeros((64, 16), cp.float16), cp.zeros((16, n), cp.float16)
        dD = cp.zeros((sms, 64, n), cp.float32)
        cyc = cp.zeros(sms, cp.int64)
        for _ in range(2):
            device.launch(
                fn, Launch((sms, 1, 1), (128, 1, 1)), [dA, dB, dD, cyc, np.int32(1)], stream()
            )
        cp.cuda.runtime.deviceSynchronize()
        per = float(np.median(cyc.get())) / reps
        print(f"m64n{n}k16, {reps} dependent, one warpgroup an SM: {per:.1f} cycles each "
              f"({64 * n * 16 * 2 / per:.0f} flop/cycle/SM)", flush=True)  # fmt: skip


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compile-only", action="store_true")
    a = ap.parse_args(argv)
    built = compile_all()
    if a.compile_only:
        return 0
    rc = run(built)
    time_chains("sm_90a")
    return rc


if __name__ == "__main__":
    sys.exit(main())
