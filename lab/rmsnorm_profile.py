"""One rmsnorm problem: the built winner beside torch.compile, for a profiler to compare.

    python3 lab/rmsnorm_profile.py float32 32768 8192 [--params k=v,...] [--reps 20]
    ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,... \
        python3 lab/rmsnorm_profile.py float32 32768 8192 --reps 3

The config is the winner that `reports/rmsnorm@h200/report.json` records for the problem (override
with --params). Both kernels run on the same inputs, the L2 flushed (a 256 MiB memset) before each
call, and are timed with CUDA events; `TORCH_LOGS=output_code` prints the Triton source that
torch.compile generated. Prints one line per kernel: median and p20/p80 in microseconds.
`--triton-ptx DIR` copies the PTX and launch metadata (num_warps, ...) of every kernel Triton compiled
for torch.compile into DIR (run 14d read its L1/L2 eviction priorities and loop unrolling this way).
The torch.compile line includes each call's Python overhead (guards, output allocation), which
falls between the two events while the GPU idles after the flush: it reads 10-20% slower than the
build's baseline timing and ncu's kernel time. Compare kernels with ncu, or with the build.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "ops" / "rmsnorm"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from event_timing import event_times_us, quantile  # noqa: E402

from ptxbuild.problem import Problem  # noqa: E402


def winner(report: Path, problem: Problem) -> dict:
    data = json.loads(report.read_text())
    for d in data["dispatch"]:
        if d.get("label") == problem.label():
            if not d.get("params"):
                raise SystemExit(
                    f"{problem.label()} has no winner in {report} (no valid candidate): pass --params"
                )
            return d["params"]
    raise SystemExit(f"{problem.label()} is not in {report}: pass --params")


def parse_params(text: str) -> dict:
    out = {}
    for kv in filter(None, text.split(",")):
        k, v = kv.split("=", 1)
        out[k] = {"True": True, "False": False}.get(v, int(v) if v.lstrip("-").isdigit() else v)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dtype", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("M", type=int)
    ap.add_argument("N", type=int)
    ap.add_argument("--residual", action="store_true")
    ap.add_argument(
        "--params", default="", help="config overrides, e.g. threads=256,load_hint=nc_na"
    )
    ap.add_argument("--report", default=str(ROOT / "reports/rmsnorm@h200/report.json"))
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--no-baseline", action="store_true", help="time only the built kernel")
    ap.add_argument(
        "--triton-ptx", metavar="DIR", help="copy the PTX of torch.compile's Triton kernels here"
    )
    a = ap.parse_args(argv)
    if a.triton_ptx:  # before torch imports Triton: a fresh cache holds only this run's kernels
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-cache-")

    import cupy as cp
    import torch
    from rmsnorm_selftest_gpu import arch_of

    from ptxbuild.compile.compiler import compile_kernel
    from ptxbuild.gpu import device
    from ptxbuild.oploader import load_op

    op = load_op("rmsnorm", ROOT)
    problem = Problem.make("rmsnorm", a.dtype, (a.M, a.N), {"residual": True} if a.residual else {})
    params = dict(winner(Path(a.report), problem)) if Path(a.report).is_file() else {}
    params = op._full({**params, **parse_params(a.params)})
    arch = arch_of(cp)
    binary = compile_kernel(op.render(params, problem, arch), arch)
    kern = device.load(binary.entry, binary.cubin, binary.ptx)
    inputs, outputs = op.make_inputs(problem, 0, cp), op.make_outputs(problem, cp)
    geom, args = (
        op.launch(params, problem, cp.cuda.Device().attributes["MultiProcessorCount"]),
        op.kernel_args(params, problem, inputs, outputs),
    )
    stream = cp.cuda.get_current_stream()
    ours = lambda: device.launch(kern, geom, args, stream)  # noqa: E731
    base = op.baselines(problem)["torch_compile"]
    theirs = lambda: base(inputs)  # noqa: E731
    flush = cp.empty(256 << 20, dtype=cp.uint8)
    print(
        f"{problem.label()} ours: {' '.join(f'{k}={v}' for k, v in sorted(params.items()))} "
        f"({binary.registers} regs, {binary.spill_bytes} B spill)"
    )
    floor_us = op.bytes_moved(problem) / 4.25e12 * 1e6
    for name, fn in (("ours", ours),) + (() if a.no_baseline else (("torch_compile", theirs),)):
        times = event_times_us(
            cp, fn, flush, a.reps
        )  # two warm-up calls first (torch.compile compiles)
        q = lambda f: quantile(times, f)  # noqa: E731
        print(
            f"{name:>14}: {q(0.5):8.1f} us [p20 {q(0.2):.1f}, p80 {q(0.8):.1f}, n={len(times)}] "
            f"({floor_us / q(0.5):.0%} of bytes / 4.25 TB/s)"
        )
    torch.cuda.synchronize()
    if a.triton_ptx:
        print(
            f"triton: {copy_triton_ptx(Path(os.environ['TRITON_CACHE_DIR']), Path(a.triton_ptx))} file(s) -> {a.triton_ptx}"
        )
    return 0


def copy_triton_ptx(cache: Path, dest: Path) -> int:
    """Each compiled kernel's .ptx and metadata .json from a Triton cache into dest, named
    <cache entry>-<file> (one entry per autotuning config)."""
    dest.mkdir(parents=True, exist_ok=True)
    n = 0
    for f in sorted(cache.rglob("*")):
        if f.suffix in (".ptx", ".json") and not f.name.startswith("__grp__"):
            shutil.copy(f, dest / f"{f.parent.name}-{f.name}")
            n += 1
    return n


if __name__ == "__main__":
    sys.exit(main())
