#!/usr/bin/env python3
"""CPU emulation of kda_s27_prepare.cu's lane mappings, step by step: phase A per channel (lane l:
channels 4l .. 4l+3) into a flat shared-memory array with the kernel's strides, the Gram-product L2
norms (mma.sync m16n8k16 by its PTX fragment definition) and their shuffle, phase B in the fragment
layout, movmatrix.trans, the swizzled Kp^T staging read back by ldmatrix (each lane's row address, as
the kernel computes it), ldmatrix.trans of v, the column forward substitution on L^T. It writes the
workspace blob that workspace.decode reads and compares it with the float64 chunked reference field
by field (emulate_s26.check's harness: relative RMS, 2e-3 gate). It checks the index reasoning, not
the CUDA text itself (float64 arithmetic, no tf32 / f16 rounding but the stores).

    python3 lab/kda/emulate_s27.py              # a few cases, < 1 min
    python3 lab/kda/emulate_s27.py --stageqk    # the same with x1c's q, k words (cp.async + ldmatrix)
    python3 lab/kda/emulate_s27.py --wstore     # x1w (S27_WSTORE): WQ and U through shared memory

--wstore (session 29) first checks x1w's store mapping on its own (check_wstore: every shared chunk
written once before it is read, every global chunk once, the bytes where x1p puts them, all four
access patterns bank-conflict-free), then runs the cases with W / Qg / U written through it: each
block staged in Kp^T's words (tagged, so that an ldmatrix of a block already overwritten fails), the
blob compared byte for byte with x1p's mapping, then field by field with the reference as before.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import emulate_s26 as E  # noqa: E402

wsl, LANE, G_, T_, LOG2E, mma1688 = E.wsl, E.LANE, E.G_, E.T_, E.LOG2E, E.mma1688
DS, VS, TS = 136, 136, 20
STAGEQK = "--stageqk" in sys.argv
WSTORE = "--wstore" in sys.argv


def wsw(c):
    """x1w's chunk swizzle in a 1 KB staging block (kda_s27_prepare.cu's s27_wsw)."""
    return c ^ ((c >> 3) & 1)


def staged_store(halves):
    """x1w's store of one 1 KB block: halves [32 lanes, 2, 16 bytes] = lane l's sector (W | Qg, or U's
    n-tiles 0 | 1). Lane l writes shared chunks wsw(2l), wsw(2l + 1); after the __syncwarp lane L
    stores shared chunks wsw(L), wsw(32 + L) to global chunks L, 32 + L. Returns the 64 global chunks,
    the writes per shared chunk and the writes per global chunk."""
    smem, sw = np.zeros((64, 16), np.uint8), np.zeros(64, int)
    for h in range(2):
        np.add.at(sw, wsw(2 * LANE + h), 1)
        smem[wsw(2 * LANE + h)] = halves[:, h]
    out, gw = np.zeros((64, 16), np.uint8), np.zeros(64, int)
    for s in range(2):
        np.add.at(gw, 32 * s + LANE, 1)
        out[32 * s + LANE] = smem[wsw(32 * s + LANE)]
    return out, sw, gw


def conflict_free(chunks):
    """One STS.128 / LDS.128: each quarter-warp's 8 chunks in 8 distinct 16-byte bank groups."""
    return all(len(set(chunks[8 * q : 8 * q + 8] % 8)) == 8 for q in range(4))


def check_wstore(seed=0):
    """x1w's mapping alone, on random bytes: returns the number of failed checks."""
    halves = np.random.default_rng(seed).integers(0, 256, (32, 2, 16), dtype=np.uint8)
    out, sw, gw = staged_store(halves)
    bad = {
        "shared chunk written != once": (sw != 1).any(),
        "global chunk written != once": (gw != 1).any(),
        "bytes not where x1p puts them": not np.array_equal(out, halves.reshape(64, 16)),
        "bank conflict": not all(
            conflict_free(wsw(c)) for c in (2 * LANE, 2 * LANE + 1, LANE, 32 + LANE)
        ),
        "unswizzled (the check would not see a conflict)": conflict_free(2 * LANE),
    }
    for what, b in bad.items():
        if b:
            print(f"check_wstore: {what}")
    print("check_wstore: " + ("OK" if not any(bad.values()) else "BAD"))
    return sum(map(bool, bad.values()))


