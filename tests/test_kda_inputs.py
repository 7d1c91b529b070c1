"""KDA inputs drawn on the device (cupy) match the host path in every key, shape, dtype and distribution."""
import types
from pathlib import Path

import numpy as np
import pytest

from ptxbuild.dtypes import to_float
from ptxbuild.oploader import load_module
from ptxbuild.problem import Problem

host = load_module(Path(__file__).resolve().parents[1] / "ops/kda/kda_host.py", "kda_kda_host")


def fake_device_xp():
    """numpy under another name: make_inputs takes its device branch (as for cupy)."""
    return types.SimpleNamespace(**{k: getattr(np, k) for k in dir(np) if not k.startswith("__")})


@pytest.mark.parametrize("opts", [{}, {"lengths": (100, 0, 412), "initial_state": False}, {"gate": "given", "hv": 8}])
def test_device_inputs_have_the_host_inputs_form_and_distributions(opts):
    p = Problem.make("kda", "bfloat16", (512, 4), opts)
    want = host.make_inputs(p, 3, np)
    got = host.make_inputs(p, 3, fake_device_xp())
    assert set(got) == set(want)
    for k in want:
        assert got[k].shape == want[k].shape and got[k].dtype == want[k].dtype, k
    for k in ("cu_seqlens", "chunk_start", "chunk_len", "chunk_offsets", "seq_order"):
        assert np.array_equal(got[k], want[k]), k
    for k in ("q", "k", "v", "a", "b"):
        x = to_float(got[k], "bfloat16", np)
        assert abs(float(x.mean())) < 0.05 and 0.95 < float(x.std()) < 1.05, k
    assert np.all((got["A_log"] >= 0) & (got["A_log"] <= np.log(16.0) + 1e-6))
    assert 0.8 < float(got["dt_bias"].std()) < 1.2
    if p.opts.get("initial_state", True):
        assert 0.08 < float(got["h0"].std()) < 0.12


def test_host_inputs_are_exactly_the_reference_cases():
    p = Problem.make("kda", "bfloat16", (64, 2), {})
    a, b = host.make_inputs(p, 5, np), host.inputs_from_case(host.case_for(p, 5), np)
    assert set(a) == set(b) and all(np.array_equal(a[k], b[k]) for k in a)
