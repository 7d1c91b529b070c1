#!/usr/bin/env python3
"""CPU: what the prepare's operands in bf16 (instead of tf32) would cost in accuracy, before any kernel
is written (and f16, whose 10 mantissa bits are tf32's, in the range it has). A leaner prepare is
the fused forward's precondition (NOTES.md, "Session 37"): bf16 packs two operands a register (the
x1w prepare keeps Kp's tf32 words, 64 registers a lane, for W) and feeds m16n8k16 MMAs (half the
m16n8k8 tf32 count for L, A_qk and W).

The prepare is emulated as x1w computes it: D = G - G_ref (G_ref: the chunk's row 7, or its last row
if shorter), Kp = k 2^D, Km = k 2^-D, Qp = scale q 2^D rounded to the MMA operand type, L = diag(beta)
(Kp Km^T) strictly lower, A_qk = Qp Km^T (s <= r), T_inv diag(beta) (float64 solve, rounded to the
operand type), W = (T_inv diag(beta) Kp) 2^G_ref, U = T_inv diag(beta) V, Qg and Kd from the unrounded
products (fp32 in the kernel); sums in float64. The workspace (f16 W, Qg, Kd, A_qk; fp32 U) and the
recurrence are then ops/kda/workspace.py's encode and simulate; every variant is compared with the
float64 token recurrence (the op's gate: relative RMS of o and hT <= 5e-3).

    python3 lab/kda/wg/prep_bf16_error.py [--T 2048] [--H 2] [--lengths ...] [--a-scale 1]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "ops" / "kda"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import reference as ref  # noqa: E402
import workspace as wsl  # noqa: E402
from u_f16_error import case_args, lengths_of, reference_case, round_to  # noqa: E402


def tf32(x: np.ndarray) -> np.ndarray:
    """x1w_tf32: fp32 bits + 0x1000, the MMA reads the top 19 bits (round half away from zero)."""
    b = np.ascontiguousarray(x, np.float32).view(np.uint32)
    b = ((b + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).astype(np.uint32)
    return b.view(np.float32).astype(np.float64)


def bf16(x: np.ndarray) -> np.ndarray:
    """Round to nearest even bf16 (cvt.rn.bf16x2.f32)."""
    return round_to(x, "bf16")


def f16(x: np.ndarray) -> np.ndarray:
    """Round to nearest even f16 (cvt.rn.f16x2.f32): 10 mantissa bits as tf32, range +-65504."""
    with np.errstate(over="ignore"):
        return round_to(x, np.float16)


def exact(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float64)


# what each variant rounds: the L / A_qk operands (Kp, Km, Qp), W's operands (T_inv diag(beta), Kp)
VARIANTS = {
    "float64 operands": (exact, exact),
    "tf32 (x1w today)": (tf32, tf32),
    "bf16 L and A_qk, tf32 W": (bf16, tf32),
    "tf32 L and A_qk, bf16 W": (tf32, bf16),
    "bf16 everywhere": (bf16, bf16),
    "f16 L and A_qk, tf32 W": (f16, tf32),
    "f16 everywhere": (f16, f16),
}


def _tok(x: np.ndarray) -> np.ndarray:
    """[HV, m, X] -> token-major [m, HV, X]."""
    return x.transpose(1, 0, 2)


def prepare(p: dict, ch: ref.Chunked, r_la, r_w) -> ref.Chunked:
    """The chunked intermediates as the prepare would write them with operands rounded by r_la (L,
    A_qk) and r_w (W, U); the rest of `ch` (layout, gamma_last) kept."""
    q, k, v, beta = (np.asarray(p[n], np.float64) for n in ("q", "k", "v", "beta"))
    scale = float(p["scale"])
    H = q.shape[1]
    HV = v.shape[1]
    hidx = np.arange(HV) // (HV // H)
    W, Qg, Kd, U = (np.zeros_like(x) for x in (ch.W, ch.Qg, ch.Kd, ch.U))
    A = np.zeros_like(ch.A_qk)
    for t0, m in zip(ch.chunk_start, ch.chunk_len):
        t0, m = int(t0), int(m)
        sl = slice(t0, t0 + m)
        kc = k[sl][:, hidx].transpose(1, 0, 2)  # [HV, m, K]
        qc = scale * q[sl][:, hidx].transpose(1, 0, 2)
        vc = v[sl].transpose(1, 0, 2)
        bc = beta[sl].T  # [HV, m]
        G = ch.G[sl].transpose(
            1, 0, 2
        )  # [HV, m, K]: the gates' cumsum in the chunk, natural log units
        Gref = G[:, min(7, m - 1) : min(7, m - 1) + 1, :]
        ep, em, cg = np.exp(G - Gref), np.exp(Gref - G), np.exp(Gref)
        kp, km, qp = kc * ep, kc * em, qc * ep  # fp32 products in the kernel
        Kp, Km, Qp = r_la(kp), r_la(km), r_la(qp)
        low = np.tril(np.ones((m, m)), -1)
        L = bc[:, :, None] * np.einsum("hrd,hsd->hrs", Kp, Km) * low
        Aqk = np.einsum("hrd,hsd->hrs", Qp, Km) * np.tril(np.ones((m, m)))
        Tb = np.tril(np.linalg.inv(np.eye(m)[None] + L)) * bc[:, None, :]  # T_inv diag(beta)
        Tw = r_w(Tb)
        Wc = np.einsum("hrs,hsd->hrd", Tw, r_w(kp)) * cg
        Uc = np.einsum("hrs,hsv->hrv", Tw, vc)  # v is bf16, exact in either operand type
        W[sl], U[sl], Qg[sl] = _tok(Wc), _tok(Uc), _tok(qp * cg)
        Kd[sl] = _tok(km * np.exp(G[:, -1:, :] - Gref))
        A[sl, :, :m] = _tok(Aqk)
    return dataclasses.replace(ch, W=W, U=U, Qg=Qg, Kd=Kd, A_qk=A)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    case_args(ap, H=2)
    ap.add_argument(
        "--a-scale", type=float, default=1.0, help="scale of the gate logits (x 8: stress)"
    )
    ap.add_argument("--seeds", type=int, default=2)
    a = ap.parse_args()
    lengths = lengths_of(a)
    print("| case | operands | o rel RMS | hT rel RMS |")
    print("|---|---|---:|---:|")
    for seed in range(a.seeds):
        p, (o_ref, h_ref), ch = reference_case(
            lengths, a.H, seed, a_scale=a.a_scale, v_scale=a.v_scale
        )
        name = f"H{a.H} {'+'.join(map(str, lengths))} a x{a.a_scale:g} v x{a.v_scale:g} seed {seed}"
        for label, (r_la, r_w) in VARIANTS.items():
            blob = wsl.encode(prepare(p, ch, r_la, r_w), "f16")
            o, hT = wsl.simulate(blob, ch, p["h0"], p["cu_seqlens"], "f16")
            print(
                f"| {name} | {label} | {ref.rel_rms(o, o_ref):.3e} | {ref.rel_rms(hT, h_ref):.3e} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
