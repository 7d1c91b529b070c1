#!/usr/bin/env python3
"""How fast does one warp issue mma.sync m16n8k16 (f16 -> f32) on this GPU, by independent chains?

KDA's recurrence issues ~50 of them per warp per 16-token chunk, in 4 (then 16) independent
accumulator chains, and measures ~1.8k cycles per chunk even with one warp per SM: as if every mma
took ~36 cycles. This probe separates latency from issue rate: one kernel per chain count C in
{1, 2, 4, 8, 16}, each warp running ITERS rounds of C independent mma (round r+1 depends on round r
per chain), timed with clock64 inside the kernel; launched with 1, 2, 4, 8 warps per SM (blocks of
one warp, one wave). Prints cycles per mma per warp and per SM.

    python3 lab/mma_probe.py            # needs a CUDA GPU, cupy and ptxbuild's compiler wheels
    python3 lab/mma_probe.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ptxbuild.problem import Kernel  # noqa: E402

CHAINS = (1, 2, 4, 8, 16)
WARPS_PER_SM = (1, 2, 4, 8)
ITERS = 4096


def source(chains: int, iters: int = ITERS) -> str:
    """A kernel of one warp per block: `chains` independent accumulators, `iters` dependent rounds."""
    return f"""
typedef unsigned int u32;
extern "C" __global__ void __launch_bounds__(32) mma_probe(float* out, long long* cycles, u32 seed) {{
  const int lane = threadIdx.x;
  u32 a0 = seed ^ lane, a1 = a0 * 3u, a2 = a0 * 5u, a3 = a0 * 7u, b0 = a0 * 11u, b1 = a0 * 13u;
  float acc[{chains}][4];
#pragma unroll
  for (int c = 0; c < {chains}; ++c) acc[c][0] = acc[c][1] = acc[c][2] = acc[c][3] = 0.f;
  __syncwarp();
  const long long t0 = clock64();
  for (int i = 0; i < {iters}; ++i) {{
#pragma unroll
    for (int c = 0; c < {chains}; ++c)
      asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {{%0,%1,%2,%3}}, {{%4,%5,%6,%7}}, {{%8,%9}}, {{%0,%1,%2,%3}};"
                   : "+f"(acc[c][0]), "+f"(acc[c][1]), "+f"(acc[c][2]), "+f"(acc[c][3])
                   : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }}
  const long long t1 = clock64();
  float s = 0.f;
#pragma unroll
  for (int c = 0; c < {chains}; ++c) s += acc[c][0] + acc[c][1] + acc[c][2] + acc[c][3];
  out[blockIdx.x * 32 + lane] = s;                      // keeps the chains alive
  if (lane == 0) cycles[blockIdx.x] = t1 - t0;
}}
"""


def kernel(chains: int, iters: int = ITERS) -> Kernel:
    return Kernel(source(chains, iters), "mma_probe")


def run(args) -> list[dict]:
    import cupy as cp

    from ptxbuild.compile.compiler import compile_kernel
    from ptxbuild.gpu import device

    dev = cp.cuda.Device()
    sms = dev.attributes["MultiProcessorCount"]
    cc = dev.compute_capability
    arch = f"sm_{cc}a" if cc == "90" else f"sm_{cc}"
    rows = []
    for chains in CHAINS:
        b = compile_kernel(kernel(chains), arch)
        fn = device.load("mma_probe", b.cubin, b.ptx)
        for wps in WARPS_PER_SM:
            blocks = sms * wps
            out = cp.zeros(blocks * 32, cp.float32)
            cyc = cp.zeros(blocks, cp.int64)
            for _ in range(2):  # the first launch loads the module
                fn((blocks,), (32,), (out, cyc, cp.uint32(12345)))
            cp.cuda.runtime.deviceSynchronize()
            per_warp = float(cp.median(cyc.astype(cp.float64)).get()) / (ITERS * chains)
            rows.append(
                {
                    "chains": chains,
                    "warps_per_sm": wps,
                    "cycles_per_mma_per_warp": round(per_warp, 2),
                    "cycles_per_mma_per_sm": round(per_warp / wps, 2),
                    "registers": b.registers,
                }
            )
            print(
                f"chains {chains:2d}  warps/SM {wps}  cycles per mma: {per_warp:7.2f} per warp, "
                f"{per_warp / wps:7.2f} per SM  ({b.registers} registers)",
                flush=True,
            )
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="also write the rows as JSON here")
    args = ap.parse_args(argv)
    rows = run(args)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
