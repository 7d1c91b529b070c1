"""RMSNorm backward op: dx, dweight, dbias from x (or the residual sum h), dy, weight and rstd.

Math per row (r = rstd, g = dy * w, xh = x * r):
    dx = r * (g - xh * mean(g * xh)) = r * g - x * (r^3 * sum(g * x) / N)   (+ dres)
    dweight = sum over rows of dy * xh      dbias = sum over rows of dy     (fp32 accumulation)

Operands (row-major, rows of length N; bf16 as uint16 bits):
  inputs  x [M, N] dtype: the forward's input, or with option residual its residual sum h (the
          forward's residual_out, in x's dtype); dy [M, N] dtype; weight [N] fp32 or dtype (option
          weight = "fp32" | "x" | "none", as the forward); rstd [M] fp32, the forward's saved rstd
          (option rstd_in, default True; without it the kernel recomputes rstd from the row it holds:
          sum x^2 in the same pass as sum g*x, so no extra bytes); dres [M, N] dtype, the gradient
          arriving at residual_out (options residual and dresidual_in).
  outputs dx [M, N] dtype: with a residual this is the gradient of both forward inputs, x and
          residual (h = x + residual passes it to both unchanged: one tensor, returned twice by the
          autograd, not written twice); dweight [N] in the weight's type; dbias [N] in the weight's
          type (x's when weight = "none", option bias); partials (SCRATCH, fp32): [0] the number of
          partial rows P (an int), then dweight partials [PSTRIDE, N] from float 4, then dbias's.
Two kernels (KERNELS, launches, stage_args), one stream:
  rmsnorm_bwd         persistent grid: row groups (G lanes, a block, or a cluster of CTAs) loop over
                      rows q, q + Q, ...; weight in registers; per-block fp32 partial rows of dweight /
                      dbias written to scratch once at the end (cluster: each CTA its columns)
  rmsnorm_bwd_reduce  sums the P partial rows in a fixed order (deterministic, no atomics), casts to
                      dweight's / dbias's type (omitted when there is neither)
See rmsnorm_bwd.cu for the regimes; NOTES.md for the floor and the predictions.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ptxbuild.dtypes import SIZE_BYTES, from_float, storage_dtype, to_float
from ptxbuild.problem import Kernel, Launch, Problem

NAME = "rmsnorm_bwd"
VERSION = "1"
SOURCES = ["rmsnorm_bwd.cu"]
DTYPES = ["bfloat16", "float16", "float32"]
OPTIONS = {"weight": "x", "bias": False, "residual": False, "dresidual_in": False,
           "rstd_in": True, "eps": 1e-6}
SPILL_BUDGET_BYTES = 0
KERNELS = ["rmsnorm_bwd", "rmsnorm_bwd_reduce"]
SCRATCH = {"partials"}

# The first value of each list is what a regime that ignores the parameter must use.
SPACE = {
    "regime": ["block", "warp", "cluster"],   # a block per row / row_threads lanes per row, several
                                              # rows per block / a row split over a cluster of CTAs
    "threads": [256, 128, 32, 64, 96, 192, 384, 512, 768, 1024],
    "row_threads": [32, 16, 8, 4],            # warp regime: lanes per row (shuffle-only row sums)
    "cluster": [1, 2, 4, 8, 16],              # cluster regime: CTAs per row (DSMEM row sums; 16 is
                                              # non-portable: the launchers set the attribute)
    "stage": ["reg", "pass2", "smem"],        # reg: the row part held in registers; pass2 (cluster
                                              # regime): two passes per row in batches, the second
                                              # re-reading x, dy (L2), the weight read per batch;
                                              # smem (block, cluster): the row part of x, dy (, dres)
                                              # staged once in shared memory by bulk copies
    "stages": [1, 2, 3, 4, 6, 8],             # smem: row buffers in the ring (stages - 1 rows ahead)
    "prefetch": [True, False],                # reg: the next row's x, dy issued before this row's math
    "unroll": [1, 2, 4],                      # pass2: vectors per lane per batch
    "vec_bytes": [16, 8],                     # bytes per x vector (ld/st .v4 or .v2)
    "blocks_per_sm": [1, 2, 3, 4, 6, 8],      # persistent grid = SMs x this; also __launch_bounds__
    "load_hint": ["nc", "none", "nc_na", "ef"],   # ld.global.nc / ld.global / .nc.L1::no_allocate /
                                              # + an L2 evict_first policy (x, dy, dres)
    "store_cs": [False, True],                # st.global.cs for dx
    "rsqrt": ["approx", "precise"],           # without rstd_in: rsqrt.approx.f32 or 1 / sqrt.rn
    "pdl": [False, True],                     # the reduce kernel as a programmatic dependent launch
    "red_threads": [256, 128, 512],           # reduce kernel: threads per block
    "red_split": [8, 4, 16, 32],              # reduce kernel: row slices per block (threads / this
                                              # column vectors of 4 floats per block)
}

MAX_SMS = 160              # scratch holds partial rows for up to this many SMs (H100/H200 132, B200 148)
SMEM_LIMIT_BYTES = 227 * 1024
SMEM_SM_BYTES = 228 * 1024     # per SM, of which 1 KB per block is reserved by the system
SMEM_STATIC = 2 * 1024         # stage=smem: that 1 KB + the static barriers and row-sum slots (< 1 KB)
KIND = {"bfloat16": 0, "float16": 1, "float32": 2}
LDH = {"none": 0, "nc": 1, "nc_na": 2, "ef": 3}
SRC = Path(__file__).with_name("rmsnorm_bwd.cu")


# ------------------------------------------------------------------ problem helpers
def _opts(problem: Problem) -> dict:
    return {**OPTIONS, **problem.opts}


def _full(params: dict) -> dict:
    return {**{k: v[0] for k, v in SPACE.items()}, **params}


def _wdt(problem: Problem) -> str:
    """The weight's / dweight's / dbias's element type."""
    return "float32" if _opts(problem)["weight"] == "fp32" else problem.dtype


