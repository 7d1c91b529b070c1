"""The prepare -> recurrence workspace layout round-trips, and the kernel's numerics (operands
rounded to f16 / bf16, fp32 state) stay inside the 5e-3 relative RMS gate, simulated on the CPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ptxbuild.oploader import load_op  # noqa: E402

KDA = load_op("kda", Path(__file__).resolve().parents[1])
ref, wsl = KDA.ref, KDA.workspace

ARGS = ("q", "k", "v", "g", "beta", "scale", "cu_seqlens", "h0")


def chunked_case(lens, H=2, **kw):
    case = ref.make_case(lens, H, seed=3, **kw)
    p = ref.preprocess(case)
    a = {n: p[n] for n in ARGS}
    return case, p, ref.recurrent(**a), ref.chunked(**a)


def test_fragment_indices_cover_each_element_once():
    K, V = 128, 64
    tok, chan = wsl.wq_index(K)
    assert sorted(zip(tok.ravel(), chan.ravel())) == [(r, d) for r in range(16) for d in range(K)]
    tok, chan = wsl.kd_index(K)
    assert sorted(zip(tok.ravel(), chan.ravel())) == [(r, d) for r in range(16) for d in range(K)]
    r, s = wsl.aq_index()
    assert sorted(zip(r.ravel(), s.ravel())) == [(i, j) for i in range(16) for j in range(16)]
    tok, v = wsl.u_index(V)
    assert sorted(zip(tok.ravel(), v.ravel())) == [(i, j) for i in range(16) for j in range(V)]
    # the mma.m16n8k16 B fragment: lane 4g+t holds (k = 2t + {0,1} (+8), n = g)
    tok, chan = wsl.wq_index(K)
    assert (tok[1, 4 * 3 + 2, 0, 1], chan[1, 4 * 3 + 2, 0, 1]) == (3, 16 + 4 + 1)
    assert (tok[1, 4 * 3 + 2, 3, 0], chan[1, 4 * 3 + 2, 3, 0]) == (11, 16 + 4 + 8)
    tok, chan = wsl.kd_index(K)
    assert (tok[2, 4 * 5 + 1, 1, 1], chan[2, 4 * 5 + 1, 1, 1]) == (2 + 8 + 1, 32 + 5)
    assert sizes_ok()


def sizes_ok():
    sz = wsl.sizes(128, 128)
    return sz["BLOB"] == 21504 and sz["U"] == 13312


@pytest.mark.parametrize("op_dtype", ["f16", "bf16"])
def test_encode_decode_round_trip(op_dtype):
    case, p, _, ch = chunked_case([37, 0, 20])
    ws = wsl.encode(ch, op_dtype)
    NC, HV = len(ch.chunk_start), 2
    d = wsl.decode(ws, NC, HV, 128, 128, op_dtype)
    tol = 1e-3 if op_dtype == "f16" else 8e-3
    for name in ("W", "Qg", "Kd", "U", "A_qk"):
        want = wsl.per_chunk(getattr(ch, name), ch)
        assert ref.rel_rms(d[name], want) < tol, name
    np.testing.assert_allclose(d["U"], wsl.per_chunk(ch.U, ch), rtol=1e-6, atol=1e-7)  # fp32
    np.testing.assert_allclose(d["gamma_last"], ch.gamma_last, rtol=1e-6)


@pytest.mark.parametrize("op_dtype,band", [("f16", 2.5e-3), ("bf16", 4.5e-3)])
def test_simulated_kernel_numerics(op_dtype, band):
    case, p, (o, hT), ch = chunked_case([300, 17, 160], H=2)
    ws = wsl.encode(ch, op_dtype)
    o_sim, h_sim = wsl.simulate(ws, ch, p["h0"], case["cu_seqlens"], op_dtype)
    assert ref.rel_rms(o_sim, o) < band
    assert ref.rel_rms(h_sim, hT) < band
