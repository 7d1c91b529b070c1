"""Host side of the KDA kernels, shared by ops/kda (the two-kernel op, also driven by bench_gpu.py)
and the stage ops ops/kda_prepare and ops/kda_recurrence: problem geometry, the #defines the .cu
files expect, launch geometry, argument order, inputs from a reference case, the relative-RMS gate.

Not an op (no op.py here); loaded by path under the module name "kda_kda_host". Every op that
renders the KDA kernels lists this file in its SOURCES (its build key changes when it does).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ptxbuild.oploader import load_module
from ptxbuild.problem import Kernel, Launch, Problem

HERE = Path(__file__).resolve().parent


def load(name: str):
    """A module of this folder under a unique name (kda_<name>): ops may each have a reference.py."""
    return load_module(HERE / f"{name}.py", f"kda_{name}")


ref = load("reference")
workspace = load("workspace")

OPTIONS = {"lengths": None, "hv": None, "K": 128, "V": 128, "gate": "safe", "l2norm": True,
           "initial_state": True, "final_state": True}
KERNELS = ("kda_prepare", "kda_recurrence")
FILES = {"kda_prepare": "kda_prepare.cu", "kda_recurrence": "kda_recurrence.cu"}
PREPARE_FILES = ("kda_prepare.cu", "kda_prepare_fast.cu")   # by params["prep_variant"] (absent: 0)
FUSED = 2                 # prep_variant 2: one kernel, kda_fused.cu (prepare fused into the recurrence)
FUSED_FILES = ("kda_prepare_fast.cu", "kda_recurrence.cu", "kda_fused.cu")   # rendered in this order
# kda_fused.cu's shared memory besides its 2-slot ring of blobs: staged q/k/a/v rows (2 buffers of
# 4 x 16 x 136 bf16), Kp/Qp/Km (3 x 16 x 132 fp32), CG/CL (2 x 128 fp32), Rq/Rk/B (3 x 16 fp32)
FUSED_SMEM_EXTRA = 2 * 4 * 16 * 136 * 2 + 3 * 16 * 132 * 4 + 2 * 128 * 4 + 3 * 16 * 4
OVERLAP = 3               # prep_variant 3: a persistent prepare beside the recurrence (kda_prepare_ovl.cu, PDL)
OVERLAP_FILES = ("kda_prepare_fast.cu", "kda_recurrence.cu", "kda_prepare_ovl.cu")   # rendered in this order
# kda_prepare_ovl.cu's dynamic shared memory (OVL_SMEM): 2 buffers of staged rows, Kp/Qp/Km, CG/CL, Rq/Rk/B
OVERLAP_SMEM = 2 * 4 * 16 * 136 * 2 + 3 * 16 * 132 * 4 + (2 * 128 + 3 * 16) * 4
OVERLAP_BLOCKS_PER_SM = 2 # its grid: 2 x 62 KB per SM leaves ~100 KB for the recurrence's blocks beside it
CH = 16
GATES = {"safe": 0, "canonical": 1, "given": 2}
GATE_RMS = 5e-3   # kda.md's gate for bf16 I/O: relative RMS of o and of hT vs the float64 reference


def dims(problem: Problem) -> dict:
    o = {**OPTIONS, **problem.opts}
    T, H = problem.shape
    lengths = tuple(o["lengths"]) if o["lengths"] else (T,)
    if sum(lengths) != T:
        raise ValueError(f"kda: lengths sum to {sum(lengths)}, shape says T={T}")
    HV = o["hv"] or H
    return dict(T=T, H=H, HV=HV, K=o["K"], V=o["V"], N=len(lengths), lengths=lengths, gate=o["gate"],
                l2norm=bool(o["l2norm"]), h0=bool(o["initial_state"]), hT=bool(o["final_state"]),
                NC=sum(math.ceil(n / CH) for n in lengths))


def problem_error(problem: Problem) -> str | None:
    """Why neither stage kernel can take this problem (dims, head counts, gate kind), or None."""
    try:
        d = dims(problem)
    except ValueError as exc:
        return str(exc)
    if d["K"] % 16 or not 16 <= d["K"] <= 128:
        return f"K={d['K']}: need a multiple of 16 up to 128"
    if d["HV"] % d["H"]:
        return f"hv={d['HV']} is not a multiple of H={d['H']}"
    if d["gate"] not in GATES:
        return f"gate={d['gate']!r}: use one of {sorted(GATES)}"
    if d["NC"] == 0:
        return "no tokens"
    return None


def smem_bytes(params: dict, problem: Problem) -> int:
    """Dynamic shared memory of kda_recurrence (or of kda_fused: its ring and staging)."""
    d = dims(problem)
    sz = workspace.sizes(d["K"], d["V"])
    if params.get("prep_variant", 0) == FUSED:
        return 2 * sz["BLOB"] + FUSED_SMEM_EXTRA
    groups = d["V"] // params["split"] // 16                     # 16-row groups per block
    xchg = groups * 2 * 3 * 32 * 16 if params.get("ksplit", 1) == 2 else 0   # ksplit's exchange slots
    return params["stages"] * (sz["U"] + groups * 32 * 32) + xchg


def defines(params: dict, problem: Problem) -> str:
    d = dims(problem)
    defs = dict(KDIM=d["K"], VDIM=d["V"], CH=CH, H=d["H"], HV=d["HV"], GATE=GATES[d["gate"]],
                L2NORM=int(d["l2norm"]), LOWER_BOUND=f"({ref.LOWER_BOUND}f)", PREP_THREADS=params["prep_threads"],
                OP_BF16=int(params["op_dtype"] == "bf16"), SPLIT=params["split"], STAGES=params["stages"],
                HAS_H0=int(d["h0"]), HAS_HT=int(d["hT"]))
    if params.get("prep_variant", 0) == OVERLAP:   # only then: the other variants' sources stay as measured
        defs["PDL_FLAGS"] = 1
    if params.get("rec_copy", "cp_async") == "bulk":   # likewise: absent, the measured sources are unchanged
        defs["REC_BULK"] = 1
    if params.get("o_store", "cols") == "rows":
        defs["REC_OROWS"] = 1
    if params.get("prep_compact", 0):
        defs["PREP_COMPACT"] = 1
    if params.get("ksplit", 1) != 1:
        defs["KSPLIT"] = params["ksplit"]
    return "".join(f"#define {k} {v}\n" for k, v in defs.items())


def stage_file(params: dict, stage: str) -> str:
    """The .cu file of a stage: prepare has two variants with the same signature and workspace."""
    return PREPARE_FILES[params.get("prep_variant", 0)] if stage == "kda_prepare" else FILES[stage]


def prepare_variant_error(params: dict, problem: Problem) -> str | None:
    """Why prepare variant 1 (kda_prepare_fast.cu) or 2 (the same steps fused into the recurrence,
    kda_fused.cu) cannot take this problem, or None. Both factor exp(G_r - G_s) through the chunk's
    middle row, which only the safe gate bounds (40 nats). Variant 2 has its own 2-slot ring."""
    pv = params.get("prep_variant", 0)
    if params.get("o_store", "cols") not in ("cols", "rows"):
        return f"o_store={params['o_store']!r}: use 'cols' or 'rows'"
    if params.get("rec_copy", "cp_async") not in ("cp_async", "bulk"):
        return f"rec_copy={params['rec_copy']!r}: use 'cp_async' or 'bulk'"
    if params.get("ksplit", 1) not in (1, 2):
        return f"ksplit={params['ksplit']}: use 1 or 2"
    if params.get("ksplit", 1) == 2 and (params.get("rec_copy") != "bulk" or params.get("o_store") != "rows"
                                         or pv in (FUSED, OVERLAP)):
        return "ksplit=2 is written for rec_copy='bulk', o_store='rows' and the two-kernel variants 0 and 1"
    if params.get("ksplit", 1) == 2:
        d = dims(problem)
        if d["K"] % 32 or d["V"] // params["split"] // 16 > 15:
            return (f"ksplit=2 needs K % 32 == 0 (K={d['K']}) and at most 15 row groups per block "
                    f"(V / split / 16 = {d['V'] // params['split'] // 16}: use a larger split)")
    if params.get("prep_compact", 0) not in (0, 1) or (params.get("prep_compact", 0) and pv != 1):
        return "prep_compact=1 is a layout of prepare variant 1 (kda_prepare_fast.cu) only"
    if pv == OVERLAP and params.get("rec_copy") == "bulk":
        return "prep_variant=3 (flags acquired per thread) copies with cp.async only (rec_copy='cp_async')"
    if pv == 0:
        return None
    d = dims(problem)
    if d["gate"] != "safe" or ref.LOWER_BOUND < -5.0:
        return f"prep_variant={pv} needs the safe gate with lower bound >= -5 (gate={d['gate']!r})"
    if (d["K"], d["V"]) != (128, 128) or params["prep_threads"] != 128:
        return f"prep_variant={pv} is built for K = V = 128 and prep_threads=128"
    if pv == FUSED and params["stages"] != 2:
        return "prep_variant=2 double-buffers in lockstep (stages=2 only)"
    if pv not in (0, 1, FUSED, OVERLAP):
        return f"prep_variant={pv}: use 0, 1, {FUSED} or {OVERLAP}"
    return None


def main_entry(params: dict) -> str:
    """The kernel whose registers the build reports: the recurrence, or the fused kernel."""
    return "kda_fused" if params.get("prep_variant", 0) == FUSED else "kda_recurrence"


def render_stage(params: dict, problem: Problem, arch: str, stage: str) -> Kernel:
    """One kernel alone: defines + kda_common.cuh + its .cu file."""
    src = defines(params, problem) + (HERE / "kda_common.cuh").read_text() + (HERE / stage_file(params, stage)).read_text()
    return Kernel(src, stage)


def overlap_tasks(problem: Problem) -> int:
    """kda_prepare_ovl's tasks: one per (chunk, value head); also the length of its flags array."""
    d = dims(problem)
    return d["NC"] * d["HV"]


