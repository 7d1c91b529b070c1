"""The float64 KDA references agree with each other, with a naive loop, and across state hand-over."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from ptxbuild.oploader import load_op  # noqa: E402

KDA = load_op("kda", Path(__file__).resolve().parents[1])
ref = KDA.ref

ARGS = ("q", "k", "v", "g", "beta", "scale", "cu_seqlens", "h0")
TOL = 1e-12


def both(case, C=16):
    p = ref.preprocess(case)
    a = {n: p[n] for n in ARGS}
    o, hT = ref.recurrent(**a)
    ch = ref.chunked(**a, C=C)
    return o, hT, ch


def assert_agree(case, C=16):
    o, hT, ch = both(case, C)
    assert np.all(np.isfinite(o)) and np.all(np.isfinite(hT))
    assert np.all(np.isfinite(ch.O)) and np.all(np.isfinite(ch.hT))
    assert ref.rel_rms(ch.O, o) < TOL, ref.rel_rms(ch.O, o)
    assert ref.rel_rms(ch.hT, hT) < TOL, ref.rel_rms(ch.hT, hT)
    return o, hT, ch


@pytest.mark.parametrize("T", [16, 17, 37, 63, 97])
@pytest.mark.parametrize("H", [1, 4])
def test_chunked_matches_recurrent(T, H):
    o, hT, _ = assert_agree(ref.make_case([T], H, seed=T * 10 + H))
    assert np.abs(o).max() > 1e-3  # outputs are not trivially zero


@pytest.mark.parametrize("lens", [[4, 8, 12], [17, 33, 65], [0, 15], [0, 31, 0, 96]])
@pytest.mark.parametrize("h0", [True, False])
def test_varlen(lens, h0):
    case = ref.make_case(lens, 2, K=64, V=32, seed=len(lens), initial_state=h0)
    o, hT, ch = assert_agree(case)
    # every segment is independent: equals running it alone
    cu = case["cu_seqlens"]
    for n, ln in enumerate(lens):
        one = ref.make_case([ln], 2, K=64, V=32, seed=0, initial_state=h0)
        for key in ("q", "k", "v", "a", "b", "qf", "kf", "vf", "af", "bf"):
            one[key] = case[key][cu[n] : cu[n + 1]]
        one["A_log"], one["dt_bias"] = case["A_log"], case["dt_bias"]
        one["h0"] = case["h0"][n : n + 1] if h0 else None
        o1, h1 = ref.reference(one)
        np.testing.assert_allclose(o1, o[cu[n] : cu[n + 1]], rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(h1[0], hT[n], rtol=1e-12, atol=1e-13)
        if ln == 0:  # an empty segment hands its initial state through
            np.testing.assert_array_equal(hT[n], case["h0"][n] if h0 else 0.0)


@pytest.mark.parametrize("C", [8, 16, 32, 64])
def test_chunk_sizes(C):
    assert_agree(ref.make_case([100, 29], 2, K=32, V=16, seed=C), C=C)


@pytest.mark.parametrize(
    "kw",
    [
        dict(a_shift=8.0),
        dict(a_shift=-8.0),
        dict(a_scale=8.0),
        dict(bias_scale=8.0),
        dict(gate="canonical"),
        dict(gate="canonical", a_scale=8.0, bias_scale=8.0),
        dict(
            gate="canonical", a_shift=8.0, a_scale=0.0, bias_scale=0.0, A_log=math.log(125.0)
        ),  # g ~ -1000
        dict(gate="given"),  # all-zero decay
        dict(gate="given", g=-1000.0),
        dict(use_qk_l2norm=False, qk_scale=0.1, gate="given", g=-0.01, v_scale=4.0),
        dict(b_scale=8.0),
        dict(HV=4),  # GVA: 4 value heads over 2 q/k heads
    ],
    ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()),
)
def test_gate_stress_and_variants(kw):
    kw = dict(kw)
    H = 2
    case = ref.make_case([37, 16, 5], H, K=64, V=32, seed=7, **kw)
    p = ref.preprocess(case)
    assert np.all(p["g"] <= 0.0) and np.all(np.isfinite(p["g"]))
    if kw.get("A_log") is not None:
        assert p["g"].max() < -990.0
    o, hT, ch = assert_agree(case)
    if kw.get("gate") == "given" and "g" not in kw:
        assert np.all(ch.gamma_last == 1.0)


def test_safe_gate_bounds():
    case = ref.make_case([64], 3, seed=3, a_scale=8.0, bias_scale=8.0)
    g = ref.preprocess(case)["g"]
    assert g.max() <= 0.0 and g.min() >= ref.LOWER_BOUND
    assert g.max() > -1e-3 and g.min() < ref.LOWER_BOUND + 1e-3  # both ends reached


def test_state_handover():
    """Running the first half, then the second half from its final state, equals one run."""
    case = ref.make_case([77], 2, K=64, V=32, seed=11)
    p = ref.preprocess(case)
    full_o, full_h = ref.recurrent(**{n: p[n] for n in ARGS})
    cut = 40
    first = {n: p[n] for n in ARGS} | {"cu_seqlens": np.array([0, cut])}
    for n in ("q", "k", "v", "g", "beta"):
        first[n] = p[n][:cut]
    o1, h1 = ref.recurrent(**first)
    second = dict(first, cu_seqlens=np.array([0, 77 - cut]), h0=h1)
    for n in ("q", "k", "v", "g", "beta"):
        second[n] = p[n][cut:]
    o2, h2 = ref.recurrent(**second)
    ch2 = ref.chunked(**second)
    np.testing.assert_allclose(np.concatenate([o1, o2]), full_o, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(h2, full_h, rtol=1e-12, atol=1e-14)
    assert ref.rel_rms(ch2.hT, full_h) < TOL and ref.rel_rms(ch2.O, full_o[cut:]) < TOL


def naive(case):
    """Straight from kda.md with python floats, K-first state, nothing shared with reference.py."""
    T, H, HV, K, V = case["T"], case["H"], case["HV"], case["K"], case["V"]
    cu = case["cu_seqlens"]
    o = np.zeros((T, HV, V))
    hT = np.zeros((len(cu) - 1, HV, V, K))
    for n in range(len(cu) - 1):
        for hv in range(HV):
            h = hv // (HV // H)
            S = [[float(case["h0"][n, hv, j, d]) for j in range(V)] for d in range(K)]  # S[d][j]
            A = math.exp(case["A_log"][hv])
            for t in range(cu[n], cu[n + 1]):
                qv = [float(x) for x in case["qf"][t, h]]
                kv = [float(x) for x in case["kf"][t, h]]
                nq = math.sqrt(sum(x * x for x in qv) + 1e-6)
                nk = math.sqrt(sum(x * x for x in kv) + 1e-6)
                qv = [x / nq * case["scale"] for x in qv]
                kv = [x / nk for x in kv]
                g = [
                    -5.0
                    / (1.0 + math.exp(-A * (float(case["af"][t, hv, d]) + case["dt_bias"][hv, d])))
                    for d in range(K)
                ]
                beta = 1.0 / (1.0 + math.exp(-float(case["bf"][t, hv])))
                S = [[S[d][j] * math.exp(g[d]) for j in range(V)] for d in range(K)]
                pred = [sum(S[d][j] * kv[d] for d in range(K)) for j in range(V)]
                u = [beta * (float(case["vf"][t, hv, j]) - pred[j]) for j in range(V)]
                S = [[S[d][j] + kv[d] * u[j] for j in range(V)] for d in range(K)]
                for j in range(V):
                    o[t, hv, j] = sum(S[d][j] * qv[d] for d in range(K))
            hT[n, hv] = np.array(S).T
    return o, hT


def test_against_naive_loop():
    case = ref.make_case([5, 0, 9], 1, K=8, V=6, HV=2, seed=5, h0_scale=1.0)
    o_n, h_n = naive(case)
    o, hT, ch = assert_agree(case, C=4)
    np.testing.assert_allclose(o, o_n, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(hT, h_n, rtol=1e-12, atol=1e-13)


def test_numba_and_numpy_agree():
    case = ref.make_case([21, 3], 2, K=16, V=8, HV=4, seed=9)
    p = ref.preprocess(case)
    p2 = ref.preprocess(case, use_numba=False)
    for n in ("q", "k", "g", "beta"):
        np.testing.assert_allclose(p[n], p2[n], rtol=1e-14, atol=1e-15)
    a = {n: p[n] for n in ARGS}
    o1, h1 = ref.recurrent(**a)
    o2, h2 = ref.recurrent(**a, use_numba=False)
    np.testing.assert_allclose(o1, o2, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(h1, h2, rtol=1e-12, atol=1e-14)


def test_inputs_are_bf16_exact():
    from ptxbuild.dtypes import from_float, to_float

    case = ref.make_case([33], 2, seed=1)
    for n in ("q", "k", "v", "a", "b"):
        bits, f = case[n], case[n + "f"]
        assert bits.dtype == np.uint16 and f.dtype == np.float32
        np.testing.assert_array_equal(to_float(bits, "bfloat16", np), f)
        np.testing.assert_array_equal(from_float(f, "bfloat16", np), bits)
    assert case["cu_seqlens"].dtype == np.int64


def test_rel_rms():
    x = np.ones(4)
    assert ref.rel_rms(x, x) == 0.0
    assert ref.rel_rms(x * 1.01, x) == pytest.approx(0.01)
    assert ref.rel_rms(np.array([np.nan, 1.0]), np.ones(2)) == math.inf
    assert ref.rel_rms(np.full(4, 0.5), np.zeros(4)) == 0.5


def test_chunk_intermediates_consistent():
    """Each intermediate satisfies its defining identity (what a GPU stage is checked against)."""
    case = ref.make_case([40], 2, K=32, V=16, seed=4)
    p = ref.preprocess(case)
    ch = ref.chunked(**{n: p[n] for n in ARGS}, keep_states=True)
    for c, (t0, m) in enumerate(zip(ch.chunk_start, ch.chunk_len)):
        sl = slice(t0, t0 + m)
        for hv in range(2):
            Lc, Tc = ch.L[sl, hv, :m], ch.T_inv[sl, hv, :m]
            np.testing.assert_allclose((np.eye(m) + Lc) @ Tc, np.eye(m), atol=1e-12)
            np.testing.assert_allclose(np.cumsum(p["g"][sl, hv], 0), ch.G[sl, hv], atol=1e-12)
            S0 = ch.states[c, hv]
            np.testing.assert_allclose(
                ch.U[sl, hv] - ch.W[sl, hv] @ S0.T, ch.V_new[sl, hv], atol=1e-12
            )
            np.testing.assert_allclose(
                ch.Qg[sl, hv] @ S0.T + ch.A_qk[sl, hv, :m] @ ch.V_new[sl, hv],
                ch.O[sl, hv],
                atol=1e-12,
            )
    np.testing.assert_array_equal(ch.chunk_start, [0, 16, 32])
    np.testing.assert_array_equal(ch.chunk_len, [16, 16, 8])
