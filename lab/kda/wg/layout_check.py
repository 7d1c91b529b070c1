#!/usr/bin/env python3
"""CPU check of workspace v2 (kda_recurrence_wg.cu's header): the v1 fragment order of
ops/kda/workspace.py, permuted as probe_wg.py's WS2REF stores it, read back the way wgmma reads a
K-major, no-swizzle B operand (core matrix (n-block nb, k-block kb) at (2 nb + kb) * 128 bytes, row n
at 16 bytes, element k at 2 bytes), gives [-W | Qg]^T, Kd and A_qk^T exactly;
and the ufromv prepare's T_inv diag(beta) store gives (T_inv diag(beta))^T.

    python3 lab/kda/wg/layout_check.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "ops" / "kda"))

import workspace as wsl  # noqa: E402

K = 128
rng = np.random.default_rng(0)


def v2_words(v1_words: np.ndarray) -> np.ndarray:
    """WS2REF: the U4 at index b * 32 + l (words 4 (b * 32 + l) + r) -> words b * 128 + 32 r + l."""
    u4 = v1_words.reshape(-1, 32, 4)  # [block][lane][reg]
    return np.ascontiguousarray(u4.transpose(0, 2, 1)).reshape(-1)


def read_b(region_u16: np.ndarray, n: int, k: int = 16) -> np.ndarray:
    """B[k][n] from a K-major no-swizzle operand: core (nb, kb) at (2 nb + kb) * 128 bytes."""
    out = np.zeros((k, n), region_u16.dtype)
    for nn in range(n):
        for kk in range(k):
            byte = (2 * (nn // 8) + kk // 8) * 128 + (nn % 8) * 16 + (kk % 8) * 2
            out[kk, nn] = region_u16[byte // 2]
    return out


def main() -> int:
    W, Qg, Kd = (rng.integers(1, 60000, (16, K)).astype(np.uint16) for _ in range(3))
    A = rng.integers(1, 60000, (16, 16)).astype(np.uint16)
    # v1 WQ: [ks][lane][which][reg][half] (workspace.encode's order; -W is just other bits here)
    tok, chan = wsl.wq_index(K)
    frag = np.stack([W[tok, chan], Qg[tok, chan]], axis=2).transpose(0, 1, 2, 3, 4)
    wq_v1 = np.ascontiguousarray(frag).reshape(-1)  # [ks, 32, 2, 4, 2] halves
    # the x1w staging: lane l's W U4 is v1 U4 (2 l), its Qg U4 is (2 l + 1); WS2REF(st, which * 32 + l)
    u4 = wq_v1.view(np.uint32).reshape(K // 16, 32, 2, 4)  # [ks][lane][which][reg]
    wq_v2 = np.ascontiguousarray(u4.transpose(0, 2, 3, 1)).reshape(-1).view(np.uint16)
    bad = 0
    for ks in range(K // 16):
        b = read_b(wq_v2[ks * 512 : (ks + 1) * 512], 32)
        want = np.concatenate(
            [W[:, 16 * ks : 16 * ks + 16], Qg[:, 16 * ks : 16 * ks + 16]], axis=0
        ).T
        bad += int((b != want).sum())
    tok, chan = wsl.kd_index(K)
    kd_v2 = v2_words(np.ascontiguousarray(Kd[tok, chan]).reshape(-1).view(np.uint32)).view(
        np.uint16
    )
    bad_kd = int((read_b(kd_v2, K) != Kd).sum())
    r, s = wsl.aq_index()
    aq_v2 = v2_words(np.ascontiguousarray(A[r, s]).reshape(-1).view(np.uint32)).view(np.uint16)
    bad_aq = int((read_b(aq_v2, 16) != A.T).sum())
    # ufromv: the prepare's T_inv diag(beta) store, word 32 c + lane = (Tb[8 (c >> 1) + g][8 (c & 1) + 2 t],
    # the next column), read as B[k = s][n = r] = Tb[r][s]
    Tb = rng.integers(1, 60000, (16, 16)).astype(np.uint16)
    words = np.zeros((4, 32, 2), np.uint16)
    for c in range(4):
        for lane in range(32):
            g, t = lane >> 2, lane & 3
            r, s0 = 8 * (c >> 1) + g, 8 * (c & 1) + 2 * t
            words[c, lane] = Tb[r, s0], Tb[r, s0 + 1]
    bad_tb = int((read_b(words.reshape(-1), 16) != Tb.T).sum())
    print(
        f"mismatches: WQ {bad} of {16 * 32 * K // 16}, KD {bad_kd} of {16 * K}, AQ {bad_aq} of 256, "
        f"Tb {bad_tb} of 256"
    )
    return 1 if bad or bad_kd or bad_aq or bad_tb else 0


if __name__ == "__main__":
    sys.exit(main())