def to_chunks(x):
    """[blocks, 32, 2, ...] (one 16-byte chunk per [block, lane, half]) -> its bytes [blocks, 32, 2, 16]."""
    return np.ascontiguousarray(x).view(np.uint8).reshape(x.shape[0], 32, 2, 16)


def staged_bytes(chunks):
    """x1w's global bytes of WQ or U, block by block, checked against x1p's layout (the same bytes)."""
    out = []
    for blk in chunks:
        o, sw, gw = staged_store(blk)
        assert (sw == 1).all() and (gw == 1).all(), "x1w: a chunk written twice or never"
        out.append(o)
    out = np.concatenate(out).reshape(-1)
    assert np.array_equal(out, chunks.reshape(-1)), "x1w: bytes differ from x1p's mapping"
    return out


def mma16816(a, b, c):
    """m16n8k16: a = 4 words, b = 2 words, a word = (lo, hi) arrays of 32 lanes."""
    A, B = np.zeros((16, 16)), np.zeros((16, 8))
    for h in range(2):
        A[G_, 2 * T_ + h] = a[0][h]
        A[G_ + 8, 2 * T_ + h] = a[1][h]
        A[G_, 2 * T_ + 8 + h] = a[2][h]
        A[G_ + 8, 2 * T_ + 8 + h] = a[3][h]
        B[2 * T_ + h, G_] = b[0][h]
        B[2 * T_ + 8 + h, G_] = b[1][h]
    D = A @ B
    return [
        c[0] + D[G_, 2 * T_],
        c[1] + D[G_, 2 * T_ + 1],
        c[2] + D[G_ + 8, 2 * T_],
        c[3] + D[G_ + 8, 2 * T_ + 1],
    ]


def movt(w):
    """movmatrix.m8n8.trans.b16: lane (g, t) holds M[g][2t], M[g][2t+1]; gets M[2t][g], M[2t+1][g]."""
    M = np.zeros((8, 8))
    M[G_, 2 * T_], M[G_, 2 * T_ + 1] = w
    return (M[2 * T_, G_], M[2 * T_ + 1, G_])


def ldsm(flat, addr, words=True):
    """ldmatrix x4: addr[lane] = the row address (word index if words, else 16-bit element index)
    that lane gives; matrix i's rows come from lanes 8i .. 8i+7. Non-trans words: reg i of lane
    (g, t) = word t of row g. (trans: see ldsm_t.)"""
    return [flat[addr[8 * i + G_] + T_] for i in range(4)]


def ldsm_t(flat, addr):
    """ldmatrix x4 .trans on 16-bit elements: reg i of lane (g, t) = (M[2t][g], M[2t+1][g]),
    M[r][c] = flat[addr[8i + r] + c]."""
    return [
        (flat[addr[8 * i + 2 * T_] + G_], flat[addr[8 * i + 2 * T_ + 1] + G_]) for i in range(4)
    ]


def kpt_index(ch, tok):
    return ch * 16 + 4 * ((tok >> 2) ^ ((ch >> 1) & 3)) + (tok & 3)


