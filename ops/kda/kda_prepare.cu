// KDA forward, stage 1 ("prepare"): token-parallel, one block of PREP_THREADS per (chunk, value
// head). Gate, beta, L2 norm, within-chunk cumsum, L and A_qk with per-pair exponentials
// exp(G_r - G_s) (no overflow for any gate), (I + L)^-1 by forward substitution, W, U, Qg, Kd,
// exp(G_last); written as one workspace blob in mma fragment order (kda_common.cuh).
// Defines from op.py: KDIM VDIM CH H HV GATE (0 safe, 1 canonical, 2 given) L2NORM LOWER_BOUND
// PREP_THREADS OP_BF16.

#define KP (KDIM + 1)
#define VP (VDIM + 1)
#define LOG2E 1.4426950408889634f

extern "C" __global__ void __launch_bounds__(PREP_THREADS)
kda_prepare(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
            const bf16_t* __restrict__ a,        // raw gate logits [T, HV, K] (GATE 0/1)
            const float* __restrict__ g_in,      // given gate [T, HV, K] (GATE 2)
            const bf16_t* __restrict__ b,        // beta logits [T, HV]
            const float* __restrict__ A_log,     // [HV]
            const float* __restrict__ dt_bias,   // [HV, K]
            const int* __restrict__ chunk_start, const int* __restrict__ chunk_len,
            unsigned char* __restrict__ ws, float scale) {
  __shared__ float sQ[CH][KP], sK[CH][KP], sG[CH][KP], sW[CH][KP], sV[CH][VP];
  __shared__ float sL[CH][CH + 1], sA[CH][CH + 1], sT[CH][CH + 1], sB[CH];

  const int c = blockIdx.x, hv = blockIdx.y, h = hv / (HV / H);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int t0 = chunk_start[c], m = chunk_len[c];
  unsigned char* blob = ws + ((size_t)c * HV + hv) * WS_BLOB;

  // 1. load (rows past the chunk's length are zero: they change nothing downstream)
  for (int i = tid; i < CH * KDIM; i += PREP_THREADS) {
    const int r = i / KDIM, d = i % KDIM;
    float qv = 0.f, kv = 0.f, gv = 0.f;
    if (r < m) {
      const size_t tq = ((size_t)(t0 + r) * H + h) * KDIM + d;
      const size_t tg = ((size_t)(t0 + r) * HV + hv) * KDIM + d;
      qv = bf16_to_f32(q[tq]);
      kv = bf16_to_f32(k[tq]);
#if GATE == 2
      gv = g_in[tg];
#else
      const float x = bf16_to_f32(a[tg]) + dt_bias[hv * KDIM + d];
      const float A = expf(A_log[hv]);
#if GATE == 0
      gv = LOWER_BOUND / (1.f + expf(-A * x));
#else
      gv = -A * (x >= 20.f ? x : log1pf(expf(x)));
#endif
#endif
    }
    sQ[r][d] = qv; sK[r][d] = kv; sG[r][d] = gv;
  }
  for (int i = tid; i < CH * VDIM; i += PREP_THREADS) {
    const int r = i / VDIM, j = i % VDIM;
    sV[r][j] = r < m ? bf16_to_f32(v[((size_t)(t0 + r) * HV + hv) * VDIM + j]) : 0.f;
  }
  if (tid < CH) sB[tid] = tid < m ? 1.f / (1.f + expf(-bf16_to_f32(b[(size_t)(t0 + tid) * HV + hv]))) : 0.f;
  __syncthreads();

  // 2. L2 norm of q and k rows (one warp per row), scale folded into q; cumsum of g (log2 units)
  for (int r = warp; r < CH; r += PREP_THREADS / 32) {
    float sq = 0.f, sk = 0.f;
    for (int d = lane; d < KDIM; d += 32) { sq += sQ[r][d] * sQ[r][d]; sk += sK[r][d] * sK[r][d]; }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      sq += __shfl_xor_sync(0xffffffffu, sq, o);
      sk += __shfl_xor_sync(0xffffffffu, sk, o);
    }
#if L2NORM
    const float rq = rsqrtf(sq + 1e-6f) * scale, rk = rsqrtf(sk + 1e-6f);
#else
    const float rq = scale, rk = 1.f;
#endif
    for (int d = lane; d < KDIM; d += 32) { sQ[r][d] *= rq; sK[r][d] *= rk; }
  }
  for (int d = tid; d < KDIM; d += PREP_THREADS) {
    float G = 0.f;
    for (int r = 0; r < CH; ++r) { G += sG[r][d]; sG[r][d] = G * LOG2E; }
  }
  __syncthreads();

  // 3. L (strictly lower, times beta_r) and A_qk (lower incl. diagonal; q carries the scale)
  for (int p = tid; p < CH * CH; p += PREP_THREADS) {
    const int r = p / CH, s = p % CH;
    float kk = 0.f, qk = 0.f;
    if (s <= r) {
      for (int d = 0; d < KDIM; ++d) {
        const float e = ex2(sG[r][d] - sG[s][d]);
        const float ks = sK[s][d] * e;
        kk += sK[r][d] * ks;
        qk += sQ[r][d] * ks;
      }
    }
    sL[r][s] = s < r ? sB[r] * kk : 0.f;
    sA[r][s] = qk;
  }
  __syncthreads();

  // 4. T_inv = (I + L)^-1, one thread per column, forward substitution
  if (tid < CH) {
    const int j = tid;
    for (int r = 0; r < CH; ++r) {
      float x = r == j ? 1.f : 0.f;
      for (int s = j; s < r; ++s) x -= sL[r][s] * sT[s][j];
      sT[r][j] = x;
    }
  }
  __syncthreads();

  // 5. per channel: W = T_inv diag(beta) (K * Gamma), Qg = Q * Gamma, Kd = K * exp(G_last - G),
  //    gamma_last; per value column: U = T_inv diag(beta) V (in place)
  for (int d = tid; d < KDIM; d += PREP_THREADS) {
    float x[CH];
    const float Gl = sG[CH - 1][d];
#pragma unroll
    for (int s = 0; s < CH; ++s) x[s] = sB[s] * sK[s][d] * ex2(sG[s][d]);
#pragma unroll
    for (int r = 0; r < CH; ++r) {
      float w = 0.f;
#pragma unroll
      for (int s = 0; s <= r; ++s) w += sT[r][s] * x[s];
      sW[r][d] = w;
      const float Gr = sG[r][d];
      sQ[r][d] *= ex2(Gr);
      sK[r][d] *= ex2(Gl - Gr);
    }
    ((float*)(blob + WS_GAM))[d] = ex2(Gl);
  }
  for (int j = tid; j < VDIM; j += PREP_THREADS) {
    float x[CH];
#pragma unroll
    for (int s = 0; s < CH; ++s) x[s] = sB[s] * sV[s][j];
#pragma unroll
    for (int r = 0; r < CH; ++r) {
      float u = 0.f;
#pragma unroll
      for (int s = 0; s <= r; ++s) u += sT[r][s] * x[s];
      sV[r][j] = u;
    }
  }
  __syncthreads();

  // 6. write the blob in fragment order (g = lane / 4 is the row/col group, t = lane % 4)
  for (int u = tid; u < (KDIM / 16) * 64; u += PREP_THREADS) {        // WQ: [ks][lane][-W | Qg]
    const int ks = u >> 6, ln = (u >> 1) & 31, which = u & 1;
    const int g = ln >> 2, t = ln & 3, c0 = 16 * ks + 2 * t;
    float (*src)[KP] = which ? sQ : sW;
    const float sg = which ? 1.f : -1.f;
    U4 o;
    o.x = pack2(sg * src[g][c0], sg * src[g][c0 + 1]);
    o.y = pack2(sg * src[g][c0 + 8], sg * src[g][c0 + 9]);
    o.z = pack2(sg * src[g + 8][c0], sg * src[g + 8][c0 + 1]);
    o.w = pack2(sg * src[g + 8][c0 + 8], sg * src[g + 8][c0 + 9]);
    ((U4*)(blob + WS_WQ))[u] = o;
  }
  for (int u = tid; u < (KDIM / 16) * 32; u += PREP_THREADS) {        // KD: [pair of n-tiles][lane]
    const int p = u >> 5, ln = u & 31, g = ln >> 2, t = ln & 3;
    const int ca = 16 * p + g, cb = 16 * p + 8 + g;                   // channels of n-tiles 2p, 2p+1
    U4 o;
    o.x = pack2(sK[2 * t][ca], sK[2 * t + 1][ca]);
    o.y = pack2(sK[2 * t + 8][ca], sK[2 * t + 9][ca]);
    o.z = pack2(sK[2 * t][cb], sK[2 * t + 1][cb]);
    o.w = pack2(sK[2 * t + 8][cb], sK[2 * t + 9][cb]);
    ((U4*)(blob + WS_KD))[u] = o;
  }
  if (tid < 32) {                                                     // AQ: [lane]
    const int g = tid >> 2, t = tid & 3;
    U4 o;
    o.x = pack2(sA[g][2 * t], sA[g][2 * t + 1]);
    o.y = pack2(sA[g][2 * t + 8], sA[g][2 * t + 9]);
    o.z = pack2(sA[g + 8][2 * t], sA[g + 8][2 * t + 1]);
    o.w = pack2(sA[g + 8][2 * t + 8], sA[g + 8][2 * t + 9]);
    ((U4*)(blob + WS_AQ))[tid] = o;
  }
  for (int u = tid; u < (VDIM / 16) * 64; u += PREP_THREADS) {        // U: [vg][lane][n-tile] float4
    const int vg = u >> 6, ln = (u >> 1) & 31, j = u & 1;
    const int g = ln >> 2, t = ln & 3, col = 16 * vg + g, tok = 8 * j + 2 * t;
    F4 o;
    o.x = sV[tok][col];
    o.y = sV[tok + 1][col];
    o.z = sV[tok][col + 8];
    o.w = sV[tok + 1][col + 8];
    ((F4*)(blob + WS_U))[u] = o;
  }
}
