"""What a plain copy of the same bytes takes, under the build's timing protocol, for the short rows.

    python3 benchmarks/copy_floor.py [--report reports/rmsnorm@h200/report.json] [--out FILE]

The report's floor is bytes / the copy bandwidth of a 1 GiB device-to-device memcpy. A 32768 x 512
bf16 RMSNorm moves 67 MB, which a GPU does not stream at that rate: launch, the first DRAM round trip
and the last stores' drain are a few microseconds of a ~20 us kernel. This script times, for each
bf16 row length, copies that read and write the same bytes as the RMSNorm (x in, y out), each after
a 256 MiB memset (the L2 flush the build does) and timed with CUDA events, median of --reps:
  memcpy      cudaMemcpyAsync device to device
  copy1       one 16-byte load and store per thread, 256 threads per block (one block per 4 KB)
  copy4       grid-stride, four 16-byte loads in flight per thread, SMs x 8 blocks of 256 threads
With --report, each row also shows the report's RMSNorm p50 and its ratio to the fastest copy.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from event_timing import event_times_us, quantile  # noqa: E402

SHAPES = [(32768, 256), (32768, 512), (32768, 1024), (32768, 2048), (32768, 4096)]

SRC = r"""
extern "C" __global__ void copy1(const uint4* __restrict__ src, uint4* __restrict__ dst, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = src[i];
}
extern "C" __global__ void copy4(const uint4* __restrict__ src, uint4* __restrict__ dst, long long n) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) if (i + u * stride < n) v[u] = src[i + u * stride];
#pragma unroll
    for (int u = 0; u < 4; ++u) if (i + u * stride < n) dst[i + u * stride] = v[u];
  }
}
"""


def report_p50(path: Path | None) -> dict:
    if path is None or not path.is_file():
        return {}
    out = {}
    for d in json.loads(path.read_text())["dispatch"]:
        p = d["problem"]
        if p["dtype"] == "bfloat16" and not p.get("options") and d.get("p50_ms"):
            out[tuple(p["shape"])] = d["p50_ms"] * 1e3
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--report", type=Path, help="a rmsnorm report.json whose bf16 rows to set beside the copies"
    )
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--out", type=Path, help="also write the table here (markdown)")
    a = ap.parse_args(argv)
    import cupy as cp

    mod = cp.RawModule(code=SRC)
    k1, k4 = mod.get_function("copy1"), mod.get_function("copy4")
    dev = cp.cuda.Device()
    sms = dev.attributes["MultiProcessorCount"]
    flush = cp.empty(256 << 20, dtype=cp.uint8)
    ours = report_p50(a.report)
    lines = [
        f"# Copies of the same bytes as bf16 RMSNorm rows ({cp.cuda.runtime.getDeviceProperties(dev.id)['name'].decode()})",
        "",
        f"- reproduce: `python3 benchmarks/copy_floor.py{' --report ' + str(a.report) if a.report else ''}`",
        f"- each: read M x N x 2 bytes, write as many; 256 MiB memset before each call; CUDA events; median of {a.reps}",
        "",
        "| M x N | MB moved | memcpy (us) | copy1 (us) | copy4 (us) | fastest copy, TB/s |"
        + (" rmsnorm p50 (us) | rmsnorm / fastest copy |" if ours else ""),
        "|---|---:|---:|---:|---:|---:|" + ("---:|---:|" if ours else ""),
    ]
    for m, n in SHAPES:
        nbytes = m * n * 2
        src = cp.ones(nbytes // 16 * 4, dtype=cp.uint32)
        dst = cp.empty_like(src)
        n16 = nbytes // 16
        calls = {
            "memcpy": lambda: cp.cuda.runtime.memcpyAsync(
                dst.data.ptr, src.data.ptr, nbytes, 3, cp.cuda.get_current_stream().ptr
            ),
            "copy1": lambda: k1(((n16 + 255) // 256,), (256,), (src, dst, cp.int64(n16))),
            "copy4": lambda: k4((sms * 8,), (256,), (src, dst, cp.int64(n16))),
        }
        t = {
            name: quantile(event_times_us(cp, fn, flush, a.reps), 0.5) for name, fn in calls.items()
        }
        best = min(t.values())
        row = (
            f"| {m} x {n} | {2 * nbytes / 1e6:.1f} | {t['memcpy']:.1f} | {t['copy1']:.1f} | {t['copy4']:.1f} | "
            f"{2 * nbytes / best / 1e6:.2f} |"
        )
        if ours:
            o = ours.get((m, n))
            row += f" {o:.1f} | {o / best:.3f} |" if o else " - | - |"
        lines.append(row)
        print(row, flush=True)
        del src, dst
    text = "\n".join(lines) + "\n"
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
