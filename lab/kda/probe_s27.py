#!/usr/bin/env python3
"""Session 27 probe: the per-channel-gate prepare (lab/kda/kda_s27_prepare.cu) in front of the locked
kda_recurrence, verified against the float64 reference, then timed beside kda@h200's own prepare and
the session-26 warp prepares w4 and w4r on kda.md's six scenarios, then (optionally) one ncu launch of
it (plan and predictions: lab/kda/plan-session27.md).

    python3 lab/kda/probe_s27.py --compile-only      # CPU: NVRTC + nvJitLink, registers / spills / smem
    python3 lab/kda/probe_s27.py --ncu               # GPU (one H200, ~2 min): verify, time, ncu

As probe_s26.py: nothing under ops/ changes. Every prepare here writes ops/kda's workspace, so the op's
recurrence (its default config) reads it and the op's stage check (workspace.decode vs ref.chunked,
each field <= 2e-3) and end-to-end check (o, hT vs ref.recurrent <= 5e-3, deterministic, inputs
untouched) apply unchanged (kda_bench_gpu.verify). A variant with any failed case is not timed.
Variants (prepare kernels): x1 / x4 / x1s = s27 at 1 warp per block (12 per SM, 168 registers),
4 per block (3 blocks), 1 per block bounded for 13 per SM (128 registers); x1n = x1's binary with every
blob written into 512 slots (L2-resident: no workspace traffic to HBM; its output is garbage, so it is
timed only, as the cost of the prepare's compute plus its input reads, i.e. what a fused producer
would pay); x1a = x1 with the gate and v rows addressed from one base pointer (~7 % fewer
instructions: does the instruction count set the time?); x1c / x1cn = x1a (/ x1n) with q, k staged by
16-byte cp.async into the D buffer and their fragment words read by ldmatrix (every input line
requested once: run 27b's suspect); w4 / w4r = session 26's warp prepare (w4r: q, k, a in registers, never timed before).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import probe_s26 as s26  # noqa: E402

from ptxbuild.problem import Kernel, Launch  # noqa: E402

ROOT, kda, log = s26.ROOT, s26.kda, s26.log
SRC = HERE / "kda_s27_prepare.cu"
WARP_BYTES = 16704  # sizeof(S27Warp)
NOSTORE_MASK = 511
# name -> (warps per block, blocks per SM bound, blob mask or None for all ones)
S27 = {
    "x1": (1, 12, None, ""),
    "x1a": (1, 12, None, "#define S27_FASTADDR 1\n"),
    "x1c": (1, 12, None, "#define S27_FASTADDR 1\n#define S27_STAGEQK 1\n"),
    "x1cn": (1, 12, NOSTORE_MASK, "#define S27_FASTADDR 1\n#define S27_STAGEQK 1\n"),
    "x4": (4, 3, None, ""),
    "x1s": (1, 13, None, ""),
    "x1n": (1, 12, NOSTORE_MASK, ""),
}
S26 = {"w4": s26.VARIANTS["w4"], "w4r": s26.VARIANTS["w4r"]}
SMALL, BIG, SCENARIOS = s26.SMALL, s26.BIG, s26.SCENARIOS


def source(params: dict, problem, wpb: int, minb: int, extra: str = "") -> str:
    defs = (
        kda.host.defines({**params, "split": 1, "stages": 2}, problem)
        + f"#define S27_WPB {wpb}\n#define S27_MINB {minb}\n"
        + extra
    )
    return defs + (ROOT / "ops" / "kda" / "kda_common.cuh").read_text() + SRC.read_text()


def kernel_of(params: dict, problem, variant: str) -> Kernel:
    if variant in S27:
        wpb, minb, _, extra = S27[variant]
        return Kernel(source(params, problem, wpb, minb, extra), "kda_s27_prepare")
    wpb, minb = S26[variant]
    return Kernel(s26.source(params, problem, wpb, minb, variant.endswith("r")), "kda_s26_prepare")


def launch_of(problem, variant: str) -> Launch:
    d = kda.dims(problem)
    if variant in S27:
        wpb = S27[variant][0]
        return Launch(
            (math.ceil(max(d["NC"], 1) / wpb), d["HV"], 1), (32 * wpb, 1, 1), wpb * WARP_BYTES
        )
    return s26.launch_of(problem, S26[variant][0])


def kernels_for(problem, variants, op: bool = True) -> list:
    params = kda.default_params(problem)
    out = []
    if op:
        k = kda.render(params, problem, "sm_90a")
        out += [k] + [Kernel(k.source, s) for s in kda.launches(params, problem, 132)]
    return out + [kernel_of(params, problem, v) for v in dict.fromkeys(variants)]


def compile_problems() -> list:
    """The problems every probe's --compile-only compiles for: the scenarios' heads (H96, H64) and
    the odd ones (one head, GVA, no L2 norm)."""
    return [
        s26.problem_of((8192,), 96),
        s26.problem_of((8192,), 64),
        s26.problem_of((16,), 1),
        s26.problem_of((97, 33), 4, {"hv": 8}),
        s26.problem_of((200,), 4, {"l2norm": False}),
    ]


def compile_only() -> int:
    """Every variant on the scenario problems and the odd ones (GVA, no L2 norm, bf16 operands)."""
    bad = 0
    for problem in compile_problems():
        params = kda.default_params(problem)
        for op_dtype in ("f16", "bf16"):
            for name in ("x1", "x1a", "x1c", "x4", "x1s"):
                t0 = time.perf_counter()
                b = s26._compile(kernel_of({**params, "op_dtype": op_dtype}, problem, name))
                wpb, minb, _, _ = S27[name]
                smem_ok = minb * (wpb * WARP_BYTES + 1024) <= 233472
                ok = smem_ok and b.spill_bytes <= (
                    128 if name == "x1s" else 16
                )  # a few bytes: noted
                bad += not ok
                log(
                    f"{'OK  ' if ok else 'BAD '} {problem.shape} {dict(problem.options)} {op_dtype} {name}: "
                    f"{b.registers} regs, {b.spill_bytes} B spill, {wpb * WARP_BYTES} B smem/block, "
                    f"{minb * wpb} warps/SM ({time.perf_counter() - t0:.1f} s)"
                )
    log("compile-only: " + ("ALL OK" if not bad else f"{bad} BAD"))
    return 1 if bad else 0


SUBSET = {0, 1, 2, 4, 6, 8, 15, 18}  # [16], [17], varlen, [0, 15], H64, H96, GVA, 1-token segments


def plan(main_v: str, others: list, big: bool):
    """[(case index, (lens, H, kw), variant, stages)]: main_v on every case (stage by stage on the
    small ones, end to end on the big ones), the others on the small ones (x4, x1s: SUBSET)."""
    steps = []
    for j, c in enumerate(SMALL):  # x4 / x1s run x1's code in another launch shape: a subset
        steps += [
            (j, c, v, True) for v in [main_v, *others] if j in SUBSET or v not in ("x4", "x1s")
        ]
    if big:
        steps += [(len(SMALL) + i, c, main_v, False) for i, c in enumerate(BIG[:2])]
    return steps


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--main", default="x1", help="verified on every case, profiled by --ncu")
    ap.add_argument("--verify-also", default="x1a,w4r,x4,x1s", help="verified on the small cases")
    ap.add_argument("--time", default="x1,x1a,x4,x1s,x1n,w4,w4r", help="prepare variants timed")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--no-big", action="store_true", help="skip the T = 8192 end-to-end cases")
    ap.add_argument("--ncu", action="store_true", help="then one ncu launch of x1 (H96 1 x 8192)")
    ap.add_argument(
        "--ncu-only",
        action="store_true",
        help="only ncu: base prepare, x1, x1c, w4r, one launch each (H96 1 x 8192), ~60 s",
    )
    ap.add_argument("--ncu-child", default="", help=argparse.SUPPRESS)
    ap.add_argument("--budget", type=float, default=140.0, help="seconds: ncu is skipped past it")
    ap.add_argument(
        "--stop-at", type=float, default=0.0, help="seconds: no scenario is timed past it (0: none)"
    )
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument(
        "--dry-run", action="store_true", help="CPU: the plan and the kernels, no compile"
    )
    ap.add_argument("--json", default=str(HERE / "probe_s27.json"))
    a = ap.parse_args(argv)
    if a.compile_only:
        return compile_only()
    t_start = time.perf_counter()

    import kda_bench_gpu as bench

    others = [v.strip() for v in a.verify_also.split(",") if v.strip()]
    timed = [v.strip() for v in a.time.split(",") if v.strip()]
    if a.ncu_child:
        return ncu_child(bench, a.ncu_child)
    if a.ncu_only:
        out = {"ncu_only": NCU_ONLY}
        run_ncu(a, out, t_start, NCU_ONLY, "kda_prepare|kda_s27_prepare|kda_s26_prepare", 0)
        Path(a.json).with_name(Path(a.json).stem + "-ncu.json").write_text(
            json.dumps(out, indent=1)
        )
        return 0 if isinstance(out["ncu"], dict) and out["ncu"].get("rc") == 0 else 1
    steps = plan(a.main, others, not a.no_big)
    problems = {j: bench.problem_of(*c) for j, c, _, _ in steps}
    kernels = []
    for j, _, v, _ in steps:
        kernels += kernels_for(problems[j][0], [v])
    for H, _, lens in SCENARIOS:
        kernels += kernels_for(s26.problem_of(lens, H), timed)
    if a.dry_run:
        uniq = {(k.source, k.entry) for k in kernels}
        log(f"dry run: {len(steps)} verifications, {len(uniq)} distinct kernels to compile")
        return 0
    secs = s26.precompile(kernels, a.workers or os.cpu_count() or 1)
    log(f"precompiled {len(s26._BINARIES)} kernels in {secs:.0f} s")
    out = {
        "variants": {
            **{k: list(v) for k, v in S27.items()},
            **{k: list(v) for k, v in S26.items()},
        },
        "binaries": {
            f"{e}:{hash(src) & 0xFFFFFFFF:08x}": f"{b.registers} regs {b.spill_bytes} B spill"
            for (src, e), b in s26._BINARIES.items()
            if e.startswith("kda_s2")
        },
        "verify": [],
        "timing": [],
    }

    def save():
        out["seconds"] = time.perf_counter() - t_start
        Path(a.json).write_text(json.dumps(out, indent=1, default=str))

    import cupy as cp

    from ptxbuild.gpu import device

    PrepBuilt = make_built(bench, cp, device)
    cache: dict = {}

    def built(problem, variant):
        if (problem, variant) not in cache:
            cache[(problem, variant)] = PrepBuilt(kda.default_params(problem), problem, variant)
        return cache[(problem, variant)]

    memo: dict = {}  # one float64 reference per case, whatever the number of variants on it
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
    failed: set = set()
    stop = False
    cases: dict = {}
    log("== correctness (relative RMS vs float64; gate 5e-3; ws_* stage fields gate 2e-3) ==")
    for j, (lens, H, kw), variant, stages in steps:
        if stop:
            break
        problem, ckw = problems[j]
        if j not in cases:
            cases[j] = kda.case_for(problem, 1000 + j, **ckw)
        label = f"{variant} {lens if len(lens) < 6 else f'{len(lens)} segs'} H={H} {kw or ''}"
        try:
            res = bench.verify(cp, built(problem, variant), cases[j], stages=stages, label=label)
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
                w in msg.lower() for w in ("illegal", "launch", "trap", "unspecified", "exception")
            ):
                log("the CUDA context may be corrupted: stopping here")
                stop = True
        save()
    cases.clear()
    memo.clear()
    failed = excluded(failed)
    out["failed"] = sorted(failed)
    names = [v for v in timed if v not in failed]
    log(f"== timing {names} (ms: median of {a.reps}, L2 flushed before each call; same inputs) ==")
    for j, (H, name, lens) in enumerate(SCENARIOS):
        if stop:
            break
        if a.stop_at and time.perf_counter() - t_start > a.stop_at:
            log(f"  --stop-at {a.stop_at:.0f} s: the remaining scenarios are not timed")
            break
        problem = s26.problem_of(lens, H)
        inputs, outputs = bench.gpu_inputs(cp, problem, 200 + j), bench.make_outputs(cp, problem)
        d = kda.dims(problem)
        row = {"scenario": f"H{H} {name}", "chunk_heads": d["NC"] * d["HV"]}
        out["timing"].append(row)

        def t(key, fn):
            try:
                row[key] = bench.bench_ms(cp, fn, reps=a.reps)[0]
            except Exception as exc:  # noqa: BLE001
                row.setdefault("errors", []).append(f"{key}: {type(exc).__name__}: {exc}"[:300])
                log(f"  {row['scenario']}: {row['errors'][-1]}")

        base = bench.Built(cp, kda.default_params(problem), problem)
        t("base_fwd", lambda: base.forward(inputs, outputs))
        t("base_prep", lambda: base.run("kda_prepare", inputs, outputs))
        t("base_rec", lambda: base.run("kda_recurrence", inputs, outputs))
        for v in names:
            s = built(problem, v)
            row[f"{v}_info"] = s.info
            t(f"{v}_prep", lambda s=s: s.run("kda_prepare", inputs, outputs))
            if v == a.main:
                t(f"{v}_fwd", lambda s=s: s.forward(inputs, outputs))
        for k in [k for k in row if k.endswith("_prep")]:
            row[k.replace("_prep", "_usSM")] = row[k] * 1e3 * 132 / row["chunk_heads"]
        log(
            f"  {row['scenario']}: "
            + " ".join(f"{k}={v:.3f}" for k, v in row.items() if isinstance(v, float))
        )
        save()

    nan = float("nan")
    cols = ["base"] + [v for v in names]
    log(
        f"\n{'scenario':<12} {'base':>6} {'rec':>6} {a.main + 'fwd':>6} {'target':>6} | prepare ms: "
        + " ".join(f"{v:>6}" for v in cols)
        + " | us-SM per chunk-head: "
        + " ".join(f"{v:>5}" for v in cols)
    )
    targets = dict(
        zip([f"H{H} {n}" for H, n, _ in s26.SCENARIOS], (0.876, 0.870, 0.747, 0.743, 0.636, 0.507))
    )
    for r in out["timing"]:
        log(
            f"{r['scenario']:<12} {r.get('base_fwd', nan):6.3f} {r.get('base_rec', nan):6.3f} "
            f"{r.get(a.main + '_fwd', nan):6.3f} {targets[r['scenario']]:6.3f} | prepare ms: "
            + " ".join(f"{r.get(f'{v}_prep', nan):6.3f}" for v in cols)
            + " | us-SM per chunk-head: "
            + " ".join(f"{r.get(f'{v}_usSM', nan):5.2f}" for v in cols)
        )
    log(
        "(base: kda@h200's default config, its forward, recurrence and prepare; <main>fwd: that prepare + the "
        "same recurrence; target: FlashKDA (kda.md, 2026-12-01) / 1.6; us-SM: prepare ms x 132 SMs / "
        "chunk-heads; x1n / x1cn: x1 / x1c without workspace traffic to HBM, timing only)"
    )
    nfail = sum(not r.get("ok") for r in out["verify"])
    out["failures"] = nfail
    save()
    if a.ncu and not stop:
        run_ncu(a, out, t_start, a.main)
        save()
    log(
        f"\n{'ALL PASS' if nfail == 0 and not stop else f'{nfail} FAILURE(S)'} in "
        f"{time.perf_counter() - t_start:.0f} s; wrote {a.json}"
    )
    return 0 if nfail == 0 and not stop else 1


def excluded(failed: set) -> set:
    """The variants not timed: the failed ones and their twins (x1n is x1's binary, x1cn x1c's)."""
    return failed | {v + "n" for v in failed if v + "n" in S27}


def make_built(bench, cp, device):
    funcs: dict = {}

    def load(binary, entry):
        if (binary.cubin, entry) not in funcs:
            with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
                f.write(binary.cubin)
            funcs[(binary.cubin, entry)] = cp.RawModule(path=f.name).get_function(entry)
        return funcs[(binary.cubin, entry)]

    class PrepBuilt(bench.Built):
        """The op's kernels (its module, default config) with kda_prepare replaced by a lab prepare."""

        def __init__(self, params, problem, variant):
            super().__init__(cp, params, problem)
            k = kernel_of(params, problem, variant)
            b = s26._compile(k)
            self.variant, self.info = variant, f"{b.registers} regs, {b.spill_bytes} B spill"
            self.lab = load(b, k.entry)
            self.lab_launch = launch_of(problem, variant)
            self.mask = S27[variant][2] if variant in S27 else None

        def run(self, stage, inputs, outputs):
            if stage != "kda_prepare":
                return super().run(stage, inputs, outputs)
            if int(inputs["chunk_start"].size) == 0:
                return None
            d, i = kda.dims(self.problem), inputs
            args = [
                i[n]
                for n in ("q", "k", "v", "a", "b", "A_log", "dt_bias", "chunk_start", "chunk_len")
            ]
            args += [outputs["ws"], np.float32(d["K"] ** -0.5), np.int32(d["NC"])]
            if self.variant in S27:
                args.append(np.int32(self.mask if self.mask is not None else 0x7FFFFFFF))
            device.launch(self.lab, self.lab_launch, args, cp.cuda.get_current_stream())
            return None

    return PrepBuilt


