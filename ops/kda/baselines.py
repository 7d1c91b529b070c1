"""KDA baselines timed beside the built kernels, on the op's inputs:
- `fla_chunk_kda`: flash-linear-attention's `chunk_kda` (fla-core 0.6.0, its own Triton kernels:
  FLA_FLASH_KDA=0 unless the environment says otherwise);
- `flashkda`: FlashKDA (MoonshotAI/FlashKDA 1ce47ea, Moonshot's CUTLASS kernel for sm_90a; issue 30),
  built on the GPU machine by benchmarks/flashkda_prepare.py into $FLASHKDA_BUILD_DIR (default
  <tempdir>/flashkda). Where it is not built, the baseline is not run and its entry says so.

Kept apart from op.py on purpose: baselines are not inputs of a kernel build (editing this rebuilds
nothing). The loader binds `baselines`; bench_gpu.py uses `fla_call` too (one conversion for both).
Inputs are the op's cupy arrays; torch sees them through DLPack views (no copy), made once per input
set outside the timed call. Outputs come back in the op's layout as views: o [T, HV, V] bf16 and
hT [N, HV, V, K] fp32, so the worker judges them with the op's compare() (FlashKDA: with its own
gate, see flashkda_compare).
"""
from __future__ import annotations

import inspect
import json
import os
import tempfile
from pathlib import Path

import numpy as np

from ptxbuild.oploader import load_module
from ptxbuild.problem import Problem

host = load_module(Path(__file__).resolve().parent / "kda_host.py", "kda_kda_host")

FLASHKDA_ENV = "FLASHKDA_BUILD_DIR"   # benchmarks/flashkda_prepare.py builds there (same default)
FLASHKDA_HOW = "benchmarks/flashkda_prepare.py: prepare where git is, `build` on the GPU machine"
# FlashKDA keeps the state in bf16 inside (an fp32 state is converted on load and store), so it misses
# the op's 5e-3 relative-RMS gate: kda.md measured 6.2e-3 (o) / 5.3e-3 (final state) at H96. It is
# timed as what it is; this gate still rejects a wrong conversion (a transposed state or a wrong
# gate gives a relative RMS near 1).
FLASHKDA_RMS_GATE = 2e-2


def flashkda_dir() -> Path:
    return Path(os.environ.get(FLASHKDA_ENV) or Path(tempfile.gettempdir()) / "flashkda")


def flashkda_built(root: Path | None = None) -> dict | None:
    """The FlashKDA build under `root` (default flashkda_dir()): its BUILT.json with "path", the folder
    to import flash_kda and flash_kda_C from; None where there is none. Files only: nothing imported
    (the host reads this at load, for BASELINES_VERSION)."""
    root = Path(root) if root is not None else flashkda_dir()
    try:
        built = json.loads((root / "BUILT.json").read_text())
    except (OSError, ValueError):
        return None
    where = root / built.get("import_dir", "src")
    if not (where / "flash_kda" / "__init__.py").is_file() or not any(where.glob("flash_kda_C*.so")):
        return None
    return {**built, "path": str(where)}


def baselines_version(built: dict | None) -> str:
    """Which baselines a cached timing saw: a build of FlashKDA (or its absence) is part of the key."""
    return "2" + (f"+flashkda-{built.get('digest', '')[:12]}" if built else "")


def not_built(root: Path | None = None) -> str:
    return f"FlashKDA: not built on this machine (see {FLASHKDA_HOW}; looked in {root or flashkda_dir()})"


def selected() -> set[str] | None:
    """$KDA_BASELINES: the names of the baselines to run, comma-separated (e.g. "flashkda": a short
    GPU run spares FLA's ~90 s of Triton autotuning per new shape); unset or empty: all of them."""
    names = {n.strip() for n in os.environ.get("KDA_BASELINES", "").split(",") if n.strip()}
    return names or None


FLASHKDA = flashkda_built()
# bump when the baselines change how they are timed (their cached timings are then re-measured);
# 2: FlashKDA beside FLA (issue 30). A selection of them is part of the key too.
BASELINES_VERSION = baselines_version(FLASHKDA) + (f"+only-{','.join(sorted(selected()))}" if selected() else "")


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


def flashkda_unsupported(d: dict) -> str | None:
    """Why FlashKDA cannot compute this problem (its interface: safe gate, L2 norm of q and k always,
    HV = H, K = V = 128, fp32 or bf16 states of one dtype), or None."""
    if d["gate"] != "safe":
        return f"FlashKDA computes only the safe gate (this problem: gate={d['gate']!r})"
    if not d["l2norm"]:
        return "FlashKDA always L2-normalises q and k (this problem: l2norm=False)"
    if d["HV"] != d["H"]:
        return f"FlashKDA has no GVA (this problem: HV={d['HV']}, H={d['H']})"
    if d["K"] != 128 or d["V"] != 128:
        return f"FlashKDA needs K = V = 128 (this problem: K={d['K']}, V={d['V']})"
    return None


