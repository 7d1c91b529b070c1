#!/usr/bin/env python3
"""Session 26 probe: a warp-per-chunk prepare (lab/kda/kda_s26_prepare.cu) in front of the locked
kda_recurrence, verified against the float64 reference and timed beside kda@h200's kernels and
FlashKDA on kda.md's six scenarios (plan and predictions: lab/kda/plan-session26.md).

    python3 lab/kda/probe_s26.py --compile-only      # CPU: NVRTC + nvJitLink, registers / spills / smem
    python3 lab/kda/probe_s26.py                     # GPU: verify, then time; table + JSON

Nothing under ops/ changes: the new prepare writes ops/kda's workspace layout, so the op's own
recurrence (compiled from ops/kda with the op's default config) reads it, and the op's stage check
(workspace.decode vs ref.chunked, field by field) and end-to-end check (o, hT vs ref.recurrent,
relative RMS <= 5e-3, deterministic, inputs untouched) apply unchanged (kda_bench_gpu.verify).
FlashKDA is timed when benchmarks/flashkda_prepare.py has built it ($FLASHKDA_BUILD_DIR); with
--flashkda-wait S the timing waits up to S seconds for a build running beside it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from ptxbuild.oploader import load_op  # noqa: E402
from ptxbuild.problem import Kernel, Launch, Problem  # noqa: E402

HERE = Path(__file__).resolve().parent
SRC = HERE / "kda_s26_prepare.cu"
WARP_BYTES = 19200  # sizeof(S26Warp) in kda_s26_prepare.cu
MIXED = (1300, 547, 2048, 963, 271, 3063)
SCENARIOS = [
    (H, name, lens)
    for H in (96, 64)
    for name, lens in (("1x8192", (8192,)), ("mixed6", MIXED), ("8x1024", (1024,) * 8))
]
VARIANTS = {
    "w4": (4, 3),
    "w2": (2, 5),
    "w1": (1, 11),
}  # warps per block, blocks per SM (launch bounds)

kda = load_op(str(ROOT / "ops" / "kda"), ROOT)


def log(*a):
    print(*a, flush=True)


def problem_of(lens, H, opts=None) -> Problem:
    return Problem.make(
        "kda",
        "bfloat16",
        (sum(lens), H),
        {"lengths": tuple(lens) if len(lens) > 1 else None, **(opts or {})},
    )


def source(params: dict, problem: Problem, wpb: int, minb: int) -> str:
    # SPLIT / STAGES are the recurrence's: fixed here, so that scenarios share one s26 binary
    defs = (
        kda.host.defines({**params, "split": 1, "stages": 2}, problem)
        + f"#define S26_WPB {wpb}\n#define S26_MINB {minb}\n"
    )
    return defs + (ROOT / "ops" / "kda" / "kda_common.cuh").read_text() + SRC.read_text()


_BINARIES: dict = {}  # source -> Binary


def compile_s26(params: dict, problem: Problem, wpb: int, minb: int):
    from ptxbuild.compile.compiler import compile_kernel

    src = source(params, problem, wpb, minb)
    if src not in _BINARIES:
        _BINARIES[src] = compile_kernel(Kernel(src, "kda_s26_prepare"), "sm_90a")
    return _BINARIES[src]


def launch_of(problem: Problem, wpb: int) -> Launch:
    d = kda.dims(problem)
    return Launch(
        (math.ceil(max(d["NC"], 1) / wpb), d["HV"], 1), (32 * wpb, 1, 1), wpb * WARP_BYTES
    )


def compile_only() -> int:
    """Every variant on the problems the GPU run builds (+ GVA, no L2 norm, bf16 operands): no spill."""
    bad = 0
    probs = [
        problem_of((8192,), 96),
        problem_of((8192,), 64),
        problem_of((16,), 1),
        problem_of((97, 33), 4, {"hv": 8}),
        problem_of((200,), 4, {"l2norm": False}),
    ]
    for problem in probs:
        params = kda.default_params(problem)
        for op_dtype in ("f16", "bf16"):
            for name, (wpb, minb) in VARIANTS.items():
                t0 = time.perf_counter()
                b = compile_s26({**params, "op_dtype": op_dtype}, problem, wpb, minb)
                ok = b.spill_bytes == 0 and wpb * WARP_BYTES + 1024 <= 233472 // minb
                bad += not ok
                log(
                    f"{'OK  ' if ok else 'BAD '} {problem.shape} {dict(problem.options)} {op_dtype} {name}: "
                    f"{b.registers} regs, {b.spill_bytes} B spill, {wpb * WARP_BYTES} B smem/block "
                    f"({time.perf_counter() - t0:.1f} s)"
                )
    log("compile-only: " + ("ALL OK" if not bad else f"{bad} BAD"))
    return 1 if bad else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument(
        "--variants",
        default="w4,w2,w1",
        help=f"of {sorted(VARIANTS)}; the first is verified at full size",
    )
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--no-big", action="store_true", help="skip the T = 8192 verification cases")
    ap.add_argument(
        "--flashkda-wait",
        type=float,
        default=0.0,
        help="seconds to wait for FlashKDA's build (benchmarks/flashkda_prepare.py build, run beside)",
    )
    ap.add_argument("--json", default=str(HERE / "probe_s26.json"))
    a = ap.parse_args(argv)
    if a.compile_only:
        return compile_only()
    try:
        import torch  # noqa: F401  (before cupy: kda_bench_gpu's note on FLA; FlashKDA is a torch extension)
    except ImportError:
        pass
    import cupy as cp
    import kda_bench_gpu as bench

    from ptxbuild.gpu import device

    baselines = kda.host.load("baselines")
    variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    t_start = time.perf_counter()

    class S26Built(bench.Built):
        """The op's kernels (its module, default config), with kda_prepare replaced by the s26 kernel."""

        def __init__(self, cp, params, problem, variant):
            super().__init__(cp, params, problem)
            wpb, minb = VARIANTS[variant]
            b = compile_s26(params, problem, wpb, minb)
            with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
                f.write(b.cubin)
            self.s26_info = f"{b.registers} regs, {b.spill_bytes} B spill"
            if b.cubin not in _FUNCS:
                _FUNCS[b.cubin] = cp.RawModule(path=f.name).get_function("kda_s26_prepare")
            self.s26 = _FUNCS[b.cubin]
            self.s26_launch = launch_of(problem, wpb)

        def run(self, stage, inputs, outputs):
            if stage != "kda_prepare":
                return super().run(stage, inputs, outputs)
            if int(inputs["chunk_start"].size) == 0:
                return None
            d = kda.dims(self.problem)
            i = inputs
            args = [
                i["q"],
                i["k"],
                i["v"],
                i["a"],
                i["b"],
                i["A_log"],
                i["dt_bias"],
                i["chunk_start"],
                i["chunk_len"],
                outputs["ws"],
                np.float32(d["K"] ** -0.5),
                np.int32(d["NC"]),
            ]
            device.launch(self.s26, self.s26_launch, args, self.cp.cuda.get_current_stream())
            return None

    cache: dict = {}
    _FUNCS: dict = {}  # cubin -> loaded function

    def s26_for(problem, variant):
        key = (problem, variant)
        if key not in cache:
            cache[key] = S26Built(cp, kda.default_params(problem), problem, variant)
        return cache[key]

    out = {"verify": [], "timing": [], "variants": {v: VARIANTS[v] for v in variants}}
    failures = 0

    # 1. correctness: stage by stage (workspace fields) on small / adversarial cases, every variant;
    #    end to end at full size, first variant
    small = [
        ([16], 1, {}),
        ([17], 1, {}),
        ([97], 4, {}),
        ([0, 15], 4, {}),
        ([17, 33, 65], 4, {}),
        ([1000], 4, {}),
        ([97], 64, {}),
        ([1000], 64, {}),
        ([37], 96, {}),
        ([97, 33], 4, dict(a_shift=8.0)),
        ([97, 33], 4, dict(a_shift=-8.0)),
        ([97, 33], 4, dict(bias_scale=8.0)),
        ([97, 33], 4, dict(a_scale=8.0)),
        ([97, 33], 4, dict(initial_state=False)),
        ([97, 33], 4, dict(final_state=False)),
        ([97, 33], 4, dict(HV=8)),
        ([200], 4, dict(use_qk_l2norm=False, qk_scale=0.1)),
        ([64], 4, dict(v_scale=30.0)),
        ([1] * 7 + [300], 4, {}),
    ]
    big = [] if a.no_big else [([8192], 96, {}), (list(MIXED), 64, {}), ([1024] * 8, 16, {})]
    log("== correctness (relative RMS vs float64; gate 5e-3; ws_* stage fields gate 2e-3) ==")
    for j, (lens, H, kw) in enumerate(small + big):
        problem, ckw = bench.problem_of(lens, H, kw)
        case = kda.case_for(problem, 1000 + j, **ckw)
        for variant in variants if j < 3 else variants[:1]:  # every variant on the first three
            label = f"{variant} {lens if len(lens) < 6 else f'{len(lens)} segs'} H={H} {kw or ''}"
            try:
                built = s26_for(problem, variant)
                res = bench.verify(cp, built, case, stages=j < len(small), label=label)
                log(bench.fmt(res))
                failures += not res["ok"]
                out["verify"].append(
                    {
                        k: (float(v) if isinstance(v, (float, np.floating)) else v)
                        for k, v in res.items()
                    }
                )
            except Exception as exc:  # noqa: BLE001 - an outcome, reported
                failures += 1
                log(f"FAIL {label}: {type(exc).__name__}: {str(exc)[:400]}")
                out["verify"].append(
                    {"case": label, "ok": False, "error": f"{type(exc).__name__}: {exc}"[:400]}
                )
                if "illegal" in str(exc).lower():
                    log("context is corrupted after an illegal address: stopping")
                    Path(a.json).write_text(json.dumps(out, indent=1))
                    return 1
    log(f"(verification took {time.perf_counter() - t_start:.0f} s)")

    # 2. timing, the six scenarios: kda@h200's kernels (default config), the s26 variants, FlashKDA
    fk = baselines.flashkda_built()
    t_wait = time.perf_counter() + a.flashkda_wait
    while fk is None and time.perf_counter() < t_wait:
        time.sleep(2.0)
        fk = baselines.flashkda_built()
    log(f"\nFlashKDA: {'built in ' + str(fk['path']) if fk else baselines.not_built()}")
    log("== timing (ms: median of n, L2 flushed before each call; one process, same inputs) ==")
    for j, (H, name, lens) in enumerate(SCENARIOS):
        problem = problem_of(lens, H)
        inputs, outputs = bench.gpu_inputs(cp, problem, 200 + j), bench.make_outputs(cp, problem)
        base = bench.Built(cp, kda.default_params(problem), problem)
        row = {"scenario": f"H{H} {name}", "params": kda.default_params(problem)}

        def t(fn):
            return bench.bench_ms(cp, fn, reps=a.reps)[0]

        row["base_fwd"] = t(lambda: base.forward(inputs, outputs))
        row["base_prep"] = t(lambda: base.run("kda_prepare", inputs, outputs))
        row["base_rec"] = t(lambda: base.run("kda_recurrence", inputs, outputs))
        for variant in variants:
            s = s26_for(problem, variant)
            row[f"{variant}_fwd"] = t(lambda s=s: s.forward(inputs, outputs))
            row[f"{variant}_prep"] = t(lambda s=s: s.run("kda_prepare", inputs, outputs))
            row[f"{variant}_info"] = s.s26_info
        row["flashkda"] = None
        if fk is not None:
            try:
                import torch

                run = baselines.flashkda_call(problem, inputs, fk)
                run()
                torch.cuda.synchronize()
                row["flashkda"] = t(run)
            except Exception as exc:  # noqa: BLE001
                row["flashkda_error"] = f"{type(exc).__name__}: {exc}"[:300]
                log(f"  FlashKDA failed: {row['flashkda_error']}")
        row["base_fwd_again"] = t(lambda: base.forward(inputs, outputs))  # drift check, same window
        out["timing"].append(row)
        log(
            f"  {row['scenario']}: base {row['base_fwd']:.3f} (prep {row['base_prep']:.3f} rec {row['base_rec']:.3f}) "
            + " ".join(f"{v} {row[f'{v}_fwd']:.3f} (prep {row[f'{v}_prep']:.3f})" for v in variants)
            + (f" FlashKDA {row['flashkda']:.3f}" if row["flashkda"] else "")
        )

    best = lambda r: min(r[f"{v}_fwd"] for v in variants)  # noqa: E731
    log(
        f"\n{'scenario':<14} {'base fwd':>9} {'prep':>7} {'rec':>7} "
        + " ".join(f"{v + ' fwd':>8} {v + ' prep':>8}" for v in variants)
        + f" {'FlashKDA':>9} {'FK/base':>8} {'FK/s26':>7} {'target':>7}"
    )
    for r in out["timing"]:
        fkms = r["flashkda"]
        log(
            f"{r['scenario']:<14} {r['base_fwd']:9.3f} {r['base_prep']:7.3f} {r['base_rec']:7.3f} "
            + " ".join(f"{r[f'{v}_fwd']:8.3f} {r[f'{v}_prep']:8.3f}" for v in variants)
            + (
                f" {fkms:9.3f} {fkms / r['base_fwd']:7.2f}x {fkms / best(r):6.2f}x {fkms / 1.6:7.3f}"
                if fkms
                else f" {'-':>9} {'-':>8} {'-':>7} {'-':>7}"
            )
        )
    log(
        "(base: kda@h200's default config, ops/kda; s26: the same recurrence after lab/kda/kda_s26_prepare.cu; "
        "target: FlashKDA / 1.6, issue 30)"
    )
    out["failures"] = failures
    out["seconds"] = time.perf_counter() - t_start
    Path(a.json).write_text(json.dumps(out, indent=1, default=str))
    log(
        f"\n{'ALL PASS' if failures == 0 else f'{failures} FAILURE(S)'} in {out['seconds']:.0f} s; wrote {a.json}"
    )
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