def chunk(q, k, a, v, beta_logit, m, bias, A2, scale, l2norm=True):
    sz = wsl.sizes(128, 128)
    beta = np.where(np.arange(16) < m, 1.0 / (1.0 + np.exp(-beta_logit)), 0.0)
    CG = -5.0 * LOG2E
    # phase A: per channel (lane l owns 4l .. 4l+3; the arithmetic is per channel, so vectorised)
    sig = 1.0 / (1.0 + 2.0 ** (-A2 * (a + bias[None, :])))  # [16, 128]
    valid = (np.arange(16) < m)[:, None]
    gate = np.where(valid, CG * sig, 0.0)
    sD = np.zeros(16 * DS)
    D = np.zeros((16, 128))
    acc = np.zeros(128)
    for r in range(6, -1, -1):
        acc = acc - gate[r + 1]
        D[r] = acc
    gref = CG * sig[0] - acc
    acc2 = np.zeros(128)
    for r in range(8, 16):
        acc2 = acc2 + gate[r]
        D[r] = acc2
    for r in range(16):
        for lane in range(32):
            sD[r * DS + 4 * lane : r * DS + 4 * lane + 4] = D[r, 4 * lane : 4 * lane + 4]
    gam = 2.0 ** (gref + acc2)
    cgcl = np.zeros(256)
    cgcl[0::2], cgcl[1::2] = 2.0**gref, 2.0**acc2
    # words of rows g, g + 8: (lo, hi) = channels 16 ks + 8 e + 2 t, + 1
    rows = [G_, G_ + 8]
    ok = [r < m for r in rows]

    def words(x):
        return [
            [
                [
                    tuple(
                        np.where(ok[rr], x[rows[rr], 16 * ks + 8 * e + 2 * T_ + h], 0.0)
                        for h in range(2)
                    )
                    for rr in range(2)
                ]
                for e in range(2)
            ]
            for ks in range(8)
        ]

    qw, kw = words(q), words(k)
    if STAGEQK:  # x1c: rows staged [32][136] (q 0..15, k 16..31, zero past m), words by ldmatrix x4
        sqk = np.zeros(32 * VS)
        for r in range(16):
            if r < m:
                sqk[r * VS : r * VS + 128], sqk[(16 + r) * VS : (16 + r) * VS + 128] = q[r], k[r]
        i, rI = LANE >> 3, LANE & 7
        for ks in range(8):
            for base, w in ((0, qw), (16, kw)):
                addr = (base + 8 * (i & 1) + rI) * VS + 16 * ks + 8 * (i >> 1)
                regs = [(sqk[addr[8 * j + G_] + 2 * T_], sqk[addr[8 * j + G_] + 2 * T_ + 1]) for j in range(4)]
                for j in range(4):
                    w[ks][j >> 1][j & 1] = regs[j]
    gq = [[np.zeros(32)] * 4 for _ in range(2)]
    gk = [[np.zeros(32)] * 4 for _ in range(2)]
    for ks in range(8):
        for jn in range(2):
            for w, acc_ in ((qw, gq), (kw, gk)):
                acc_[jn] = mma16816(
                    [w[ks][0][0], w[ks][0][1], w[ks][1][0], w[ks][1][1]],
                    [w[ks][0][jn], w[ks][1][jn]],
                    acc_[jn],
                )
    src, odd = 4 * G_ + (G_ >> 1), (G_ & 1) == 1

    def shfl(x):
        return x[src]

    sq0 = shfl(np.where(odd, gq[0][1], gq[0][0]))
    sq1 = shfl(np.where(odd, gq[1][3], gq[1][2]))
    sk0 = shfl(np.where(odd, gk[0][1], gk[0][0]))
    sk1 = shfl(np.where(odd, gk[1][3], gk[1][2]))
    if l2norm:
        rq = [scale / np.sqrt(sq0 + 1e-6), scale / np.sqrt(sq1 + 1e-6)]
        rk = [1 / np.sqrt(sk0 + 1e-6), 1 / np.sqrt(sk1 + 1e-6)]
    else:
        rq, rk = [np.full(32, scale)] * 2, [np.ones(32)] * 2
    # phase B
    accL = [[np.zeros(32)] * 4 for _ in range(2)]
    accA = [[np.zeros(32)] * 4 for _ in range(2)]
    ka = {}
    wq = np.zeros((8, 32, 2, 4, 2))
    kdf = np.zeros((8, 32, 4, 2))
    for ks in range(8):
        qgw, kdw = {}, {}
        for e in range(2):
            c0 = 16 * ks + 8 * e + 2 * T_
            cc = [cgcl[2 * c0], cgcl[2 * c0 + 1], cgcl[2 * c0 + 2], cgcl[2 * c0 + 3]]
            qa, kb = {}, {}
            for rr in range(2):
                dd = (sD[(G_ + 8 * rr) * DS + c0], sD[(G_ + 8 * rr) * DS + c0 + 1])
                qg, kd = [None] * 2, [None] * 2
                for hh in range(2):
                    ep, em = 2.0 ** dd[hh], 2.0 ** (-dd[hh])
                    kh = kw[ks][e][rr][hh] * rk[rr]
                    qh = qw[ks][e][rr][hh] * rq[rr]
                    kp, km, qp = kh * ep, kh * em, qh * ep
                    ka[ks, e, rr, hh], kb[rr, hh], qa[rr, hh] = kp, km, qp
                    qg[hh] = qp * (cc[2] if hh else cc[0])
                    kd[hh] = km * (cc[3] if hh else cc[1])
                qgw[e, rr], kdw[e, rr] = tuple(qg), tuple(kd)
            for jn in range(2):
                A_ = [ka[ks, e, 0, 0], ka[ks, e, 1, 0], ka[ks, e, 0, 1], ka[ks, e, 1, 1]]
                Q_ = [qa[0, 0], qa[1, 0], qa[0, 1], qa[1, 1]]
                B_ = [kb[jn, 0], kb[jn, 1]]
                accL[jn] = mma1688(A_, B_, accL[jn])
                accA[jn] = mma1688(Q_, B_, accA[jn])
        for reg, key in enumerate(((0, 0), (1, 0), (0, 1), (1, 1))):
            wq[ks, :, 1, reg, 0], wq[ks, :, 1, reg, 1] = qgw[key]
        for reg, key in enumerate(((0, 0), (0, 1), (1, 0), (1, 1))):
            kdf[ks, :, reg, 0], kdf[ks, :, reg, 1] = movt(kdw[key])
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
    sLt = np.zeros(16 * TS)
    for j in range(2):
        for e in range(4):
            r, s = G_ + 8 * (e >> 1), 8 * j + 2 * T_ + (e & 1)
            sLt[s * TS + r] = np.where(s < r, beta[r] * accL[j][e], 0.0)
    kpt = np.zeros(128 * 16)
    staged = np.zeros(128 * 16, bool)  # x1w: Kp^T words overwritten by the WQ staging
    for (ks, e, rr, hh), val in ka.items():
        kpt[kpt_index(16 * ks + 8 * e + 2 * T_ + hh, G_ + 8 * rr)] = val
    sTb = np.zeros(16 * TS)
    for lane in range(16):
        x = np.eye(16)[lane].copy()
        for s in range(15):
            col = sLt[s * TS : s * TS + 16]
            for r in range(s + 1, 16):
                x[r] -= col[r] * x[s]
        for r in range(16):
            sTb[r * TS + lane] = x[r] * beta[lane]
    ta = [
        [
            sTb[G_ * TS + 8 * kk + T_],
            sTb[(G_ + 8) * TS + 8 * kk + T_],
            sTb[G_ * TS + 8 * kk + T_ + 4],
            sTb[(G_ + 8) * TS + 8 * kk + T_ + 4],
        ]
        for kk in range(2)
    ]
    for ks in range(8):
        acc = [[np.zeros(32)] * 4 for _ in range(2)]
        for j in range(2):
            ch, i = 16 * ks + 8 * j + (LANE & 7), LANE >> 3
            row = ch * 16 + 4 * (i ^ ((ch >> 1) & 3))
            assert not staged[row[:, None] + np.arange(4)].any(), "x1w: ldmatrix of a staged block"
            bq = ldsm(kpt, row)
            acc[j] = mma1688(ta[0], [bq[0], bq[1]], acc[j])
            acc[j] = mma1688(ta[1], [bq[2], bq[3]], acc[j])
        c0 = 16 * ks + 2 * T_
        cg0, cg1, cg8, cg9 = cgcl[2 * c0], cgcl[2 * c0 + 2], cgcl[2 * c0 + 16], cgcl[2 * c0 + 18]
        wq[ks, :, 0, 0] = np.stack([-acc[0][0] * cg0, -acc[0][1] * cg1], -1)
        wq[ks, :, 0, 1] = np.stack([-acc[1][0] * cg8, -acc[1][1] * cg9], -1)
        wq[ks, :, 0, 2] = np.stack([-acc[0][2] * cg0, -acc[0][3] * cg1], -1)
        wq[ks, :, 0, 3] = np.stack([-acc[1][2] * cg8, -acc[1][3] * cg9], -1)
        if WSTORE:  # x1w: block ks of Kp^T (words 256 ks ..) now holds [W | Qg] of ks
            staged[256 * ks : 256 * ks + 256] = True
    sV = np.zeros(16 * VS)
    for r in range(16):
        sV[r * VS : r * VS + 128] = v[r] if r < m else 0.0
    tbb = {
        (jn, kk): (
            sTb[(8 * jn + G_) * TS + 8 * kk + 2 * T_],
            sTb[(8 * jn + G_) * TS + 8 * kk + 2 * T_ + 1],
        )
        for jn in range(2)
        for kk in range(2)
    }
    u = np.zeros((8, 32, 2, 4))
    for vg in range(8):
        i = LANE >> 3
        vv = ldsm_t(sV, (8 * (i >> 1) + (LANE & 7)) * VS + 16 * vg + 8 * (i & 1))
        acc = [[np.zeros(32)] * 4 for _ in range(2)]
        for kk in range(2):
            w0, w1 = vv[2 * kk], vv[2 * kk + 1]
            aa = [w0[0], w1[0], w0[1], w1[1]]
            for jn in range(2):
                acc[jn] = mma1688(aa, list(tbb[jn, kk]), acc[jn])
        for jn in range(2):
            u[vg, :, jn, :] = np.stack(acc[jn], -1)
    blob = np.zeros(sz["BLOB"], np.uint8)
    if WSTORE:
        blob[sz["WQ"] : sz["KD"]] = staged_bytes(to_chunks(wsl.to_bits(wq, "f16")))
    else:
        blob[sz["WQ"] : sz["KD"]] = wsl.to_bits(wq, "f16").reshape(-1).view(np.uint8)
    blob[sz["KD"] : sz["AQ"]] = wsl.to_bits(kdf, "f16").reshape(-1).view(np.uint8)
    blob[sz["AQ"] : sz["GAM"]] = wsl.to_bits(aq, "f16").reshape(-1).view(np.uint8)
    blob[sz["GAM"] : sz["U"]] = gam.astype(np.float32).view(np.uint8)
    if WSTORE:
        blob[sz["U"] :] = staged_bytes(to_chunks(u.astype(np.float32)))
    else:
        blob[sz["U"] :] = u.astype(np.float32).reshape(-1).view(np.uint8)
    return blob


if __name__ == "__main__":
    E.chunk = chunk
    bad = check_wstore() if WSTORE else 0
    for lens, H, kw in (
        ([16], 1, {}),
        ([17, 33], 1, {}),
        ([97, 33], 2, dict(HV=4)),
        ([40], 1, dict(a_shift=8.0)),
        ([40], 1, dict(a_shift=-8.0)),
        ([30], 1, dict(use_qk_l2norm=False, qk_scale=0.1)),
        ([1] * 3 + [20], 1, {}),
    ):
        print(lens, H, kw, end="")
        e = E.check(lens, H, **kw)
        bad += not e <= 2e-3
    print("ALL OK" if not bad else f"{bad} BAD")
    sys.exit(1 if bad else 0)