def flashkda_layout(d: dict) -> dict:
    """The shape of each flash_kda.fwd argument for dims `d` (None: not passed). Every input is a view
    of the op's array (q, k, a [T, H, K] -> [1, T, H, K]; v -> [1, T, H, V]; b [T, H] -> [1, T, H];
    h0 [N, H, V, K] is already FlashKDA's V-first [N, H, V, K]); out and final_state are allocated once
    per input set. One sequence runs FlashKDA's batched path (no cu_seqlens), as FLA's is called."""
    T, H, K, V, N = d["T"], d["H"], d["K"], d["V"], d["N"]
    state = (N, H, V, K)
    return dict(q=(1, T, H, K), k=(1, T, H, K), v=(1, T, H, V), g=(1, T, H, K), beta=(1, T, H),
                out=(1, T, H, V), A_log=(H,), dt_bias=(H, K),
                initial_state=state if d["h0"] else None, final_state=state if d["hT"] else None,
                cu_seqlens=(N + 1,) if N > 1 else None)


def flashkda_compare(output: str, got, want):
    """FlashKDA's verdict: relative RMS of o (bf16 bits) / hT (fp32) <= FLASHKDA_RMS_GATE, all finite."""
    from ptxbuild.dtypes import to_float
    g = host.host(got)
    e = host.ref.rel_rms(to_float(g, "bfloat16", np) if output == "o" else g, host.host(want))
    return e <= FLASHKDA_RMS_GATE, (f"relative RMS {e:.3e} (FlashKDA's gate {FLASHKDA_RMS_GATE:g}; "
                                    f"the op's is {host.GATE_RMS:g}: FlashKDA's state is bf16 inside)")


def _flashkda(built: dict):
    import sys
    try:
        import torch
        if built["path"] not in sys.path:
            sys.path.insert(0, built["path"])
        import flash_kda
    except Exception as exc:  # noqa: BLE001 - a build that does not import here is reported, and retried
        raise RuntimeError(f"FlashKDA built in {built['path']} does not import here: {type(exc).__name__}: {exc} "
                           f"(rebuild it: {FLASHKDA_HOW})") from exc
    return torch, flash_kda


def flashkda_call(problem: Problem, inputs: dict, built: dict):
    """A closure running flash_kda.fwd once on `inputs` (views; its out and final_state allocated here,
    once), returning {"o", "hT"} in the op's layout."""
    torch, flash_kda = _flashkda(built)
    d = host.dims(problem)
    shape = flashkda_layout(d)
    t = torch.from_dlpack
    bf = lambda n, s: t(inputs[n]).view(torch.bfloat16).view(shape[s])   # noqa: E731 - uint16 bits -> bf16
    q, k, v, g, beta = bf("q", "q"), bf("k", "k"), bf("v", "v"), bf("a", "g"), bf("b", "beta")
    out = torch.empty(shape["out"], dtype=torch.bfloat16, device=q.device)
    kw = dict(initial_state=t(inputs["h0"]).view(shape["initial_state"]) if d["h0"] else None,
              final_state=torch.empty(shape["final_state"], dtype=torch.float32, device=q.device) if d["hT"] else None,
              cu_seqlens=t(inputs["cu_seqlens"]).view(shape["cu_seqlens"]) if d["N"] > 1 else None)
    A_log, dt_bias = t(inputs["A_log"]).view(shape["A_log"]), t(inputs["dt_bias"]).view(shape["dt_bias"])
    scale, lb = d["K"] ** -0.5, host.ref.LOWER_BOUND

    def run() -> dict:
        flash_kda.fwd(q, k, v, g, beta, scale, out, A_log, dt_bias, lb, **kw)
        res = {"o": out[0]}
        if d["hT"]:
            res["hT"] = kw["final_state"]
        return res
    return run


def baselines(problem: Problem, defaults: dict) -> dict:
    """name -> callable(inputs) -> outputs for `problem`, or -> the reason it is not run here (a str);
    `defaults` are the op's OPTIONS (dims reads them)."""
    def cached(make):
        """make(problem, inputs) once per input set: the conversion is not timed. Each baseline has its
        own cache, freed with it (the worker drops a timed baseline before the next one's check)."""
        calls = {}   # id of an input set's q -> (q, its closure)

        def call(inputs: dict) -> dict:
            key = id(inputs["q"])
            if key not in calls:   # q is kept so that its id is not reused by another set while cached
                calls[key] = (inputs["q"], make(problem, inputs))
            return calls[key][1]()
        return call

    def flashkda():
        built = flashkda_built()
        if built is None:
            return not_built()
        why = flashkda_unsupported(host.dims(problem))
        if why:
            return why
        try:   # torch first: the worker then runs FlashKDA's check on its own stream too, as its timing
            import torch  # noqa: F401
        except Exception:  # noqa: BLE001 - flashkda_call says why, at its call
            pass
        fn = cached(lambda p, ins: flashkda_call(p, ins, built))
        fn.compare = flashkda_compare
        return fn

    only = selected()
    makers = {"fla_chunk_kda": lambda: cached(fla_call), "flashkda": flashkda}
    return {n: make() for n, make in makers.items() if only is None or n in only}
