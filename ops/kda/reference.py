"""float64 CPU references for the KDA forward: preprocessing, token recurrence, chunked form.

Layouts (B = 1, variable length through int64 `cu_seqlens` of N + 1 offsets):
  q, k      [T, H, K]        v, o      [T, HV, V]      (HV = H, or HV > H for GVA: value head
  a, g      [T, HV, K]        b, beta  [T, HV]           hv reads q/k head hv // (HV // H))
  A_log     [HV]              dt_bias  [HV, K]
  h0, hT    [N, HV, V, K]     states V-first (S^T of the K x V state of kda.md)

Math (per head, kda.md): S~_t = diag(exp g_t) S_{t-1}; u_t = beta_t (v_t - S~_t^T k_t);
S_t = S~_t + k_t u_t^T; o_t = scale * S_t^T q_t.  The gate and the decay live on the value head.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

try:  # numba makes T = 8192, H = 96 take seconds; numpy fallback is much slower
    import numba
    from numba import njit, prange
except ImportError:  # pragma: no cover - depends on the machine
    numba = None

LOWER_BOUND = -5.0
NORM_EPS = 1e-6


# ---------------------------------------------------------------- preprocessing
def sigmoid(x):
    x = np.asarray(x, np.float64)
    e = np.exp(-np.abs(x))
    r = 1.0 / (1.0 + e)
    return np.where(x >= 0, r, e * r)


def softplus(x):
    """log(1 + e^x), identity for x >= 20 (as the GPU kernels do)."""
    x = np.asarray(x, np.float64)
    return np.where(x >= 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def l2norm(x):
    """x * rsqrt(sum x^2 + 1e-6) over the last axis."""
    x = np.asarray(x, np.float64)
    return x / np.sqrt((x * x).sum(-1, keepdims=True) + NORM_EPS)


def gate(a, A_log, dt_bias, kind: str = "safe", lower_bound: float = LOWER_BOUND):
    """g [T, HV, K] in natural-log space from raw logits a [T, HV, K].

    safe:      g = lb * sigmoid(exp(A_log[h]) * (a + dt_bias[h]))      in (lb, 0)
    canonical: g = -exp(A_log[h]) * softplus(a + dt_bias[h])           in (-inf, 0]
    """
    a = np.asarray(a, np.float64)
    A = np.exp(np.asarray(A_log, np.float64))[None, :, None]
    x = a + np.asarray(dt_bias, np.float64)[None]
    if kind == "safe":
        return lower_bound * sigmoid(A * x)
    if kind == "canonical":
        return -A * softplus(x)
    raise ValueError(f"unknown gate kind {kind!r}: use 'safe', 'canonical' or pass g directly")


def _prep_body(qf, kf, af, A_log, dt_bias, kind, lb, norm, q, k, g):
    T, H, K = qf.shape
    HV = af.shape[1]
    for t in prange(T):
        for h in range(H):
            sq = 0.0
            sk = 0.0
            for d in range(K):
                sq += float(qf[t, h, d]) * float(qf[t, h, d])
                sk += float(kf[t, h, d]) * float(kf[t, h, d])
            rq = 1.0 / math.sqrt(sq + NORM_EPS) if norm else 1.0
            rk = 1.0 / math.sqrt(sk + NORM_EPS) if norm else 1.0
            for d in range(K):
                q[t, h, d] = float(qf[t, h, d]) * rq
                k[t, h, d] = float(kf[t, h, d]) * rk
        if kind >= 0:
            for hv in range(HV):
                A = math.exp(A_log[hv])
                for d in range(K):
                    x = float(af[t, hv, d]) + dt_bias[hv, d]
                    if kind == 0:
                        y = A * x
                        e = math.exp(-abs(y))
                        s = 1.0 / (1.0 + e) if y >= 0 else e / (1.0 + e)
                        g[t, hv, d] = lb * s
                    else:
                        sp = x if x >= 20.0 else math.log1p(math.exp(x))
                        g[t, hv, d] = -A * sp


_prep_nb = njit(parallel=True)(_prep_body) if numba is not None else None


def preprocess(case: dict, use_numba: bool = True) -> dict:
    """float64 (q, k, v, g, beta, scale, cu_seqlens, h0) from a make_case() dict."""
    kind = {"safe": 0, "canonical": 1}.get(case["gate"], -1)
    if use_numba and _prep_nb is not None:
        T, H, K = case["qf"].shape
        q, k = np.empty((T, H, K)), np.empty((T, H, K))
        g = np.empty(case["af"].shape) if kind >= 0 else np.asarray(case["g"], np.float64)
        _prep_nb(case["qf"], case["kf"], case["af"], case["A_log"], case["dt_bias"], kind,
                 float(case["lower_bound"]), bool(case["use_qk_l2norm"]), q, k, g)
    else:
        q, k = case["qf"].astype(np.float64), case["kf"].astype(np.float64)
        if case["use_qk_l2norm"]:
            q, k = l2norm(q), l2norm(k)
        if kind >= 0:
            g = gate(case["af"], case["A_log"], case["dt_bias"], case["gate"], case["lower_bound"])
        else:
            g = np.asarray(case["g"], np.float64)
    beta = sigmoid(case["bf"]) if case.get("beta") is None else np.asarray(case["beta"], np.float64)
    return dict(q=q, k=k, v=case["vf"].astype(np.float64), g=g, beta=beta, scale=case["scale"],
                cu_seqlens=case["cu_seqlens"], h0=case["h0"])


# ---------------------------------------------------------------- token recurrence
def _recurrent_body(q, k, v, g, beta, scale, cu, h0, has_h0, o, hT):
    T, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    N = cu.shape[0] - 1
    grp = HV // H
    for idx in prange(N * HV):
        n = idx // HV
        hv = idx - n * HV
        h = hv // grp
        S = np.zeros((V, K))
        if has_h0:
            for j in range(V):
                for d in range(K):
                    S[j, d] = h0[n, hv, j, d]
        eg = np.empty(K)
        kt = np.empty(K)
        qt = np.empty(K)
        for t in range(cu[n], cu[n + 1]):
            for d in range(K):
                eg[d] = math.exp(g[t, hv, d])
                kt[d] = k[t, h, d]
                qt[d] = q[t, h, d] * scale
            bt = beta[t, hv]
            for j in range(V):  # rows of the V-first state are independent
                kv = 0.0
                for d in range(K):
                    s = S[j, d] * eg[d]
                    S[j, d] = s
                    kv += s * kt[d]
                u = bt * (v[t, hv, j] - kv)
                acc = 0.0
                for d in range(K):
                    s = S[j, d] + u * kt[d]
                    S[j, d] = s
                    acc += s * qt[d]
                o[t, hv, j] = acc
        for j in range(V):
            for d in range(K):
                hT[n, hv, j, d] = S[j, d]


if numba is not None:
    # reassoc/contract only: lets the dot products vectorize, keeps inf/nan semantics
    _recurrent_nb = njit(parallel=True, fastmath={"reassoc", "contract"})(_recurrent_body)
else:  # pragma: no cover
    _recurrent_nb = None


def _recurrent_numpy(q, k, v, g, beta, scale, cu, h0, has_h0, o, hT):
    H, HV = q.shape[1], v.shape[1]
    hidx = np.arange(HV) // (HV // H)
    for n in range(len(cu) - 1):
        S = h0[n].copy() if has_h0 else np.zeros(hT.shape[1:])
        for t in range(cu[n], cu[n + 1]):
            kt, qt = k[t, hidx], q[t, hidx] * scale  # [HV, K]
            S = S * np.exp(g[t])[:, None, :]
            u = beta[t][:, None] * (v[t] - np.einsum("hvk,hk->hv", S, kt))
            S = S + u[:, :, None] * kt[:, None, :]
            o[t] = np.einsum("hvk,hk->hv", S, qt)
        hT[n] = S


def recurrent(q, k, v, g, beta, scale, cu_seqlens, h0=None, use_numba: bool = True):
    """Token-by-token float64 recurrence. Returns (o [T, HV, V], hT [N, HV, V, K])."""
    q, k, v, g, beta = (np.ascontiguousarray(x, np.float64) for x in (q, k, v, g, beta))
    cu = np.ascontiguousarray(cu_seqlens, np.int64)
    T, H, K = q.shape
    HV, V = v.shape[1:]
    if HV % H:
        raise ValueError(f"HV={HV} is not a multiple of H={H}")
    N = len(cu) - 1
    o = np.zeros((T, HV, V))
    hT = np.zeros((N, HV, V, K))
    has_h0 = h0 is not None
    h0a = np.ascontiguousarray(h0, np.float64) if has_h0 else np.zeros((1, 1, 1, 1))
    fn = _recurrent_nb if (use_numba and _recurrent_nb is not None) else _recurrent_numpy
    fn(q, k, v, g, beta, float(scale), cu, h0a, has_h0, o, hT)
    return o, hT


# ---------------------------------------------------------------- chunked form
@dataclass
class Chunked:
    """Every per-chunk intermediate of the chunked algorithm, token-major.

    Row r of a chunk is stored at the chunk's token r; matrices over the chunk (L, T_inv, A_qk)
    keep their C columns (zero past the chunk's length). chunk_start[c] is the first token of
    chunk c (chunks never cross segments; the last chunk of a segment may be short).
    """

    C: int
    chunk_start: np.ndarray  # [NC] int64
    chunk_len: np.ndarray    # [NC] int64
    chunk_offsets: np.ndarray  # [N + 1] first chunk of each segment
    G: np.ndarray       # [T, HV, K]  inclusive cumsum of g within the chunk
    L: np.ndarray       # [T, HV, C]  strictly lower: beta_r sum_d k_rd k_sd exp(G_rd - G_sd)
    T_inv: np.ndarray   # [T, HV, C]  (I + L)^-1
    W: np.ndarray       # [T, HV, K]  T_inv diag(beta) (K * Gamma)
    U: np.ndarray       # [T, HV, V]  T_inv diag(beta) V
    V_new: np.ndarray   # [T, HV, V]  U - W S0
    A_qk: np.ndarray    # [T, HV, C]  scale sum_d q_rd k_sd exp(G_rd - G_sd), s <= r
    Qg: np.ndarray      # [T, HV, K]  scale * Q * Gamma
    Kd: np.ndarray      # [T, HV, K]  K * exp(G_last - G)
    gamma_last: np.ndarray  # [NC, HV, K]  exp(G of the chunk's last token)
    O: np.ndarray       # [T, HV, V]
    hT: np.ndarray      # [N, HV, V, K]
    states: np.ndarray | None  # [NC, HV, V, K] state entering each chunk (keep_states=True)


def chunk_layout(cu_seqlens, C: int = 16):
    """(chunk_start, chunk_len, chunk_offsets) of the chunks of every segment."""
    cu = np.asarray(cu_seqlens, np.int64)
    starts, lens, offs = [], [], [0]
    for n in range(len(cu) - 1):
        for c0 in range(int(cu[n]), int(cu[n + 1]), C):
            starts.append(c0)
            lens.append(min(C, int(cu[n + 1]) - c0))
        offs.append(len(starts))
    return np.array(starts, np.int64), np.array(lens, np.int64), np.array(offs, np.int64)


def chunked(q, k, v, g, beta, scale, cu_seqlens, h0=None, C: int = 16, keep_states: bool = False) -> Chunked:
    """Chunked float64 KDA forward with per-pair exponentials exp(G_r - G_s) (no overflow for any gate)."""
    q, k, v, g, beta = (np.asarray(x, np.float64) for x in (q, k, v, g, beta))
    T, H, K = q.shape
    HV, V = v.shape[1:]
    hidx = np.arange(HV) // (HV // H)
    cs, cl, co = chunk_layout(cu_seqlens, C)
    NC, N = len(cs), len(co) - 1
    z = lambda *s: np.zeros(s)
    G, L, Ti, Aqk = z(T, HV, K), z(T, HV, C), z(T, HV, C), z(T, HV, C)
    W, Qg, Kd = z(T, HV, K), z(T, HV, K), z(T, HV, K)
    U, Vn, O = z(T, HV, V), z(T, HV, V), z(T, HV, V)
    gl = z(NC, HV, K)
    hT = z(N, HV, V, K)
    states = z(NC, HV, V, K) if keep_states else None
    for n in range(N):
        S = np.array(h0[n], np.float64) if h0 is not None else z(HV, V, K)
        for c in range(co[n], co[n + 1]):
            t0, m = int(cs[c]), int(cl[c])
            sl = slice(t0, t0 + m)
            if keep_states:
                states[c] = S
            kc = k[sl][:, hidx].transpose(1, 0, 2)   # [HV, m, K]
            qc = q[sl][:, hidx].transpose(1, 0, 2)
            vc = v[sl].transpose(1, 0, 2)            # [HV, m, V]
            bc = beta[sl].T                          # [HV, m]
            Gc = np.cumsum(g[sl].transpose(1, 0, 2), axis=1)
            incl = np.tril(np.ones((m, m), bool))
            D = Gc[:, :, None, :] - Gc[:, None, :, :]                     # [HV, r, s, K]
            E = np.exp(np.where(incl[None, :, :, None], D, -np.inf))      # 0 above the diagonal
            kk = np.einsum("hrd,hsd,hrsd->hrs", kc, kc, E, optimize=True)
            qk = np.einsum("hrd,hsd,hrsd->hrs", qc, kc, E, optimize=True) * scale
            Lc = bc[:, :, None] * kk * np.tril(np.ones((m, m)), -1)
            Tc = np.linalg.inv(np.eye(m)[None] + Lc)
            Tc = np.tril(Tc)  # exact zeros above the diagonal
            Gam = np.exp(Gc)
            Wc = Tc @ (bc[:, :, None] * kc * Gam)
            Uc = Tc @ (bc[:, :, None] * vc)
            Vc = Uc - np.einsum("hrk,hvk->hrv", Wc, S)
            Oc = scale * np.einsum("hrk,hvk->hrv", qc * Gam, S) + qk @ Vc
            Kdc = kc * np.exp(Gc[:, -1:, :] - Gc)
            S = S * Gam[:, -1, None, :] + np.einsum("hrv,hrk->hvk", Vc, Kdc)
            tr = lambda x: x.transpose(1, 0, 2)
            G[sl], W[sl], U[sl], Vn[sl], O[sl] = tr(Gc), tr(Wc), tr(Uc), tr(Vc), tr(Oc)
            Qg[sl], Kd[sl] = tr(scale * qc * Gam), tr(Kdc)
            L[sl, :, :m], Ti[sl, :, :m], Aqk[sl, :, :m] = tr(Lc), tr(Tc), tr(qk)
            gl[c] = Gam[:, -1]
        hT[n] = S
    return Chunked(C, cs, cl, co, G, L, Ti, W, U, Vn, Aqk, Qg, Kd, gl, O, hT, states)


# ---------------------------------------------------------------- inputs and errors
def make_case(T_list, H, K: int = 128, V: int = 128, seed: int = 0, gate: str = "safe", HV: int | None = None,
              use_qk_l2norm: bool = True, initial_state: bool = True, scale: float | None = None,
              a_scale: float = 1.0, a_shift: float = 0.0, bias_scale: float = 1.0, b_scale: float = 1.0,
              A_log=None, g=None, v_scale: float = 1.0, qk_scale: float = 1.0, h0_scale: float = 0.1,
              lower_bound: float = LOWER_BOUND) -> dict:
    """Random KDA inputs. q, k, v, a, b are rounded to bf16 once (dtypes.from_float, RNE) and kept
    both as uint16 bit patterns (for the GPU) and as their exact float32 upcast ("qf", ...; the
    reference computes in float64 from these, so both sides see bit-identical values).
    A_log, dt_bias, g (gate="given"), h0 are float32 (and their exact float64 upcast).

    gate: "safe" | "canonical" | "given" (g given [T, HV, K], or zeros when g is None: no decay).
    Raw gate logits a = a_shift + a_scale * N(0, 1); dt_bias = bias_scale * N(0, 1).
    """
    from ptxbuild.dtypes import from_float, to_float

    HV = HV or H
    rng = np.random.default_rng(seed)
    lens = [int(t) for t in T_list]
    T = sum(lens)
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)

    def bf16(x):
        bits = from_float(np.asarray(x, np.float32), "bfloat16", np)
        return bits, to_float(bits, "bfloat16", np)

    def randn(shape, sd=1.0, shift=0.0):
        x = rng.standard_normal(shape, dtype=np.float32)
        if sd != 1.0:
            x *= np.float32(sd)
        if shift:
            x += np.float32(shift)
        return x

    case = dict(T_list=lens, T=T, H=H, HV=HV, K=K, V=V, N=len(lens), seed=seed, gate=gate,
                use_qk_l2norm=use_qk_l2norm, lower_bound=lower_bound, cu_seqlens=cu,
                scale=float(K ** -0.5 if scale is None else scale), beta=None)
    for name, shape, sd in (("q", (T, H, K), qk_scale), ("k", (T, H, K), qk_scale), ("v", (T, HV, V), v_scale),
                            ("b", (T, HV), b_scale)):
        case[name], case[name + "f"] = bf16(randn(shape, sd))
    case["a"], case["af"] = bf16(randn((T, HV, K), a_scale, a_shift))
    if A_log is None:
        A_log = np.log(rng.uniform(1.0, 16.0, HV))
    case["A_log"] = np.broadcast_to(np.asarray(A_log, np.float32), (HV,)).astype(np.float64)
    case["dt_bias"] = (bias_scale * rng.standard_normal((HV, K))).astype(np.float32).astype(np.float64)
    if gate == "given":
        gg = np.zeros((T, HV, K)) if g is None else np.broadcast_to(g, (T, HV, K))
        case["g"] = np.asarray(gg, np.float32).astype(np.float64)
    case["h0"] = ((h0_scale * rng.standard_normal((len(lens), HV, V, K))).astype(np.float32).astype(np.float64)
                  if initial_state else None)
    return case


def rel_rms(x, ref) -> float:
    """sqrt(sum (x - ref)^2 / sum ref^2); inf if x has a non-finite value; abs RMS if ref is 0."""
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    if not np.all(np.isfinite(x)):
        return math.inf
    num = float(np.sum((x - ref) ** 2))
    den = float(np.sum(ref ** 2))
    if den == 0.0:
        return math.sqrt(num / max(x.size, 1))
    return math.sqrt(num / den)


def reference(case: dict, use_numba: bool = True):
    """(o, hT) of the recurrent float64 reference for a make_case() dict."""
    p = preprocess(case)
    return recurrent(p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], p["cu_seqlens"], p["h0"],
                     use_numba=use_numba)
