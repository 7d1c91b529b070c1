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


@pytest.mark.parametrize(
    "opts", [{}, {"lengths": (100, 0, 412), "initial_state": False}, {"gate": "given", "hv": 8}]
)
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


def test_chunk_order_runs_every_segment_side_by_side():
    """The overlapped prepare's task order (chunk_order): a permutation of the chunks, chunk j of
    every segment before chunk j + 1 of any, segments longest first within a position."""
    lens = [40, 17, 100, 0, 33]
    lay = host._layout(np.concatenate([[0], np.cumsum(lens)]).astype(np.int64))
    order, co = lay["chunk_order"], lay["chunk_offsets"]
    assert sorted(order.tolist()) == list(range(co[-1]))
    seg = np.searchsorted(co, order, side="right") - 1  # each chunk's segment
    pos = order - co[seg]  # its position in the segment
    assert (np.diff(pos) >= 0).all()
    rank = {int(n): r for r, n in enumerate(lay["seq_order"])}
    keys = [(int(p), rank[int(s)]) for p, s in zip(pos, seg)]
    assert keys == sorted(keys)
    assert order[:3].tolist() == [
        co[2],
        co[0],
        co[4],
    ]  # position 0 of the 100-, 40-, 33-token segments
