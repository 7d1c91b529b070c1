"""KDA (Kimi Delta Attention) forward: a two-kernel op, prepare (token-parallel) + recurrence.

Problem.shape = (T_total, H); options: lengths (tuple of segment lengths; default one segment),
hv (value heads, GVA; default H), K, V (128), gate ("safe" | "canonical" | "given"),
l2norm, initial_state, final_state. dtype: bfloat16 q, k, v, a, b, o; fp32 A_log, dt_bias, states.

Both kernels live in one source (kda_common.cuh + kda_prepare.cu + kda_recurrence.cu); render()
returns it with entry "kda_recurrence" (the main kernel: its registers are the build's report);
KERNELS / launches() / stage_args() describe the two launches, which the GPU worker (and
bench_gpu.py) runs in order on one stream:
  kda_prepare    grid (NC, HV)                  workspace ws [NC, HV, BLOB] (workspace.py)
  kda_recurrence grid (N * HV * split)          o, hT
ws is an output only because the worker allocates outputs: SCRATCH, never checked (its bytes may
legitimately be 0xFF, the poison). prep_variant 2 is one launch instead, kda_fused (grid as the
recurrence, +128 producer threads per block; kda_fused.cu), the entry of its render(); it leaves ws
untouched. Measured slower than the two kernels on the H200, it is in the space, not the default.
prep_variant 4 (kda_prepare_x1w.cu, "x1w" from lab/kda) is a persistent prepare of one warp per block,
grid (min(NC * HV, 7 * SMs)), writing the same workspace in whole 32-byte sectors; the default where
check() allows it. Verified against the float64 token recurrence by compare():
relative RMS of o and hT each <= 5e-3 (kda.md), all finite. Baselines (FLA chunk_kda): baselines.py.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ptxbuild.oploader import load_module
from ptxbuild.problem import Kernel, Launch, Problem

_HERE = Path(__file__).resolve().parent


host = load_module(_HERE / "kda_host.py", "kda_kda_host")   # geometry, defines, launches, argument order: shared with ops/kda_* stage ops
ref = host.ref
workspace = host.workspace

NAME = "kda"
VERSION = "0.4"   # 0.4: rec_copy, o_store, prep_variant 3 (FLA re-timed beside it); 0.3: verified only on cases its binary was built for (runs.same_binary); 0.2: relative RMS, ws scratch
SOURCES = ["kda_common.cuh", "kda_prepare.cu", "kda_prepare_fast.cu", "kda_recurrence.cu", "kda_fused.cu",
           "kda_prepare_ovl.cu", "kda_prepare_x1w.cu", "reference.py", "workspace.py", "kda_host.py"]
DTYPES = ["bfloat16"]
OPTIONS = dict(host.OPTIONS)
SPACE = {"split": [1, 2, 4, 8], "stages": [2, 3, 4, 5], "op_dtype": ["f16", "bf16"], "prep_threads": [128, 256],
         "prep_variant": [0, 1, 2, 3, 4], "rec_copy": ["cp_async", "bulk"], "o_store": ["cols", "rows"],
         "prep_compact": [0, 1], "ksplit": [1, 2]}
SPILL_BUDGET_BYTES = 0
KERNELS = host.KERNELS
SCRATCH = {"ws"}
CH = host.CH
GATES = host.GATES
dims = host.dims
smem_bytes = host.smem_bytes
_defines = host.defines
case_for = host.case_for
inputs_from_case = host.inputs_from_case

# prep_variant 4 ("x1w", kda_prepare_x1w.cu): ops/kda's own, so its host side lives here and not in
# kda_host.py, which ops/kda_prepare and ops/kda_recurrence list in their SOURCES too (an edit there
# would make their locks stale although none of their kernels changes)
X1W = 4
X1W_FILES = ("kda_prepare_x1w.cu", "kda_recurrence.cu")   # rendered in this order
X1W_SMEM = 29504          # dynamic shared memory per block of one warp: sizeof(X1wWarp) (static_assert'ed)
X1W_WARPS_PER_SM = 7      # its launch bound: 7 x (29,504 + 1,024) B <= 233,472 B of an SM; 255 registers
X1W_MASK = 0x7FFFFFFF     # its blob_mask argument: all ones (the stores' runtime condition, see X1W_ST)


# ---------------------------------------------------------------- problem geometry

def default_params(problem: Problem) -> dict:
    """V-split: the smallest of 1, 2, 4, 8 giving about two blocks per SM (N * HV * split >= 250 on
    132 SMs), else 8. The recurrence is bound by each warp's instruction latency, not by mma.sync or
    memory (ncu, H96 1 x 8192: 1.2 instructions issued per SM-cycle, 1.5 warps per scheduler, ~490
    warp instructions per chunk; benchmarks/mma_probe.py: m16n8k16 takes 24 cycles dependent, 6
    cycles issue with 4+ chains), so the default cuts instructions per chunk:
      - rec_copy "bulk": one thread fills a stage with two cp.async.bulk instead of ~15-28 cp.async per
        thread (H200, benchmarks/kda_profile.py: recurrence 0.70 -> 0.57 ms at H96, 0.56 -> 0.43 at H64);
      - 4 stages (0.57 -> 0.53 ms at H96, 0.43 -> 0.39 at H64), split 4 (split 1, 2, 8 slower with bulk);
      - o_store "rows": O with tokens as rows, stored as bf16 pairs (half the stores of O^T).
    f16 operands; the fast prepare (variant 1) where it applies (H200: 0.78 ms vs 4.3 ms at H96 1x8192),
    with prep_compact=1 (Km laid over the dead k and a rows: 6 prepare blocks per SM instead of 5;
    H200 run 12a, bench_gpu.py scenarios: H96 1.276/1.289/1.255 -> 1.233/1.207/1.206 ms, H64 1 x 8192
    0.874 -> 0.852, 8 x 1024 0.858 -> 0.834, six mixed 0.922 -> 0.964 ms; kda_profile.py H96: prepare
    781 -> 762 us, forward 1286 -> 1229 us). Configs that omit prep_compact keep meaning 0.
    Ahead of variant 1: prepare variant 4 (kda_prepare_x1w.cu, lab/kda's x1w) where check() allows it (safe
    gate, K = V = 128, the L2 norm on): H200 run 30a (lab/kda/probe_s29.py, 40 verifications passed),
    prepare 0.753 (variant 1, compact) / 0.702 (x1p) -> 0.605 ms at H96 1 x 8192 and forward 1.247 ->
    1.098 ms with this recurrence; H64 mixed6 prepare 0.486 (x1p) -> 0.450, forward 0.913 -> 0.825 ms.
    The 8 x 1024 scenarios and H16 / H32 were not timed: `ptxbuild build` times this default beside
    the lessons' winners (variant 1) and keeps the faster per problem."""
    d = dims(problem)
    split = next((s for s in (1, 2, 4, 8) if d["N"] * d["HV"] * s >= 250 and d["V"] % (16 * s) == 0), 8)
    while d["V"] % (16 * split):
        split //= 2
    params = {"split": split, "stages": 4, "op_dtype": "f16", "prep_threads": 128, "prep_variant": 1,
              "rec_copy": "bulk", "o_store": "rows", "prep_compact": 1}
    if check(x1w := with_prep_variant(params, X1W), problem) is None:
        return x1w
    if check(params, problem) is None:
        return params
    return with_prep_variant(params, 0)   # variants 1 and 4: safe gate only


