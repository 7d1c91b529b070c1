"""KDA forward, stage 1 ("prepare"), as its own op: the token-parallel kernel kda_prepare of
ops/kda/kda_prepare.cu, one block per (chunk of 16 tokens, value head), writing the workspace
that the recurrence stage (ops/kda_recurrence) reads.

Problem.shape = (T_total, H); options as ops/kda (lengths, hv, K, V, gate, l2norm, initial_state,
final_state) plus op_dtype ("f16" | "bf16"): the element type of the workspace's mma operands.
op_dtype is a problem option, not a search parameter, because the workspace is the interface
between two separately searched targets: kda_prepare and kda_recurrence must agree on it (declare
the same options / modes for both in kernelfile.toml).

Inputs: bf16 q, k [T, H, K], v [T, HV, V], a [T, HV, K], b [T, HV]; fp32 g (given gate, or [1]),
A_log [HV], dt_bias [HV, K]; int32 chunk_start, chunk_len [NC]. Output: ws, uint32 [NC, HV, BLOB/4]
(ops/kda/workspace.py; uint32 words so that the poison check cannot mistake a written byte 0xFF for
an unwritten one: no correct word is all ones, as that would be two f16/bf16 NaNs or an f32 NaN).

Verified against workspace.encode() of the float64 chunk algebra (ops/kda/workspace_batched.py, on
the GPU under cupy; on the CPU it encodes byte for byte what ops/kda/reference.py's chunked form does),
field by field after decoding (compare): relative RMS of W, Qg, Kd, A_qk, U, gamma_last each
<= 2e-3 (op_dtype f16) / 8e-3 (bf16): bench_gpu.py's STAGE_RMS, which the H200 run passed with
~2e-4 / ~1.8e-3 (reports/h200-logs/run5-kda_quick.log). Above MAX_REF_CHUNKS chunks the reference
covers a sample of chunks (first and last of every segment + random ones); the others are marked
all ones in the reference and not compared (the full workspace of T = 8192, H = 96 costs ~90 s of
one CPU core by the per-chunk path).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ptxbuild.oploader import load_module
from ptxbuild.problem import Kernel, Launch, Problem

_KDA = Path(__file__).resolve().parent.parent / "kda"
host = load_module(_KDA / "kda_host.py", "kda_kda_host")   # shared with ops/kda and the other stage
ref, workspace = host.ref, host.workspace
batched = load_module(_KDA / "workspace_batched.py", "kda_workspace_batched")   # shared with ops/kda_recurrence

NAME = "kda_prepare"
VERSION = "0.1"
SOURCES = ["../kda/kda_common.cuh", "../kda/kda_prepare.cu", "../kda/kda_prepare_fast.cu", "../kda/kda_host.py",
           "../kda/reference.py", "../kda/workspace.py", "../kda/workspace_batched.py"]
DTYPES = ["bfloat16"]
OPTIONS = {**host.OPTIONS, "op_dtype": "f16"}
# prep_variant 0: kda_prepare.cu (per-pair exponentials, any gate); 1: kda_prepare_fast.cu (factored
# exponentials on tensor cores, safe gate, 128 threads). Same workspace, same source for variant 0.
SPACE = {"prep_threads": [128, 256], "prep_variant": [0, 1]}
SPILL_BUDGET_BYTES = 0
STAGE_RMS = {"f16": 2e-3, "bf16": 8e-3}
MAX_REF_CHUNKS = 64
_UNCHECKED = 0xFFFFFFFF
# recurrence-only defines, fixed so that they never change this kernel's source
_FILL = {"split": 1, "stages": 2}


def op_dtype(problem: Problem) -> str:
    return {**OPTIONS, **problem.opts}["op_dtype"]


def _full(params: dict, problem: Problem) -> dict:
    return {**_FILL, **params, "op_dtype": op_dtype(problem)}


def default_params(problem: Problem) -> dict:
    """128 threads per (chunk, head); variant 1 (kda_prepare_fast.cu) where check() allows it (the
    safe gate, K = V = 128), else variant 0. On the H200 variant 1 passed every case of the quick list
    and took 0.78 ms against 4.29 ms at H96 1x8192 (reports/h200-logs/run8-kda-variants.log)."""
    fast = {"prep_threads": 128, "prep_variant": 1}
    return fast if check(fast, problem) is None else {"prep_threads": 128, "prep_variant": 0}


def check(params: dict, problem: Problem) -> str | None:
    if reason := host.problem_error(problem):
        return reason
    d = host.dims(problem)
    if d["V"] % 16:
        return f"V={d['V']} is not a multiple of 16"
    if op_dtype(problem) not in STAGE_RMS:
        return f"op_dtype={op_dtype(problem)!r}: use one of {sorted(STAGE_RMS)}"
    if params["prep_threads"] % 32 or not 32 <= params["prep_threads"] <= 1024:
        return f"prep_threads={params['prep_threads']}: a multiple of 32 up to 1024"
    return host.prepare_variant_error(params, problem)


def render(params: dict, problem: Problem, arch: str) -> Kernel:
    return host.render_stage(_full(params, problem), problem, arch, "kda_prepare")


def launch(params: dict, problem: Problem, sm_count: int) -> Launch:
    return host.launches(_full(params, problem), problem, sm_count)["kda_prepare"]


def bytes_moved(problem: Problem) -> int:
    """q, k, v, a (or the fp32 gate), b read once; the workspace written once."""
    d = host.dims(problem)
    gate = d["K"] * (4 if d["gate"] == "given" else 2)
    read = d["T"] * (2 * d["H"] * d["K"] * 2 + d["HV"] * (d["V"] * 2 + gate + 2))
    return read + d["NC"] * d["HV"] * workspace.sizes(d["K"], d["V"])["BLOB"]


# ---------------------------------------------------------------- data
KERNEL_INPUTS = ("q", "k", "v", "a", "g", "b", "A_log", "dt_bias", "chunk_start", "chunk_len")


def make_inputs(problem: Problem, seed: int, xp) -> dict:
    ins = host.make_inputs(problem, seed, xp)        # drawn on the GPU under cupy
    return {k: ins[k] for k in KERNEL_INPUTS}


def _words(problem: Problem) -> tuple[int, int, int]:
    d = host.dims(problem)
    return d["NC"], d["HV"], workspace.sizes(d["K"], d["V"])["BLOB"] // 4


def make_outputs(problem: Problem, xp) -> dict:
    return {"ws": xp.zeros(_words(problem), xp.uint32)}


def kernel_args(params: dict, problem: Problem, inputs: dict, outputs: dict) -> list:
    return host.stage_args("kda_prepare", problem, inputs, outputs["ws"], outputs)


def reference_chunks(problem: Problem, inputs: dict) -> np.ndarray:
    """The chunks the reference computes: all of them up to MAX_REF_CHUNKS, else the first and last
    chunk of every segment (short tails, segment starts) and random others (seeded by the inputs)."""
    NC = _words(problem)[0]
    if NC <= MAX_REF_CHUNKS:
        return np.arange(NC)
    cu = np.concatenate([[0], np.cumsum(host.dims(problem)["lengths"])]).astype(np.int64)
    _, _, co = ref.chunk_layout(cu, host.CH)
    ends = {int(c) for n in range(len(co) - 1) if co[n + 1] > co[n] for c in (co[n], co[n + 1] - 1)}
    rng = np.random.default_rng(int(host.host(inputs["b"]).ravel()[:256].astype(np.int64).sum()))
    rest = rng.permutation(np.setdiff1d(np.arange(NC), sorted(ends)))
    return np.sort(np.concatenate([sorted(ends), rest[:max(0, MAX_REF_CHUNKS - len(ends))]]).astype(np.int64))


def reference(problem: Problem, inputs: dict, xp) -> dict:
    """workspace.encode() of the float64 chunk algebra (ops/kda/workspace_batched.py: on the GPU under
    cupy), as uint32 words; chunks outside reference_chunks() are all ones (not compared)."""
    pre = ref.preprocess(host.case_from_inputs(problem, inputs))
    ids = reference_chunks(problem, inputs)
    want = np.full(_words(problem), _UNCHECKED, np.uint32)
    want[ids] = batched.workspace_chunks(pre, ids, op_dtype(problem), ref, workspace, xp).view(np.uint32)
    return {"ws": xp.asarray(want)}


def compare(problem: Problem, output: str, got, want, xp):
    """Decode both workspaces; relative RMS per field <= STAGE_RMS[op_dtype]; non-finite fails."""
    d = host.dims(problem)
    got, want = host.host(got), host.host(want)
    ids = np.flatnonzero(want[:, 0, 0] != _UNCHECKED)
    dt = op_dtype(problem)
    dec = lambda w: workspace.decode(np.ascontiguousarray(w[ids]).view(np.uint8), len(ids), d["HV"], d["K"], d["V"], dt)
    g, w = dec(got), dec(want)
    errs = {n: ref.rel_rms(g[n], w[n]) for n in ("W", "Qg", "Kd", "A_qk", "U", "gamma_last")}
    gate = STAGE_RMS[dt]
    worst = max(errs, key=errs.get)
    detail = (f"relative RMS per field over {len(ids)} of {len(want)} chunks (gate {gate:g}): "
              + " ".join(f"{n}={e:.2e}" for n, e in errs.items()))
    return errs[worst] <= gate, detail


def tolerance(problem: Problem, output: str) -> tuple[float, float]:
    """(0, relative-RMS gate): compare() judges the workspace per decoded field, not elementwise."""
    return 0.0, STAGE_RMS[op_dtype(problem)]


def verify_problems(problem: Problem, params: dict | None = None) -> list[Problem]:
    """Small shapes, the same binary (T and the segment lengths are runtime sizes): one short and
    partial chunks, several segments with short tails, an empty segment."""
    H = problem.shape[1]
    mk = lambda T, lengths=None: Problem.make(problem.op, problem.dtype, (T, H), {**problem.opts, "lengths": lengths})
    return [mk(16), mk(17), mk(37), mk(15, (0, 15)), mk(115, (17, 33, 65))]
