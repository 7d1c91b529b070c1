"""Prepare variant 1 (ops/kda/kda_prepare_fast.cu) emulated on the CPU: the same algorithm step by
step in float32 (factored exponentials around row 7's cumulative gate, tf32-rounded mma operands
with fp32 accumulation, fp32 forward substitution, outputs rounded to the workspace's types),
compared per field with the float64 chunked reference at the prepare stage's gate (STAGE_RMS)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ptxbuild.oploader import load_op
from ptxbuild.problem import Problem

ROOT = Path(__file__).resolve().parents[1]
PREP = load_op("kda_prepare", ROOT)
ref, wsl = PREP.ref, PREP.workspace
F32 = np.float32
LOG2E = F32(1.4426950408889634)
REF_ROW = 7  # G_ref: the chunk's middle row, as in the kernel


def tf32(x):
    """cvt.rna.tf32.f32: round to a 10-bit mantissa, ties away from zero (finite inputs)."""
    bits = np.ascontiguousarray(x, F32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(F32)


def ex2(x):
    return np.exp2(np.asarray(x, F32), dtype=F32)


def emulate(case: dict, op_dtype: str = "f16") -> dict:
    """Variant 1's fields per (chunk, value head): W, Qg, Kd, A_qk, U [NC, HV, 16, X], gamma_last
    [NC, HV, K], with the kernel's roundings; also the largest |log2| of any factored exponential."""
    cs, cl, _ = ref.chunk_layout(case["cu_seqlens"], 16)
    ch = type("Layout", (), {"chunk_start": cs, "chunk_len": cl})
    HV, H = case["af"].shape[1], case["qf"].shape[1]
    hidx = np.arange(HV) // (HV // H)

    def per(x):
        return wsl.per_chunk(np.asarray(x, np.float64), ch).astype(F32)  # bf16 values: exact

    q, k, a, v = (
        per(case["qf"][:, hidx]),
        per(case["kf"][:, hidx]),
        per(case["af"]),
        per(case["vf"]),
    )
    valid = (np.arange(16)[None, :] < cl[:, None])[:, None, :, None]  # [NC, 1, 16, 1]
    with np.errstate(over="ignore"):
        # 1. L2 norms (scale folded into q); beta
        scale = F32(case["scale"])
        if case["use_qk_l2norm"]:
            rq = (F32(1) / np.sqrt((q * q).sum(-1, keepdims=True, dtype=F32) + F32(1e-6))) * scale
            rk = F32(1) / np.sqrt((k * k).sum(-1, keepdims=True, dtype=F32) + F32(1e-6))
        else:
            rq, rk = scale, F32(1)
        b = per(case["bf"][:, :, None])  # [NC, HV, 16, 1]
        beta = np.where(valid, F32(1) / (F32(1) + ex2(-LOG2E * b)), F32(0))
        # 2. gate in log2 units, cumsum, factored exponentials
        A2 = np.exp(case["A_log"]).astype(F32)[None, :, None, None] * LOG2E
        x = a + case["dt_bias"].astype(F32)[None, :, None, :]
        g2 = np.where(
            valid, F32(ref.LOWER_BOUND) * LOG2E * (F32(1) / (F32(1) + ex2(-A2 * x))), F32(0)
        )
    G = np.cumsum(g2, axis=2, dtype=F32)
    Gref = G[:, :, REF_ROW : REF_ROW + 1]
    kh = k * rk
    e = ex2(G - Gref)
    Kp, Qp, Km = kh * e, (q * rq) * e, kh * ex2(Gref - G)
    cG, cL = ex2(Gref), ex2(G[:, :, -1:] - Gref)
    # 3. L, A_qk: tf32 operands, fp32 accumulation; the upper triangle is selected away
    r, s = np.arange(16)[:, None], np.arange(16)[None, :]
    with np.errstate(over="ignore", invalid="ignore"):
        Lacc = tf32(Kp) @ tf32(Km).swapaxes(-1, -2)
        Aacc = tf32(Qp) @ tf32(Km).swapaxes(-1, -2)
    L = np.where(s < r, beta * Lacc, F32(0))
    A = np.where(s <= r, Aacc, F32(0))
    # 4. T_inv column-parallel forward substitution, then Tb = T_inv diag(beta)
    T = np.broadcast_to(np.eye(16, dtype=F32), L.shape).copy()
    for j in range(16):
        T[:, :, j + 1 :] -= L[:, :, j + 1 :, j : j + 1] * T[:, :, j : j + 1]
    Tb = T * beta.swapaxes(-1, -2)
    # 5. W = Tb (K * Gamma), U = Tb V (tf32 operands; V is bf16 so exact); elementwise Qg, Kd
    W = tf32(Tb) @ tf32(Kp * cG)
    U = tf32(Tb) @ v

    def rnd(y):
        return wsl.from_bits(wsl.to_bits(y, op_dtype), op_dtype)

    expo = np.abs(np.concatenate([G - Gref, G[:, :, -1:] - Gref], axis=2)).max()
    return dict(
        W=rnd(W),
        Qg=rnd(Qp * cG),
        Kd=rnd(Km * cL),
        A_qk=rnd(A),
        U=U.astype(np.float64),
        gamma_last=ex2(G[:, :, -1]).astype(np.float64),
        max_log2=float(expo),
    )