NCU_ONLY = "base,x1,x1c,w4r"  # profiled in this order (x1 and x1a share the entry name)


def ncu_child(bench, variants: str) -> int:
    """Under ncu, H96 1 x 8192: `variants` (a comma list; "base" = kda@h200's prepare) each launched
    once, in order; a single variant is launched twice (run_ncu's --launch-skip 1 skips the first)."""
    import cupy as cp

    from ptxbuild.gpu import device

    problem = s26.problem_of((8192,), 96)
    names = variants.split(",")
    params = kda.default_params(problem)
    PrepBuilt = make_built(bench, cp, device)
    built = [
        bench.Built(cp, params, problem) if v == "base" else PrepBuilt(params, problem, v)
        for v in names
    ]
    inputs, outputs = bench.gpu_inputs(cp, problem, 200), bench.make_outputs(cp, problem)
    for b in built * (2 if len(built) == 1 else 1):
        b.run("kda_prepare", inputs, outputs)
        cp.cuda.runtime.deviceSynchronize()
    return 0


NCU_METRICS = (
    "gpu__time_duration.sum,smsp__inst_executed.sum,sm__cycles_elapsed.avg,dram__bytes_read.sum,"
    "dram__bytes_write.sum,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,"
    "launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem,l1tex__t_sector_hit_rate.pct"
)