def with_prep_variant(params: dict, variant: int) -> dict:
    """`params` with another prepare kernel; prep_compact is a layout of variant 1 only, so the
    others go without it."""
    return {k: v for k, v in params.items() if variant == 1 or k != "prep_compact"} | {"prep_variant": variant}


def fused_params(problem: Problem) -> dict:
    """prep_variant 2 (kda_fused.cu), in the space but not the default: verified correct on the
    H200 and measured 2.1x (H96) to 2.7x (H64) slower than the two kernels at 1 x 8192 (see
    kda_fused.cu). Split up to one block per SM, since each block runs its own prepare."""
    d = dims(problem)
    split = max([s for s in (1, 2, 4, 8) if d["N"] * d["HV"] * s <= 132 and d["V"] % (16 * s) == 0] or [1])
    return {"split": split, "stages": 2, "op_dtype": "f16", "prep_threads": 128, "prep_variant": 2}


def check(params: dict, problem: Problem) -> str | None:
    if reason := host.problem_error(problem):   # e.g. lengths that do not sum to T (fewer_rows' shapes)
        return reason
    d = dims(problem)
    if d["K"] % 16 or not 16 <= d["K"] <= 128:
        return f"K={d['K']}: need a multiple of 16 up to 128 (state registers, prepare smem)"
    if d["V"] % (16 * params["split"]):
        return f"V={d['V']} is not a multiple of 16 * split={params['split']}"
    if d["HV"] % d["H"]:
        return f"hv={d['HV']} is not a multiple of H={d['H']}"
    if d["gate"] not in GATES:
        return f"gate={d['gate']!r}: use one of {sorted(GATES)}"
    if params["stages"] < 2:
        return "stages < 2"
    if smem_bytes(params, problem) > 227 * 1024:
        return f"shared memory {smem_bytes(params, problem)} B > 227 KiB"
    if (pv := params.get("prep_variant", 0)) not in SPACE["prep_variant"]:
        return f"prep_variant={pv}: use one of {SPACE['prep_variant']}"
    if pv == X1W:
        return x1w_error(params, problem)
    return host.prepare_variant_error(params, problem)


