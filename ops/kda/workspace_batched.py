"""The KDA workspace of many chunks at once, as batched float64 array operations: numpy, or cupy on the
GPU. The stage ops use it: ops/kda_recurrence's make_inputs (the workspace its kernel reads, in place
of ops/kda_prepare's output) and ops/kda_prepare's reference (what its kernel must write).

Why: the per-chunk float64 path (kda_host.workspace_all / workspace_chunks: ref.chunked one chunk at
a time) takes ~90 s of one CPU core for every chunk at T = 8192, H = 96, and the recurrence's
inputs need every chunk for each verification seed: a candidate cost 50-85 s on the H200 host
(ops/kda/NOTES.md, session 16). Here the same quantities are computed `batch` chunks per step, on
the GPU when the worker passes cupy.

A second implementation of the chunk algebra of ops/kda/reference.py: tests/test_kda_stages.py
checks that on the CPU it encodes byte for byte what the per-chunk path encodes, and on a GPU
within float64 rounding.
Per chunk of m <= 16 tokens, rows padded to 16 with zero q, k, v, beta and g (padded rows come out
zero, as workspace.per_chunk pads them; rows < m never read rows >= m: every product is lower
triangular):
  G = cumsum(g)  E[r, s] = exp(G_r - G_s) for s <= r, else 0 (per channel; no overflow for any gate)
  L = beta_r (k_r . E[r, s] . k_s) strictly below the diagonal;  T = (I + L)^-1
  W = T diag(beta) (k * exp(G));  U = T diag(beta) v;  A_qk = scale (q_r . E[r, s] . k_s), s <= r
  Qg = scale q exp(G);  Kd = k exp(G_last - G);  gamma_last = exp(G_last), G_last at row m - 1
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

CH = 16                 # tokens per chunk (ops/kda/workspace.CH)
BATCH_ELEMENTS = 1 << 27   # float64 elements of one [B, HV, 16, 16, K] temporary (1 GiB)


def chunk_fields(pre: dict, layout, xp=np, batch: int | None = None) -> SimpleNamespace:
    """workspace.encode's fields for every chunk, chunk-major and zero-padded (token c * 16 + r is
    row r of chunk c, so workspace.per_chunk reads them back unchanged). `pre`: ref.preprocess()
    (numpy float64); `layout`: ref.chunk_layout(cu_seqlens, 16). Returns numpy arrays."""
    q, k, v, g, beta, scale = (pre[n] for n in ("q", "k", "v", "g", "beta", "scale"))
    T, H, K = q.shape
    HV, V = v.shape[1:]
    heads = np.arange(HV) // (HV // H)
    cs, cl = np.asarray(layout[0], np.int64), np.asarray(layout[1], np.int64)
    NC = len(cs)
    batch = batch or max(1, BATCH_ELEMENTS // (HV * CH * CH * K))
    out = {n: np.zeros((NC, HV, CH, w)) for n, w in (("W", K), ("Qg", K), ("Kd", K), ("U", V), ("A_qk", CH))}
    gamma_last = np.zeros((NC, HV, K))
    rows = np.arange(CH)
    incl = xp.tril(xp.ones((CH, CH), bool))
    strict = xp.tril(xp.ones((CH, CH)), -1)
    eye = xp.eye(CH)
    for c0 in range(0, NC, batch):
        ids = np.arange(c0, min(NC, c0 + batch))
        valid = rows[None, :] < cl[ids][:, None]                          # [B, 16]
        tok = np.where(valid, cs[ids][:, None] + rows[None, :], 0)
        mask = xp.asarray(valid)[:, None, :, None]                       # [B, 1, 16, 1]

        def take(x, head=None):
            """[T, H*, X] -> [B, HV, 16, X] on xp, padded rows zero."""
            x = x[tok] if head is None else x[tok][:, :, head]
            return xp.where(mask, xp.asarray(np.ascontiguousarray(x.transpose(0, 2, 1, 3))), 0.0)

        qc, kc, vc = take(q, heads), take(k, heads), take(v)
        gc, bc = take(g), take(beta[:, :, None])[..., 0]                  # bc: [B, HV, 16]
        G = xp.cumsum(gc, axis=2)
        E = xp.exp(xp.where(incl[:, :, None], G[:, :, :, None, :] - G[:, :, None, :, :], -xp.inf))
        kk = (kc[:, :, :, None, :] * E * kc[:, :, None, :, :]).sum(-1)   # [B, HV, r, s]
        qk = (qc[:, :, :, None, :] * E * kc[:, :, None, :, :]).sum(-1) * scale
        del E
        Tinv = xp.where(incl, xp.linalg.inv(eye + bc[..., None] * kk * strict), 0.0)
        gam = xp.exp(G)
        last = xp.asarray(cl[ids] - 1)
        g_last = G[xp.arange(len(ids)), :, last]                          # [B, HV, K]
        fields = {"W": Tinv @ (bc[..., None] * kc * gam), "U": Tinv @ (bc[..., None] * vc),
                  "Qg": scale * qc * gam, "Kd": kc * xp.exp(g_last[:, :, None, :] - G), "A_qk": qk}
        for n, x in fields.items():
            x = xp.where(mask, x, 0.0)          # +0.0 where per_chunk pads (a product with 0 may be -0.0)
            out[n][ids] = x.get() if hasattr(x, "get") else x
        gl = xp.exp(g_last)
        gamma_last[ids] = gl.get() if hasattr(gl, "get") else gl
    token_major = {n: x.transpose(0, 2, 1, 3).reshape(NC * CH, HV, -1) for n, x in out.items()}
    return SimpleNamespace(C=CH, chunk_start=np.arange(NC, dtype=np.int64) * CH,
                           chunk_len=np.full(NC, CH, np.int64), gamma_last=gamma_last, **token_major)


def workspace_chunks(pre: dict, chunk_ids, op_dtype: str, ref, workspace, xp=np, batch: int | None = None):
    """uint8 [len(chunk_ids), HV, BLOB]: workspace.encode of the chosen chunks (kda_host.workspace_chunks)."""
    cs, cl, _ = ref.chunk_layout(pre["cu_seqlens"], CH)
    ids = np.asarray(chunk_ids, np.int64)
    return workspace.encode(chunk_fields(pre, (cs[ids], cl[ids]), xp, batch), op_dtype)


def workspace_all(pre: dict, op_dtype: str, ref, workspace, xp=np, batch: int | None = None) -> np.ndarray:
    """uint8 [NC, HV, BLOB]: workspace.encode of every chunk (kda_host.workspace_all's layout)."""
    cs, cl, _ = ref.chunk_layout(pre["cu_seqlens"], CH)
    return workspace.encode(chunk_fields(pre, (cs, cl), xp, batch), op_dtype)