def run_ncu(a, out: dict, t_start: float, child="x1", kernels="kda_s27_prepare", skip=1) -> None:
    left = a.budget - (time.perf_counter() - t_start)
    ncu = shutil.which("ncu") or next(
        (p for p in ("/usr/local/cuda/bin/ncu",) if os.path.exists(p)), None
    )
    if ncu is None or left < 25:
        log(f"ncu: skipped ({'not found' if ncu is None else f'{left:.0f} s left of the budget'})")
        out["ncu"] = "skipped"
        return
    logf = Path(a.json).with_name(Path(a.json).stem + "-ncu.log")
    cmd = [
        ncu, "--clock-control", "none", "-k", f"regex:^({kernels})$", "--launch-skip", str(skip),
        "--launch-count", str(len(child.split(","))), "--section", "SpeedOfLight", "--section", "Occupancy",
        "--section", "WarpStateStats", "--section", "SchedulerStats", "--section", "InstructionStats",
        "--section", "MemoryWorkloadAnalysis", "--metrics", NCU_METRICS,
        sys.executable, str(Path(__file__).resolve()), "--ncu-child", child,
    ]  # fmt: skip
    log(f"== ncu ({child}, H96 1 x 8192, one launch each; {left:.0f} s left) -> {logf}")
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=max(20.0, left - 5))
        text = r.stdout + r.stderr
        out["ncu"] = {"rc": r.returncode}
    except subprocess.TimeoutExpired as exc:
        text = f"TIMEOUT\n{exc.stdout or ''}{exc.stderr or ''}"
        out["ncu"] = {"rc": "timeout"}
    logf.write_text(text if isinstance(text, str) else text.decode(errors="replace"))
    keep = [
        ln
        for ln in str(text).splitlines()
        if any(
            w in ln
            for w in (
                "inst_executed", "Executed Ipc", "Issue Slots", "Warp Cycles Per Issued", "Stall",
                "Hit Rate", "Achieved Occupancy", "Registers", "Duration", "DRAM Throughput",
                "dram__bytes", "Theoretical Occupancy", "Eligible", "No Eligible", "ERROR",
                "Context", "gpu__time_duration", "lts__", "l1tex__",
            )
        )
    ]  # fmt: skip
    out["ncu"]["summary"] = keep[:160]
    for ln in keep[:160]:
        log("  " + ln.strip())


if __name__ == "__main__":
    sys.exit(main())
