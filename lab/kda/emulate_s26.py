#!/usr/bin/env python3
"""CPU emulation of kda_s26_prepare.cu's lane mapping, step by step (lanes as numpy arrays of 32,
mma.sync m16n8k8 by its PTX fragment definition, shuffles by their lane arithmetic), writing the
workspace blob that workspace.decode reads; compared with the float64 chunked reference field by
field (relative RMS, the GPU stage check's 2e-3 gate for f16). It checks the index reasoning
(fragment positions, the shuffle scan, the Kd / K * Gamma staging), not the CUDA text itself.

    python3 lab/kda/emulate_s26.py        # a few cases, < 1 min
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from ptxbuild.oploader import load_op  # noqa: E402
from ptxbuild.problem import Problem  # noqa: E402

kda = load_op(str(ROOT / "ops" / "kda"), ROOT)
ref, wsl = kda.ref, kda.workspace
LANE = np.arange(32)
G_, T_ = LANE >> 2, LANE & 3
LOG2E = 1.4426950408889634


def mma1688(a, b, c):
    """a: 4 x [32], b: 2 x [32], c: 4 x [32] -> d (4 x [32]): D = A (16x8) B (8x8) + C."""
    A, B = np.zeros((16, 8)), np.zeros((8, 8))
    A[G_, T_], A[G_ + 8, T_], A[G_, T_ + 4], A[G_ + 8, T_ + 4] = a
    B[T_, G_], B[T_ + 4, G_] = b
    D = A @ B
    return [
        c[0] + D[G_, 2 * T_],
        c[1] + D[G_, 2 * T_ + 1],
        c[2] + D[G_ + 8, 2 * T_],
        c[3] + D[G_ + 8, 2 * T_ + 1],
    ]


def shfl_up(x, d):
    src = LANE - d
    return np.where(src >= 0, x[np.maximum(src, 0)], x)


def chunk(q, k, a, v, beta_logit, m, bias, A2, scale, l2norm=True):
    """One chunk-head as the kernel computes it: rows [16, K] (zero past m) -> fields for a blob."""
    sz = wsl.sizes(128, 128)
    rows = [G_, G_ + 8]
    ok = [r < m for r in rows]
    beta = np.where(np.arange(16) < m, 1.0 / (1.0 + np.exp(-beta_logit)), 0.0)
    chans = [
        (ks, e, h, 16 * ks + 8 * e + 2 * T_ + h)
        for ks in range(8)
        for e in range(2)
        for h in range(2)
    ]
    rq, rk = [], []
    for rr in range(2):
        sq = sum(q[rows[rr], c] ** 2 for *_, c in chans)
        sk = sum(k[rows[rr], c] ** 2 for *_, c in chans)
        for x in (1, 2):
            sq, sk = sq + sq[LANE ^ x], sk + sk[LANE ^ x]
        rq.append(1 / np.sqrt(sq + 1e-6) * scale if l2norm else np.full(32, scale))
        rk.append(1 / np.sqrt(sk + 1e-6) if l2norm else np.ones(32))
    accL = [[np.zeros(32) for _ in range(4)] for _ in range(2)]
    accA = [[np.zeros(32) for _ in range(4)] for _ in range(2)]
    kg, kd = np.zeros((16, 128)), np.zeros((128, 16))
    gam = np.zeros(128)
    wq = np.zeros((8, 32, 2, 4, 2))  # [ks][lane][W | Qg][reg][half]
    for ks in range(8):
        qgv = {}
        for e in range(2):
            kp, km, qp = {}, {}, {}
            for h in range(2):
                c = 16 * ks + 8 * e + 2 * T_ + h
                x = [
                    np.where(
                        ok[rr], -5.0 * LOG2E / (1 + 2.0 ** (-A2 * (a[rows[rr], c] + bias[c]))), 0.0
                    )
                    for rr in range(2)
                ]
                for d in (1, 2, 4):
                    y0, y1 = shfl_up(x[0], 4 * d), shfl_up(x[1], 4 * d)
                    x = [np.where(G_ >= d, x[0] + y0, x[0]), np.where(G_ >= d, x[1] + y1, x[1])]
                gref, tail = x[0][28 + T_], x[1][28 + T_]
                glast = gref + tail
                G = [x[0], gref + x[1]]
                cg, cl = 2.0**gref, 2.0 ** (glast - gref)
                gam[c[G_ == 0]] = (2.0**glast)[G_ == 0]
                for rr in range(2):
                    kh, qh = k[rows[rr], c] * rk[rr], q[rows[rr], c] * rq[rr]
                    ep, em = 2.0 ** (G[rr] - gref), 2.0 ** (gref - G[rr])
                    kp[rr, h], km[rr, h], qp[rr, h] = kh * ep, kh * em, qh * ep
                    qgv[e, rr, h] = qp[rr, h] * cg
                    kg[rows[rr], c] = kp[rr, h] * cg
                    kd[c, rows[rr]] = km[rr, h] * cl
            ka = [kp[0, 0], kp[1, 0], kp[0, 1], kp[1, 1]]
            qa = [qp[0, 0], qp[1, 0], qp[0, 1], qp[1, 1]]
            for jn in range(2):
                b = [km[jn, 0], km[jn, 1]]
                accL[jn] = mma1688(ka, b, accL[jn])
                accA[jn] = mma1688(qa, b, accA[jn])
        for reg, (e, rr) in enumerate(((0, 0), (1, 0), (0, 1), (1, 1))):
            for h in range(2):
                wq[ks, :, 1, reg, h] = qgv[e, rr, h]
    # A_qk fragment [lane][reg][half]: x = (acc0[0], acc0[1]), y = acc1[0..1], z = acc0[2..3], w = acc1[2..3]
    mask = lambda j, e: 8 * j + 2 * T_ + (e & 1) <= G_ + 8 * (e >> 1)  # noqa: E731
    xa = [[np.where(mask(j, e), accA[j][e], 0.0) for e in range(4)] for j in range(2)]
    aq = np.stack(
        [
            np.stack([xa[0][0], xa[0][1]], -1),
            np.stack([xa[1][0], xa[1][1]], -1),
            np.stack([xa[0][2], xa[0][3]], -1),
            np.stack([xa[1][2], xa[1][3]], -1),
        ],
        1,
    )
    # KD fragments [p][lane][reg][half] from kd[ch][tok]
    kdf = np.zeros((8, 32, 4, 2))
    for p in range(8):
        ca, cb = 16 * p + G_, 16 * p + 8 + G_
        for reg, (cc, tk) in enumerate(
            ((ca, 2 * T_), (ca, 2 * T_ + 8), (cb, 2 * T_), (cb, 2 * T_ + 8))
        ):
            kdf[p, :, reg, 0], kdf[p, :, reg, 1] = kd[cc, tk], kd[cc, tk + 1]
    # L, forward substitution, Tb
    L = np.zeros((16, 16))
    for j in range(2):
        for e in range(4):
            r, s = G_ + 8 * (e >> 1), 8 * j + 2 * T_ + (e & 1)
            L[r, s] = np.where(s < r, beta[r] * accL[j][e], 0.0)
    Tb = np.zeros((16, 16))
    for lane in range(16):
        x = np.eye(16)[lane].copy()
        for s in range(16):
            for r in range(s + 1, 16):
                x[r] -= L[r, s] * x[s]
        Tb[:, lane] = x * beta[lane]
    ta = [
        [
            Tb[G_, 8 * kk + T_],
            Tb[G_ + 8, 8 * kk + T_],
            Tb[G_, 8 * kk + T_ + 4],
            Tb[G_ + 8, 8 * kk + T_ + 4],
        ]
        for kk in range(2)
    ]
    for ks in range(8):
        acc = [[np.zeros(32)] * 4 for _ in range(2)]
        for j in range(2):
            ch = 16 * ks + 8 * j + G_
            for kk in range(2):
                acc[j] = mma1688(ta[kk], [kg[8 * kk + T_, ch], kg[8 * kk + T_ + 4, ch]], acc[j])
        for reg, (j, e0) in enumerate(((0, 0), (1, 0), (0, 2), (1, 2))):
            wq[ks, :, 0, reg, 0], wq[ks, :, 0, reg, 1] = -acc[j][e0], -acc[j][e0 + 1]
    u = np.zeros((8, 32, 2, 4))
    for vg in range(8):
        col = 16 * vg + G_
        acc = [[np.zeros(32)] * 4 for _ in range(2)]
        for kk in range(2):
            s0 = 8 * kk + T_
            aa = [v[s0, col], v[s0, col + 8], v[s0 + 4, col], v[s0 + 4, col + 8]]
            for j in range(2):
                acc[j] = mma1688(aa, [ta[kk][j], ta[kk][j + 2]], acc[j])
        for j in range(2):
            u[vg, :, j, :] = np.stack(acc[j], -1)
    blob = np.zeros(sz["BLOB"], np.uint8)
    blob[sz["WQ"] : sz["KD"]] = wsl.to_bits(wq, "f16").reshape(-1).view(np.uint8)
    blob[sz["KD"] : sz["AQ"]] = wsl.to_bits(kdf, "f16").reshape(-1).view(np.uint8)
    blob[sz["AQ"] : sz["GAM"]] = wsl.to_bits(aq, "f16").reshape(-1).view(np.uint8)
    blob[sz["GAM"] : sz["U"]] = gam.astype(np.float32).view(np.uint8)
    blob[sz["U"] :] = u.astype(np.float32).reshape(-1).view(np.uint8)
    return blob


def check(lens, H, seed=0, **kw) -> float:
    opts = {
        "lengths": tuple(lens) if len(lens) > 1 else None,
        "l2norm": kw.pop("use_qk_l2norm", True),
        "hv": kw.pop("HV", None),
    }
    problem = Problem.make("kda", "bfloat16", (sum(lens), H), opts)
    case = kda.case_for(problem, seed, **kw)
    p = ref.preprocess(case)
    args = {n: p[n] for n in ("q", "k", "v", "g", "beta", "scale", "cu_seqlens", "h0")}
    ch = ref.chunked(**args)
    c = kda.host.case_from_inputs(problem, kda.inputs_from_case(case))
    NC, HV = len(ch.chunk_start), p["v"].shape[1]
    hh = HV // H
    ws = np.zeros((NC, HV, wsl.sizes(128, 128)["BLOB"]), np.uint8)
    for ci, (t0, m) in enumerate(zip(ch.chunk_start, ch.chunk_len)):
        for hv in range(HV):
            pad = lambda x: np.concatenate([x[t0 : t0 + m], np.zeros((16 - m,) + x.shape[1:])])  # noqa: E731
            q, k = pad(c["qf"][:, hv // hh]), pad(c["kf"][:, hv // hh])
            a, v, b = pad(c["af"][:, hv]), pad(c["vf"][:, hv]), pad(c["bf"][:, hv])
            ws[ci, hv] = chunk(
                q,
                k,
                a,
                v,
                b,
                m,
                c["dt_bias"][hv],
                np.exp(c["A_log"][hv]) * LOG2E,
                c["scale"],
                l2norm=c["use_qk_l2norm"],
            )
    dec = wsl.decode(ws.ravel(), NC, HV, 128, 128, "f16")
    worst = 0.0
    for name in ("W", "Qg", "Kd", "A_qk", "U"):
        e = ref.rel_rms(dec[name], wsl.per_chunk(getattr(ch, name), ch))
        worst = max(worst, e)
        print(f"  {name}: {e:.2e}", end="")
    e = ref.rel_rms(dec["gamma_last"], ch.gamma_last)
    print(f"  gamma: {e:.2e}")
    return max(worst, e)


if __name__ == "__main__":
    bad = 0
    for lens, H, kw in (
        ([16], 1, {}),
        ([17, 33], 1, {}),
        ([97, 33], 2, dict(HV=4)),
        ([40], 1, dict(a_shift=8.0)),
        ([40], 1, dict(a_shift=-8.0)),
        ([30], 1, dict(use_qk_l2norm=False, qk_scale=0.1)),
    ):
        print(lens, H, kw, end="")
        e = check(lens, H, **kw)
        bad += not e <= 2e-3
    print("ALL OK" if not bad else f"{bad} BAD")
    sys.exit(1 if bad else 0)
