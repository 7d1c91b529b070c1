#!/usr/bin/env python3
"""The wgmma recurrence (kda_recurrence_wg.cu) beside ops/kda's locked path, on one GPU (issue 30).

Builds ops/kda's default config for each problem (x1w prepare + the mma.sync recurrence), and beside
it the same prepare with its WQ / KD / AQ stores in the register-major "v2" order (a text patch of
kda_prepare_x1w.cu's four store sites, counted) followed by kda_recurrence_wg. Then:

1. verification: each case of a list (odd lengths, empty segments, varlen, the scenarios) through
   both paths against the float64 token recurrence (relative RMS of o and the final state, gate
   5e-3), outputs poisoned first, run twice for determinism;
2. timing (L2 flushed, median of 30): prepare v1 / v2, recurrence v1 / wg variants, and the forward
   of each path, on kda.md's six scenarios.

    python3 lab/kda/wg/probe_wg.py                   # needs an sm_90 GPU, cupy, ptxbuild's compiler
    python3 lab/kda/wg/probe_wg.py --compile-only    # any machine with the compiler wheels
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from ptxbuild.oploader import load_op  # noqa: E402
from ptxbuild.problem import Kernel, Launch, Problem  # noqa: E402

kda = load_op(str(ROOT / "ops" / "kda"), ROOT)
ref = kda.ref

L8 = (1024,) * 8
MIXED = (1300, 547, 2048, 963, 271, 3063)
SCENARIOS = [(h, lens) for h in (96, 64) for lens in ((8192,), MIXED, L8)]
CASES = [
    (4, (37,)),
    (4, (17, 33, 65)),
    (4, (0, 31, 96, 160)),
    (32, (1000,)),
    (64, L8),
    (96, MIXED),
    (96, (8192,)),
]

# (old, new, how many times): the x1w prepare's WQ / KD / AQ stores in register-major order. WS2REF's
# index is the v1 U4 index (block * 32 + lane); it stores word r of the U4 at block * 128 + 32 r + lane.
PATCHES = [
    ("((U4*)(blob + WS_KD))[ks * 32 + lane] =", "WS2REF(blob + WS_KD, ks * 32 + lane) =", 1),
    ("((U4*)(blob + WS_AQ))[lane] =", "WS2REF(blob + WS_AQ, lane) =", 1),
    ("st[x1w_wsw(2 * lane)] = U4{pack2(-acc", "WS2REF(st, lane) = U4{pack2(-acc", 1),
    ("st[x1w_wsw(2 * lane + 1)] = U4{qgs", "WS2REF(st, 32 + lane) = U4{qgs", 1),
    ("wq[64 * ks + lane] = st[x1w_wsw(lane)];", "wq[64 * ks + lane] = st[lane];", 1),
    (
        "wq[64 * ks + 32 + lane] = st[x1w_wsw(32 + lane)];",
        "wq[64 * ks + 32 + lane] = st[32 + lane];",
        1,
    ),
]
WS2REF = """
// workspace v2 (lab/kda/wg): a U4 of lane l in block b stored as words b * 128 + 32 r + l, r = 0..3
struct Ws2Ref {
  u32* p;
  __device__ __forceinline__ void operator=(const U4& v) const { p[0] = v.x; p[32] = v.y; p[64] = v.z; p[96] = v.w; }
};
#define WS2REF(base, idx) Ws2Ref{(u32*)(base) + ((idx) >> 5) * 128 + ((idx) & 31)}
"""


# uf16: U^T stored as f16 pairs (one U4 a lane and 16-row group, straight out of the registers; the
# blob shrinks by VDIM / 16 * 512 bytes, for the prepare and the recurrence alike)
PATCHES_UF16 = [
    (
        "#define WS_BLOB (WS_U + (VDIM / 16) * 32 * 32)",
        "#define WS_BLOB (WS_U + (VDIM / 16) * 32 * 16)",
        1,
    ),
    (
        "      F4* st = reinterpret_cast<F4*>(&sm.u.kpt[256 * vg]);",
        "      ((U4*)(blob + WS_U))[vg * 32 + lane] = U4{x1w_f16x2(acc[0][0], acc[0][1]), "
        "x1w_f16x2(acc[0][2], acc[0][3]), x1w_f16x2(acc[1][0], acc[1][1]), x1w_f16x2(acc[1][2], acc[1][3])};\n"
        "    }\n    if (0) {\n"
        "      F4* st = reinterpret_cast<F4*>(&sm.u.kpt[256 * vg]);",
        1,
    ),
]
# ufromv: the blob ends after T_inv diag(beta) (f16, B-operand core order, 512 B where U^T began), the
# prepare neither loads v nor forms U^T; the recurrence forms U^T from v
PATCHES_UFROMV = [
    (
        "#define WS_BLOB (WS_U + (VDIM / 16) * 32 * 32)",
        "#define WS_BLOB (WS_U + 512)",
        1,
    ),
    (
        "  __syncwarp();                                          // Tb and Kp^T visible\n",
        "  __syncwarp();                                          // Tb and Kp^T visible\n"
        "  if (X1W_ST) {  // lab/kda/wg ufromv: Tb [r][s] as B[k = s][n = r], core (r / 8, s / 8)\n"
        "#pragma unroll\n"
        "    for (int c = 0; c < 4; ++c)\n"
        "      ((u32*)(blob + WS_U))[32 * c + lane] = x1w_f16x2(sm.tb[8 * (c >> 1) + g][8 * (c & 1) + 2 * t],\n"
        "                                                         sm.tb[8 * (c >> 1) + g][8 * (c & 1) + 2 * t + 1]);\n"
        "  }\n",
        1,
    ),
    (
        "  const bf16_t* vbase = v + ((size_t)t0 * HV + hv) * VDIM + 8 * (lane & 15);",
        "  return;  // lab/kda/wg ufromv: the recurrence reads v\n"
        "  const bf16_t* vbase = v + ((size_t)t0 * HV + hv) * VDIM + 8 * (lane & 15);",
        1,
    ),
    (
        "  for (int vg = 0; vg < VDIM / 16; ++vg) {",
        "  for (int vg = 0; vg < 0; ++vg) {  // lab/kda/wg ufromv: no U^T here",
        1,
    ),
]
F16X2 = """
__device__ __forceinline__ u32 x1w_f16x2(float lo, float hi) {
  u32 r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
"""


def patched(src: str, patches: list) -> str:
    """`src` with each (old, new, count) applied, every site found exactly `count` times."""
    for old, new, count in patches:
        if src.count(old) != count:
            raise SystemExit(f"patch site {old!r} found {src.count(old)} times, expected {count}")
        src = src.replace(old, new)
    return src


def v2_source(params: dict, problem: Problem, wg: dict) -> str:
    src = kda.render(params, problem, "sm_90a").source
    extra = PATCHES_UF16 if wg.get("WG_UF16") else PATCHES_UFROMV if wg.get("WG_UFROMV") else []
    src = patched(src, extra)  # the WS_BLOB define first: the helpers go after it
    at = src.index("\n", src.index("#define WS_BLOB")) + 1
    src = src[:at] + WS2REF + (F16X2 if extra else "") + src[at:]
    src = patched(src, PATCHES)
    defs = "".join(f"#define {k} {v}\n" for k, v in wg.items())
    body = (HERE / "kda_recurrence_wg.cu").read_text()
    marker = "// WG_MMA_INC: wg_n16, wg_n32, wg_n128 (wg_mma.inc, pasted here by probe_wg.py)\n"
    body = body.replace(marker, (HERE / "wg_mma.inc").read_text(), 1)
    return src + defs + body


def wg_launch(problem: Problem, wg: dict) -> Launch:
    d = kda.dims(problem)
    sizes = kda.workspace.sizes(d["K"], d["V"])
    vs = d["V"] // wg["WG_SPLIT"]
    stage = sizes["U"] + (vs // 16) * 32 * (16 if wg.get("WG_UF16") else 32)
    if wg.get("WG_UFROMV"):  # WQ..GAM, T_inv diag(beta), 512 B of zeros, 16 padded v rows
        stage = sizes["U"] + 1024 + 16 * (2 * vs + 16)
    otiles = (vs // 64) * 2 * 16 * 144 if wg.get("WG_OSTAGE") else 0  # two O tiles per warpgroup
    smem = wg["WG_STAGES"] * (stage + 8) + otiles + 128  # + mbarriers, alignment slack
    return Launch((d["N"] * d["HV"] * wg["WG_SPLIT"], 1, 1), (vs // 16 * 32, 1, 1), smem)


_BUILT: dict = {}  # source -> (cupy module, info)


class V2:
    """The v2 prepare and one wgmma recurrence variant of (params, problem), loaded into cupy."""

    def __init__(self, cp, params: dict, problem: Problem, wg: dict, compile_only: bool = False):
        from ptxbuild.compile.compiler import compile_kernel

        self.cp, self.params, self.problem, self.wg = cp, params, problem, wg
        src = v2_source(params, problem, wg)
        if src not in _BUILT:  # lengths do not enter the source: one compile per (H, variant)
            b = compile_kernel(
                Kernel(src, "kda_recurrence_wg"), "sm_90a"
            )  # the cubin holds both kernels
            info = f"wg {b.registers} regs / {b.spill_bytes} B spill"
            if compile_only:
                _BUILT[src] = (None, info)
            else:
                with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
                    f.write(b.cubin)
                _BUILT[src] = (cp.RawModule(path=f.name), info)
        self.mod, self.info = _BUILT[src]
        if compile_only:
            return
        self.fp = self.mod.get_function("kda_prepare_x1w")
        self.fr = self.mod.get_function("kda_recurrence_wg")
        self.lp = kda.launches(params, problem, 132)["kda_prepare_x1w"]
        self.lr = wg_launch(problem, wg)

    def prepare(self, inputs, outputs):
        from ptxbuild.gpu import device

        args = kda.stage_args("kda_prepare_x1w", self.params, self.problem, inputs, outputs)
        device.launch(self.fp, self.lp, args, self.cp.cuda.get_current_stream())

    def recurrence(self, inputs, outputs):
        from ptxbuild.gpu import device

        args = kda.stage_args("kda_recurrence", self.params, self.problem, inputs, outputs)
        if self.wg.get("WG_UFROMV"):
            args = [*args, inputs["v"]]
        device.launch(self.fr, self.lr, args, self.cp.cuda.get_current_stream())

    def forward(self, inputs, outputs):
        self.prepare(inputs, outputs)
        self.recurrence(inputs, outputs)


def problem_of(H: int, lengths) -> Problem:
    return Problem.make("kda", "bfloat16", (sum(lengths), H), {"lengths": tuple(lengths)})


def variants(spec: str) -> list[dict]:
    out = []
    for item in spec.split(";"):
        split, stages, lbo, ostage, uf16, ufromv = (
            int(x) for x in (item + ",0,0,0").split(",")[:6]
        )
        out.append(
            {
                "WG_SPLIT": split,
                "WG_STAGES": stages,
                "WG_LBO_IS_K": lbo,
                "WG_OSTAGE": ostage,
                "WG_UF16": uf16,
                "WG_UFROMV": ufromv,
            }
        )
    return out


def check(cp, bench, v2s: list, H: int, lengths, seed: int) -> list[dict]:
    problem = problem_of(H, lengths)
    d = kda.dims(problem)
    case = kda.host.case_for(problem, seed)
    inputs = kda.inputs_from_case(case, cp)
    p = ref.preprocess(case)
    args = {n: p[n] for n in ("q", "k", "v", "g", "beta", "scale", "cu_seqlens", "h0")}
    o_ref, h_ref = ref.recurrent(**args)
    rows = []
    runners = [("v1", bench.Built(cp, kda.default_params(problem), problem).forward)]
    runners += [(name(v.wg), v.forward) for v in v2s(problem)]
    for label, fwd in runners:
        outs = []
        for _ in range(2):
            o = bench.make_outputs(cp, problem)
            bench.poison(cp, o)
            fwd(inputs, o)
            cp.cuda.runtime.deviceSynchronize()
            outs.append(o)
        o1, o2 = outs
        row = {
            "H": H,
            "lengths": list(lengths),
            "path": label,
            "o_rms": ref.rel_rms(bench.host_o(cp, o1["o"]), o_ref),
            "hT_rms": ref.rel_rms(cp.asnumpy(o1["hT"]), h_ref) if d["hT"] else 0.0,
            "deterministic": bool(cp.array_equal(o1["o"], o2["o"]))
            and bool(cp.array_equal(o1["hT"], o2["hT"])),
        }
        row["ok"] = row["o_rms"] <= 5e-3 and row["hT_rms"] <= 5e-3 and row["deterministic"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def debug(cp, bench, wg: dict, dump: str = "", lengths=(37,)) -> int:
    """One small case step by step, synchronizing after each kernel (run it under compute-sanitizer):
    the v2 prepare's workspace against the v1 one permuted on the CPU (bit for bit), then the wgmma
    recurrence on it."""
    problem = problem_of(4, lengths)
    d = kda.dims(problem)
    tag = "x".join(map(str, lengths))
    params = kda.default_params(problem)
    inputs = kda.inputs_from_case(kda.host.case_for(problem, 5), cp)
    built, v2 = bench.Built(cp, params, problem), V2(cp, params, problem, wg)
    print("built", v2.info, v2.lr, flush=True)
    o1, o2 = bench.make_outputs(cp, problem), bench.make_outputs(cp, problem)
    built.run("kda_prepare", inputs, o1)
    cp.cuda.runtime.deviceSynchronize()
    print("prepare v1 ok", flush=True)
    v2.prepare(inputs, o2)
    cp.cuda.runtime.deviceSynchronize()
    print("prepare v2 ok", flush=True)
    sz = kda.workspace.sizes(d["K"], d["V"])
    nb = d["NC"] * d["HV"]
    w1 = cp.asnumpy(o1["ws"])[: nb * sz["BLOB"]].reshape(nb, sz["BLOB"])
    w2 = cp.asnumpy(o2["ws"])[: nb * sz["BLOB"]].reshape(nb, sz["BLOB"])
    want = w1.copy()
    for lo, hi in (("WQ", "KD"), ("KD", "AQ"), ("AQ", "GAM")):
        words = np.ascontiguousarray(w1[:, sz[lo] : sz[hi]]).view(np.uint32)
        if lo == "WQ":  # [ks][lane][W or Qg][reg] -> [ks][W or Qg][reg][lane]
            v2w = words.reshape(nb, -1, 32, 2, 4).transpose(0, 1, 3, 4, 2)
        else:  # [block][lane][reg] -> [block][reg][lane]
            v2w = words.reshape(nb, -1, 32, 4).transpose(0, 1, 3, 2)
        want[:, sz[lo] : sz[hi]] = np.ascontiguousarray(v2w).reshape(nb, -1).view(np.uint8)
    for lo, hi in (("WQ", "KD"), ("KD", "AQ"), ("AQ", "GAM"), ("GAM", "U"), ("U", "BLOB")):
        bad = int((w2[:, sz[lo] : sz[hi]] != want[:, sz[lo] : sz[hi]]).sum())
        print(f"workspace v2 {lo}: {bad} bytes differ from v1 permuted", flush=True)
    if dump:
        np.savez(Path(dump) / f"ws_{tag}.npz", v1=w1[:4], v2=w2[:4])
    built.run("kda_recurrence", inputs, o1)
    cp.cuda.runtime.deviceSynchronize()
    a = bench.host_o(cp, o1["o"])
    for label, ws in (("v2 prepare", None), ("v1 permuted on the CPU", want)):
        o2 = bench.make_outputs(cp, problem) if ws is not None else o2
        if ws is not None:
            o2["ws"][: ws.size] = cp.asarray(ws.reshape(-1))
        o2["o"].fill(0xFFFF)  # poison o and hT, not the workspace
        o2["hT"].fill(cp.nan)
        v2.recurrence(inputs, o2)
        cp.cuda.runtime.deviceSynchronize()
        b = bench.host_o(cp, o2["o"])
        h = ref.rel_rms(cp.asnumpy(o2["hT"]), cp.asnumpy(o1["hT"]))
        print(
            f"wg recurrence on the {label} workspace, vs v1: o {ref.rel_rms(b, a):.3e}, hT {h:.3e}"
        )
        if dump:
            np.savez(
                Path(dump) / f"out_{tag}_{'cpu' if ws is not None else 'v2'}.npz",
                o_v1=a,
                o_wg=b,
                h_v1=cp.asnumpy(o1["hT"]),
                h_wg=cp.asnumpy(o2["hT"]),
            )
    return 0


def name(wg: dict) -> str:
    o = (" ostage" if wg.get("WG_OSTAGE") else "") + (" uf16" if wg.get("WG_UF16") else "")
    o += " ufromv" if wg.get("WG_UFROMV") else ""
    return f"wg s{wg['WG_SPLIT']} st{wg['WG_STAGES']} lbo{'k' if wg['WG_LBO_IS_K'] else 'n'}{o}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--variants",
        default="2,3,1;2,3,1,1;2,4,1,1;1,3,1,1;2,2,1,1",
        help="split,stages,lbo_is_k[,ostage[,uf16[,ufromv]]];... (lbo_is_k 1: the descriptor's LBO is the k stride; ostage 1: O through shared memory; uf16 1: U^T stored in f16; ufromv 1: U^T formed from v in the recurrence)",
    )
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument(
        "--debug", action="store_true", help="one small case step by step (first variant)"
    )
    ap.add_argument("--dump", default="", help="with --debug: save workspaces and outputs here")
    ap.add_argument("--no-time", action="store_true")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--cases", default="", help="indices into CASES to verify (default: all)")
    ap.add_argument("--scenarios", default="", help="indices into SCENARIOS to time (default: all)")
    ap.add_argument("--json", default="", help="write every row here")
    a = ap.parse_args(argv)
    wgs = variants(a.variants)
    if a.compile_only:
        for H, lens in SCENARIOS[:1]:
            pr = problem_of(H, lens)
            for wg in wgs:
                print(name(wg), V2(None, kda.default_params(pr), pr, wg, compile_only=True).info)
        return 0
    import cupy as cp
    import kda_bench_gpu as bench

    if a.debug:
        for lens in ((16,), (37,)):
            debug(cp, bench, wgs[0], a.dump, lens)
        return 0
    cache: dict = {}

    def v2s_for(problem):
        key = (problem.shape, problem.opts.get("lengths"))
        if key not in cache:
            cache[key] = []
            for wg in wgs:
                try:
                    cache[key].append(V2(cp, kda.default_params(problem), problem, wg))
                except (
                    Exception
                ) as e:  # a variant that does not compile or load is a row, not the end
                    print(json.dumps({"path": name(wg), "error": str(e)[:400]}), flush=True)
        return cache[key]

    rows: list[dict] = []
    print(f"device: {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}", flush=True)
    if not a.no_check:
        pick = [int(x) for x in a.cases.split(",")] if a.cases else range(len(CASES))
        for i, (H, lens) in ((i, CASES[i]) for i in pick):
            rows += check(cp, bench, v2s_for, H, lens, seed=100 + i)
        good = {r["path"] for r in rows if r["path"] != "v1"} - {
            r["path"] for r in rows if not r.get("ok", True)
        }
        print(f"verified variants: {sorted(good)}", flush=True)
        wgs_ok = [wg for wg in wgs if name(wg) in good]
    else:
        wgs_ok = wgs
    if not a.no_time:
        pick = [int(x) for x in a.scenarios.split(",")] if a.scenarios else range(len(SCENARIOS))
        for H, lens in (SCENARIOS[i] for i in pick):
            problem = problem_of(H, lens)
            params = kda.default_params(problem)
            built = bench.Built(cp, params, problem)
            inputs, outputs = bench.gpu_inputs(cp, problem, 0), bench.make_outputs(cp, problem)
            timed = [
                ("prepare v1", lambda: built.run("kda_prepare", inputs, outputs)),
                ("rec v1", lambda: built.run("kda_recurrence", inputs, outputs)),
                ("forward v1", lambda: built.forward(inputs, outputs)),
            ]
            out2 = bench.make_outputs(cp, problem)
            for v in v2s_for(problem):
                if name(v.wg) not in {name(w) for w in wgs_ok}:
                    continue
                v.prepare(inputs, out2)
                timed += [
                    (f"rec {name(v.wg)}", lambda v=v: v.recurrence(inputs, out2)),
                    (f"forward {name(v.wg)}", lambda v=v: v.forward(inputs, out2)),
                ]
                timed.insert(1, (f"prepare v2 ({name(v.wg)})", lambda v=v: v.prepare(inputs, out2)))
            label = f"H{H} {'x'.join(map(str, lens)) if len(set(lens)) > 1 else f'{len(lens)}x{lens[0]}'}"
            for what, fn in timed:
                med, p20, p80, n = bench.bench_ms(cp, fn, reps=a.reps)
                row = {
                    "scenario": label,
                    "what": what,
                    "us": round(med * 1e3, 1),
                    "p20": round(p20 * 1e3, 1),
                    "p80": round(p80 * 1e3, 1),
                    "n": n,
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
    if a.json:
        Path(a.json).write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return 0


if __name__ == "__main__":
    t0 = time.time()
    rc = main()
    print(f"done in {time.time() - t0:.0f} s")
    sys.exit(rc)