def _vec(p: dict, problem: Problem) -> int:
    return p["vec_bytes"] // SIZE_BYTES[problem.dtype]


def _group(p: dict) -> int:
    return p["row_threads"] if p["regime"] == "warp" else p["threads"]


def _geometry(p: dict, problem: Problem) -> tuple[int, int, int]:
    """(elements of a CTA's row part, its vectors, vectors per lane)."""
    np_ = problem.shape[1] // p["cluster"]
    nvp = np_ // _vec(p, problem)
    return np_, nvp, -(-nvp // _group(p))


def bps_max(n: int) -> int:
    """Blocks per SM the scratch is sized for at row length n (check() refuses more)."""
    return 8 if n <= 2048 else 4 if n <= 8192 else 2 if n <= 32768 else 1


def pstride(problem: Problem) -> int:
    """Partial rows the scratch holds: at most one per block (cluster) of the persistent grid."""
    m, n = problem.shape
    return max(1, min(m, MAX_SMS * bps_max(n)))


def _nsums(problem: Problem) -> int:
    """Column sums the op produces: dweight (weight given), dbias (bias)."""
    o = _opts(problem)
    return (o["weight"] != "none") + bool(o["bias"])


def _reg_cap(p: dict) -> int:
    """ptxas's register cap under __launch_bounds__(threads, blocks_per_sm): each of the SM's four
    sub-partitions (16K registers) holds a quarter of the warps, rounded up (96 threads x 3: 168)."""
    per_part = -(-(p["threads"] // 32 * p["blocks_per_sm"]) // 4)
    return min(255, 16384 // (per_part * 32) // 8 * 8)


def _data_regs(p: dict, problem: Problem) -> int:
    """Words a lane keeps live: the weight, the fp32 partial sums, the row buffers."""
    o = _opts(problem)
    vec = _vec(p, problem)
    xw = p["vec_bytes"] // 4
    ww = vec * SIZE_BYTES[_wdt(problem)] // 4 if o["weight"] != "none" else 0
    streams = 2 + bool(o["residual"] and o["dresidual_in"])
    _, _, vpt = _geometry(p, problem)
    if p["stage"] == "reg":
        return vpt * (ww + vec * _nsums(problem)) + vpt * streams * xw * (2 if p["prefetch"] else 1)
    if p["stage"] == "smem":     # weight and sums held, one vector of each stream read from smem
        return vpt * (ww + vec * _nsums(problem)) + streams * xw
    return p["unroll"] * (streams * xw + ww + vec)   # pass2: one batch (the sums are in shared memory)


# registers ~ A * data words + B, fitted to ptxas (sm_90a, CUDA 13.0) over the regimes: 16-bit rows
# are unpacked to floats for the math (hence A > 1), and without prefetch ptxas keeps more of them
# live; every config check() accepts compiles without spills (tests/test_rmsnorm_bwd_op.py)
REG_MODEL = {(True, "reg", True): (1.7, 24), (True, "reg", False): (2.7, 25),
             (False, "reg", True): (1.0, 50), (False, "reg", False): (1.45, 40),
             (True, "pass2", True): (1.2, 40), (False, "pass2", True): (1.2, 40),
             (True, "smem", True): (1.2, 40), (False, "smem", True): (1.0, 30)}


def _regs(p: dict, problem: Problem) -> int:
    a, b = REG_MODEL[(SIZE_BYTES[problem.dtype] == 2, p["stage"], p["prefetch"])]
    return int(a * _data_regs(p, problem) + b)


def _streams(problem: Problem) -> int:
    """Row streams read: x, dy (+ dres)."""
    o = _opts(problem)
    return 2 + bool(o["residual"] and o["dresidual_in"])


def _smem_bytes(p: dict, problem: Problem) -> int:
    """Dynamic shared memory: stage=pass2's fp32 sums of the CTA's columns; stage=smem's ring of row
    buffers; the warp regime's per-warp partial rows (several groups per block)."""
    np_, _, _ = _geometry(p, problem)
    if p["stage"] == "smem":
        return p["stages"] * _streams(problem) * np_ * SIZE_BYTES[problem.dtype]
    if p["stage"] == "pass2":
        return np_ * 4 * _nsums(problem)
    if p["regime"] == "warp" and p["threads"] > p["row_threads"] and _nsums(problem):
        return p["threads"] // 32 * np_ * 4
    return 0


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
    if o["dresidual_in"] and not o["residual"]:
        return "dresidual_in needs residual=True"
    for k, v in p.items():
        if k not in SPACE:
            return f"unknown parameter {k}"
        if v not in SPACE[k] or type(v) is not type(SPACE[k][0]):
            return f"{k}={v!r} is not one of {SPACE[k]}"
    m, n = problem.shape
    canon = {k: v[0] for k, v in SPACE.items()}
    regime, threads, c = p["regime"], p["threads"], p["cluster"]
    if regime != "warp" and p["row_threads"] != canon["row_threads"]:
        return "row_threads only applies to the warp regime (leave 32)"
    if regime == "warp" and threads < p["row_threads"]:
        return f"threads={threads} < row_threads={p['row_threads']}"
    if regime != "cluster" and c != 1:
        return "cluster only applies to the cluster regime (leave 1)"
    if regime == "cluster" and c == 1:
        return "the cluster regime needs cluster >= 2"
    if regime == "cluster" and n < 8192:
        return f"the cluster regime is for long rows (N={n} < 8192)"
    if p["stage"] == "pass2" and regime != "cluster":
        return "stage=pass2 is for the cluster regime's long rows (a block's row part fits registers)"
    if p["stage"] != "reg" and p["prefetch"] != canon["prefetch"]:
        return "prefetch only applies to stage=reg (leave True)"
    if p["stage"] != "pass2" and p["unroll"] != canon["unroll"]:
        return "unroll only applies to stage=pass2 (leave 1)"
    if p["stage"] != "smem" and p["stages"] != canon["stages"]:
        return "stages only applies to stage=smem (leave 1)"
    if p["stage"] == "smem" and regime == "warp":
        return "stage=smem is for the block and cluster regimes (a row group of a block or more)"
    if p["stage"] == "smem" and p["load_hint"] not in ("nc", "ef"):
        return "stage=smem loads by bulk copy: load_hint none / nc_na are moot (nc or ef)"
    if o["rstd_in"] and p["rsqrt"] != canon["rsqrt"]:
        return "rsqrt is moot with rstd_in (the forward's rstd is read)"
    if not _nsums(problem) and (p["pdl"], p["red_threads"], p["red_split"]) != (
            canon["pdl"], canon["red_threads"], canon["red_split"]):
        return "no dweight / dbias: there is no reduce kernel (leave pdl, red_threads, red_split)"
    if p["red_split"] > p["red_threads"]:
        return f"red_split={p['red_split']} > red_threads={p['red_threads']}"
    vec = _vec(p, problem)
    if n % 4 or n % (vec * c):
        return f"N={n} must be a multiple of 4 and of VEC x cluster = {vec * c}"
    np_, nvp, vpt = _geometry(p, problem)
    if np_ % 4:
        return f"a CTA's part of {np_} elements must be a multiple of 4"
    if nvp < _group(p):
        return f"{_group(p)} lanes per row but only {nvp} vectors: lanes would idle"
    if vpt > 32:
        return f"{vpt} vectors per lane is too many to unroll"
    if p["stage"] == "pass2" and p["unroll"] > vpt:
        return f"unroll={p['unroll']} > {vpt} vectors per lane"
    if p["stage"] == "smem" and vpt > 8:
        return f"{vpt} vectors per lane with the row part in shared memory: use more threads (<= 8)"
    xb = SIZE_BYTES[problem.dtype]
    if p["stage"] == "smem" and (np_ * xb % 16 or n * xb % 16):
        return f"bulk copies need 16-byte parts and rows ({np_} and {n} elements of {xb} bytes)"
    if p["blocks_per_sm"] > bps_max(n):
        return f"blocks_per_sm={p['blocks_per_sm']} > {bps_max(n)} (the partials' scratch is sized for that at N={n})"
    if threads * p["blocks_per_sm"] > 2048:
        return f"threads x blocks_per_sm = {threads * p['blocks_per_sm']} > 2048 threads per SM"
    smem = _smem_bytes(p, problem)
    if p["stage"] == "smem" and p["blocks_per_sm"] * (smem + SMEM_STATIC) > SMEM_SM_BYTES:
        return (f"{p['stages']} row buffers of {smem // p['stages']} bytes x {p['blocks_per_sm']} "
                f"blocks do not fit an SM's shared memory")
    if smem > SMEM_LIMIT_BYTES or smem * p["blocks_per_sm"] > 228 * 1024:
        return f"{smem} bytes of shared memory per block x {p['blocks_per_sm']} do not fit an SM"
    need = _regs(p, problem)
    if need > _reg_cap(p):
        return f"~{need} registers per lane > {_reg_cap(p)} at {threads} threads x {p['blocks_per_sm']}"
    return None


def _smem_cands(problem: Problem, min_stages: int, ahead: int) -> list[dict]:
    """stage=smem configs: the fewest CTAs per row (1 = a block per row, 2 blocks per SM first: one
    computes while the other waits at its row barrier) whose rings hold >= min_stages row buffers
    each with >= `ahead` bytes of rows in flight per SM, the most buffers that fit (<= 8), at the
    fewest threads (256, 512, 1024) giving <= 2, then <= 4 vectors per lane."""
    n = problem.shape[1]
    xb = SIZE_BYTES[problem.dtype]
    out = []
    for c, bps in ((1, 2), (1, 1), (2, 1), (4, 1), (8, 1), (16, 1)):
        stage_bytes = _streams(problem) * (n // c) * xb
        s = min(8, (SMEM_SM_BYTES // bps - SMEM_STATIC) // stage_bytes)
        s = max([k for k in SPACE["stages"] if k <= s], default=0)
        if s < min_stages or bps * (s - 1) * stage_bytes < ahead:
            continue
        regime = {"regime": "block"} if c == 1 else {"regime": "cluster", "cluster": c}
        for most in (2, 4, 32):
            for t in (256, 512, 1024):
                if -(-(n // c // (16 // xb)) // t) <= most:
                    out.append({**regime, "threads": t, "stage": "smem", "stages": s,
                                "blocks_per_sm": bps})
    return out


def default_params(problem: Problem) -> dict:
    """The documented default, by 16-byte vectors per row NV = N / VEC:

    * NV <= 256: warp regime, 256 threads, row_threads = min(32, NV), the row in registers with the
      next row prefetched, the most blocks per SM (8, 4, 2, 1) that fit the registers.
    * else a block per row at the fewest threads (128..1024) giving <= 4 vectors per lane that fit
      (prefetch on, then off), the most blocks per SM that fit;
    * else a cluster of 2, 4, 8, 16 (reg, prefetch on then off);
    * then stage=smem (_smem_cands: >= 2 row buffers and >= 64 KB of rows in flight, then >= 2
      buffers, then one), then stage=pass2 (unroll 2, then 1) at 4, 8, 16 CTAs.
    stage=smem comes first where the registers hold too little in flight (run26a on the H200: 72-80%
    of the floor with a residual from N = 4096 on, pass2 at 36-48%): a residual with dres and rows
    of >= 8 KB (bf16 N >= 4096), and rows of >= 256 KB (bf16 N >= 131072).
    ld.global.nc loads, default stores, no PDL, reduce 256 threads x 8 slices.
    """
    n = problem.shape[1]
    xb = SIZE_BYTES[problem.dtype]
    nv = n // (16 // xb)
    cands = []
    bps_list = (8, 6, 4, 3, 2, 1)
    smem = _smem_cands(problem, 2, 64 * 1024) + _smem_cands(problem, 2, 0)
    if (_streams(problem) == 3 and n * xb >= 8192) or n * xb >= 256 * 1024:
        cands += smem
    if nv <= 256:
        rt = min(32, 1 << int(math.log2(max(nv, 4))))
        for b in bps_list:
            cands.append({"regime": "warp", "threads": 256, "row_threads": rt, "blocks_per_sm": b})
    for pre in (True, False):
        for t in (128, 256, 512, 1024):
            if nv <= 4 * t:
                for b in bps_list:
                    cands.append({"regime": "block", "threads": t, "prefetch": pre, "blocks_per_sm": b})
    for c in (2, 4, 8, 16):
        for pre in (True, False):
            for t in (256, 512, 1024):
                cands.append({"regime": "cluster", "cluster": c, "threads": t, "prefetch": pre})
    cands += smem + _smem_cands(problem, 1, 0)
    for c in (4, 8, 16):
        for t in (512, 1024):
            for u in (2, 1):
                cands.append({"regime": "cluster", "cluster": c, "threads": t, "stage": "pass2", "unroll": u})
    for cand in cands:
        params = _full(cand)
        if check(params, problem) is None:
            return params
    raise ValueError(f"no default config for {problem.label()}")


def _defines(p: dict, problem: Problem) -> dict:
    o = _opts(problem)
    return {
        "DT": KIND[problem.dtype],
        "WT": {"none": 0, "x": 1, "fp32": 2}[o["weight"]],
        "HAS_DB": int(bool(o["bias"])),
        "RSTD_IN": int(bool(o["rstd_in"])),
        "HAS_DRES": int(bool(o["residual"] and o["dresidual_in"])),
        "THREADS": p["threads"],
        "MIN_BLOCKS": p["blocks_per_sm"],
        "G": _group(p),
        "CLUSTER": p["cluster"],
        "NC": problem.shape[1],
        "VB": p["vec_bytes"],
        "STAGE": {"reg": 0, "pass2": 1, "smem": 2}[p["stage"]],
        "NSTAGE": p["stages"],
        "PREFETCH": int(bool(p["prefetch"])),
        "UNROLL": p["unroll"],
        "LDH": LDH[p["load_hint"]],
        "STCS": int(bool(p["store_cs"])),
        "APPROX": int(p["rsqrt"] == "approx"),
        "PDL": int(bool(p["pdl"])),
        "RT": p["red_threads"],
        "RS": p["red_split"],
    }


def render(params: dict, problem: Problem, arch: str) -> Kernel:
    head = "".join(f"#define {k} {v}\n" for k, v in _defines(_full(params), problem).items())
    return Kernel(source=head + SRC.read_text(), entry="rmsnorm_bwd")


def _grid(p: dict, problem: Problem, sm_count: int) -> int:
    """CTAs of the persistent grid: SMs x blocks_per_sm, no more row groups than rows."""
    m = problem.shape[0]
    sms = min(sm_count or 132, MAX_SMS)
    if p["regime"] == "cluster":
        return max(1, min(m, sms * p["blocks_per_sm"] // p["cluster"])) * p["cluster"]
    groups = p["threads"] // _group(p)
    return max(1, min(-(-m // groups), sms * p["blocks_per_sm"]))


def launches(params: dict, problem: Problem, sm_count: int) -> dict:
    p = _full(params)
    n = problem.shape[1]
    c = p["cluster"]
    main = Launch(grid=(_grid(p, problem, sm_count), 1, 1), block=(p["threads"], 1, 1),
                  smem_bytes=_smem_bytes(p, problem), cluster=(c, 1, 1), persistent=c > 1)
    out = {"rmsnorm_bwd": main}
    if _nsums(problem):
        rc = p["red_threads"] // p["red_split"]
        out["rmsnorm_bwd_reduce"] = Launch(grid=(-(-(n // 4) // rc), 1, 1),
                                           block=(p["red_threads"], 1, 1), pdl=bool(p["pdl"]))
    return out


def launch(params: dict, problem: Problem, sm_count: int) -> Launch:
    return launches(params, problem, sm_count)["rmsnorm_bwd"]


def bytes_moved(problem: Problem) -> int:
    """Read x, dy (+ dres), write dx, read weight and rstd once, write dweight / dbias.

    The fp32 partial rows (P x N x 4 bytes written, then read by the reduce kernel, P = blocks of the
    persistent grid, <= 1280) are excluded: a perfect kernel still needs some cross-block sum, the
    partials are written once per block (not per row) and mostly read back from L2. They are <= 2% of
    the bytes on every benchmark row (32768 x 256 bf16: 0.5 MB of 50 MB), so the floor is honest to
    within that."""
    o = _opts(problem)
    m, n = problem.shape
    xb = SIZE_BYTES[problem.dtype]
    wb = SIZE_BYTES[_wdt(problem)]
    streams = 3 + bool(o["residual"] and o["dresidual_in"])      # x, dy, dx (+ dres)
    total = streams * m * n * xb
    if o["weight"] != "none":
        total += 2 * n * wb                                     # weight in, dweight out
    if o["bias"]:
        total += n * wb
    if o["rstd_in"]:
        total += 4 * m
    return total


def verify_problems(problem: Problem, params: dict | None = None) -> list[Problem]:
    """M in {1, 199} and an M at which every row group of the persistent grid loops over >= 2 rows
    and some one row more than others (up to MAX_SMS SMs), all at the problem's N.

    The binary has N compiled in (it traps on another N), so other N cannot run on it: the odd
    row lengths N = 760 and 1128 (and M in {1, 199} there) are verified as problems of their own,
    by the GPU tests (tests/test_rmsnorm_bwd_gpu.py) and the reference tests."""
    n = problem.shape[1]
    out = [problem.with_shape((1, n)), problem.with_shape((199, n))]
    p = _full(params or default_params(problem))
    groups = MAX_SMS * p["blocks_per_sm"] * (p["threads"] // _group(p)) // p["cluster"]
    loop = 2 * groups + 7
    if loop * n <= (1 << 28) and loop != problem.shape[0]:
        out.append(problem.with_shape((loop, n)))
    return out


# ------------------------------------------------------------------ contract: GPU side
def _row_chunks(m: int, n: int, elems: int = 1 << 25):
    step = max(1, elems // max(n, 1))
    for r in range(0, m, step):
        yield slice(r, min(m, r + step))


def make_inputs(problem: Problem, seed: int, xp) -> dict:
    """x ~ N(0, 1) scaled (seed % 3 == 1: whole zero rows, == 2: large magnitudes, as the forward's);
    dy ~ N(0, 1); weight 1 + 0.1 N(0, 1); rstd as the forward writes it (fp32, from the stored x);
    dres 0.5 N(0, 1). Drawn on xp's device."""
    o = _opts(problem)
    m, n = problem.shape
    rng = xp.random.default_rng(seed)
    scale = {0: 1.0, 1: 2.0, 2: 300.0 if problem.dtype == "float16" else 1e4}[seed % 3]
    x = rng.standard_normal((m, n), dtype=xp.float32)
    x *= scale
    if seed % 3 == 1:
        x[:: max(1, m // 3)] = 0.0
    out = {"x": from_float(x, problem.dtype, xp)}
    del x
    out["dy"] = from_float(rng.standard_normal((m, n), dtype=xp.float32), problem.dtype, xp)
    if o["weight"] != "none":
        w = 1.0 + 0.1 * rng.standard_normal(n, dtype=xp.float32)
        out["weight"] = from_float(w, _wdt(problem), xp)
    if o["rstd_in"]:
        out["rstd"] = _rstd(problem, out["x"], xp).astype(xp.float32)
    if o["residual"] and o["dresidual_in"]:
        d = rng.standard_normal((m, n), dtype=xp.float32)
        d *= 0.5
        out["dres"] = from_float(d, problem.dtype, xp)
    return out


def _rstd(problem: Problem, x, xp):
    """float64 rstd of every row of the stored x (row chunks: bounded temporaries)."""
    m, n = problem.shape
    eps = float(_opts(problem)["eps"])
    r = xp.empty(m, dtype=xp.float64)
    for s in _row_chunks(m, n):
        xs = to_float(x[s], problem.dtype, xp).astype(xp.float64)
        r[s] = 1.0 / xp.sqrt(xp.mean(xs * xs, axis=1) + eps)
    return r


def make_outputs(problem: Problem, xp) -> dict:
    o = _opts(problem)
    m, n = problem.shape
    out = {"dx": xp.empty((m, n), dtype=storage_dtype(problem.dtype, xp))}
    if o["weight"] != "none":
        out["dweight"] = xp.empty((n,), dtype=storage_dtype(_wdt(problem), xp))
    if o["bias"]:
        out["dbias"] = xp.empty((n,), dtype=storage_dtype(_wdt(problem), xp))
    out["partials"] = xp.empty((4 + pstride(problem) * n * _nsums(problem),), dtype=xp.float32)
    return out


def stage_args(entry: str, params: dict, problem: Problem, inputs: dict, outputs: dict) -> list:
    o = _opts(problem)
    m, n = problem.shape
    none = np.uint64(0)
    if entry == "rmsnorm_bwd":
        return [inputs["x"], inputs["dy"], inputs.get("weight", none), inputs.get("rstd", none),
                inputs.get("dres", none), outputs["dx"], outputs["partials"], np.int64(m),
                np.int64(n), np.int64(pstride(problem)), np.float32(o["eps"])]
    if entry == "rmsnorm_bwd_reduce":
        return [outputs["partials"], outputs.get("dweight", none), outputs.get("dbias", none),
                np.int64(n), np.int64(pstride(problem))]
    raise ValueError(f"unknown entry {entry!r} (one of {KERNELS})")


def kernel_args(params: dict, problem: Problem, inputs: dict, outputs: dict) -> list:
    return stage_args("rmsnorm_bwd", params, problem, inputs, outputs)


def reference(problem: Problem, inputs: dict, xp) -> dict:
    """float64 closed form from the stored inputs (row chunks); dx returned as float32 (exact enough
    for every dx tolerance, half the memory of float64 at 2^31 elements)."""
    o = _opts(problem)
    m, n = problem.shape
    rstd = (inputs["rstd"].astype(xp.float64) if o["rstd_in"]
            else _rstd(problem, inputs["x"], xp))
    w = (to_float(inputs["weight"], _wdt(problem), xp).astype(xp.float64)
         if o["weight"] != "none" else None)
    dx = xp.empty((m, n), dtype=xp.float32)
    dw = xp.zeros(n, dtype=xp.float64)
    db = xp.zeros(n, dtype=xp.float64)
    for s in _row_chunks(m, n):
        x = to_float(inputs["x"][s], problem.dtype, xp).astype(xp.float64)
        dy = to_float(inputs["dy"][s], problem.dtype, xp).astype(xp.float64)
        r = rstd[s][:, None]
        g = dy * w[None, :] if w is not None else dy
        c = (r ** 3) * xp.sum(g * x, axis=1, keepdims=True) / n
        d = r * g - x * c
        if "dres" in inputs:
            d += to_float(inputs["dres"][s], problem.dtype, xp).astype(xp.float64)
        dx[s] = d.astype(xp.float32)
        dw += xp.sum(dy * x * r, axis=0)
        db += xp.sum(dy, axis=0)
    out = {"dx": dx}
    if o["weight"] != "none":
        out["dweight"] = dw
    if o["bias"]:
        out["dbias"] = db
    return out


# dx: the forward's bands per dtype. dweight / dbias: rtol the output type's rounding, atol
# A[type] * sqrt(M): a column sum of M independent O(1) terms (dy ~ N(0, 1) times the normalized
# xh) is O(sqrt(M)); A[type] * sqrt(M) is the output's half-ulp at that size for 16-bit outputs
# (bf16 2^-9, fp16 2^-11) and, for fp32, above the fp32 accumulation error of the blocked sums at
# the benchmark's M (measured on the CPU: tests/test_rmsnorm_bwd_op.py).
DX_TOL = {"bfloat16": (3e-2, 1e-2), "float16": (5e-3, 2e-3), "float32": (1e-4, 1e-4)}
SUM_ATOL = {"bfloat16": 2e-3, "float16": 5e-4, "float32": 3e-5}
SUM_RTOL = {"bfloat16": 1e-2, "float16": 2e-3, "float32": 1e-4}


def tolerance(problem: Problem, output: str) -> tuple[float, float]:
    if output == "dx":
        return DX_TOL[problem.dtype]
    od = _wdt(problem)
    return (SUM_ATOL[od] * math.sqrt(problem.shape[0]), SUM_RTOL[od])
