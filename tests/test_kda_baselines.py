"""ops/kda/baselines.py on the CPU: a stand-in chunk_kda (no fla here) checks the argument
conversion, the op-layout outputs (views) and that inputs are converted once per input set."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import numpy as np
import pytest

from ptxbuild.oploader import load_op
from ptxbuild.problem import Problem

torch = pytest.importorskip("torch")
op = load_op("kda", Path(__file__).resolve().parents[1])
P = Problem.make("kda", "bfloat16", (37, 2), {"lengths": (17, 20)})


def fake_fla(monkeypatch, calls):
    def chunk_kda(
        q,
        k,
        v,
        g,
        beta,
        scale=None,
        initial_state=None,
        output_final_state=False,
        cu_seqlens=None,
        cu_seqlens_cpu=None,
        use_qk_l2norm_in_kernel=False,
        use_gate_in_kernel=False,
        safe_gate=False,
        lower_bound=None,
        A_log=None,
        dt_bias=None,
        state_v_first=False,
        use_beta_sigmoid_in_kernel=False,
    ):
        calls.append(
            dict(
                q=q,
                beta=beta,
                h0=initial_state,
                cu=cu_seqlens,
                v_first=state_v_first,
                safe=safe_gate,
            )
        )
        return torch.zeros_like(v), initial_state + 1

    mod = types.ModuleType("fla.ops.kda")
    mod.chunk_kda = chunk_kda
    for name, m in (
        ("fla", types.ModuleType("fla")),
        ("fla.ops", types.ModuleType("fla.ops")),
        ("fla.ops.kda", mod),
    ):
        monkeypatch.setitem(sys.modules, name, m)


def test_fla_baseline_converts_once_per_input_set_and_returns_the_ops_layout(monkeypatch):
    calls, made = [], []
    fake_fla(monkeypatch, calls)
    bmod = sys.modules[op.__name__ + "_baselines"]
    monkeypatch.setattr(
        bmod, "fla_call", lambda p, ins, f=bmod.fla_call: made.append(1) or f(p, ins)
    )
    fn = op.baselines(P)["fla_chunk_kda"]
    sets = [op.make_inputs(P, s, np) for s in (1, 2)]
    for ins in sets + sets:
        out = fn(ins)
    assert len(made) == 2 and len(calls) == 4  # two sets converted once each, four timed calls
    d = op.dims(P)
    assert out["o"].dtype == torch.bfloat16 and tuple(out["o"].shape) == (d["T"], d["HV"], d["V"])
    assert tuple(out["hT"].shape) == (d["N"], d["HV"], d["V"], d["K"])
    c = calls[-1]
    assert c["safe"] and c["v_first"] and c["cu"] is not None and c["beta"].dtype == torch.bfloat16
    # q is a view of the op's input (no copy): its bf16 bits are the input's
    assert np.array_equal(c["q"][0].view(torch.int16).numpy().view(np.uint16), sets[1]["q"])


def test_fla_baseline_without_fla_is_a_clear_runtime_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "fla", None)
    with pytest.raises(RuntimeError, match="fla-core"):
        op.baselines(P)["fla_chunk_kda"](op.make_inputs(P, 1, np))


def test_flashkda_baseline_passes_views_in_its_layout_once_per_input_set(tmp_path, monkeypatch):
    """FlashKDA (a stand-in flash_kda here): q, k, v, a, b, h0, cu_seqlens are views of the op's
    inputs in flash_kda.fwd's layout; out and final_state are allocated once per input set."""
    calls, made = [], []

    def fwd(
        q,
        k,
        v,
        g,
        beta,
        scale,
        out,
        A_log,
        dt_bias,
        lower_bound,
        initial_state=None,
        final_state=None,
        cu_seqlens=None,
    ):
        calls.append(
            dict(
                q=q,
                g=g,
                beta=beta,
                scale=scale,
                out=out,
                lb=lower_bound,
                h0=initial_state,
                hT=final_state,
                cu=cu_seqlens,
                dt_bias=dt_bias,
            )
        )
        out.fill_(1.0)
        final_state.copy_(initial_state)

    mod = types.ModuleType("flash_kda")
    mod.fwd = fwd
    monkeypatch.setitem(sys.modules, "flash_kda", mod)
    bmod = sys.modules[op.__name__ + "_baselines"]
    monkeypatch.setattr(bmod, "flashkda_built", lambda root=None: {"path": str(tmp_path)})
    monkeypatch.setattr(
        bmod,
        "flashkda_call",
        lambda p, ins, b, f=bmod.flashkda_call: made.append(1) or f(p, ins, b),
    )
    fn = op.baselines(P)["flashkda"]
    sets = [op.make_inputs(P, s, np) for s in (1, 2)]
    for ins in sets + sets:
        out = fn(ins)
    assert len(made) == 2 and len(calls) == 4
    d, c, ins = op.dims(P), calls[-1], sets[1]
    assert out["o"].dtype == torch.bfloat16 and tuple(out["o"].shape) == (d["T"], d["HV"], d["V"])
    assert bool((out["o"] == 1).all()) and np.array_equal(out["hT"].numpy(), ins["h0"])
    bits = lambda x: x.view(torch.int16).numpy().view(np.uint16)  # noqa: E731
    assert tuple(c["q"].shape) == (1, d["T"], d["H"], d["K"]) and np.array_equal(
        bits(c["q"][0]), ins["q"]
    )
    assert np.array_equal(bits(c["g"][0]), ins["a"]) and tuple(c["beta"].shape) == (
        1,
        d["T"],
        d["H"],
    )
    assert c["h0"].data_ptr() == ins["h0"].ctypes.data  # the op's V-first state as it is: no copy
    assert c["cu"].dtype == torch.int64 and c["cu"].tolist() == [0, 17, 37]
    assert (
        c["lb"] == -5.0
        and c["scale"] == 128**-0.5
        and tuple(c["dt_bias"].shape) == (d["H"], d["K"])
    )
    assert calls[1]["out"] is not calls[0]["out"] and calls[2]["out"] is calls[0]["out"]