def x1w_error(params: dict, problem: Problem) -> str | None:
    """Why kda_prepare_x1w cannot take this problem, or None: what lab/kda's x1w assumes (the
    factored exponentials of variant 1: the safe gate; K = V = 128, C = 16; one warp per block, so
    prep_threads is unused and asked to be 128, one config of it in the space), and no L2-norm-off
    case: the kernel sits at 255 registers and ptxas 13.0 spills 56 B there (the spill budget is 0).
    The recurrence's own rules (o_store, rec_copy, ksplit) as for the other two-kernel variants."""
    d = dims(problem)
    if params.get("prep_compact", 0):
        return "prep_compact=1 is a layout of prepare variant 1 (kda_prepare_fast.cu) only"
    if reason := host.prepare_variant_error(with_prep_variant(params, 0), problem):
        return reason
    if d["gate"] != "safe" or ref.LOWER_BOUND < -5.0:
        return f"prep_variant=4 needs the safe gate with lower bound >= -5 (gate={d['gate']!r})"
    if (d["K"], d["V"]) != (128, 128) or params["prep_threads"] != 128:
        return "prep_variant=4 is built for K = V = 128 and prep_threads=128"
    if not d["l2norm"]:
        return "prep_variant=4 spills at 255 registers without the L2 norm (l2norm=False)"
    return None


# ---------------------------------------------------------------- rendering and launching


def render(params: dict, problem: Problem, arch: str) -> Kernel:
    if params.get("prep_variant", 0) == host.FUSED:   # one kernel; it reuses the helpers of both stage files
        files = host.FUSED_FILES
    elif params.get("prep_variant", 0) == host.OVERLAP:   # the persistent prepare reuses pf_chunk
        files = host.OVERLAP_FILES
    elif params.get("prep_variant", 0) == X1W:   # its own file, nothing shared with the other prepares
        files = X1W_FILES
    else:
        files = (host.stage_file(params, "kda_prepare"), "kda_recurrence.cu")
    src = _defines(params, problem) + (_HERE / "kda_common.cuh").read_text() + "".join((_HERE / f).read_text() for f in files)
    return Kernel(src, host.main_entry(params))



def render_stage(params: dict, problem: Problem, arch: str, stage: str) -> Kernel:
    """One kernel alone (kda_host.render_stage), kda_prepare_x1w included."""
    if stage != "kda_prepare_x1w":
        return host.render_stage(params, problem, arch, stage)
    return Kernel(_defines(params, problem) + (_HERE / "kda_common.cuh").read_text()
                  + (_HERE / "kda_prepare_x1w.cu").read_text(), stage)


def x1w_grid(problem: Problem, sm_count: int) -> int:
    """kda_prepare_x1w's blocks of one warp: 7 per SM, fewer where there are fewer chunk-heads."""
    d = dims(problem)
    return max(1, min(d["NC"] * d["HV"], X1W_WARPS_PER_SM * sm_count))


def launches(params: dict, problem: Problem, sm_count: int) -> dict[str, Launch]:
    """kda_host.launches, and for variant 4 its persistent prepare (grid from the SM count alone; each
    warp loops over chunk-heads with stride gridDim.x) then variant 1's recurrence."""
    if params.get("prep_variant", 0) != X1W:
        return host.launches(params, problem, sm_count)
    rec = host.launches(with_prep_variant(params, 1), problem, sm_count)["kda_recurrence"]
    prep = Launch((x1w_grid(problem, sm_count), 1, 1), (32, 1, 1), X1W_SMEM, persistent=True)
    return {"kda_prepare_x1w": prep, "kda_recurrence": rec}


