"""RMSNorm forward op: y = h * rsqrt(mean(h^2) + eps) * w (+ b), h = x (+ residual).

LAB COPY (issue 29 item 4): ops/rmsnorm with stage="ring" added (persistent, the next row part
bulk-copied through a ring of shared-memory slots while this one is reduced and stored), under its
own name so that ops/rmsnorm and every rmsnorm lock stay as they are until a GPU rebuild moves it
there. Every config of ops/rmsnorm renders the same defines and compiles to the same PTX and cubin
here (tests/test_rmsnorm_long_op.py); `diff -r ops/rmsnorm lab/ops/rmsnorm_long` is the change.

Operands (all row-major, rows of length N; bf16 stored as uint16 bits):
  x [M, N] dtype; residual [M, N] dtype (option residual); weight [N] fp32 or dtype (option
  weight = "fp32" | "x" | "none"); bias [N] in the weight's type (dtype when weight = "none");
  outputs y [M, N] dtype; residual_out [M, N] dtype or fp32 (residual_out_fp32); rstd [M] fp32.
With residual, h = x + residual is added in fp32 and rounded to residual_out's type; y normalizes
that stored h (as torch does for h = x + r in bf16), so residual_out is bit-exact.

Regimes (param "regime"), see rmsnorm.cu for the code:
  warp    a group of row_threads (4..32) lanes per row, rows_per_group rows per group, several
          groups per block; shuffle-only reduction. For rows up to ~2K elements.
  block   one block per row; warp shuffles + one shared-memory exchange. ~2K..32K.
  cluster one row split over a cluster of 2/4/8 CTAs (sm_90+); each CTA pushes its partial into
          every CTA's shared memory (st.async, counted by that CTA's mbarrier).
  exact=True : N is a compile-time constant; the row lives in registers (stage="reg") or, for rows
          too long for registers (block/cluster only), in dynamic shared memory (stage="smem");
          x (+ residual) is read from global memory exactly once.
          stage="chunk" (block/cluster): two passes over the row in chunks of `unroll` vectors per
          lane, few registers; pass 2 re-reads x (L1/L2 hits) or, with a residual, reads h back
          from residual_out.
          stage="bulk" (block/cluster): thread 0 bulk-copies the CTA's row part (x, residual) into
          shared memory (cp.async.bulk, no registers held), two passes over it; weight loaded late.
          bulk_reg vectors per lane of the part are held in registers instead (parts too big for
          shared memory alone: bf16 256K over a cluster of 2 is 256 KB per CTA).
          stage="pipe": persistent; block: the next row bulk-copied into shared memory while this
          one is finished; warp / cluster: the next row loaded into a second register set (cluster:
          as many clusters as can be resident, Launch.persistent).
          stage="ring" (block/cluster): persistent (as pipe); thread 0 streams the CTA's row parts in
          chunks of `unroll` iterations through a ring of shared-memory slots (cp.async.bulk, one
          mbarrier per slot), each slot refilled with the next row's chunk as soon as this row's
          pass 2 has read it: the next row part is in flight through this row's reduction and
          stores. Weight / bias held in registers across rows. Rows of N >= 65536 (default there).
          ring_group (block regime): a row over 2/4/8 CTAs without a hardware cluster, summed
          through mailbox words in y (the grid takes whole groups of any SMs: 33 x 4 = 132);
          ring_skew: pass 1 of the next row before this row's sum completes (two parts in the ring).
          stage="stream" (block/cluster; lab probe long9): the backward's stage=smem (ops/rmsnorm_bwd) on
          the forward: persistent (as ring), a ring of `stages` buffers in shared memory, each one whole
          row part of x (+ residual) filled by one bulk copy per stream, stages - 1 rows ahead; every warp
          frees a buffer on an mbarrier; weight / bias held in registers; sums by row parity.
          interleave (cluster regime, stage="reg"; lab probe long7): the CTAs of a cluster take the row
          in chunks of `interleave` vectors dealt round-robin (chunk j to CTA j % cluster) instead of
          one contiguous 1/cluster each; 0 (the default) is the contiguous split.
  exact=False: any N at run time (also N % 8 != 0, via element accesses); two passes over global
          memory (the second re-reads x (+ residual), usually from L2). Rendered without N.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ptxbuild.dtypes import SIZE_BYTES, from_float, storage_dtype, to_float
from ptxbuild.problem import Kernel, Launch, Problem

NAME = "rmsnorm_long"
VERSION = "1"
SOURCES = ["rmsnorm.cu"]
DTYPES = ["bfloat16", "float16", "float32"]
OPTIONS = {"weight": "x", "bias": False, "residual": False, "residual_out_fp32": False,
           "rstd": False, "eps": 1e-6}
SPILL_BUDGET_BYTES = 0

# The first value of each list is the canonical value a regime that ignores the parameter must use.
SPACE = {
    "regime": ["warp", "block", "cluster"],
    "threads": [32, 64, 96, 128, 192, 256, 384, 448, 512, 640, 768, 1024],
    "row_threads": [32, 16, 8, 4],        # warp regime: lanes per row
    "rows_per_group": [1, 2, 4],          # warp regime: rows per lane group, all loads issued first
    "cluster": [1, 2, 4, 8, 16],          # cluster regime: CTAs per row (16 is refused, see check)
    "exact": [True, False],               # N compile-time (register/smem resident) vs generic N
    "stage": ["reg", "smem", "pipe", "chunk", "bulk", "ring", "stream"],  # exact: where the row is held
                                          # (pipe: persistent, the next row fetched while this one
                                          # finishes; chunk: two passes; bulk: bulk-copied into shared
                                          # memory; ring: persistent, bulk-copied chunks through a ring of
                                          # slots; stream: persistent, whole row parts bulk-copied into a
                                          # ring of `stages` buffers, as the backward's stage=smem)
    "unroll": [1, 2, 4, 8],               # generic / smem / chunk / bulk stage: vectors per lane per batch;
                                          # ring: iterations per chunk (slot)
    "min_blocks": [1, 2, 3, 4, 8, 16, 32],  # __launch_bounds__ min blocks per SM (occupancy / register
                                          # cap; 8-32 for the one- and two-warp CTAs of short rows)
    "load_hint": ["none", "nc", "nc_na", "nc_ef", "l2"],  # ld.global / .nc / .nc.L1::no_allocate /
                                          # + .L2::evict_first / (chunk) L2 evict_last then evict_first
    "store_cs": [False, True],            # st.global.cs (streaming) for y and residual_out
    "rsqrt": ["approx", "precise"],       # rsqrt.approx.f32 vs 1 / sqrt.rn
    "weight_load": ["late", "early"],     # weight/bias loaded in the epilogue or with x
    "bulk_reg": [0, 2, 4, 8, 16],         # stage=bulk: vectors per lane held in registers, not smem
    "fast_front": [False, True],          # warp, exact, reg: whole blocks of rows take a path without
                                          # row predicates and with 32-bit offsets (FAST_FRONT)
    "w_el": [False, True],                # exact, reg: weight / bias loads ld.global.L1::evict_last (W_EL)
    "ring_group": [1, 2, 4, 8],           # ring, block regime: CTAs per row, summed through the L2 (no
                                          # hardware cluster: 33 x 4 tile 132 SMs; clusters of 4/8 get 120)
    "ring_skew": [False, True],           # ring: pass 1 of the next row before this row's sum completes
    "interleave": [0, 1, 2, 4, 8, 16, 32, 64],  # cluster regime, reg: 0 contiguous parts; g: chunks of g
                                          # vectors dealt round-robin over the cluster's CTAs (INTERLEAVE)
    "stages": [1, 2, 3, 4, 6, 8],         # stream: row buffers in the ring (stages - 1 rows ahead; NSTAGE)
}

# Cluster dims > 8 need cudaFuncAttributeNonPortableClusterSizeAllowed on the function: ptxbuild.launch
# sets it for every cluster launch (rmsnorm_bwd's cluster-16 winners run on it), so the lab op allows
# 16 in every stage (probe long8); ops/rmsnorm still refuses it until its own rebuild.
NONPORTABLE_CLUSTER_OK = True
SMEM_LIMIT_BYTES = 227 * 1024
MAX_SMS = 160              # verification shapes for persistent grids assume at most this many SMs
REG_OVERHEAD = 20          # registers a thread needs besides the row data (pointers, indices, ...)
RING_SM_BYTES = 222 * 1024  # stage=ring: the slots of all min_blocks CTAs of an SM, less 2 KB per CTA
RING_MAX_SLOTS = 64         # stage=ring: mbarriers (8 B of static shared memory each) and slots at most
SMEM_SM_BYTES = 228 * 1024  # stage=stream (as ops/rmsnorm_bwd): per SM, 1 KB per block reserved by the system
SMEM_STATIC = 2 * 1024      # stage=stream: that 1 KB + the static mbarriers and row-sum slots (< 1 KB)
STREAM_MAX_VPT = 16         # stage=stream: vectors per lane (the weight part held: 16 x 4 words at most)
KIND = {"bfloat16": 0, "float16": 1, "float32": 2}
LDH = {"none": 0, "nc": 1, "nc_na": 2, "nc_ef": 3, "l2": 4}
SRC = Path(__file__).with_name("rmsnorm.cu")


# ------------------------------------------------------------------ problem helpers
def _opts(problem: Problem) -> dict:
    return {**OPTIONS, **problem.opts}


def _vec(dtype: str) -> int:
    return 16 // SIZE_BYTES[dtype]


def _kinds(problem: Problem) -> tuple[int, int, int]:
    """(x kind, weight/bias kind, h/residual_out kind), 0 bf16 / 1 f16 / 2 f32."""
    o = _opts(problem)
    kx = KIND[problem.dtype]
    kw = 2 if o["weight"] == "fp32" else kx
    kh = 2 if (kx == 2 or (o["residual"] and o["residual_out_fp32"])) else kx
    return kx, kw, kh


def _words(kind: int, vec: int) -> int:
    return vec * (4 if kind == 2 else 2) // 4


def _full(params: dict) -> dict:
    return {**{k: v[0] for k, v in SPACE.items()}, **params}


def _group(p: dict) -> int:
    return p["row_threads"] if p["regime"] == "warp" else p["threads"]


def _geometry(p: dict, problem: Problem) -> tuple[int, int]:
    """(vectors in the row worker's range, vectors per lane) of an exact variant."""
    n = problem.shape[1]
    nv = n // (p["cluster"] * p["ring_group"]) // _vec(problem.dtype)
    return nv, -(-nv // _group(p))


def _reg_cap(p: dict) -> int:
    return min(255, 65536 // (p["threads"] * p["min_blocks"]) // 8 * 8)


def _data_regs(p: dict, problem: Problem) -> int:
    """Row data a lane keeps live in registers (32-bit words): the check's loose spill estimate
    (calibrated on sm_90a: exact variants at the estimate's limit compile without spills; the
    compile step is the real judge)."""
    o = _opts(problem)
    vec = _vec(problem.dtype)
    _, kw, kh = _kinds(problem)
    res = bool(o["residual"])
    per_vec = max(4 * (1 + res), _words(kh, vec))
    wwords = _words(kw, vec) * ((o["weight"] != "none") + bool(o["bias"]))
    if p["exact"] and p["stage"] == "stream":               # the weight part held + one vector in use
        _, vpt = _geometry(p, problem)
        return vpt * wwords + 4 * (1 + res) + _words(kh, vec) + 4
    if p["exact"] and p["stage"] == "ring":                 # the weight part held + one chunk in use
        _, vpt = _geometry(p, problem)                      # (sm_90a: 8 x 4 held words at 1024 threads
        return vpt * wwords + p["unroll"] * (4 * (1 + res) + _words(kh, vec) + 4)   # compile to 54-61)
    if p["exact"] and p["stage"] == "bulk":                 # pass 2's batch + the register tail
        return p["unroll"] * (per_vec + wwords) + p["bulk_reg"] * max(4 * (1 + res), _words(kh, vec))
    if not p["exact"] or p["stage"] == "smem":
        return p["unroll"] * (per_vec + wwords) + 12        # + 64-bit loop indices / bounds
    _, vpt = _geometry(p, problem)
    if p["stage"] == "pipe" and p["regime"] == "warp":      # this group's x (+ residual), the next's, h
        return p["rows_per_group"] * vpt * (2 * 4 * (1 + res) + _words(kh, vec)) + 12
    if p["stage"] == "pipe" and p["regime"] == "cluster":   # x (+ residual) of this row and the next;
        return vpt * (2 * 4 * (1 + res) + (_words(kh, vec) if res else 0)) + 12   # h is x without one
    if p["stage"] == "pipe":                                # h of the row + the weight held across rows
        return vpt * (_words(kh, vec) + wwords) + 12
    # ptxas keeps the packed h (it may combine x + residual as loads land, at fewer bytes in flight)
    hold = p["rows_per_group"] * vpt * _words(kh, vec)
    return int(hold * (1.75 if res else 1.0)) + (vpt * wwords if p["weight_load"] == "early" else 0)


def _chunk_regs(p: dict, problem: Problem) -> int:
    """Registers a chunked lane needs in all: pass 2 holds h and the weight of up to 4 vectors at a
    time; past 4, pass 1 holds 4 words more per extra vector of x (and residual) in flight.
    Calibrated on sm_90a: fp32 8K, 512 threads, unroll 4 compiles to exactly 40 without spills;
    unroll 1-2 needs 24-32, fp32 32K at unroll 8 58; past the cap it spills, and the compile step
    rejects it."""
    o = _opts(problem)
    vec = _vec(problem.dtype)
    _, kw, kh = _kinds(problem)
    wwords = _words(kw, vec) * ((o["weight"] != "none") + bool(o["bias"]))
    u2 = min(p["unroll"], 4)
    return u2 * (max(4, _words(kh, vec)) + wwords) + 8 + (p["unroll"] - u2) * 4 * (1 + bool(o["residual"]))


def _ring(p: dict, problem: Problem) -> tuple[int, int, int]:
    """stage=ring: (chunks per row part, slots, bytes per slot). A chunk is `unroll` whole iterations
    of x (+ the same of the residual); as many slots as fit (RING_SM_BYTES / min_blocks, less 2 KB).
    Run 27c: the parts that had more bytes requested ahead ran faster (32 / 64 / 88 KB ahead: 74 / 82
    / 93% of the floor at bf16 128K), so the ring is no longer capped at two row parts (that cap
    left 32-64 KB ahead for parts of 32-64 KB; parts of 128 KB never reached it)."""
    _, vpt = _geometry(p, problem)
    nch = max(1, vpt // p["unroll"])
    sb = p["unroll"] * p["threads"] * 16 * (1 + bool(_opts(problem)["residual"]))
    slots = min(RING_MAX_SLOTS, (RING_SM_BYTES // p["min_blocks"] - 2048) // sb)
    return nch, slots, sb


def _stream_bytes(p: dict, problem: Problem) -> int:
    """stage=stream: the ring of `stages` buffers, each one row part of every stream (x, residual),
    as ops/rmsnorm_bwd's _smem_bytes for its stage=smem."""
    streams = 1 + bool(_opts(problem)["residual"])
    return p["stages"] * streams * (problem.shape[1] // p["cluster"]) * SIZE_BYTES[problem.dtype]


def _smem_bytes(p: dict, problem: Problem) -> int:
    if p["exact"] and p["stage"] == "stream":
        return _stream_bytes(p, problem)
    if p["exact"] and p["stage"] == "ring":
        _, slots, sb = _ring(p, problem)
        return max(0, slots) * sb
    if p["exact"] and p["stage"] == "pipe" and p["regime"] == "block":   # two rows of x (+ residual)
        return 2 * problem.shape[1] * SIZE_BYTES[problem.dtype] * (1 + bool(_opts(problem)["residual"]))
    if p["exact"] and p["stage"] == "bulk":          # the CTA's part of x (+ residual) less the register tail
        part = problem.shape[1] // p["cluster"] * SIZE_BYTES[problem.dtype] - p["bulk_reg"] * p["threads"] * 16
        return part * (1 + bool(_opts(problem)["residual"]))
    if not (p["exact"] and p["stage"] == "smem"):
        return 0
    _, _, kh = _kinds(problem)
    _, vpt = _geometry(p, problem)
    return vpt * _words(kh, _vec(problem.dtype)) * 4 * p["threads"]


# ------------------------------------------------------------------ contract: configs
def check(params: dict, problem: Problem) -> str | None:
    p = _full(params)
    o = _opts(problem)
    if problem.dtype not in DTYPES:
        return f"dtype {problem.dtype} not supported (one of {DTYPES})"
    if len(problem.shape) != 2 or min(problem.shape) < 1:
        return f"shape {problem.shape} must be (M, N) with M, N >= 1"
    if o["weight"] not in ("fp32", "x", "none"):
        return f"option weight={o['weight']!r} must be 'fp32', 'x' or 'none'"
    if o["residual_out_fp32"] and not o["residual"]:
        return "residual_out_fp32 needs residual=True"
    for k, v in p.items():
        if k not in SPACE:
            return f"unknown parameter {k}"
        if isinstance(SPACE[k][0], (str, bool)) and (v not in SPACE[k] or type(v) is not type(SPACE[k][0])):
            return f"{k}={v!r} is not one of {SPACE[k]}"
    if type(p["threads"]) is not int:
        return f"threads={p['threads']!r} must be an integer"
    for k in ("cluster", "row_threads", "rows_per_group", "unroll", "min_blocks", "ring_group", "interleave",
              "stages"):
        if type(p[k]) is not int or p[k] not in SPACE[k]:
            return f"{k}={p[k]!r} is not one of {SPACE[k]}"
    n = problem.shape[1]
    vec = _vec(problem.dtype)
    regime, threads = p["regime"], p["threads"]
    canon = {k: SPACE[k][0] for k in SPACE}
    if regime != "warp" and (p["row_threads"], p["rows_per_group"]) != (32, 1):
        return "row_threads / rows_per_group only apply to the warp regime (leave 32 / 1)"
    if regime != "cluster" and p["cluster"] != 1:
        return "cluster only applies to the cluster regime (leave 1)"
    if regime == "cluster" and p["cluster"] == 1:
        return "the cluster regime needs cluster >= 2"
    if p["cluster"] > 8 and not (NONPORTABLE_CLUSTER_OK or p["stage"] == "ring"):   # ring: new, so
        # allowed (ptxbuild.launch sets the function's non-portable cluster attribute above 8)
        return "cluster > 8 needs cudaFuncAttributeNonPortableClusterSizeAllowed, which Launch cannot request"
    if p["stage"] == "smem" and (not p["exact"] or regime == "warp"):
        return "stage=smem only applies to exact block/cluster variants"
    if p["stage"] == "chunk" and (not p["exact"] or regime == "warp"):
        return "stage=chunk only applies to exact block/cluster variants"
    if p["stage"] == "bulk" and (not p["exact"] or regime == "warp"):
        return "stage=bulk only applies to exact block/cluster variants"
    if p["stage"] == "ring" and (not p["exact"] or regime == "warp"):
        return "stage=ring only applies to exact block/cluster variants"
    if p["stage"] == "ring" and (p["load_hint"], p["weight_load"]) != (canon["load_hint"], canon["weight_load"]):
        return "stage=ring bulk-copies x and holds the weight (leave load_hint, weight_load)"
    if p["stage"] == "stream" and (not p["exact"] or regime == "warp"):
        return "stage=stream only applies to exact block/cluster variants"
    if p["stage"] == "stream" and (p["load_hint"], p["weight_load"]) != (canon["load_hint"], canon["weight_load"]):
        return "stage=stream bulk-copies x and holds the weight (leave load_hint, weight_load)"
    if p["stage"] == "stream" and p["unroll"] != canon["unroll"]:
        return "stage=stream reads one vector at a time from shared memory (leave unroll 1)"
    if p["stages"] != canon["stages"] and not (p["exact"] and p["stage"] == "stream"):
        return "stages only applies to stage=stream (leave 1)"
    if (p["ring_group"], p["ring_skew"]) != (canon["ring_group"], canon["ring_skew"]) and not (
            p["exact"] and p["stage"] == "ring"):
        return "ring_group / ring_skew only apply to stage=ring (leave 1 / False)"
    if p["ring_group"] > 1 and regime != "block":
        return "ring_group (a software group of CTAs per row) is for the block regime; clusters use cluster"
    if p["interleave"] and not (regime == "cluster" and p["exact"] and p["stage"] == "reg"):
        return "interleave only applies to exact register-resident cluster-regime variants (leave 0)"
    if p["stage"] != "bulk" and p["bulk_reg"] != canon["bulk_reg"]:
        return "bulk_reg only applies to stage=bulk (leave 0)"
    if p["load_hint"] == "l2" and p["stage"] != "chunk":
        return "load_hint=l2 (pass 1 evict_last, pass 2 evict_first) only applies to stage=chunk"
    if p["stage"] == "pipe" and not p["exact"]:
        return "stage=pipe only applies to exact variants"
    if p["stage"] == "pipe" and (p["weight_load"] != canon["weight_load"] or p["unroll"] != canon["unroll"]):
        return "stage=pipe places the weight itself and has no batches (leave weight_load, unroll)"
    if p["exact"] and p["stage"] == "reg" and p["unroll"] != canon["unroll"]:
        return "unroll only applies to generic, smem-staged or chunked variants (leave 1)"
    if not p["exact"] and p["weight_load"] != canon["weight_load"]:
        return "weight_load=early only applies to exact register-resident variants"
    if p["stage"] in ("smem", "chunk", "bulk") and p["weight_load"] != canon["weight_load"]:
        return "weight_load=early only applies to exact register-resident variants"
    if o["weight"] == "none" and not o["bias"] and p["weight_load"] != canon["weight_load"]:
        return "weight_load is moot without weight or bias"
    if p["fast_front"] and not (regime == "warp" and p["exact"] and p["stage"] == "reg"):
        return "fast_front only applies to exact register-resident warp-regime variants"
    if p["w_el"] and not (p["exact"] and p["stage"] == "reg"):
        return "w_el only applies to exact register-resident variants"
    if p["w_el"] and o["weight"] == "none" and not o["bias"]:
        return "w_el is moot without weight or bias"
    if threads % 32 or not 32 <= threads <= 1024:
        return f"threads={threads} must be a multiple of 32 in [32, 1024]"
    if threads * p["min_blocks"] > 2048:
        return f"threads * min_blocks = {threads * p['min_blocks']} exceeds 2048 threads per SM"
    if regime == "warp" and n > 64 * vec * p["row_threads"] and not p["exact"]:
        return f"warp regime: N={n} too long for {p['row_threads']} lanes per row (use block)"
    if regime == "cluster" and n < 8192:
        return f"cluster regime is for long rows (N={n} < 8192)"
    if p["exact"]:
        if n % (vec * p["cluster"] * p["ring_group"]):
            return f"exact variant needs N % {vec * p['cluster'] * p['ring_group']} == 0 (VEC={vec} x cluster x ring_group), N={n}"
        nv, vpt = _geometry(p, problem)
        if (nv % max(1, p["interleave"])) or threads % max(1, p["interleave"]):
            return f"interleave={p['interleave']} needs whole chunks: {nv} vectors per CTA and {threads} threads % {p['interleave']}"
        if nv < _group(p):
            return f"{_group(p)} lanes per row but only {nv} vectors: lanes would idle"
        if p["stage"] in ("smem", "bulk") and p["unroll"] > vpt:
            return f"unroll={p['unroll']} > {vpt} vectors per lane"
        if p["stage"] == "bulk" and p["bulk_reg"] and (nv % threads or p["bulk_reg"] >= vpt):
            return (f"bulk_reg={p['bulk_reg']} needs whole iterations ({nv} vectors % {threads} lanes == 0) "
                    f"and at least one in shared memory (< {vpt} vectors per lane)")
        if p["stage"] == "ring":
            nch, slots, sb = _ring(p, problem)
            if nv % threads or vpt % p["unroll"]:
                return f"stage=ring needs whole chunks: {nv} vectors % {threads} lanes, {vpt} iterations % unroll={p['unroll']}"
            if vpt > 64:
                return f"{vpt} vectors per lane is too many to unroll"
            if slots <= nch:
                return f"stage=ring: {slots} slots of {sb} bytes do not hold a row part ({nch} chunks) and one chunk more"
            if p["ring_skew"] and slots <= 2 * nch:
                return f"ring_skew: {slots} slots of {sb} bytes do not hold two row parts ({2 * nch} chunks) and one chunk more"
            need = _data_regs(p, problem) + REG_OVERHEAD
            if need > _reg_cap(p):
                return f"ring needs ~{need} registers per lane > {_reg_cap(p)} at {threads} threads x {p['min_blocks']}"
        if p["stage"] == "stream":
            if vpt > STREAM_MAX_VPT:
                return f"stage=stream: {vpt} vectors per lane > {STREAM_MAX_VPT} (the weight part held): use more threads or CTAs"
            smem = _stream_bytes(p, problem)
            if smem + SMEM_STATIC - 1024 > SMEM_LIMIT_BYTES or p["min_blocks"] * (smem + SMEM_STATIC) > SMEM_SM_BYTES:
                return (f"stage=stream: {p['stages']} row buffers of {smem // p['stages']} bytes x "
                        f"{p['min_blocks']} CTAs do not fit an SM's shared memory")
            need = _data_regs(p, problem) + REG_OVERHEAD
            if need > _reg_cap(p):
                return f"stream needs ~{need} registers per lane > {_reg_cap(p)} at {threads} threads x {p['min_blocks']}"
        if p["stage"] == "chunk":
            if p["unroll"] // 2 >= vpt:
                return f"stage=chunk: unroll={p['unroll']} for {vpt} vectors per lane (half the chunk would hold them all: use a smaller unroll)"
            need = _chunk_regs(p, problem)
            if need > _reg_cap(p):
                return f"chunk needs ~{need} registers per lane > {_reg_cap(p)}"
        if _smem_bytes(p, problem):                  # smem, block pipe: rows staged in shared memory
            smem = _smem_bytes(p, problem)
            what = {"pipe": "two staged rows need", "bulk": "the bulk-copied row part needs",
                    "ring": "the ring needs", "stream": "the stream's buffers need"}.get(p["stage"], "staged row part needs")
            if smem > SMEM_LIMIT_BYTES:
                return f"{what} {smem} bytes of shared memory > {SMEM_LIMIT_BYTES}"
            if smem * p["min_blocks"] > 228 * 1024:
                return f"{what} {smem} bytes of shared memory: min_blocks={p['min_blocks']} CTAs exceed the SM's"
        if p["stage"] == "bulk":                     # pass 2's batch: weight loads in flight
            need = _data_regs(p, problem) + REG_OVERHEAD
            if need > _reg_cap(p):
                return f"batch needs ~{need} registers per lane > {_reg_cap(p)} at {threads} threads x {p['min_blocks']}"
        if p["stage"] in ("reg", "pipe"):            # the row's data in registers
            if vpt > 64:
                return f"{vpt} vectors per lane is too many to unroll"
            need = _data_regs(p, problem) + REG_OVERHEAD
            if need > _reg_cap(p):
                return f"row needs ~{need} registers per lane > {_reg_cap(p)} at {threads} threads x {p['min_blocks']}"
    else:
        need = _data_regs(p, problem) + REG_OVERHEAD
        if need > _reg_cap(p):
            return f"batch needs ~{need} registers per lane > {_reg_cap(p)}"
        if regime != "warp" and n < threads * vec * p["cluster"] // 2:
            return f"N={n} leaves most of {threads} x {p['cluster']} lanes idle"
    return None


def default_params(problem: Problem) -> dict:
    """The documented default: by vectors per row NV = N / VEC (VEC = 8 for 16-bit x, 4 for fp32).

    * N % VEC != 0: generic (exact=False) warp regime (32 lanes, 256 threads) for N <= 2048,
      else generic block regime with 512 threads, unroll 4.
    * NV <= 256 (bf16/fp16 N <= 2048, fp32 N <= 1024): warp regime, exact, row_threads =
      min(32, NV), rows_per_group 2 when a lane holds one vector (more bytes in flight), 256 threads.
    * N <= 32768: block regime, exact, the fewest threads (>= 128) giving <= 4 vectors per lane
      that fits the registers; if none fits (fp32 with residual) the next cluster size.
    * N >= 65536: stage="ring" (persistent, bulk-copied chunks through a shared-memory ring, the next
      row part in flight through this one's reduction), one iteration per chunk, the smallest
      cluster in 1 (block) / 2 / 4 / 8 whose part and one chunk more fit the ring, at 1024 threads
      if they fit the registers, else 512; if none does (fp32 with a residual at 256K), as below.
    * larger N: cluster regime, exact, the smallest cluster in 2/4/8 whose part fits registers at
      512 or 1024 threads; else cluster 8 staged in shared memory (unroll 4, 512 then 1024
      threads); else cluster 8 chunked (512 threads, unroll 2); else generic cluster, else generic block.
    Loads ld.global.nc, rsqrt.approx, weight loaded in the epilogue, default stores.
    The first candidate of that list that passes check() is returned.
    """
    n = problem.shape[1]
    vec = _vec(problem.dtype)
    nv = n // vec
    base = {"load_hint": "nc", "rsqrt": "approx"}
    cands = []
    if n % vec:
        if n <= 2048:
            cands.append({"regime": "warp", "threads": 256, "exact": False, "unroll": 2})
        cands.append({"regime": "block", "threads": 512, "exact": False, "unroll": 4})
    elif nv <= 256:
        rt = min(32, 1 << int(math.log2(nv)))
        cands.append({"regime": "warp", "threads": 256, "row_threads": rt,
                      "rows_per_group": 2 if nv <= rt else 1})
    else:
        if n >= 65536:   # 1024 threads beat 512 by 4-9% at equal parts (run 27c, NOTES.md)
            for c in (1, 2, 4, 8):
                for t in (1024, 512):
                    cands.append({"regime": "block" if c == 1 else "cluster", "threads": t, "cluster": c,
                                  "stage": "ring", "load_hint": "none"})
        if n <= 32768:
            for t in (128, 256, 512, 1024):
                if nv <= 4 * t:
                    cands.append({"regime": "block", "threads": t})
            cands.append({"regime": "block", "threads": 1024})
        for c in (2, 4, 8):
            for t in (512, 1024):
                cands.append({"regime": "cluster", "threads": t, "cluster": c})
        cands.append({"regime": "cluster", "threads": 512, "cluster": 8, "stage": "smem", "unroll": 4})
        cands.append({"regime": "cluster", "threads": 1024, "cluster": 8, "stage": "smem", "unroll": 4})
        cands.append({"regime": "cluster", "threads": 512, "cluster": 8, "stage": "chunk", "unroll": 2})
        cands.append({"regime": "cluster", "threads": 1024, "cluster": 8, "exact": False, "unroll": 2})
        cands.append({"regime": "block", "threads": 1024, "exact": False, "unroll": 2})
    for c in cands:
        params = _full({**base, **c})
        if check(params, problem) is None:
            return params
    raise ValueError(f"no default config for {problem.label()}")


def render(params: dict, problem: Problem, arch: str) -> Kernel:
    p = _full(params)
    o = _opts(problem)
    regime = {"warp": 0, "block": 1, "cluster": 2}[p["regime"]]
    exact = bool(p["exact"])
    defs = {
        "DT": KIND[problem.dtype],
        "WT": {"none": 0, "x": 1, "fp32": 2}[o["weight"]],
        "HAS_BIAS": int(bool(o["bias"])),
        "HAS_RES": int(bool(o["residual"])),
        "RES_F32": int(bool(o["residual"] and o["residual_out_fp32"])),
        "HAS_RSTD": int(bool(o["rstd"])),
        "REGIME": regime,
        "THREADS": p["threads"],
        "MIN_BLOCKS": p["min_blocks"],
        "ROW_THREADS": p["row_threads"] if regime == 0 else 32,
        "RPG": p["rows_per_group"] if regime == 0 else 1,
        "CLUSTER": p["cluster"] if regime == 2 else 1,
        "EXACT": int(exact),
        "NC": problem.shape[1] if exact else 0,     # N enters the source only for exact variants
        "STAGE_SMEM": int(exact and p["stage"] == "smem"),
        "STAGE_PIPE": int(exact and p["stage"] == "pipe"),
        "STAGE_CHUNK": int(exact and p["stage"] == "chunk"),
        "STAGE_BULK": int(exact and p["stage"] == "bulk"),
        "BULK_REG": p["bulk_reg"] if exact and p["stage"] == "bulk" else 0,
        "UNROLL": p["unroll"],
        "LDH": LDH[p["load_hint"]],
        "STCS": int(bool(p["store_cs"])),
        "APPROX": int(p["rsqrt"] == "approx"),
        "WEARLY": int(exact and p["stage"] == "reg" and p["weight_load"] == "early"),
        "ENTRY": "rmsnorm_fwd",
    }
    # set only when on, after ENTRY, so that every variant without them renders as it did before
    defs.update({k: 1 for k, on in (("FAST_FRONT", p["fast_front"]), ("W_EL", p["w_el"])) if on})
    if p["interleave"]:                 # set only when on: every contiguous split renders as before
        defs["INTERLEAVE"] = p["interleave"]
    if exact and p["stage"] == "ring":
        defs.update(STAGE_RING=1, RING_SLOTS=_ring(p, problem)[1])
        if p["ring_group"] > 1:         # set only when on: every other ring renders as before
            defs["RING_GROUP"] = p["ring_group"]
        if p["ring_skew"]:
            defs["RING_SKEW"] = 1
    if exact and p["stage"] == "stream":  # set only when on: every other stage renders as before
        defs.update(STAGE_STREAM=1, NSTAGE=p["stages"])
    head = "".join(f"#define {k} {v}\n" for k, v in defs.items())
    return Kernel(source=head + SRC.read_text(), entry="rmsnorm_fwd")


def launch(params: dict, problem: Problem, sm_count: int) -> Launch:
    p = _full(params)
    m = problem.shape[0]
    t = p["threads"]
    smem = _smem_bytes(p, problem)
    if p["exact"] and p["stage"] == "stream":   # persistent, as ops/rmsnorm_bwd's _grid: SMs x min_blocks
        sms = min(sm_count or 132, MAX_SMS)
        c = p["cluster"]
        if p["regime"] == "cluster":
            grid = max(1, min(m, sms * p["min_blocks"] // c)) * c
            return Launch(grid=(grid, 1, 1), block=(t, 1, 1), smem_bytes=smem, cluster=(c, 1, 1), persistent=True)
        return Launch(grid=(max(1, min(m, sms * p["min_blocks"])), 1, 1), block=(t, 1, 1), smem_bytes=smem)
    if p["regime"] == "warp":
        rpb = t // p["row_threads"] * p["rows_per_group"]
        groups = -(-m // rpb)
        if p["exact"] and p["stage"] == "pipe" and sm_count:   # persistent: min_blocks per SM
            groups = min(groups, sm_count * p["min_blocks"])
        return Launch(grid=(groups, 1, 1), block=(t, 1, 1), smem_bytes=smem)
    if p["regime"] == "block":
        if p["exact"] and p["stage"] in ("pipe", "ring") and sm_count:   # persistent: min_blocks per SM
            g = p["ring_group"]           # ring_group: whole groups, all resident at once (the L2 sum waits)
            return Launch(grid=(g * max(1, min(m, sm_count * p["min_blocks"] // g)), 1, 1), block=(t, 1, 1), smem_bytes=smem)
        if p["ring_group"] > 1:
            return Launch(grid=(m * p["ring_group"], 1, 1), block=(t, 1, 1), smem_bytes=smem)
        return Launch(grid=(m, 1, 1), block=(t, 1, 1), smem_bytes=smem)
    c = p["cluster"]
    if p["exact"] and p["stage"] in ("pipe", "ring"):   # persistent clusters: the launcher clamps to those resident
        cap = m if not sm_count else min(m, max(1, sm_count * p["min_blocks"] // c))
        return Launch(grid=(cap * c, 1, 1), block=(t, 1, 1), smem_bytes=smem, cluster=(c, 1, 1), persistent=True)
    return Launch(grid=(m * c, 1, 1), block=(t, 1, 1), smem_bytes=smem, cluster=(c, 1, 1))


def bytes_moved(problem: Problem) -> int:
    o = _opts(problem)
    m, n = problem.shape
    xb = SIZE_BYTES[problem.dtype]
    wb = 4 if o["weight"] == "fp32" else xb
    total = 2 * m * n * xb                                    # x in, y out
    if o["residual"]:
        total += m * n * xb + m * n * (4 if o["residual_out_fp32"] else xb)
    if o["rstd"]:
        total += 4 * m
    total += n * wb * ((o["weight"] != "none") + bool(o["bias"]))
    return total


def verify_problems(problem: Problem, params: dict | None = None) -> list[Problem]:
    """M in {1, 199} at the problem's N; generic configs (params given, exact=False) also get
    N that are not multiples of 8 (N-1, N+3, and 760 / 1128 / 4095 or 13 / 100 / 250 for short rows).

    The verifier (ptxbuild/gpu/runs.py) runs the SAME binary on every shape: an exact binary serves
    only its N (it traps on another N), so only generic configs get other N. Persistent (pipe)
    configs also get an M at which every block loops over several rows.
    """
    n = problem.shape[1]
    out = [problem.with_shape((1, n)), problem.with_shape((199, n))]
    p = None if params is None else _full(params)
    if p is not None and p["exact"] and p["stage"] == "pipe" and p["regime"] == "block":
        out.append(problem.with_shape((1031, n)))   # persistent blocks: several rows each, both parities
    if p is not None and p["exact"] and p["stage"] == "pipe" and p["regime"] == "warp":
        # persistent lane groups: enough row groups that every block loops (up to 160 SMs), the last
        # group partial
        rpb = p["threads"] // p["row_threads"] * p["rows_per_group"]
        out.append(problem.with_shape((2 * MAX_SMS * p["min_blocks"] * rpb + 7, n)))
    if p is not None and p["exact"] and p["stage"] == "pipe" and p["regime"] == "cluster":
        # persistent clusters: every cluster loops over >= 2 rows (both slot sets and parities) on
        # up to 160 SMs, and some one row more than others
        # (4 x the clusters: every resident cluster gets >= 4 rows, so slot set 1 reaches parity 1)
        out.append(problem.with_shape((4 * MAX_SMS * p["min_blocks"] // p["cluster"] + 3, n)))
    if p is not None and p["exact"] and p["stage"] == "ring":
        # persistent blocks / clusters on up to 160 SMs: every worker loops over enough rows that each
        # slot is filled >= 3 times (both parities; the ring may hold several row parts), some one row more
        nch, slots, _ = _ring(p, problem)
        rows = max(4, -(-3 * slots // nch) + 1)
        out.append(problem.with_shape((rows * MAX_SMS * p["min_blocks"] // (p["cluster"] * p["ring_group"]) + 3, n)))
    if p is not None and p["exact"] and p["stage"] == "stream":
        # persistent workers on up to 160 SMs: each loops over >= 2 x stages + 1 rows (every buffer
        # refilled, both mbarrier parities and both row-sum slot sets), some one row more
        workers = MAX_SMS * p["min_blocks"] // p["cluster"]
        loop = (2 * p["stages"] + 1) * workers + 3
        if loop * n <= (1 << 28):
            out.append(problem.with_shape((loop, n)))
    if p is None or p["exact"]:
        return out
    extra = {n - 1, n + 3} if n > 8 else {n + 3}
    if n <= 2048:
        extra |= {760, 1128, 4095} if n > 512 else {13, 100, 250}
    for e in sorted(extra):
        out.append(problem.with_shape((199 if e <= 65536 else 3, e)))
    return out


# ------------------------------------------------------------------ contract: GPU side
def make_inputs(problem: Problem, seed: int, xp) -> dict:
    """x ~ N(0, 1) scaled; seed % 3 == 1 adds zero rows, seed % 3 == 2 large magnitudes.

    Drawn on xp's device (cupy: on the GPU, so a 2^31-element input costs milliseconds, not a host
    minute); a given (xp, seed) is reproducible, numpy and cupy draw different streams."""
    o = _opts(problem)
    m, n = problem.shape
    rng = xp.random.default_rng(seed)
    scale = {0: 1.0, 1: 2.0, 2: 300.0 if problem.dtype == "float16" else 1e4}[seed % 3]
    x = rng.standard_normal((m, n), dtype=xp.float32)
    x *= scale
    if seed % 3 == 1:
        x[:: max(1, m // 3)] = 0.0          # whole rows of zeros (rstd = 1/sqrt(eps))
    out = {"x": from_float(x, problem.dtype, xp)}
    del x
    if o["residual"]:
        r = rng.standard_normal((m, n), dtype=xp.float32)
        r *= 0.5 * scale
        if seed % 3 == 1:
            r[:: max(1, m // 3)] = 0.0
        out["residual"] = from_float(r, problem.dtype, xp)
        del r
    wdt = "float32" if o["weight"] == "fp32" else problem.dtype
    if o["weight"] != "none":
        w = 1.0 + 0.1 * rng.standard_normal(n, dtype=xp.float32)
        out["weight"] = from_float(w, wdt, xp)
    if o["bias"]:
        b = 0.1 * rng.standard_normal(n, dtype=xp.float32)
        out["bias"] = from_float(b, wdt, xp)
    return out


def make_outputs(problem: Problem, xp) -> dict:
    o = _opts(problem)
    m, n = problem.shape
    out = {"y": xp.empty((m, n), dtype=storage_dtype(problem.dtype, xp))}
    if o["residual"]:
        rdt = "float32" if o["residual_out_fp32"] else problem.dtype
        out["residual_out"] = xp.empty((m, n), dtype=storage_dtype(rdt, xp))
    if o["rstd"]:
        out["rstd"] = xp.empty((m,), dtype=xp.float32)
    return out


def kernel_args(params: dict, problem: Problem, inputs: dict, outputs: dict) -> list:
    o = _opts(problem)
    m, n = problem.shape
    none = np.uint64(0)
    return [inputs["x"], inputs.get("residual", none), inputs.get("weight", none),
            inputs.get("bias", none), outputs["y"], outputs.get("residual_out", none),
            outputs.get("rstd", none), np.int64(m), np.int64(n), np.float32(o["eps"])]


def _h(problem: Problem, inputs: dict, xp):
    """h as the kernel holds it (fp32 sum, rounded to residual_out's type), as float64."""
    o = _opts(problem)
    x = to_float(inputs["x"], problem.dtype, xp)
    if not o["residual"]:
        return x.astype(xp.float64)
    h = x + to_float(inputs["residual"], problem.dtype, xp)     # float32 add, like the kernel
    if not o["residual_out_fp32"]:
        h = to_float(from_float(h, problem.dtype, xp), problem.dtype, xp)
    return h.astype(xp.float64)


def reference(problem: Problem, inputs: dict, xp) -> dict:
    o = _opts(problem)
    wdt = "float32" if o["weight"] == "fp32" else problem.dtype
    h = _h(problem, inputs, xp)
    rstd = 1.0 / xp.sqrt(xp.mean(h * h, axis=1) + float(o["eps"]))
    y = h * rstd[:, None]
    if o["weight"] != "none":
        y = y * to_float(inputs["weight"], wdt, xp).astype(xp.float64)[None, :]
    if o["bias"]:
        y = y + to_float(inputs["bias"], wdt, xp).astype(xp.float64)[None, :]
    out = {"y": y}
    if o["residual"]:
        out["residual_out"] = h
    if o["rstd"]:
        out["rstd"] = rstd
    return out


def tolerance(problem: Problem, output: str) -> tuple[float, float]:
    if output == "residual_out":
        return (0.0, 0.0)                       # the same fp32 add and rounding: bit-exact
    if output == "rstd":
        return (0.0, 1e-5)
    return {"bfloat16": (3e-2, 1e-2), "float16": (5e-3, 2e-3), "float32": (1e-4, 1e-4)}[problem.dtype]
