#!/usr/bin/env python3
"""Verify and time the KDA forward kernels (prepare + recurrence) on a GPU against the float64
reference; time flash-linear-attention's chunk_kda beside them when it is installed.

Needs: an NVIDIA Hopper GPU, cupy (cupy-cuda13x), numpy, numba (fast reference); torch and fla
only for the baseline. Compiles with ptxbuild's NVRTC/nvJitLink wheels, or cupy's NVRTC if those
are missing.

Per case: outputs poisoned (NaN) before each run; launch errors checked; the prepare workspace
decoded and compared stage by stage with the chunked reference (small cases); the recurrence run
alone on a CPU-encoded workspace; the full pipeline compared with the recurrent reference
(relative RMS <= 5e-3 on o and the final state, all finite, all written); two runs bit-identical;
inputs unmodified. Timing: CUDA events, L2 flushed before every call, median / p20 / p80.
Both prepare variants (prep_variant 0: kda_prepare.cu, 1: kda_prepare_fast.cu, safe gate only) are
verified and timed by default, each as its own row; --prep-variant 0, 1 or 4 (the persistent
x1w prepare, kda_prepare_x1w.cu, safe gate with the L2 norm) keeps one.

    python3 benchmarks/kda_bench_gpu.py --quick                 # < 3 minutes per prepare variant
    python3 benchmarks/kda_bench_gpu.py --prep-variant 1        # kda.md's whole case list (T up to 131072, H 1-96)
    python3 benchmarks/kda_bench_gpu.py --all-configs           # also every config of SPACE on 12 cases (hours)
    python3 benchmarks/kda_bench_gpu.py --params split=4,stages=3,op_dtype=bf16
    python3 benchmarks/kda_bench_gpu.py --quick --prep-variant 1
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "ops" / "kda"  # the op this script drives (it lived there until issue 26 item 10)
sys.path.insert(0, str(ROOT))

from ptxbuild.oploader import load_op  # noqa: E402
from ptxbuild.problem import Problem  # noqa: E402

kda = load_op(str(HERE), ROOT)
ref, wsl = kda.ref, kda.workspace
fla_baseline = kda.host.load("baselines")

GATE_RMS = kda.host.GATE_RMS
MIXED = (1300, 547, 2048, 963, 271, 3063)
STAGE_RMS = {"f16": 2e-3, "bf16": 8e-3}


def log(*a):
    print(*a, flush=True)


# ---------------------------------------------------------------- build
_MODULES: dict = {}  # rendered source -> (cupy module, compile info); T does not enter the source


def load_module(cp, kernel, params: dict, problem: Problem):
    try:
        from ptxbuild.compile.compiler import ToolchainMissing, compile_kernel
    except ImportError:
        compile_kernel = None
    if compile_kernel is not None:
        try:
            b = compile_kernel(kernel, "sm_90a")
            with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
                f.write(b.cubin)
            from ptxbuild.problem import Kernel

            regs = {
                s: compile_kernel(Kernel(kernel.source, s), "sm_90a")
                for s in kda.launches(params, problem, 132)
            }
            info = " ".join(
                f"{s[4:]}:{r.registers}regs/{r.spill_bytes}B-spill" for s, r in regs.items()
            )
            return cp.RawModule(path=f.name), info
        except ToolchainMissing:
            pass
    mod = cp.RawModule(code=kernel.source, options=("--gpu-architecture=sm_90a", "-std=c++17"))
    return mod, "compiled by cupy's NVRTC"


class Built:
    """Both kernels of one (params, problem), loaded into cupy."""

    def __init__(self, cp, params: dict, problem: Problem):
        self.cp, self.params, self.problem = cp, params, problem
        why = kda.check(params, problem)
        if why:
            raise ValueError(why)
        kernel = kda.render(params, problem, "sm_90a")
        if kernel.source not in _MODULES:
            _MODULES[kernel.source] = load_module(cp, kernel, params, problem)
            log(
                f"  built {' '.join(f'{k}={v}' for k, v in params.items())}: {_MODULES[kernel.source][1]}"
            )
        self.mod, self.info = _MODULES[kernel.source]
        self.launch = kda.launches(params, problem, 132)  # entry -> geometry, in launch order
        self.fn = {s: self.mod.get_function(s) for s in self.launch}
        self.prepare = next(iter(self.launch))  # kda_prepare, or kda_prepare_ovl (variant 3)

    def run(self, stage: str, inputs: dict, outputs: dict):
        if stage == "kda_prepare" and self.prepare != stage:
            stage = self.prepare
        if stage.startswith("kda_prepare") and int(inputs["chunk_start"].size) == 0:
            return
        # the worker's launch: smem opt-in, clusters, PDL (variant 3)
        from ptxbuild.gpu import device

        device.launch(
            self.fn[stage],
            self.launch[stage],
            kda.stage_args(stage, self.params, self.problem, inputs, outputs),
            self.cp.cuda.get_current_stream(),
        )

    def forward(self, inputs: dict, outputs: dict):
        for stage in self.launch:
            self.run(stage, inputs, outputs)


def make_outputs(cp, problem: Problem) -> dict:
    """The op's outputs; without final_state a one-element hT the kernel must not write (the op
    passes its input hT_unused there), so that poison and determinism treat every case alike."""
    outputs = kda.make_outputs(problem, cp)
    outputs.setdefault("hT", cp.zeros(1, cp.float32))
    return outputs


def poison(cp, outputs: dict):
    outputs["o"].fill(0xFFFF)  # bf16 NaN
    outputs["hT"].fill(cp.nan)
    outputs["ws"].fill(0xFF)


def host_o(cp, o) -> np.ndarray:
    from ptxbuild.dtypes import to_float

    return to_float(cp.asnumpy(o), "bfloat16", np).astype(np.float64)


# ---------------------------------------------------------------- verification
def verify(cp, built: Built, case: dict, stages: bool, label: str) -> dict:
    problem, params = built.problem, built.params
    d = kda.dims(problem)
    inputs = kda.inputs_from_case(case, cp)
    copies = {k: v.copy() for k, v in inputs.items()}
    outputs = make_outputs(cp, problem)
    t0 = time.perf_counter()
    p = ref.preprocess(case)
    args = {n: p[n] for n in ("q", "k", "v", "g", "beta", "scale", "cu_seqlens", "h0")}
    o_ref, h_ref = ref.recurrent(**args)
    ref_s = time.perf_counter() - t0
    res = {"case": label, "ref_s": ref_s}

    poison(cp, outputs)
    built.forward(inputs, outputs)
    cp.cuda.runtime.deviceSynchronize()  # raises on a launch / execution error
    o1, h1 = outputs["o"].copy(), outputs["hT"].copy()
    o = host_o(cp, o1)
    res["o_rms"] = ref.rel_rms(o, o_ref)
    res["hT_rms"] = ref.rel_rms(cp.asnumpy(h1), h_ref) if d["hT"] else 0.0
    if d["T"] >= 2048:  # error along T: the last 1024 tokens vs the first 1024
        res["o_rms_first1k"] = ref.rel_rms(o[:1024], o_ref[:1024])
        res["o_rms_last1k"] = ref.rel_rms(o[-1024:], o_ref[-1024:])

    if stages:  # stage 1 alone: the workspace against the chunked reference
        ch = ref.chunked(**args)
        NC = len(ch.chunk_start)
        if NC:
            dec = wsl.decode(
                cp.asnumpy(kda.host.blobs_of(problem, outputs["ws"])),
                NC,
                d["HV"],
                d["K"],
                d["V"],
                params["op_dtype"],
            )
            worst = 0.0
            for name in ("W", "Qg", "Kd", "A_qk", "U"):
                e = ref.rel_rms(dec[name], wsl.per_chunk(getattr(ch, name), ch))
                res[f"ws_{name}"] = e
                worst = max(worst, e)
            e = ref.rel_rms(dec["gamma_last"], ch.gamma_last)
            res["ws_gamma"] = e
            res["ws_ok"] = max(worst, e) <= STAGE_RMS[params["op_dtype"]]
            # stage 2 alone: the recurrence on a CPU-built workspace
            out2 = make_outputs(cp, problem)
            poison(cp, out2)
            kda.host.blobs_of(problem, out2["ws"])[...] = cp.asarray(
                wsl.encode(ch, params["op_dtype"]).ravel()
            )
            # variant 3's recurrence waits for its flags: published (uint32 1, little-endian bytes)
            kda.host.flags_of(problem, out2["ws"])[...] = cp.asarray(
                np.tile(np.array([1, 0, 0, 0], np.uint8), kda.host.overlap_tasks(problem))
            )
            built.run("kda_recurrence", inputs, out2)
            cp.cuda.runtime.deviceSynchronize()
            res["rec_o_rms"] = ref.rel_rms(host_o(cp, out2["o"]), o_ref)
            res["rec_hT_rms"] = ref.rel_rms(cp.asnumpy(out2["hT"]), h_ref) if d["hT"] else 0.0

    poison(cp, outputs)  # determinism
    built.forward(inputs, outputs)
    cp.cuda.runtime.deviceSynchronize()
    res["deterministic"] = bool(cp.array_equal(o1, outputs["o"])) and bool(
        cp.array_equal(h1, outputs["hT"], equal_nan=True)
    )
    res["inputs_kept"] = all(bool(cp.array_equal(copies[k], inputs[k])) for k in inputs)
    res["ok"] = (
        res["o_rms"] <= GATE_RMS
        and res["hT_rms"] <= GATE_RMS
        and res["deterministic"]
        and res["inputs_kept"]
        and res.get("ws_ok", True)
        and res.get("rec_o_rms", 0) <= GATE_RMS
        and res.get("rec_hT_rms", 0) <= GATE_RMS
    )
    return res


def fmt(res: dict) -> str:
    keys = [
        "o_rms",
        "hT_rms",
        "rec_o_rms",
        "rec_hT_rms",
        "ws_W",
        "ws_Qg",
        "ws_Kd",
        "ws_A_qk",
        "ws_U",
        "ws_gamma",
        "o_rms_first1k",
        "o_rms_last1k",
    ]
    s = " ".join(f"{k}={res[k]:.2e}" for k in keys if k in res)
    flags = (
        ""
        if res["deterministic"] and res["inputs_kept"]
        else f" det={res['deterministic']} kept={res['inputs_kept']}"
    )
    return (
        f"{'PASS' if res['ok'] else 'FAIL'} {res['case']:<44} {s}{flags} (ref {res['ref_s']:.1f}s)"
    )


# ---------------------------------------------------------------- timing
def bench_ms(cp, fn, warmup_s: float = 0.2, reps: int = 30) -> tuple[float, float, float, int]:
    flush = cp.empty(512 * 1024 * 1024, cp.uint8)  # > 50 MB L2 of the H200
    t_end = time.perf_counter() + warmup_s
    while time.perf_counter() < t_end:
        fn()
        cp.cuda.runtime.deviceSynchronize()
    times = []
    for _ in range(reps):
        flush.fill(1)
        a, b = cp.cuda.Event(), cp.cuda.Event()
        cp.cuda.runtime.deviceSynchronize()
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(cp.cuda.get_elapsed_time(a, b))
    t = np.array(times)
    return float(np.median(t)), float(np.percentile(t, 20)), float(np.percentile(t, 80)), len(t)


def gpu_inputs(cp, problem: Problem, seed: int) -> dict:
    """Random inputs made on the GPU (timing only: no reference needed)."""
    from ptxbuild.dtypes import from_float

    d = kda.dims(problem)
    rs = cp.random.RandomState(seed)

    def bf(*s):
        return from_float(rs.standard_normal(s, dtype=cp.float32), "bfloat16", cp)

    cu = np.concatenate([[0], np.cumsum(d["lengths"])]).astype(np.int64)
    layout = {
        k: cp.asarray(v) for k, v in kda.host._layout(cu).items()
    }  # the op's own chunk layout arrays
    return dict(
        q=bf(d["T"], d["H"], d["K"]),
        k=bf(d["T"], d["H"], d["K"]),
        v=bf(d["T"], d["HV"], d["V"]),
        a=bf(d["T"], d["HV"], d["K"]),
        b=bf(d["T"], d["HV"]),
        g=cp.zeros(1, cp.float32),
        A_log=cp.log(rs.uniform(1, 16, d["HV"]).astype(cp.float32)),
        dt_bias=rs.standard_normal((d["HV"], d["K"]), dtype=cp.float32),
        h0=0.1 * rs.standard_normal((d["N"], d["HV"], d["V"], d["K"]), dtype=cp.float32),
        **layout,
    )


def fla_runner(problem: Problem, inputs: dict):
    """(a closure running fla's chunk_kda on the same inputs, "") or (None, why): baselines.fla_call,
    the conversion the ptxbuild build's baseline uses too."""
    try:
        return fla_baseline.fla_call(problem, inputs), ""
    except RuntimeError as exc:
        import traceback

        tb = "".join(traceback.format_exception(exc.__cause__ or exc)[-6:])
        return None, f"fla not available ({exc})\n{tb}"


# ---------------------------------------------------------------- main
def small_cases(quick: bool):
    cases = [
        ([16], 1, {}),
        ([17], 4, {}),
        ([37], 4, {}),
        ([63], 1, {}),
        ([97], 4, {}),
        ([1000], 4, {}),
        ([4, 8, 12], 4, {}),
        ([17, 33, 65], 4, {}),
        ([0, 15], 4, {}),
        ([0, 31, 96, 160], 4, {}),
        ([97, 33], 4, dict(a_shift=8.0)),
        ([97, 33], 4, dict(a_shift=-8.0)),
        ([97, 33], 4, dict(bias_scale=8.0)),
        ([97, 33], 4, dict(a_scale=8.0)),
        ([97, 33], 4, dict(gate="canonical")),
        (
            [97, 33],
            4,
            dict(gate="canonical", a_shift=8.0, a_scale=0.0, bias_scale=0.0, A_log=math.log(125.0)),
        ),
        ([97, 33], 4, dict(gate="given")),
        ([97, 33], 4, dict(gate="given", g=-1000.0)),
        ([97, 33], 4, dict(initial_state=False)),
        ([97, 33], 4, dict(final_state=False)),
        ([97, 33], 4, dict(HV=8)),
        ([200], 4, dict(use_qk_l2norm=False, qk_scale=0.1)),
        ([64], 4, dict(v_scale=30.0)),
    ]
    if not quick:
        cases += [([1000], 32, {}), ([8192], 4, {}), ([131072], 2, {}), ([1] * 7 + [300], 4, {})]
    return cases


def problem_of(lens, H, kw) -> tuple[Problem, dict]:
    """(Problem, make_case kwargs) for a case spec."""
    kw = dict(kw)
    opts = {
        "lengths": tuple(lens) if len(lens) > 1 else None,
        "gate": kw.pop("gate", "safe"),
        "hv": kw.pop("HV", None),
        "l2norm": kw.pop("use_qk_l2norm", True),
        "initial_state": kw.pop("initial_state", True),
        "final_state": kw.pop("final_state", True),
    }
    return Problem.make("kda", "bfloat16", (sum(lens), H), opts), kw


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="fewer cases and scenarios (< 3 minutes per prepare variant)",
    )
    ap.add_argument(
        "--all-configs",
        action="store_true",
        help="also verify every config of SPACE on the first 12 cases (thousands of compiles: hours)",
    )
    ap.add_argument(
        "--params", default="", help="override the default config, e.g. split=4,stages=3"
    )
    ap.add_argument("--no-fla", action="store_true")
    ap.add_argument(
        "--sweep", action="store_true", help="also time every config of SPACE on each scenario"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--prep-variant",
        choices=("0", "1", "4", "both"),
        default="both",
        help="prepare kernel(s) to verify and time (default: both, one row each)",
    )
    a = ap.parse_args(argv)
    if not a.no_fla:
        try:  # torch before cupy and numba: imported lazily inside fla_runner it failed on the H200
            # ("partially initialized module 'torch' has no attribute 'library'")
            importlib.import_module("torch")
        except ImportError:
            pass
    try:
        import cupy as cp
    except ImportError:
        log("needs cupy: pip install cupy-cuda13x")
        return 2
    dev = cp.cuda.runtime.getDeviceProperties(0)
    log(
        f"GPU {dev['name'].decode()} SMs={dev['multiProcessorCount']} cupy {cp.__version__} "
        f"driver {cp.cuda.runtime.driverGetVersion()} runtime {cp.cuda.runtime.runtimeGetVersion()}"
    )
    t_start = time.perf_counter()
    override = {}
    for item in filter(None, a.params.split(",")):
        k, v = item.split("=")
        override[k] = int(v) if v.lstrip("-").isdigit() else v
    variants = (
        [override.pop("prep_variant")]
        if "prep_variant" in override
        else ([0, 1] if a.prep_variant == "both" else [int(a.prep_variant)])
    )

    def with_variants(params: dict) -> list[dict]:
        """params once per chosen prepare variant (callers skip those check() rejects)."""
        return [kda.with_prep_variant(params, pv) for pv in variants]

    failures = 0
    cache: dict = {}

    def built_for(problem, params):
        key = (problem, tuple(sorted(params.items())))
        if key not in cache:
            cache[key] = Built(cp, params, problem)
        return cache[key]

    # 1. correctness on small and adversarial cases, default config (+ every config when not quick)
    log("\n== correctness (relative RMS vs float64; gate 5e-3) ==")
    for i, (lens, H, kw) in enumerate(small_cases(a.quick)):
        problem, ckw = problem_of(lens, H, kw)
        configs = with_variants({**kda.default_params(problem), **override})
        if a.all_configs and i < 12:
            configs += [dict(zip(kda.SPACE, c)) for c in itertools.product(*kda.SPACE.values())]
        elif i < 4:
            configs += [
                dict(split=s, stages=st, op_dtype=dt, prep_threads=pt)
                for s, st, dt, pt in ((4, 3, "bf16", 256), (2, 4, "f16", 128), (1, 2, "bf16", 128))
            ]
        case = kda.case_for(problem, a.seed + i, **ckw)
        for params in configs:
            if kda.check(params, problem):
                continue
            try:
                res = verify(
                    cp,
                    built_for(problem, params),
                    case,
                    stages=True,
                    label=f"{lens if len(lens) < 6 else f'{len(lens)} segs'} H={H} {kw or ''} "
                    f"{'' if params == configs[0] else params}",
                )
                log(fmt(res))
                failures += not res["ok"]
            except Exception as exc:  # noqa: BLE001 - an outcome, not a crash of the bench
                failures += 1
                log(f"FAIL {lens} H={H} {kw} {params}: {type(exc).__name__}: {str(exc)[:400]}")
                if "illegal" in str(exc).lower():
                    log("context is corrupted after an illegal address: stopping")
                    return 1

    # 2. the kda.md scenarios: verify (quick: two of them) and time, once per prepare variant
    log("\n== scenarios (ms: median [p20, p80] of n, L2 flushed) ==")
    rows = []
    scen = [
        (H, name, lens)
        for H in (96, 64)
        for name, lens in (("1x8192", (8192,)), ("mixed6", MIXED), ("8x1024", (1024,) * 8))
    ]
    for j, (H, name, lens) in enumerate(scen):
        problem = Problem.make(
            "kda", "bfloat16", (sum(lens), H), {"lengths": lens if len(lens) > 1 else None}
        )
        inputs = gpu_inputs(cp, problem, a.seed + 200 + j)
        outputs = make_outputs(cp, problem)
        case = (
            kda.case_for(problem, a.seed + 100 + j) if not a.quick or j in (0, 4) else None
        )  # quick: 2 of 6
        fla_ms, fla_note = None, ""
        if not a.no_fla and (not a.quick or name == "1x8192"):  # first call autotunes (slow)
            run, fla_note = fla_runner(problem, inputs)
            if run is not None:
                try:
                    import torch

                    run()
                    torch.cuda.synchronize()
                    fla_ms = bench_ms(cp, lambda: run())[0]
                except Exception as exc:  # noqa: BLE001
                    fla_note = f"fla failed: {type(exc).__name__}: {str(exc)[:200]}"
        floor_ms = kda.bytes_moved(problem) / 4.27e12 * 1e3
        mains = with_variants({**kda.default_params(problem), **override})
        for params in mains:
            if why := kda.check(params, problem):
                log(f"H{H} {name} {params}: skipped ({why})")
                continue
            try:
                built = built_for(problem, params)
            except Exception as exc:  # noqa: BLE001
                log(f"H{H} {name} {params}: build failed: {exc}")
                failures += 1
                continue
            if case is not None:
                res = verify(cp, built, case, stages=False, label=f"H{H} {name} {params}")
                log(fmt(res))
                failures += not res["ok"]
            rows.append(
                (
                    f"H{H} {name}",
                    params,
                    bench_ms(cp, lambda: built.forward(inputs, outputs)),
                    bench_ms(cp, lambda: built.run("kda_prepare", inputs, outputs)),
                    bench_ms(cp, lambda: built.run("kda_recurrence", inputs, outputs)),
                    fla_ms,
                    floor_ms,
                )
            )
        if a.sweep:  # timing only: the configs are verified on the small cases (full mode)
            for c in itertools.product(*kda.SPACE.values()):
                p2 = dict(zip(kda.SPACE, c))
                if p2 in mains or kda.check(p2, problem):
                    continue
                b2 = built_for(problem, p2)
                rows.append(
                    (
                        f"H{H} {name}",
                        p2,
                        bench_ms(cp, lambda: b2.forward(inputs, outputs)),
                        bench_ms(cp, lambda: b2.run("kda_prepare", inputs, outputs)),
                        bench_ms(cp, lambda: b2.run("kda_recurrence", inputs, outputs)),
                        None,
                        floor_ms,
                    )
                )
        if fla_note:
            log(f"  ({fla_note})")
    log(
        f"\n{'scenario':<14} {'config':<62} {'total ms':>22} {'prepare':>8} {'recur.':>8} {'fla':>8} {'floor':>7}"
    )
    for label, params, t_all, t_prep, t_rec, fla_ms, floor_ms in rows:
        cfg = " ".join(f"{k}={v}" for k, v in params.items())
        log(
            f"{label:<14} {cfg:<62} {t_all[0]:7.3f} [{t_all[1]:.3f},{t_all[2]:.3f}] n={t_all[3]:<2} "
            f"{t_prep[0]:8.3f} {t_rec[0]:8.3f} {fla_ms if fla_ms is not None else float('nan'):8.3f} {floor_ms:7.3f}"
        )
    log(
        "(floor: bytes_moved / 4.27 TB/s, the fused-kernel floor; fla: chunk_kda, same inputs, same run)"
    )
    log(
        f"\n{'ALL PASS' if failures == 0 else f'{failures} FAILURE(S)'} in {time.perf_counter() - t_start:.0f} s"
    )
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