def launch(params: dict, problem: Problem, sm_count: int) -> Launch:
    return launches(params, problem, sm_count)[host.main_entry(params)]


def bytes_moved(problem: Problem) -> int:
    """q, k, v, a, b read, o written, initial / final fp32 states (the fused-kernel floor)."""
    d = dims(problem)
    tok = d["T"] * (2 * d["H"] * d["K"] * 2 + d["HV"] * (d["V"] * 2 * 2 + d["K"] * 2 + 2))
    state = d["N"] * d["HV"] * d["V"] * d["K"] * 4 * (int(d["h0"]) + int(d["hT"]))
    return tok + state


# ---------------------------------------------------------------- data


def make_inputs(problem: Problem, seed: int, xp) -> dict:
    """kda_host.make_inputs (drawn on the GPU under cupy); without final_state, hT_unused (fp32 [1])
    is the hT pointer the kernel must not write."""
    ins = host.make_inputs(problem, seed, xp)
    if not dims(problem)["hT"]:
        ins["hT_unused"] = xp.zeros(1, xp.float32)
    return ins


def make_outputs(problem: Problem, xp) -> dict:
    d = dims(problem)
    blobs = max(d["NC"], 1) * d["HV"] * workspace.sizes(d["K"], d["V"])["BLOB"]
    out = dict(o=xp.zeros((d["T"], d["HV"], d["V"]), xp.uint16),
               ws=xp.zeros(blobs + 4 * max(d["NC"], 1) * d["HV"], xp.uint8))   # + variant 3's flags
    if d["hT"]:
        out["hT"] = xp.zeros((d["N"], d["HV"], d["V"], d["K"]), xp.float32)
    return out


def stage_args(stage: str, params: dict, problem: Problem, inputs: dict, outputs: dict) -> list:
    if stage == "kda_prepare_x1w":
        i, d = inputs, dims(problem)
        return [i["q"], i["k"], i["v"], i["a"], i["b"], i["A_log"], i["dt_bias"], i["chunk_start"], i["chunk_len"],
                outputs["ws"], np.float32(d["K"] ** -0.5), np.int32(d["NC"]), np.int32(X1W_MASK)]
    outs = outputs if "hT" in outputs else {**outputs, "hT": inputs["hT_unused"]}
    return host.stage_args(stage, problem, inputs, outputs["ws"], outs,
                           overlap=params.get("prep_variant", 0) == host.OVERLAP)


def kernel_args(params: dict, problem: Problem, inputs: dict, outputs: dict) -> list:
    return stage_args(host.main_entry(params), params, problem, inputs, outputs)


def reference(problem: Problem, inputs: dict, xp) -> dict:
    """float64 recurrent reference from the (bf16 bit-pattern) inputs (numba: T = 8192, H = 96 in ~1 s
    on the H200 host, plus the JIT on a worker's first call)."""
    o, hT = ref.reference(host.case_from_inputs(problem, inputs))
    return {"o": xp.asarray(o), "hT": xp.asarray(hT)} if dims(problem)["hT"] else {"o": xp.asarray(o)}


def compare(problem: Problem, output: str, got, want, xp):
    """Relative RMS of o / hT <= 5e-3 (kda.md), all finite: the gate, not an elementwise band."""
    return host.rms_verdict(output, got, want)


def tolerance(problem: Problem, output: str) -> tuple[float, float]:
    """(0, relative-RMS gate): compare() judges o and hT by relative RMS, not elementwise."""
    return 0.0, host.GATE_RMS


def verify_problems(problem: Problem) -> list[Problem]:
    H = problem.shape[1]
    mk = lambda T, **kw: Problem.make(NAME, problem.dtype, (T, H), {**problem.opts, "lengths": None, **kw})
    return [mk(16), mk(17), mk(37), mk(97), mk(24, lengths=(4, 8, 12)), mk(115, lengths=(17, 33, 65)),
            mk(15, lengths=(0, 15)), mk(287, lengths=(0, 31, 96, 160)), mk(64, initial_state=False),
            mk(64, final_state=False)]