def launches(params: dict, problem: Problem, sm_count: int) -> dict[str, Launch]:
    """The kernels of one call, in launch order: prepare then recurrence, the fused kernel alone, or
    (variant 3) the persistent prepare then the recurrence as its programmatic dependent."""
    d = dims(problem)
    if params.get("prep_variant", 0) == OVERLAP:
        rec = Launch((d["N"] * d["HV"] * params["split"], 1, 1), (d["V"] // params["split"] // 16 * 32, 1, 1),
                     smem_bytes(params, problem), pdl=True)
        grid = max(1, min(OVERLAP_BLOCKS_PER_SM * sm_count, overlap_tasks(problem)))
        return {"kda_prepare_ovl": Launch((grid, 1, 1), (128, 1, 1), OVERLAP_SMEM), "kda_recurrence": rec}
    if params.get("prep_variant", 0) == FUSED:
        return {"kda_fused": Launch((d["N"] * d["HV"] * params["split"], 1, 1),
                                    (d["V"] // params["split"] // 16 * 32 + 128, 1, 1), smem_bytes(params, problem))}
    return {
        "kda_prepare": Launch((max(d["NC"], 1), d["HV"], 1), (params["prep_threads"], 1, 1), 0),
        "kda_recurrence": Launch((d["N"] * d["HV"] * params["split"], 1, 1),
                                 (d["V"] // params["split"] // 16 * 32 * params.get("ksplit", 1), 1, 1),
                                 smem_bytes(params, problem)),
    }


def case_for(problem: Problem, seed: int, **kw) -> dict:
    d = dims(problem)
    return ref.make_case(d["lengths"], d["H"], K=d["K"], V=d["V"], seed=seed, gate=d["gate"], HV=d["HV"],
                         use_qk_l2norm=d["l2norm"], initial_state=d["h0"], **kw)


def _layout(cu_seqlens: np.ndarray) -> dict:
    """The chunk layout arrays of the kernels' arguments (host, small)."""
    cs, cl, co = ref.chunk_layout(cu_seqlens, CH)
    lens = np.diff(cu_seqlens)
    order = np.argsort(-lens, kind="stable")                      # longest segments first
    rank = np.empty(len(lens), np.int64)
    rank[order] = np.arange(len(lens))
    seg = np.repeat(np.arange(len(lens)), np.diff(co))            # each chunk's segment
    local = np.arange(len(cs)) - co[:-1][seg]                     # its position in the segment
    return dict(cu_seqlens=cu_seqlens.astype(np.int64), chunk_start=cs.astype(np.int32),
                chunk_len=cl.astype(np.int32), chunk_offsets=co.astype(np.int32),
                seq_order=order.astype(np.int32),
                # the persistent prepare's order (variant 3): chunk j of every segment before chunk j + 1
                chunk_order=np.lexsort((rank[seg], local)).astype(np.int32))


def inputs_from_case(case: dict, xp=np) -> dict:
    host = dict(q=case["q"], k=case["k"], v=case["v"], a=case["a"], b=case["b"],
                g=np.asarray(case["g"], np.float32) if case.get("g") is not None else np.zeros(1, np.float32),
                A_log=case["A_log"].astype(np.float32), dt_bias=case["dt_bias"].astype(np.float32),
                h0=case["h0"].astype(np.float32) if case["h0"] is not None else np.zeros(1, np.float32),
                **_layout(case["cu_seqlens"]))
    return {k: xp.asarray(np.ascontiguousarray(v)) for k, v in host.items()}


def make_inputs(problem: Problem, seed: int, xp) -> dict:
    """The kernels' inputs for `problem` with make_case's default distributions. numpy: exactly
    inputs_from_case(case_for(problem, seed)) (CPU tests and bench_gpu rely on it). Another xp
    (cupy): the same distributions drawn on its device, so a T = 8192, H = 96 case (~1 GB, ~10 s of
    host RNG and bf16 rounding) costs milliseconds per verify and per timing set; the reference
    reads the same bits back (case_from_inputs), so it stays exact."""
    if xp is np:
        return inputs_from_case(case_for(problem, seed), np)
    from ptxbuild.dtypes import from_float
    d = dims(problem)
    T, H, HV, K, V = d["T"], d["H"], d["HV"], d["K"], d["V"]
    rng = xp.random.default_rng(seed)
    bf16 = lambda shape: from_float(rng.standard_normal(shape, dtype=xp.float32), "bfloat16", xp)  # noqa: E731
    out = {"q": bf16((T, H, K)), "k": bf16((T, H, K)), "v": bf16((T, HV, V)), "b": bf16((T, HV)),
           "a": bf16((T, HV, K))}
    small = np.random.default_rng(seed)          # the small parameters as make_case draws them
    host = dict(A_log=np.log(small.uniform(1.0, 16.0, HV)).astype(np.float32),
                dt_bias=small.standard_normal((HV, K)).astype(np.float32),
                g=np.zeros((T, HV, K) if d["gate"] == "given" else 1, np.float32),
                h0=(0.1 * small.standard_normal((d["N"], HV, V, K))).astype(np.float32) if d["h0"]
                else np.zeros(1, np.float32),
                **_layout(np.concatenate([[0], np.cumsum(d["lengths"])]).astype(np.int64)))
    out.update({k: xp.asarray(np.ascontiguousarray(v)) for k, v in host.items()})
    return out


def blob_bytes(problem: Problem) -> int:
    """NC * HV * BLOB: the workspace's blobs, where variant 3's flags start in ops/kda's buffer."""
    d = dims(problem)
    return d["NC"] * d["HV"] * workspace.sizes(d["K"], d["V"])["BLOB"]


def blobs_of(problem: Problem, ws):
    """The blobs of ops/kda's workspace buffer (uint8), without variant 3's flags."""
    return ws[:blob_bytes(problem)]


def flags_of(problem: Problem, ws):
    """Variant 3's flags: the uint32 [NC * HV] tail of ops/kda's workspace buffer (uint8), after the blobs."""
    off = blob_bytes(problem)
    return ws[off:off + 4 * overlap_tasks(problem)]


def stage_args(stage: str, problem: Problem, inputs: dict, ws, outputs: dict, overlap: bool = False) -> list:
    """The kernel's arguments in signature order; `ws` is the workspace buffer (any integer dtype;
    uint8 with the flags tail when `overlap`, prep_variant 3)."""
    d = dims(problem)
    i, o = inputs, outputs
    if stage == "kda_prepare_ovl":
        return [i["q"], i["k"], i["v"], i["a"], i["b"], i["A_log"], i["dt_bias"], i["chunk_start"], i["chunk_len"],
                i["chunk_order"], ws, flags_of(problem, ws), np.int32(overlap_tasks(problem)),
                np.float32(d["K"] ** -0.5)]
    if stage == "kda_prepare":
        return [i["q"], i["k"], i["v"], i["a"], i["g"], i["b"], i["A_log"], i["dt_bias"], i["chunk_start"],
                i["chunk_len"], ws, np.float32(d["K"] ** -0.5)]
    if stage == "kda_fused":
        return [i["q"], i["k"], i["v"], i["a"], i["b"], i["A_log"], i["dt_bias"], o["o"], i["h0"], o["hT"],
                i["cu_seqlens"], i["seq_order"], np.float32(d["K"] ** -0.5)]
    rec = [ws, o["o"], i["h0"], o["hT"], i["cu_seqlens"], i["chunk_offsets"], i["seq_order"]]
    return rec + [flags_of(problem, ws)] if overlap else rec


def host(x) -> np.ndarray:
    return x.get() if hasattr(x, "get") else np.asarray(x)


def rms_verdict(output: str, got, want) -> tuple[bool, str]:
    """An op's compare() verdict on o (bf16 bits) or hT (fp32): relative RMS <= GATE_RMS, every value
    finite (rel_rms is inf otherwise). Shared by ops/kda and ops/kda_recurrence."""
    from ptxbuild.dtypes import to_float
    got = host(got)
    g = to_float(got, "bfloat16", np) if output == "o" else got
    e = ref.rel_rms(g, host(want))
    return e <= GATE_RMS, f"relative RMS {e:.3e} (gate {GATE_RMS:g})"


def case_from_inputs(problem: Problem, inputs: dict) -> dict:
    """The reference's float64 view of (bf16 bit-pattern) inputs: exactly the values the kernel reads."""
    from ptxbuild.dtypes import to_float
    d = dims(problem)
    h = {k: host(v) for k, v in inputs.items()}
    bf = lambda n: to_float(h[n], "bfloat16", np)
    cu = h.get("cu_seqlens")
    if cu is None:
        cu = np.concatenate([[0], np.cumsum(d["lengths"])]).astype(np.int64)
    return dict(qf=bf("q"), kf=bf("k"), vf=bf("v"), af=bf("a"), bf=bf("b"), A_log=h["A_log"].astype(np.float64),
                dt_bias=h["dt_bias"].astype(np.float64), g=h["g"], gate=d["gate"], beta=None,
                use_qk_l2norm=d["l2norm"], lower_bound=ref.LOWER_BOUND, scale=d["K"] ** -0.5, cu_seqlens=cu,
                h0=h["h0"].astype(np.float64) if (d["h0"] and "h0" in h) else None)


def workspace_chunks(pre: dict, chunk_ids, op_dtype: str) -> np.ndarray:
    """uint8 [len(chunk_ids), HV, BLOB]: the encoded workspace (workspace.encode of the float64 chunked
    reference) of the chosen chunks only. `pre` is ref.preprocess() of the whole case. The workspace
    of a chunk depends only on that chunk's tokens (not on the state), so each chosen chunk is run
    through ref.chunked as a one-chunk segment of its own."""
    cs, cl, _ = ref.chunk_layout(pre["cu_seqlens"], CH)
    ids = np.asarray(chunk_ids, np.int64)
    tok = np.concatenate([np.arange(cs[c], cs[c] + cl[c]) for c in ids]) if len(ids) else np.zeros(0, np.int64)
    cu = np.concatenate([[0], np.cumsum(cl[ids])]).astype(np.int64)
    ch = ref.chunked(pre["q"][tok], pre["k"][tok], pre["v"][tok], pre["g"][tok], pre["beta"][tok], pre["scale"], cu)
    return workspace.encode(ch, op_dtype)


def workspace_all(pre: dict, op_dtype: str, pieces: int | None = None) -> np.ndarray:
    """uint8 [NC, HV, BLOB] of every chunk, computed in independent pieces on a thread pool (numpy
    releases the GIL in the large array operations; T = 8192, H = 96 takes ~90 s on one core)."""
    import os
    from concurrent.futures import ThreadPoolExecutor
    cs, _, _ = ref.chunk_layout(pre["cu_seqlens"], CH)
    NC = len(cs)
    pieces = max(1, min(pieces or os.cpu_count() or 1, NC // 8 or 1))
    parts = np.array_split(np.arange(NC), pieces)
    if pieces == 1:
        return workspace_chunks(pre, parts[0], op_dtype)
    with ThreadPoolExecutor(pieces) as ex:
        return np.concatenate(list(ex.map(lambda ids: workspace_chunks(pre, ids, op_dtype), parts)), axis=0)
