#!/usr/bin/env python3
"""Time one KDA forward config stage by stage (prepare alone, recurrence alone, both) on a GPU, with
the L2 flushed before each call; small enough to run under a profiler:

    python3 lab/kda_profile.py --H 96 --T 8192                      # the op's default config
    python3 lab/kda_profile.py --H 64 --params split=8,stages=4
    ncu --launch-skip 4 --launch-count 2 -k regex:kda python3 lab/kda_profile.py --reps 1

Inputs are random (no reference: `ptxbuild build kda@<gpu>` and benchmarks/kda_bench_gpu.py verify).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import kda_bench_gpu as bench_gpu  # noqa: E402  (benchmarks/kda_bench_gpu.py: Built, gpu_inputs, make_outputs, bench_ms)

from ptxbuild.problem import Problem  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--H", type=int, default=96)
    ap.add_argument("--T", type=int, default=8192)
    ap.add_argument(
        "--lengths", default="", help="comma-separated segment lengths (default: one of T)"
    )
    ap.add_argument(
        "--params", default="", help="override the default config, e.g. split=4,stages=3"
    )
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument(
        "--prep-cap",
        type=int,
        default=0,
        help="pad prepare's dynamic shared memory so that at most this many of its blocks share an SM",
    )
    ap.add_argument(
        "--concurrent",
        action="store_true",
        help="also time the recurrence and prepare launched at once on two streams (recurrence first): "
        "what overlapping the stages could reach; the data dependency is ignored, so timing only",
    )
    a = ap.parse_args(argv)
    import cupy as cp

    lengths = tuple(int(x) for x in a.lengths.split(",")) if a.lengths else None
    T = sum(lengths) if lengths else a.T
    problem = Problem.make("kda", "bfloat16", (T, a.H), {"lengths": lengths})
    params = dict(bench_gpu.kda.default_params(problem))
    for item in filter(None, a.params.split(",")):
        key, val = item.split("=")
        params[key] = int(val) if val.lstrip("-").isdigit() else val
    built = bench_gpu.Built(cp, params, problem)
    if a.prep_cap:
        import dataclasses

        fn, L = built.fn[built.prepare], built.launch[built.prepare]
        static = (
            fn.attributes["shared_size_bytes"] + L.smem_bytes
        )  # what one prepare block takes now
        per_sm, reserved = 233472, 1024  # H100/H200: 228 KB per SM, 1 KB per block
        pad = L.smem_bytes + max(per_sm // a.prep_cap - static - reserved, 0)
        built.launch[built.prepare] = dataclasses.replace(L, smem_bytes=pad)
        fn.max_dynamic_shared_size_bytes = pad
    inputs, outputs = bench_gpu.gpu_inputs(cp, problem, 0), bench_gpu.make_outputs(cp, problem)
    warm = 0.0 if a.reps < 5 else 0.2
    rows = [
        ("prepare", lambda: built.run("kda_prepare", inputs, outputs)),
        ("recurrence", lambda: built.run("kda_recurrence", inputs, outputs)),
        ("forward", lambda: built.forward(inputs, outputs)),
    ]
    if a.concurrent:
        side = cp.cuda.Stream(non_blocking=True)

        def both():
            main = cp.cuda.get_current_stream()
            side.wait_event(main.record())  # both start after what came before on main
            built.run("kda_recurrence", inputs, outputs)
            with side:
                built.run("kda_prepare", inputs, outputs)
            main.wait_event(side.record())

        rows.append(("concurrent", both))
    print(f"H={a.H} T={T} lengths={lengths} params={params} ({built.info})")
    for name, fn in rows:
        med, p20, p80, n = bench_gpu.bench_ms(cp, fn, warmup_s=warm, reps=a.reps)
        print(f"{name:>10}: {med * 1e3:8.1f} us  [p20 {p20 * 1e3:.1f}, p80 {p80 * 1e3:.1f}, n={n}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
