"""KDA baseline timed beside the built kernels: flash-linear-attention's `chunk_kda` (fla-core 0.6.0,
its own Triton kernels: FLA_FLASH_KDA=0 unless the environment says otherwise), on the op's inputs.

Kept apart from op.py on purpose: baselines are not inputs of a kernel build (editing this rebuilds
nothing). The loader binds `baselines`; bench_gpu.py uses `fla_call` too (one conversion for both).
Inputs are the op's cupy arrays; torch sees them through DLPack views (no copy), made once per input
set outside the timed call. Outputs come back in the op's layout as views: o [T, HV, V] bf16 and
hT [N, HV, V, K] fp32, so the worker judges them with the op's compare().
"""
from __future__ import annotations

import inspect
import os
from pathlib import Path

from ptxbuild.oploader import load_module
from ptxbuild.problem import Problem

host = load_module(Path(__file__).resolve().parent / "kda_host.py", "kda_kda_host")

# bump when the baselines change how they are timed (their cached timings are then re-measured)
BASELINES_VERSION = "1"


def _fla():
    os.environ.setdefault("FLA_FLASH_KDA", "0")   # read by fla at import: time its Triton chunk_kda
    try:
        import torch
        from fla.ops.kda import chunk_kda
    except Exception as exc:  # noqa: BLE001 - any import failure means "no baseline", said clearly
        raise RuntimeError(f"fla_chunk_kda needs torch and fla-core 0.6.0 (pip install fla-core==0.6.0): "
                           f"{type(exc).__name__}: {exc}") from exc
    return torch, chunk_kda


def fla_call(problem: Problem, inputs: dict):
    """A closure running chunk_kda once on `inputs` (safe gate in kernel, L2 norm, fp32 states),
    returning {"o", "hT"} in the op's layout. Raises RuntimeError for what it cannot compare."""
    torch, chunk_kda = _fla()
    d = host.dims(problem)
    if d["gate"] != "safe" or d["HV"] != d["H"]:
        raise RuntimeError(f"fla_chunk_kda is set up for the safe gate and HV = H (gate={d['gate']!r}, "
                           f"HV={d['HV']}, H={d['H']})")
    names = set(inspect.signature(chunk_kda).parameters)
    t = torch.from_dlpack
    bf = lambda n: t(inputs[n]).view(torch.bfloat16)[None]   # noqa: E731 - uint16 bits -> bf16, batch 1
    q, k, v, a, b = (bf(n) for n in ("q", "k", "v", "a", "b"))
    v_first = "state_v_first" in names          # else fla keeps states K-first: transposed views
    kw = dict(scale=d["K"] ** -0.5, output_final_state=d["hT"], use_qk_l2norm_in_kernel=d["l2norm"],
              use_gate_in_kernel=True, safe_gate=True, lower_bound=host.ref.LOWER_BOUND,
              A_log=t(inputs["A_log"]), dt_bias=t(inputs["dt_bias"]).reshape(-1),
              cu_seqlens=t(inputs["cu_seqlens"]) if d["N"] > 1 else None)
    if d["h0"]:
        h0 = t(inputs["h0"])                    # [N, HV, V, K]
        kw["initial_state"] = h0 if v_first else h0.transpose(-1, -2).contiguous()   # a copy, made once
    if v_first:
        kw["state_v_first"] = True
    if "use_beta_sigmoid_in_kernel" in names:
        kw["use_beta_sigmoid_in_kernel"] = True
        beta = b
    else:
        beta = torch.sigmoid(b.float()).to(torch.bfloat16)
    if d["N"] > 1 and "cu_seqlens_cpu" in names:
        kw["cu_seqlens_cpu"] = kw["cu_seqlens"].cpu()

    def run() -> dict:
        with torch.inference_mode():
            o, hT = chunk_kda(q, k, v, a, beta, **kw)
        out = {"o": o[0]}
        if d["hT"]:
            out["hT"] = hT if v_first else hT.transpose(-1, -2)
        return out
    return run


def baselines(problem: Problem, defaults: dict) -> dict:
    """name -> callable(inputs) -> outputs, for `problem`; `defaults` are the op's OPTIONS (dims reads them)."""
    calls = {}   # id of an input set's q -> (q, its chunk_kda closure): the conversion is not timed

    def fla_chunk_kda(inputs: dict) -> dict:
        key = id(inputs["q"])
        if key not in calls:   # q is kept so that its id is not reused by another set while cached
            calls[key] = (inputs["q"], fla_call(problem, inputs))
        return calls[key][1]()

    return {"fla_chunk_kda": fla_chunk_kda}
