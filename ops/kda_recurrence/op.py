"""KDA forward, stage 2 ("recurrence"), as its own op: the kernel kda_recurrence of
ops/kda/kda_recurrence.cu, one block per (segment, value head, V-slice), fp32 state in registers,
reading the workspace that ops/kda_prepare writes (DEPENDS: its targets are built first).

Problem and options as ops/kda_prepare (op_dtype: the workspace's operand type, which this
kernel also rounds the state to for its MMAs; a problem option so both targets agree on it).

Inputs: ws uint32 [NC, HV, BLOB/4] (workspace.encode of the float64 chunk algebra, computed by
../kda/workspace_batched.py: on the GPU under cupy, as the worker calls make_inputs), fp32 h0 [N, HV, V, K]
(or [1]), int64 cu_seqlens, int32 chunk_offsets, seq_order; plus the raw bf16/fp32 inputs the
workspace was made from (q, k, v, a, b, g, A_log, dt_bias: read by the reference only, not by the
kernel; the verifier checks them unmodified like every input), and hT_unused (fp32 [1], passed as
the hT pointer when final_state is off: the kernel must not write it). Outputs: o bf16 [T, HV, V]
and, with final_state, hT fp32 [N, HV, V, K].

Verified against the float64 token recurrence (ops/kda/reference.py) of the raw inputs, by
compare(): relative RMS of o and of hT each <= 5e-3 (kda.md's gate for bf16 I/O), every value
finite. The H200 run measured 1.6e-3..1.7e-3 (o) and ~3e-4 (hT) with op_dtype f16, 2.9e-3..3.1e-3 /
~2.4e-3 with bf16 (reports/h200-logs/run5-kda_quick.log, rec_o_rms / rec_hT_rms).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ptxbuild.oploader import load_module
from ptxbuild.problem import Kernel, Launch, Problem

_KDA = Path(__file__).resolve().parent.parent / "kda"
host = load_module(_KDA / "kda_host.py", "kda_kda_host")   # shared with ops/kda and the other stage
ref, workspace = host.ref, host.workspace
batched = load_module(_KDA / "workspace_batched.py", "kda_workspace_batched")   # shared with ops/kda_prepare

NAME = "kda_recurrence"
VERSION = "0.1"
SOURCES = ["../kda/kda_common.cuh", "../kda/kda_recurrence.cu", "../kda/kda_host.py", "../kda/reference.py",
           "../kda/workspace.py", "../kda/workspace_batched.py"]
DTYPES = ["bfloat16"]
OPTIONS = {**host.OPTIONS, "op_dtype": "f16"}
SPACE = {"split": [1, 2, 4], "stages": [2, 3, 4]}
SPILL_BUDGET_BYTES = 0
DEPENDS = ["kda_prepare"]
_FILL = {"prep_threads": 128}   # prepare-only define, fixed so that it never changes this kernel's source


def op_dtype(problem: Problem) -> str:
    return {**OPTIONS, **problem.opts}["op_dtype"]


def _full(params: dict, problem: Problem) -> dict:
    return {**_FILL, **params, "op_dtype": op_dtype(problem)}


def default_params(problem: Problem) -> dict:
    """V-split: the smallest of 1, 2, 4 whose blocks (N * HV * split) fill 132 SMs; 2 stages (ops/kda)."""
    d = host.dims(problem)
    split = next((s for s in (1, 2, 4) if d["N"] * d["HV"] * s >= 132 and d["V"] % (16 * s) == 0), 1)
    while d["V"] % (16 * split):
        split //= 2
    return {"split": split, "stages": 2}


def check(params: dict, problem: Problem) -> str | None:
    if reason := host.problem_error(problem):
        return reason
    d = host.dims(problem)
    if d["V"] % (16 * params["split"]):
        return f"V={d['V']} is not a multiple of 16 * split={params['split']}"
    if op_dtype(problem) not in ("f16", "bf16"):
        return f"op_dtype={op_dtype(problem)!r}: use f16 or bf16"
    if params["stages"] < 2:
        return "stages < 2"
    if host.smem_bytes(params, problem) > 227 * 1024:
        return f"shared memory {host.smem_bytes(params, problem)} B > 227 KiB"
    return None


def render(params: dict, problem: Problem, arch: str) -> Kernel:
    return host.render_stage(_full(params, problem), problem, arch, "kda_recurrence")


def launch(params: dict, problem: Problem, sm_count: int) -> Launch:
    return host.launches(_full(params, problem), problem, sm_count)["kda_recurrence"]


def bytes_moved(problem: Problem) -> int:
    """The workspace read once, o written, fp32 initial / final states read / written."""
    d = host.dims(problem)
    ws = d["NC"] * d["HV"] * workspace.sizes(d["K"], d["V"])["BLOB"]
    state = d["N"] * d["HV"] * d["V"] * d["K"] * 4 * (int(d["h0"]) + int(d["hT"]))
    return ws + d["T"] * d["HV"] * d["V"] * 2 + state


# ---------------------------------------------------------------- data
KERNEL_INPUTS = ("h0", "cu_seqlens", "chunk_offsets", "seq_order")
REFERENCE_INPUTS = ("q", "k", "v", "a", "b", "g", "A_log", "dt_bias")


def make_inputs(problem: Problem, seed: int, xp) -> dict:
    case = host.case_for(problem, seed)
    ins = host.inputs_from_case(case, np)
    d = host.dims(problem)
    ws = workspace_of(case, op_dtype(problem), xp)
    out = {k: ins[k] for k in KERNEL_INPUTS + REFERENCE_INPUTS}
    out["ws"] = ws.view(np.uint32).reshape(d["NC"], d["HV"], -1)
    out["hT_unused"] = np.zeros(1, np.float32)
    return {k: xp.asarray(np.ascontiguousarray(v)) for k, v in out.items()}


def workspace_of(case: dict, op_dtype: str, xp, pieces: int | None = None) -> np.ndarray:
    """uint8 [NC, HV, BLOB]: every chunk's workspace. The chunk algebra runs batched (on the GPU under
    cupy), then workspace.encode in pieces on a thread pool (numpy releases the GIL there): in one
    thread the encode alone took ~25 s at T = 8192, H = 96, and with the rest of a seed's inputs a
    verification passed the worker's 60 s deadline (run 24a, ops/kda/NOTES.md)."""
    import os
    from concurrent.futures import ThreadPoolExecutor
    from types import SimpleNamespace
    pre = ref.preprocess(case)
    cs, cl, _ = ref.chunk_layout(pre["cu_seqlens"], batched.CH)
    f = batched.chunk_fields(pre, (cs, cl), xp)
    NC, C = len(cs), batched.CH
    fields = ("W", "Qg", "Kd", "A_qk", "U")

    def encode(c: range) -> np.ndarray:
        part = {n: getattr(f, n)[c.start * C:c.stop * C] for n in fields}
        return workspace.encode(SimpleNamespace(C=C, chunk_start=np.arange(len(c)) * C, chunk_len=np.full(len(c), C),
                                                gamma_last=f.gamma_last[c.start:c.stop], **part), op_dtype)
    n = max(1, min(pieces or os.cpu_count() or 1, NC // 8 or 1))
    bounds = np.linspace(0, NC, n + 1).astype(int)
    with ThreadPoolExecutor(n) as ex:
        return np.concatenate(list(ex.map(encode, [range(a, b) for a, b in zip(bounds[:-1], bounds[1:])])), axis=0)


def make_outputs(problem: Problem, xp) -> dict:
    d = host.dims(problem)
    out = {"o": xp.zeros((d["T"], d["HV"], d["V"]), xp.uint16)}
    if d["hT"]:
        out["hT"] = xp.zeros((d["N"], d["HV"], d["V"], d["K"]), xp.float32)
    return out


def kernel_args(params: dict, problem: Problem, inputs: dict, outputs: dict) -> list:
    outs = {**outputs, "hT": outputs.get("hT", inputs["hT_unused"])}
    return host.stage_args("kda_recurrence", problem, inputs, inputs["ws"], outs)


def reference(problem: Problem, inputs: dict, xp) -> dict:
    """float64 token recurrence of the raw inputs (numba; T = 8192, H = 96 in seconds)."""
    o, hT = ref.reference(host.case_from_inputs(problem, inputs))
    out = {"o": xp.asarray(o)}
    if host.dims(problem)["hT"]:
        out["hT"] = xp.asarray(hT)
    return out


def compare(problem: Problem, output: str, got, want, xp):
    """Relative RMS <= 5e-3 (kda.md), all finite (kda_host.rms_verdict)."""
    return host.rms_verdict(output, got, want)


def tolerance(problem: Problem, output: str) -> tuple[float, float]:
    """(0, relative-RMS gate): compare() judges o and hT by relative RMS, not elementwise."""
    return 0.0, host.GATE_RMS


def verify_problems(problem: Problem, params: dict | None = None) -> list[Problem]:
    """Small shapes, the same binary (T and the segment lengths are runtime sizes)."""
    H = problem.shape[1]
    mk = lambda T, lengths=None: Problem.make(problem.op, problem.dtype, (T, H), {**problem.opts, "lengths": lengths})
    return [mk(16), mk(17), mk(37), mk(15, (0, 15)), mk(115, (17, 33, 65))]
