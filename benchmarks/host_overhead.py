"""Host time per call of ptxbuild's rmsnorm@h200 against torch.nn.functional.rms_norm (issue 28).

Method (one process, one GPU): for each row both callables get the same bf16 tensors x [M, N] and
weight [N] (eps 1e-6). In a measurement round each callable in turn first enqueues torch.cuda._sleep
(a spin kernel of about 300 us), so the GPU is busy and every timed call only enqueues its work
behind it, then has 16 calls timed one by one with time.perf_counter_ns around the Python call
(output allocation and every launch included); then the stream is synchronized. 16 calls stay far below the driver's launch queue, so a call never waits for the
GPU (its host time is not hidden behind, nor inflated by, kernel time); rounds alternate which
callable goes first. A row reports the median over all timed calls (default 40 rounds: 640
calls each), after warm-up calls that resolve and prepare the shape (first-call work is not
per-call work). Rows: the 11 bf16 benchmark rows of rmsnorm.md and decode shapes M = 1..64 for
N = 4096 and 8192.

Also timed (in the .md only), on a subset: the torch custom op (torch.ops.ptxbuild.rmsnorm_h200,
eager), kernel.torch_op (what patched torch modules call: the custom op under torch.compile, the
kernel itself in eager) and the cuda.bindings launcher (PTXBUILD_LAUNCHER=bindings) beside the
default ctypes one.

    python benchmarks/host_overhead.py --out reports/runtime/host_overhead.json

Writes the JSON ({"environment": {...}, "rows": [{"target", "dtype", "shape", "ptxbuild_host_us",
"torch_host_us"}]}) and a .md table beside it. Needs a GPU of the target, torch and the build
(made with `ptxbuild build --locked rmsnorm@h200` if missing).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
BENCH_ROWS = [(32768, 256), (32768, 512), (32768, 1024), (32768, 2048), (32768, 4096),
              (32768, 8192), (32768, 16384), (32768, 32768), (32768, 65536), (16384, 131072),
              (8192, 262144)]  # fmt: skip
DECODE_ROWS = [(m, n) for n in (4096, 8192) for m in range(1, 65)]
EPS = 1e-6
PER_ROUND = 16


def environment() -> dict:
    try:
        from ptxbuild.outputs.environment import environment as env
    except ImportError:
        from ptxbuild.report import environment as env
    return env(ROOT)


def time_calls(fns: dict, rounds: int, torch) -> dict:
    """name -> median host microseconds per call of fn() (see the module docstring)."""
    samples = {name: [] for name in fns}
    names = list(fns)
    khz = getattr(torch.cuda.get_device_properties(0), "clock_rate", 1_980_000)  # H200: 1.98 GHz
    cycles = int(300e-6 * khz * 1e3)
    clock = time.perf_counter_ns
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            torch.cuda._sleep(cycles)  # the GPU busy before each callable's calls
            fn, out = fns[name], samples[name]
            for _ in range(PER_ROUND):
                t0 = clock()
                fn()
                out.append(clock() - t0)
        torch.cuda.synchronize()
    return {name: statistics.median(v) / 1e3 for name, v in samples.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="rmsnorm@h200")
    ap.add_argument("--out", default=str(ROOT / "reports/runtime/host_overhead.json"))
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--quick", action="store_true", help="a few rows only (a smoke test)")
    args = ap.parse_args()
    import torch

    import ptxbuild
    from ptxbuild.runtime import LoaderError
    from ptxbuild.torch_ops import register

    if not (ROOT / "build" / args.target / "manifest.json").is_file():
        subprocess.run([sys.executable, "-m", "ptxbuild.cli", "build", "--locked", args.target],
                       check=True, cwd=ROOT)  # fmt: skip
    kf = ROOT / "kernelfile.toml"
    os.environ["PTXBUILD_LAUNCHER"] = "ctypes"
    k = ptxbuild.load(args.target, kernelfile=kf)
    os.environ["PTXBUILD_LAUNCHER"] = "bindings"
    k_bindings = ptxbuild.load(args.target, kernelfile=kf)
    os.environ["PTXBUILD_LAUNCHER"] = "ctypes"
    op = register(k)
    rms_norm = torch.nn.functional.rms_norm
    rows_in = BENCH_ROWS + DECODE_ROWS
    if args.quick:
        rows_in = [(32768, 4096), (1, 4096), (64, 8192)]
    extra_rows = {(1, 4096), (8, 4096), (64, 4096), (1, 8192), (64, 8192), (32768, 4096)}
    rows, extra, notes = [], [], []
    for m, n in rows_in:
        g = torch.Generator(device="cuda").manual_seed(m * 7 + n)
        x = torch.randn(m, n, device="cuda", generator=g).bfloat16()
        w = (1 + 0.1 * torch.randn(n, device="cuda", generator=g)).bfloat16()
        fns = {"torch": lambda x=x, w=w, n=n: rms_norm(x, (n,), w, EPS)}
        try:
            k(x, w)
            fns["ptxbuild"] = lambda x=x, w=w: k(x, w)
            if (m, n) in extra_rows:
                k_bindings(x, w)
                op(x, w)
                fns["bindings"] = lambda x=x, w=w: k_bindings(x, w)
                fns["custom_op"] = lambda x=x, w=w: op(x, w)
                mod = k.torch_op  # what patched modules call: direct in eager
                mod(x, w)
                fns["module"] = lambda x=x, w=w: mod(x, w)
        except LoaderError as exc:
            notes.append(f"{m}x{n}: {exc}")
        for fn in fns.values():  # warm up
            for _ in range(20):
                fn()
        torch.cuda.synchronize()
        us = time_calls(fns, args.rounds, torch)
        rows.append(dict(target=args.target, dtype="bfloat16", shape=[m, n],
                         ptxbuild_host_us=round(us["ptxbuild"], 2) if "ptxbuild" in us else None,
                         torch_host_us=round(us["torch"], 2)))  # fmt: skip
        if "bindings" in us:
            extra.append(((m, n), us))
        print(f"{m:>6} x {n:<7} ptxbuild {rows[-1]['ptxbuild_host_us']} us, torch {us['torch']:.2f} us"
              + (f", bindings {us['bindings']:.2f}, custom op {us['custom_op']:.2f}" if "bindings" in us else ""),
              flush=True)  # fmt: skip
        del x, w
        torch.cuda.empty_cache()
    env = environment()
    env.update(gpu=torch.cuda.get_device_name(0), torch=torch.__version__, launcher="ctypes",
               method="median host time per call, time.perf_counter_ns, GPU kept busy (see script)",
               rounds=args.rounds, calls_per_round=PER_ROUND)  # fmt: skip
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"environment": env, "rows": rows}, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(env, rows, extra, notes))
    worst = max(
        (r["ptxbuild_host_us"] / r["torch_host_us"] for r in rows if r["ptxbuild_host_us"]),
        default=None,
    )
    print(f"wrote {out} and {out.with_suffix('.md')}; worst ptxbuild / torch = {worst}")


def markdown(env: dict, rows: list, extra: list, notes: list) -> str:
    ok = [r for r in rows if r["ptxbuild_host_us"] is not None]
    passed = sum(r["ptxbuild_host_us"] <= 1.2 * r["torch_host_us"] for r in ok)
    lines = [
        "# Host time per call: ptxbuild rmsnorm vs torch.nn.functional.rms_norm",
        "",
        f"{env.get('gpu')}, torch {env.get('torch')}, ptxbuild {env.get('git_revision')}; "
        f"{env['method']}, {env['rounds']} rounds x {env['calls_per_round']} calls. "
        "Written by benchmarks/host_overhead.py (its docstring has the method).",
        "",
        f"Bar (issue 28): every row ptxbuild_host_us <= 1.2 x torch_host_us: {passed} of "
        f"{len(rows)} rows pass.",
        "",
        "| M x N | ptxbuild (us) | torch (us) | ptxbuild / torch |",
        "|---|---:|---:|---:|",
    ]
    for r in rows:
        p, t = r["ptxbuild_host_us"], r["torch_host_us"]
        ratio = f"{p / t:.2f}" if p else "-"
        lines.append(
            f"| {r['shape'][0]} x {r['shape'][1]} | {p if p else 'not built'} | {t} | {ratio} |"
        )
    if extra:
        lines += ["", "Other call paths (same method, same rows):", "",
                  "| M x N | ctypes launcher (us) | cuda.bindings launcher (us) | torch custom op, eager (us) | kernel.torch_op, eager (us) | torch (us) |",
                  "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
        for (m, n), us in extra:
            lines.append(f"| {m} x {n} | {us['ptxbuild']:.2f} | {us['bindings']:.2f} | "
                         f"{us['custom_op']:.2f} | {us['module']:.2f} | {us['torch']:.2f} |")  # fmt: skip
    if notes:
        lines += ["", "Not covered by the build:", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