def reference_fields(case: dict) -> dict:
    p = ref.preprocess(case)
    ch = ref.chunked(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], p["cu_seqlens"])
    out = {n: wsl.per_chunk(getattr(ch, n), ch) for n in ("W", "Qg", "Kd", "A_qk", "U")}
    out["gamma_last"] = ch.gamma_last
    return out


FIELDS = ("W", "Qg", "Kd", "A_qk", "U", "gamma_last")
CASES = {
    "random": dict(),
    "gate_at_lower_bound": dict(
        a_shift=8.0, a_scale=0.0, bias_scale=0.0, A_log=np.log(16.0)
    ),  # g = -5 every step
    "no_decay": dict(
        a_shift=-8.0, a_scale=0.0, bias_scale=0.0, A_log=np.log(16.0)
    ),  # g = -5 * sigmoid(-128)
    "channels_at_both_ends": dict(bias_scale=8.0),
    "tokens_at_both_ends": dict(a_scale=8.0, A_log=np.log(16.0)),
    "no_l2norm_small_qk": dict(use_qk_l2norm=False, qk_scale=0.1),
    "large_v": dict(v_scale=30.0),
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("op_dtype", ["f16", "bf16"])
def test_emulation_matches_the_float64_reference(name, op_dtype):
    case = ref.make_case([37, 16, 17, 65, 5], 2, seed=11, gate="safe", **CASES[name])
    got, want = emulate(case, op_dtype), reference_fields(case)
    errs = {n: ref.rel_rms(got[n], want[n]) for n in FIELDS}
    assert max(errs.values()) <= PREP.STAGE_RMS[op_dtype], errs


def test_emulation_with_value_heads_sharing_qk():
    case = ref.make_case([50, 30], 2, seed=4, gate="safe", HV=4)
    got, want = emulate(case), reference_fields(case)
    assert max(ref.rel_rms(got[n], want[n]) for n in FIELDS) <= PREP.STAGE_RMS["f16"]


def test_factored_exponentials_stay_in_fp32_range_at_the_lower_bound():
    """8 steps of g = -5 on either side of row 7: |G_r - G_ref| <= 40 nats = 57.7 in log2 units,
    far inside fp32/tf32 (2^127) but beyond f16 (2^16): why the products use tf32."""
    case = ref.make_case([16], 1, seed=0, gate="safe", **CASES["gate_at_lower_bound"])
    got = emulate(case)
    assert 57.0 < got["max_log2"] <= 8 * 5 * float(LOG2E) + 1e-3
    assert all(np.all(np.isfinite(got[n])) for n in FIELDS)


def test_check_keeps_unbounded_gates_on_variant_0():
    for gate in ("canonical", "given"):
        pr = Problem.make("kda_prepare", "bfloat16", (64, 2), {"gate": gate})
        assert "safe gate" in PREP.check({"prep_threads": 128, "prep_variant": 1}, pr)
        assert PREP.check({"prep_threads": 128, "prep_variant": 0}, pr) is None
    pr = Problem.make("kda_prepare", "bfloat16", (64, 2))
    assert PREP.check({"prep_threads": 128, "prep_variant": 1}, pr) is None
    assert PREP.check({"prep_threads": 256, "prep_variant": 1}, pr) is not None
    assert (
        PREP.check(
            {"prep_threads": 128, "prep_variant": 1},
            Problem.make("kda_prepare", "bfloat16", (64, 2), {"K": 64}),
        )
        is not None
    )


def test_variant_0_source_is_the_original_file():
    pr = Problem.make("kda_prepare", "bfloat16", (8192, 96))
    kda = ROOT / "ops" / "kda"
    head = (
        PREP.host.defines({**PREP._FILL, "prep_threads": 128, "op_dtype": "f16"}, pr)
        + (kda / "kda_common.cuh").read_text()
    )
    for variant, file in ((0, "kda_prepare.cu"), (1, "kda_prepare_fast.cu")):
        src = PREP.render({"prep_threads": 128, "prep_variant": variant}, pr, "sm_90a")
        assert src.source == head + (kda / file).read_text() and src.entry == "kda_prepare"
    assert PREP.render({"prep_threads": 128}, pr, "sm_90a") == PREP.render(
        {"prep_threads": 128, "prep_variant": 0}, pr, "sm_90a"
    )
