#!/usr/bin/env python3
"""Session 26 probe: a warp-per-chunk prepare (lab/kda/kda_s26_prepare.cu) in front of the locked
kda_recurrence, verified against the float64 reference and timed beside kda@h200's kernels and
FlashKDA on kda.md's six scenarios (plan and predictions: lab/kda/plan-session26.md).

    python3 lab/kda/probe_s26.py --compile-only      # CPU: NVRTC + nvJitLink, registers / spills / smem
    python3 lab/kda/probe_s26.py                     # GPU: verify, time, then the same for the fused kernel

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
    "w4r": (4, 2),  # S26_REGS: inputs kept in registers, 8 warps per SM
    "w2r": (2, 4),
}  # warps per block, blocks per SM (launch bounds)
# kda_s26_fused: V split, producer warps, ring slots
FUSED = {
    "f1p4": (1, 4, 4),
    "f1p5": (1, 5, 5),
    "f2p4": (2, 4, 4),
    "f2p2": (2, 2, 2),
    "f4p2": (4, 2, 2),
    "f1p8": (1, 8, 3),  # FZ_P > FZ_R: the consumed-counter handover
    "f2p6": (2, 6, 3),
}
FUSED_SRC = HERE / "kda_s26_fused.cu"
BLOB = 21504  # ops/kda workspace blob (workspace.sizes(128, 128)["BLOB"])

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


def source(params: dict, problem: Problem, wpb: int, minb: int, regs: bool = False) -> str:
    # SPLIT / STAGES are the recurrence's: fixed here, so that scenarios share one s26 binary
    defs = (
        kda.host.defines({**params, "split": 1, "stages": 2}, problem)
        + f"#define S26_WPB {wpb}\n#define S26_MINB {minb}\n"
        + ("#define S26_REGS 1\n" if regs else "")
    )
    return defs + (ROOT / "ops" / "kda" / "kda_common.cuh").read_text() + SRC.read_text()


_BINARIES: dict = {}  # (source, entry) -> Binary: every compile of this process goes through it


def _compile_one(kernel: Kernel):
    """(key, Binary) or (key, the error's text): one bad kernel must not stop the others."""
    from ptxbuild.compile import compiler

    plain = getattr(compiler.compile_kernel, "__wrapped__", compiler.compile_kernel)
    try:
        return (kernel.source, kernel.entry), plain(kernel, "sm_90a")
    except Exception as exc:  # noqa: BLE001 - reported by the step that needs it (compiled again there)
        return (kernel.source, kernel.entry), f"{type(exc).__name__}: {exc}"[:2000]


def install_memo() -> None:
    """ptxbuild's compile_kernel, memoised in _BINARIES (kda_bench_gpu compiles through it too)."""
    from ptxbuild.compile import compiler

    if hasattr(compiler.compile_kernel, "__wrapped__"):
        return
    plain = compiler.compile_kernel

    def memo(kernel, arch):
        key = (kernel.source, kernel.entry)
        if arch != "sm_90a" or kernel.flags:
            return plain(kernel, arch)
        if key not in _BINARIES:
            _BINARIES[key] = plain(kernel, arch)
        return _BINARIES[key]

    memo.__wrapped__ = plain
    compiler.compile_kernel = memo


def precompile(kernels: list, workers: int) -> float:
    """Compile every distinct kernel in a process pool (NVRTC only: no CUDA context, so before cupy)."""
    from concurrent.futures import ProcessPoolExecutor

    install_memo()
    todo = list(
        {(k.source, k.entry): k for k in kernels if (k.source, k.entry) not in _BINARIES}.values()
    )
    t0 = time.perf_counter()
    ex = ProcessPoolExecutor(workers) if workers > 1 and len(todo) > 1 else None
    try:
        for (src, entry), b in ex.map(_compile_one, todo) if ex else map(_compile_one, todo):
            if isinstance(b, str):
                log(f"COMPILE ERROR {entry}: {b[:600]}")
            else:
                _BINARIES[(src, entry)] = b
    finally:
        if ex:
            ex.shutdown()
    return time.perf_counter() - t0


def _compile(kernel: Kernel):
    from ptxbuild.compile import compiler

    install_memo()
    return compiler.compile_kernel(kernel, "sm_90a")


def compile_s26(params: dict, problem: Problem, wpb: int, minb: int, regs: bool = False):
    return _compile(Kernel(source(params, problem, wpb, minb, regs), "kda_s26_prepare"))


def fused_source(params: dict, problem: Problem, split: int, P: int, R: int) -> str:
    defs = (
        kda.host.defines({**params, "split": split}, problem)
        + f"#define FZ_P {P}\n#define FZ_R {R}\n"
    )
    ops = ROOT / "ops" / "kda"
    return defs + "".join(
        f.read_text() for f in (ops / "kda_common.cuh", ops / "kda_recurrence.cu", SRC, FUSED_SRC)
    )


def compile_fused(params: dict, problem: Problem, variant: str):
    return _compile(Kernel(fused_source(params, problem, *FUSED[variant]), "kda_s26_fused"))


def kernels_for(problem: Problem, variants, fused, op: bool = True) -> list:
    """What the GPU run compiles for `problem`: the op's module and entries (as kda_bench_gpu's
    load_module asks for them), the s26 prepare variants, the fused variants."""
    params = kda.default_params(problem)
    out = []
    if op:
        k = kda.render(params, problem, "sm_90a")
        out += [k] + [Kernel(k.source, s) for s in kda.launches(params, problem, 132)]
    out += [
        Kernel(source(params, problem, *VARIANTS[v], v.endswith("r")), "kda_s26_prepare")
        for v in variants
    ]
    out += [Kernel(fused_source(params, problem, *FUSED[v]), "kda_s26_fused") for v in fused]
    return out


def fused_launch(problem: Problem, variant: str) -> Launch:
    d = kda.dims(problem)
    split, P, R = FUSED[variant]
    return Launch(
        (d["N"] * d["HV"] * split, 1, 1),
        ((d["V"] // split // 16 + P) * 32, 1, 1),
        R * BLOB + P * WARP_BYTES,
    )


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
                b = compile_s26(
                    {**params, "op_dtype": op_dtype}, problem, wpb, minb, name.endswith("r")
                )
                ok = b.spill_bytes == 0 and wpb * WARP_BYTES + 1024 <= 233472 // minb
                bad += not ok
                log(
                    f"{'OK  ' if ok else 'BAD '} {problem.shape} {dict(problem.options)} {op_dtype} {name}: "
                    f"{b.registers} regs, {b.spill_bytes} B spill, {wpb * WARP_BYTES} B smem/block "
                    f"({time.perf_counter() - t0:.1f} s)"
                )
        for name in FUSED:
            t0 = time.perf_counter()
            b = compile_fused(params, problem, name)
            smem = fused_launch(problem, name).smem_bytes
            ok = b.spill_bytes == 0 and smem + 64 <= 232448
            bad += not ok
            log(
                f"{'OK  ' if ok else 'BAD '} {problem.shape} {dict(problem.options)} fused {name}: "
                f"{b.registers} regs, {b.spill_bytes} B spill, {smem} B smem/block ({time.perf_counter() - t0:.1f} s)"
            )
    log("compile-only: " + ("ALL OK" if not bad else f"{bad} BAD"))
    return 1 if bad else 0


SMALL = [
    ([16], 1, {}),
    ([17], 1, {}),
    ([17, 33, 65], 4, {}),
    ([97], 4, {}),
    ([0, 15], 4, {}),
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
BIG = [([8192], 96, {}), (list(MIXED), 64, {}), ([1024] * 8, 16, {})]
FUSED_SMALL = {0, 1, 2, 4, 7, 9, 13, 14, 15, 18}
FUSED_ALL = {
    7,
    len(SMALL) + 2,
}  # [1000] H64 and 8 x 1024: every fused variant  # SMALL cases the fused kernels are also verified on


def plan(variants, fused, big: bool):
    """[(phase, case index, (lens, H, kw), variant, stages)] in run order: the prepare's phase first,
    so that a fused kernel that traps (corrupting the context) cannot lose the prepare's results."""
    cases = SMALL + (BIG if big else [])
    steps = []
    for j, c in enumerate(cases):
        for v in variants if j < 3 else variants[:1]:
            steps.append(("prepare", j, c, v, j < len(SMALL)))
    for j, c in enumerate(cases):
        if j in FUSED_SMALL or j >= len(SMALL):
            if j < 3 or j in FUSED_ALL:
                names = fused
            elif j >= len(SMALL):  # the 8192-token cases: each handover protocol and split once
                names = [v for v in fused if v in ("f1p4", "f2p4", "f1p8")] or fused[:1]
            else:
                names = fused[:1]
            for v in names:
                steps.append(("fused", j, c, v, False))
    return steps


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument(
        "--variants", default="w4,w2,w1", help=f"prepare variants, of {sorted(VARIANTS)}"
    )
    ap.add_argument(
        "--fused",
        default="f1p4,f1p5,f2p4,f2p2,f4p2,f1p8,f2p6",
        help=f"fused variants, of {sorted(FUSED)}",
    )
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--no-big", action="store_true", help="skip the T = 8192 verification cases")
    ap.add_argument("--workers", type=int, default=0, help="compile processes (default: CPUs)")
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
    import os

    import kda_bench_gpu as bench

    variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    fused = [v.strip() for v in a.fused.split(",") if v.strip()]
    t_start = time.perf_counter()
    steps = plan(variants, fused, not a.no_big)
    problems = {j: bench.problem_of(*c) for _, j, c, _, _ in steps}
    kernels = []
    for phase, j, _, v, _ in steps:  # exactly what each verification step builds
        pr = problems[j][0]
        kernels += (
            kernels_for(pr, [v], [], op=True)
            if phase == "prepare"
            else kernels_for(pr, [], [v], op=False)
        )
    kernels += [
        k for H, _, lens in SCENARIOS for k in kernels_for(problem_of(lens, H), variants, fused)
    ]
    secs = precompile(kernels, a.workers or os.cpu_count() or 1)
    log(f"precompiled {len(_BINARIES)} kernels in {secs:.0f} s")
    out = {
        "variants": {v: VARIANTS[v] for v in variants},
        "fused": {v: FUSED[v] for v in fused},
        "binaries": {
            f"{e}:{hash(src) & 0xFFFFFFFF:08x}": f"{b.registers} regs {b.spill_bytes} B spill"
            for (src, e), b in _BINARIES.items()
            if e.startswith("kda_s26")
        },
        "verify": [],
        "timing": [],
    }

    def save():
        out["seconds"] = time.perf_counter() - t_start
        Path(a.json).write_text(json.dumps(out, indent=1, default=str))

    try:
        import torch  # noqa: F401  (before cupy: kda_bench_gpu's note on FLA; FlashKDA is a torch extension)
    except ImportError:
        pass
    import cupy as cp

    from ptxbuild.gpu import device

    baselines = kda.host.load("baselines")
    funcs: dict = {}  # (cubin, entry) -> loaded function

    def load(binary, entry):
        if (binary.cubin, entry) not in funcs:
            with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
                f.write(binary.cubin)
            funcs[(binary.cubin, entry)] = cp.RawModule(path=f.name).get_function(entry)
        return funcs[(binary.cubin, entry)]

    class S26Built(bench.Built):
        """The op's kernels (its module, default config), with kda_prepare replaced by the s26 kernel."""

        def __init__(self, cp, params, problem, variant):
            super().__init__(cp, params, problem)
            wpb, minb = VARIANTS[variant]
            b = compile_s26(params, problem, wpb, minb, variant.endswith("r"))
            self.info = f"{b.registers} regs, {b.spill_bytes} B spill"
            self.s26 = load(b, "kda_s26_prepare")
            self.s26_launch = launch_of(problem, wpb)

        def run(self, stage, inputs, outputs):
            if stage != "kda_prepare":
                return super().run(stage, inputs, outputs)
            if int(inputs["chunk_start"].size) == 0:
                return None
            d, i = kda.dims(self.problem), inputs
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

    class FusedBuilt:
        """kda_s26_fused alone: one launch, no workspace (verify(stages=False) only)."""

        def __init__(self, cp, params, problem, variant):
            self.cp, self.params, self.problem = cp, params, problem
            b = compile_fused(params, problem, variant)
            self.info = f"{b.registers} regs, {b.spill_bytes} B spill"
            self.fn = load(b, "kda_s26_fused")
            self.geom = fused_launch(problem, variant)

        def forward(self, inputs, outputs):
            d, i = kda.dims(self.problem), inputs
            args = [
                i["q"],
                i["k"],
                i["v"],
                i["a"],
                i["b"],
                i["A_log"],
                i["dt_bias"],
                outputs["o"],
                i["h0"],
                outputs["hT"],
                i["cu_seqlens"],
                i["seq_order"],
                np.float32(d["K"] ** -0.5),
            ]
            device.launch(self.fn, self.geom, args, self.cp.cuda.get_current_stream())

    cache: dict = {}

    def built(problem, variant):
        key = (problem, variant)
        if key not in cache:
            cls = FusedBuilt if variant in FUSED else S26Built
            cache[key] = cls(cp, kda.default_params(problem), problem, variant)
        return cache[key]

    cases: dict = {}
    # one float64 reference per case, whatever the number of variants verified on it (kda_bench_gpu's
    # verify recomputes it per call: ~2-4 s each at T = 8192, H = 96)
    memo: dict = {}
    pre0, rec0 = bench.ref.preprocess, bench.ref.recurrent

    def pre_memo(case, *args, **kw):
        if id(case) not in memo:
            memo[id(case)] = (case, pre0(case, *args, **kw))
        return memo[id(case)][1]

    def rec_memo(**args):
        key = ("rec", id(args["q"]))
        if key not in memo:
            memo[key] = (args["q"], rec0(**args))
        return memo[key][1]

    bench.ref.preprocess, bench.ref.recurrent = pre_memo, rec_memo
    failed: set = set()  # variants with a failed case: not timed
    stop = False

    def verify_phase(phase: str) -> None:
        nonlocal stop
        log(
            f"== correctness, {phase} (relative RMS vs float64; gate 5e-3; ws_* stage fields gate 2e-3) =="
        )
        for ph, j, (lens, H, kw), variant, stages in steps:
            if ph != phase or stop:
                continue
            problem, ckw = problems[j]
            if j not in cases:
                cases[j] = kda.case_for(problem, 1000 + j, **ckw)
            label = f"{variant} {lens if len(lens) < 6 else f'{len(lens)} segs'} H={H} {kw or ''}"
            try:
                res = bench.verify(
                    cp, built(problem, variant), cases[j], stages=stages, label=label
                )
                log(bench.fmt(res))
                if not res["ok"]:
                    failed.add(variant)
                out["verify"].append(
                    {
                        k: (float(v) if isinstance(v, (float, np.floating)) else v)
                        for k, v in res.items()
                    }
                )
            except Exception as exc:  # noqa: BLE001 - an outcome, reported
                failed.add(variant)
                msg = f"{type(exc).__name__}: {exc}"[:400]
                log(f"FAIL {label}: {msg}")
                out["verify"].append({"case": label, "ok": False, "error": msg})
                if any(
                    w in msg.lower()
                    for w in ("illegal", "launch", "trap", "unspecified", "exception")
                ):
                    log("the CUDA context may be corrupted: stopping here")
                    stop = True
            save()
        if phase == "fused":
            cases.clear()
            memo.clear()

    fk_state = {"built": baselines.flashkda_built(), "waited": False}

    def flashkda():
        if fk_state["built"] is None and not fk_state["waited"]:
            t_wait = time.perf_counter() + max(
                0.0, a.flashkda_wait - (time.perf_counter() - t_start)
            )
            while fk_state["built"] is None and time.perf_counter() < t_wait:
                time.sleep(2.0)
                fk_state["built"] = baselines.flashkda_built()
            fk_state["waited"] = True
            log(
                f"FlashKDA: {'built in ' + str(fk_state['built']['path']) if fk_state['built'] else baselines.not_built()}"
            )
        return fk_state["built"]

    def timing_phase(names, mode: str) -> None:
        """mode "first": rows, kda@h200's stages and `names`; "more": `names`; "flashkda": FlashKDA, then
        kda@h200 and the fastest candidate of each row again, in the same window (same inputs: same seed)."""
        names = [v for v in names if v not in failed]
        if mode == "flashkda" and flashkda() is None:
            return
        log(
            f"== timing {mode} {names} (ms: median of {a.reps}, L2 flushed before each call; same inputs) =="
        )
        for j, (H, name, lens) in enumerate(SCENARIOS):
            if stop:
                return
            problem = problem_of(lens, H)
            inputs, outputs = (
                bench.gpu_inputs(cp, problem, 200 + j),
                bench.make_outputs(cp, problem),
            )
            if mode == "first":
                out["timing"].append(
                    {"scenario": f"H{H} {name}", "params": kda.default_params(problem)}
                )
            if j >= len(out["timing"]):
                return
            row = out["timing"][j]

            def t(key, make):
                """row[key] = the median of make()'s callable; an error is recorded, the row goes on."""
                try:
                    row[key] = bench.bench_ms(cp, make(), reps=a.reps)[0]
                except Exception as exc:  # noqa: BLE001
                    row.setdefault("errors", []).append(f"{key}: {type(exc).__name__}: {exc}"[:300])
                    log(f"  {row['scenario']}: {row['errors'][-1]}")

            base = bench.Built(cp, kda.default_params(problem), problem) if mode != "more" else None
            if mode == "first":
                t("base_fwd", lambda: lambda: base.forward(inputs, outputs))
                t("base_prep", lambda: lambda: base.run("kda_prepare", inputs, outputs))
                t("base_rec", lambda: lambda: base.run("kda_recurrence", inputs, outputs))
            if mode != "flashkda":
                for v in names:
                    s = built(problem, v)
                    row[f"{v}_info"] = s.info
                    t(f"{v}_fwd", lambda s=s: lambda: s.forward(inputs, outputs))
                    if v in VARIANTS:
                        t(f"{v}_prep", lambda s=s: lambda: s.run("kda_prepare", inputs, outputs))
            else:

                def fk_run():
                    import torch

                    run = baselines.flashkda_call(problem, inputs, fk_state["built"])
                    run()
                    torch.cuda.synchronize()
                    return run

                t("flashkda", fk_run)
                t("base_fwd_again", lambda: lambda: base.forward(inputs, outputs))
                done = [v for v in names if isinstance(row.get(f"{v}_fwd"), float)]
                if done:
                    best = min(done, key=lambda v: row[f"{v}_fwd"])
                    row["best_again_variant"] = best
                    t("best_again", lambda: lambda: built(problem, best).forward(inputs, outputs))
                t("flashkda_again", fk_run)
            log(
                f"  {row['scenario']}: "
                + " ".join(f"{k}={v:.3f}" for k, v in row.items() if isinstance(v, float))
            )
            save()

    verify_phase("prepare")
    timing_phase(variants, "first")
    verify_phase("fused")
    timing_phase(fused, "more")
    timing_phase(
        variants + fused, "flashkda"
    )  # last: FlashKDA's build (beside this run) has had the most time

    cols = [v for v in variants + fused if any(f"{v}_fwd" in r for r in out["timing"])]
    log(
        f"\n{'scenario':<14} {'base':>7} {'prep':>6} {'rec':>6} "
        + " ".join(f"{v:>6}" for v in cols)
        + " "
        + " ".join(f"{v + 'p':>6}" for v in cols if v in VARIANTS)
        + f" {'best':>5} {'FK':>6} {'base2':>6} {'best2':>6} {'FK/base':>7} {'FK/best':>7} {'target':>6}"
    )
    nan = float("nan")
    for r in out["timing"]:
        fks = [x for x in (r.get("flashkda"), r.get("flashkda_again")) if x]
        fkms = min(fks) if fks else nan
        bv = (
            min(cols, key=lambda v: r.get(f"{v}_fwd", nan) if r.get(f"{v}_fwd") else 1e9)
            if cols
            else "-"
        )
        best = r.get(f"{bv}_fwd", nan)
        log(
            f"{r['scenario']:<14} {r.get('base_fwd', nan):7.3f} {r.get('base_prep', nan):6.3f} "
            f"{r.get('base_rec', nan):6.3f} "
            + " ".join(f"{r.get(f'{v}_fwd', nan):6.3f}" for v in cols)
            + " "
            + " ".join(f"{r.get(f'{v}_prep', nan):6.3f}" for v in cols if v in VARIANTS)
            + f" {bv:>5} {fkms:6.3f} {r.get('base_fwd_again', nan):6.3f} {r.get('best_again', nan):6.3f}"
            + f" {fkms / r.get('base_fwd_again', nan):6.2f}x {fkms / r.get('best_again', best):6.2f}x {fkms / 1.6:6.3f}"
        )
    log(
        "(ms. base: kda@h200's default config (ops/kda), prep / rec its stages; w*: lab/kda/kda_s26_prepare.cu + "
        "the same recurrence, w*p its prepare alone; f*: kda_s26_fused.cu; best: the fastest of w*, f*; FK: FlashKDA "
        "(the faster of its two timings); base2 / best2: kda@h200 and best timed again beside FK, the ratios' "
        "denominators; target: FK / 1.6, the issue-30 bar for best2)"
    )
    nfail = sum(not r.get("ok") for r in out["verify"])
    out["failures"] = nfail
    save()
    log(
        f"\n{'ALL PASS' if nfail == 0 and not stop else f'{nfail} FAILURE(S)'} in {out['seconds']:.0f} s; "
        f"wrote {a.json}"
    )
    return 0 if nfail == 0 and not stop else 1


if __name__ == "__main__":
    sys.exit(main())
