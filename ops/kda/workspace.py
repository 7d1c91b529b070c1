"""The prepare -> recurrence workspace layout (mma fragment order, kda_common.cuh) on the CPU.

encode() builds the workspace the prepare kernel should write, from the float64 chunked
reference; decode() turns a workspace (from the GPU) back into matrices, so the prepare stage is
checked on its own and the recurrence can be fed a CPU-built workspace.
"""
from __future__ import annotations

import numpy as np

CH = 16


def sizes(K: int, V: int) -> dict[str, int]:
    wq = 0
    kd = wq + (K // 16) * 32 * 32
    aq = kd + (K // 16) * 32 * 16
    gam = aq + 32 * 16
    u = gam + K * 4
    return dict(WQ=wq, KD=kd, AQ=aq, GAM=gam, U=u, BLOB=u + (V // 16) * 32 * 32)


def _lanes():
    ln = np.arange(32)
    return ln >> 2, ln & 3


def wq_index(K: int):
    """(tok, chan) [K/16, 32, 4 regs, 2 halves] of one W or Qg fragment."""
    g, t = _lanes()
    ks = np.arange(K // 16)[:, None, None, None]
    half = np.arange(2)[None, None, None, :]
    reg = np.arange(4)[None, None, :, None]
    tok = g[None, :, None, None] + 8 * (reg >> 1)
    chan = 16 * ks + 2 * t[None, :, None, None] + 8 * (reg & 1) + half
    return np.broadcast_arrays(tok, chan)


def kd_index(K: int):
    """(tok, chan) [K/16, 32, 4, 2] of the Kd fragments."""
    g, t = _lanes()
    p = np.arange(K // 16)[:, None, None, None]
    half = np.arange(2)[None, None, None, :]
    reg = np.arange(4)[None, None, :, None]
    tok = 2 * t[None, :, None, None] + 8 * (reg & 1) + half
    chan = 16 * p + 8 * (reg >> 1) + g[None, :, None, None]
    return np.broadcast_arrays(tok, chan)


def aq_index():
    """(r, s) [32, 4, 2] of the A_qk fragment."""
    g, t = _lanes()
    half = np.arange(2)[None, None, :]
    reg = np.arange(4)[None, :, None]
    r = g[:, None, None] + 8 * (reg >> 1)
    s = 2 * t[:, None, None] + 8 * (reg & 1) + half
    return np.broadcast_arrays(r, s)


def u_index(V: int):
    """(tok, v) [V/16, 32, 2 n-tiles, 4] of the U^T accumulator tiles."""
    g, t = _lanes()
    vg = np.arange(V // 16)[:, None, None, None]
    j = np.arange(2)[None, None, :, None]
    e = np.arange(4)[None, None, None, :]
    tok = 8 * j + 2 * t[None, :, None, None] + (e & 1)
    v = 16 * vg + g[None, :, None, None] + 8 * (e >> 1)
    return np.broadcast_arrays(tok, v)


def to_bits(x, op_dtype: str) -> np.ndarray:
    x = np.ascontiguousarray(x, np.float32)
    if op_dtype == "f16":
        return x.astype(np.float16).view(np.uint16)
    from ptxbuild.dtypes import from_float
    return np.ascontiguousarray(from_float(x, "bfloat16", np))


def from_bits(bits, op_dtype: str) -> np.ndarray:
    if op_dtype == "f16":
        return bits.view(np.float16).astype(np.float64)
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def per_chunk(x, ch, width: int | None = None):
    """[T, HV, X] token-major -> [NC, HV, 16, X] zero-padded per chunk."""
    NC = len(ch.chunk_start)
    X = x.shape[2] if width is None else width
    out = np.zeros((NC, x.shape[1], CH, X))
    for c, (t0, m) in enumerate(zip(ch.chunk_start, ch.chunk_len)):
        out[c, :, :m] = x[t0:t0 + m, :, :X].transpose(1, 0, 2)
    return out


def encode(ch, op_dtype: str = "f16") -> np.ndarray:
    """uint8 [NC, HV, BLOB]: the workspace of a Chunked reference (C = 16)."""
    assert ch.C == CH
    W, Qg, Kd = per_chunk(ch.W, ch), per_chunk(ch.Qg, ch), per_chunk(ch.Kd, ch)
    A, U = per_chunk(ch.A_qk, ch), per_chunk(ch.U, ch)
    NC, HV, _, K = W.shape
    V = U.shape[3]
    sz = sizes(K, V)
    ws = np.zeros((NC, HV, sz["BLOB"]), np.uint8)
    tok, chan = wq_index(K)
    frag = np.stack([-W[:, :, tok, chan], Qg[:, :, tok, chan]], axis=3)  # [NC, HV, K/16, 2, 32, 4, 2]
    frag = frag.transpose(0, 1, 2, 4, 3, 5, 6)                           # [.., ks, lane, which, reg, half]
    ws[:, :, sz["WQ"]:sz["KD"]] = to_bits(frag, op_dtype).reshape(NC, HV, -1).view(np.uint8)
    tok, chan = kd_index(K)
    ws[:, :, sz["KD"]:sz["AQ"]] = to_bits(Kd[:, :, tok, chan], op_dtype).reshape(NC, HV, -1).view(np.uint8)
    r, s = aq_index()
    ws[:, :, sz["AQ"]:sz["GAM"]] = to_bits(A[:, :, r, s], op_dtype).reshape(NC, HV, -1).view(np.uint8)
    ws[:, :, sz["GAM"]:sz["U"]] = np.ascontiguousarray(ch.gamma_last, np.float32).reshape(NC, HV, -1).view(np.uint8)
    tok, v = u_index(V)
    ws[:, :, sz["U"]:] = np.ascontiguousarray(U[:, :, tok, v], np.float32).reshape(NC, HV, -1).view(np.uint8)
    return ws


def decode(ws, NC: int, HV: int, K: int, V: int, op_dtype: str = "f16") -> dict[str, np.ndarray]:
    """Matrices [NC, HV, 16, X] (W, Qg, Kd, A_qk, U) and gamma_last [NC, HV, K] from a workspace."""
    sz = sizes(K, V)
    ws = np.asarray(ws, np.uint8)[:NC * HV * sz["BLOB"]].reshape(NC, HV, sz["BLOB"])   # any tail (flags) ignored
    out = {n: np.zeros((NC, HV, CH, X)) for n, X in (("W", K), ("Qg", K), ("Kd", K), ("A_qk", CH), ("U", V))}
    frag = from_bits(np.ascontiguousarray(ws[:, :, sz["WQ"]:sz["KD"]]).view(np.uint16), op_dtype)
    frag = frag.reshape(NC, HV, K // 16, 32, 2, 4, 2)
    tok, chan = wq_index(K)
    out["W"][:, :, tok, chan] = -frag[:, :, :, :, 0]
    out["Qg"][:, :, tok, chan] = frag[:, :, :, :, 1]
    tok, chan = kd_index(K)
    out["Kd"][:, :, tok, chan] = from_bits(np.ascontiguousarray(ws[:, :, sz["KD"]:sz["AQ"]]).view(np.uint16),
                                           op_dtype).reshape(NC, HV, K // 16, 32, 4, 2)
    r, s = aq_index()
    out["A_qk"][:, :, r, s] = from_bits(np.ascontiguousarray(ws[:, :, sz["AQ"]:sz["GAM"]]).view(np.uint16),
                                        op_dtype).reshape(NC, HV, 32, 4, 2)
    out["gamma_last"] = np.ascontiguousarray(ws[:, :, sz["GAM"]:sz["U"]]).view(np.float32).astype(np.float64)
    tok, v = u_index(V)
    out["U"][:, :, tok, v] = np.ascontiguousarray(ws[:, :, sz["U"]:]).view(np.float32).astype(
        np.float64).reshape(NC, HV, V // 16, 32, 2, 4)
    return out


def simulate(ws, ch, h0, cu_seqlens, op_dtype: str = "f16"):
    """What the recurrence kernel computes from a workspace, in matrix form (operands rounded as
    the kernel rounds them, accumulation in float64): (o [T, HV, V] rounded to bf16, hT)."""
    from ptxbuild.dtypes import from_float, to_float
    NC = len(ch.chunk_start)
    HV, V, K = ch.hT.shape[1:]
    d = decode(ws, NC, HV, K, V, op_dtype)
    rnd = lambda x: from_bits(to_bits(x, op_dtype), op_dtype)
    T = ch.O.shape[0]
    o = np.zeros((T, HV, V))
    hT = np.zeros_like(ch.hT)
    co = ch.chunk_offsets
    for n in range(len(co) - 1):
        S = np.array(h0[n], np.float64) if h0 is not None else np.zeros((HV, V, K))
        for c in range(co[n], co[n + 1]):
            S16 = rnd(S)
            Vn = rnd(d["U"][c] - np.einsum("hrk,hvk->hrv", d["W"][c], S16))
            Oc = np.einsum("hrk,hvk->hrv", d["Qg"][c], S16) + d["A_qk"][c] @ Vn
            t0, m = ch.chunk_start[c], ch.chunk_len[c]
            o[t0:t0 + m] = Oc[:, :m].transpose(1, 0, 2)
            S = (S * d["gamma_last"][c][:, None, :] + np.einsum("hrv,hrk->hvk", Vn, d["Kd"][c])).astype(np.float32)
        hT[n] = S
    o = to_float(from_float(o.astype(np.float32), "bfloat16", np), "bfloat16", np)
    return o, hT
