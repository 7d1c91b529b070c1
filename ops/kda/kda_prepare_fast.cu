// KDA forward, stage 1 ("prepare"), variant 1: same signature, entry and workspace as kda_prepare.cu,
// one block of 4 warps per (chunk, value head), built for throughput (see NOTES.md for the counts):
//   - the chunk's q, k, a, v rows arrive in one wave of 16-byte cp.async (zero-filled past the
//     chunk's length); small register and shared-memory footprint, so 4-5 blocks share an SM;
//   - exp(G_r - G_s) = exp(G_r - G_ref) exp(G_ref - G_s), G_ref = G of row 7: L and A_qk become two
//     16 x 16 x 128 products on the tensor cores. |G_r - G_ref| <= 8 * |LOWER_BOUND| = 40 nats for the
//     safe gate, which fp32 holds (2^58) but f16 does not, so the products use tf32 operands (the
//     fp32 exponent, a 10-bit mantissa like f16) with fp32 accumulation; the masked upper triangle
//     (up to e^75) stays finite too and is discarded by a select. GATE 1/2 are unbounded: op.py's
//     check() keeps them on variant 0;
//   - (I + L)^-1 by column-parallel forward substitution (one lane per column, fp32), then
//     W = T_inv diag(beta) (K * Gamma) and U^T = V^T (T_inv diag(beta))^T as tf32 products whose
//     accumulators are already the workspace's fragment order.
// Defines from op.py: KDIM VDIM CH H HV GATE L2NORM LOWER_BOUND PREP_THREADS OP_BF16.

#if PREP_THREADS != 128 || KDIM != 128 || VDIM != 128 || CH != 16
#error "kda_prepare_fast: 128 threads, K = V = 128, C = 16"
#endif
#if GATE != 0
#error "kda_prepare_fast: the factored exponentials need the bounded (safe) gate"
#endif

#define PF_LOG2E 1.4426950408889634f
#define PF_BS 136      // bf16 row stride of the staged inputs: conflict-free V^T fragment loads
#define PF_FS 132      // fp32 row stride of Kp, Qp, Km: conflict-free tf32 fragment loads (4g + t)
#define PF_TS 20       // fp32 row stride of L and T_inv diag(beta): (20g + t) mod 32 distinct

__device__ __forceinline__ void pf_cp_async16(void* smem, const void* gmem, int bytes) {
  const u32 s = (u32)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(bytes) : "memory");
}

__device__ __forceinline__ u32 tf32(float x) {
  u32 r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}

__device__ __forceinline__ float rcp(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

// D (16x8 fp32) += A (16x8 tf32, row) * B (8x8 tf32, col)
__device__ __forceinline__ void mma1688(float* d, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float bf16_lo(u32 w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(u32 w) { return __uint_as_float(w & 0xffff0000u); }

// 128 threads between the steps of one chunk's prepare: the whole block (BAR 0, kda_prepare) or the
// producer warps of kda_fused.cu (BAR 1: named barrier 1 of 128 threads; consumers never take it)
template <int BAR>
__device__ __forceinline__ void pf_sync() {
  if (BAR == 0) {
    __syncthreads();
  } else {
    asm volatile("bar.sync 1, 128;" ::: "memory");
  }
}

// Steps 1-4 of one chunk's prepare, from its staged rows (sIn: q, k, a, v; the L and T_inv scratch
// reuses the q rows) and beta (sB) to the workspace blob (global memory here, shared memory in
// kda_fused.cu). Shared by both kernels; tid is the thread's index among the 128 that run it (lane,
// warp, g = lane / 4, t = lane % 4 derived from it by the caller). KM_OVER_ROWS: sKm lies over the k
// and a rows (prep_compact), so step 2 reads its k and a columns, syncs, then writes.
template <int BAR, bool KM_OVER_ROWS = false>
__device__ __forceinline__ void pf_chunk(bf16_t (*sIn)[CH][PF_BS], float (*sKp)[PF_FS], float (*sQp)[PF_FS],
                                         float (*sKm)[PF_FS], float* sCG, float* sCL, float* sRq, float* sRk,
                                         float* sB, unsigned char* blob, int m, float bias, float A2, float scale,
                                         int tid, int lane, int warp, int g, int t) {
  // L and T_inv diag(beta) reuse the q rows once step 2 has read them
  float (*sL)[PF_TS] = reinterpret_cast<float (*)[PF_TS]>(&sIn[0][0][0]);
  float (*sTb)[PF_TS] = sL + CH;

  // 1. L2 norms of the q and k rows (one warp per 4 rows, 4 channels per lane); scale folded into q
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = 4 * warp + i;
    const u32* qw = reinterpret_cast<const u32*>(&sIn[0][r][4 * lane]);
    const u32* kw = reinterpret_cast<const u32*>(&sIn[1][r][4 * lane]);
    float sq = 0.f, sk = 0.f;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      sq += bf16_lo(qw[j]) * bf16_lo(qw[j]) + bf16_hi(qw[j]) * bf16_hi(qw[j]);
      sk += bf16_lo(kw[j]) * bf16_lo(kw[j]) + bf16_hi(kw[j]) * bf16_hi(kw[j]);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      sq += __shfl_xor_sync(0xffffffffu, sq, o);
      sk += __shfl_xor_sync(0xffffffffu, sk, o);
    }
    if (lane == 0) {
#if L2NORM
      sRq[r] = rsqrtf(sq + 1e-6f) * scale;
      sRk[r] = rsqrtf(sk + 1e-6f);
#else
      sRq[r] = scale;
      sRk[r] = 1.f;
#endif
    }
  }
  pf_sync<BAR>();

  // 2. one thread per channel d: gate (log2 units), cumsum, the factored exponentials
  //    Kp = k^ 2^(G - Gref), Qp = q^ 2^(G - Gref), Km = k^ 2^(Gref - G); per channel 2^Gref and
  //    2^(G_last - Gref), from which Qg = Qp 2^Gref, K * Gamma = Kp 2^Gref, Kd = Km 2^(G_last - Gref)
  {
    const int d = tid;
    float G[CH], kv[CH], acc = 0.f;
#pragma unroll
    for (int r = 0; r < CH; ++r) {
      const float x = bf16_to_f32(sIn[2][r][d]) + bias;          // safe gate: lb * sigmoid(A x)
      acc += r < m ? (LOWER_BOUND * PF_LOG2E) * rcp(1.f + ex2(-A2 * x)) : 0.f;
      G[r] = acc;
      if (KM_OVER_ROWS) kv[r] = bf16_to_f32(sIn[1][r][d]);
    }
    if (KM_OVER_ROWS) pf_sync<BAR>();      // every column of k and a is read: Km may overwrite them
    const float Gref = G[7];
#pragma unroll
    for (int r = 0; r < CH; ++r) {
      const float e = ex2(G[r] - Gref), kh = (KM_OVER_ROWS ? kv[r] : bf16_to_f32(sIn[1][r][d])) * sRk[r];
      sKp[r][d] = kh * e;
      sQp[r][d] = bf16_to_f32(sIn[0][r][d]) * sRq[r] * e;
      sKm[r][d] = kh * ex2(Gref - G[r]);
    }
    sCG[d] = ex2(Gref);
    sCL[d] = ex2(G[CH - 1] - Gref);
    ((float*)(blob + WS_GAM))[d] = ex2(G[CH - 1]);
  }
  pf_sync<BAR>();

  // 3. warp 0: L = diag(beta) (Kp Km^T), strictly lower, then T_inv; warp 1: A_qk = Qp Km^T (s <= r)
  //    straight to its fragment; warps 2, 3: the Kd fragments
  if (warp < 2) {
    float (*src)[PF_FS] = warp ? sQp : sKp;
    float acc[2][4] = {};
#pragma unroll
    for (int ks = 0; ks < KDIM / 8; ++ks) {
      const int c0 = 8 * ks + t;
      const u32 a0 = tf32(src[g][c0]), a1 = tf32(src[g + 8][c0]), a2 = tf32(src[g][c0 + 4]), a3 = tf32(src[g + 8][c0 + 4]);
#pragma unroll
      for (int j = 0; j < 2; ++j)
        mma1688(acc[j], a0, a1, a2, a3, tf32(sKm[8 * j + g][c0]), tf32(sKm[8 * j + g][c0 + 4]));
    }
    // acc[j][e]: row r = g + 8 (e >> 1), column s = 8 j + 2 t + (e & 1)
    if (warp == 1) {
      float x[2][4];
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) x[j][e] = 8 * j + 2 * t + (e & 1) <= g + 8 * (e >> 1) ? acc[j][e] : 0.f;
      U4 o;
      o.x = pack2(x[0][0], x[0][1]);
      o.y = pack2(x[1][0], x[1][1]);
      o.z = pack2(x[0][2], x[0][3]);
      o.w = pack2(x[1][2], x[1][3]);
      ((U4*)(blob + WS_AQ))[lane] = o;
    } else {
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = g + 8 * (e >> 1), s = 8 * j + 2 * t + (e & 1);
          sL[r][s] = s < r ? sB[r] * acc[j][e] : 0.f;
        }
      __syncwarp();
      // column j of T_inv: x_s is final once rows < s are done; then x_r -= L_rs x_s for r > s
      if (lane < CH) {
        float x[CH];
#pragma unroll
        for (int r = 0; r < CH; ++r) x[r] = r == lane ? 1.f : 0.f;
#pragma unroll
        for (int s = 0; s < CH; ++s)
#pragma unroll
          for (int r = s + 1; r < CH; ++r) x[r] -= sL[r][s] * x[s];
        const float bj = sB[lane];
#pragma unroll
        for (int r = 0; r < CH; ++r) sTb[r][lane] = x[r] * bj;
      }
    }
  } else {
    for (int u = tid - 64; u < (KDIM / 16) * 32; u += 64) {           // KD: [pair of n-tiles][lane]
      const int p = u >> 5, ca = 16 * p + g, cb = ca + 8;
      const float la = sCL[ca], lb = sCL[cb];
      U4 o;
      o.x = pack2(sKm[2 * t][ca] * la, sKm[2 * t + 1][ca] * la);
      o.y = pack2(sKm[2 * t + 8][ca] * la, sKm[2 * t + 9][ca] * la);
      o.z = pack2(sKm[2 * t][cb] * lb, sKm[2 * t + 1][cb] * lb);
      o.w = pack2(sKm[2 * t + 8][cb] * lb, sKm[2 * t + 9][cb] * lb);
      ((U4*)(blob + WS_KD))[u] = o;
    }
  }
  pf_sync<BAR>();

  // 4. each warp: W = Tb (K * Gamma) and Qg for channel blocks 2w, 2w+1; U^T = V^T Tb^T for value
  //    blocks 2w, 2w+1 (Tb = T_inv diag(beta); V is bf16, so exact in tf32)
  // Tb fragments, as A (rows g, g + 8) of W and as B (n = tokens 8 j + g) of U^T: the same registers
  u32 ta[2][4];
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) {
    const int s0 = 8 * kk + t;
    ta[kk][0] = tf32(sTb[g][s0]);
    ta[kk][1] = tf32(sTb[g + 8][s0]);
    ta[kk][2] = tf32(sTb[g][s0 + 4]);
    ta[kk][3] = tf32(sTb[g + 8][s0 + 4]);
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int ks = 2 * warp + i;
    float acc[2][4] = {};
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int ch = 16 * ks + 8 * j + g;
      const float cg = sCG[ch];
#pragma unroll
      for (int kk = 0; kk < 2; ++kk)
        mma1688(acc[j], ta[kk][0], ta[kk][1], ta[kk][2], ta[kk][3],
                tf32(sKp[8 * kk + t][ch] * cg), tf32(sKp[8 * kk + t + 4][ch] * cg));
    }
    const int c0 = 16 * ks + 2 * t;
    const float g0 = sCG[c0], g1 = sCG[c0 + 1], g8 = sCG[c0 + 8], g9 = sCG[c0 + 9];
    U4 w, qg;
    w.x = pack2(-acc[0][0], -acc[0][1]);
    w.y = pack2(-acc[1][0], -acc[1][1]);
    w.z = pack2(-acc[0][2], -acc[0][3]);
    w.w = pack2(-acc[1][2], -acc[1][3]);
    qg.x = pack2(sQp[g][c0] * g0, sQp[g][c0 + 1] * g1);
    qg.y = pack2(sQp[g][c0 + 8] * g8, sQp[g][c0 + 9] * g9);
    qg.z = pack2(sQp[g + 8][c0] * g0, sQp[g + 8][c0 + 1] * g1);
    qg.w = pack2(sQp[g + 8][c0 + 8] * g8, sQp[g + 8][c0 + 9] * g9);
    U4* dst = (U4*)(blob + WS_WQ) + (ks * 32 + lane) * 2;               // WQ: [ks][lane][-W | Qg]
    dst[0] = w;
    dst[1] = qg;
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int vg = 2 * warp + i, col = 16 * vg + g;
    float acc[2][4] = {};
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      const int s0 = 8 * kk + t;
      const u32 a0 = __float_as_uint(bf16_to_f32(sIn[3][s0][col])), a1 = __float_as_uint(bf16_to_f32(sIn[3][s0][col + 8]));
      const u32 a2 = __float_as_uint(bf16_to_f32(sIn[3][s0 + 4][col])), a3 = __float_as_uint(bf16_to_f32(sIn[3][s0 + 4][col + 8]));
#pragma unroll
      for (int j = 0; j < 2; ++j) mma1688(acc[j], a0, a1, a2, a3, ta[kk][j], ta[kk][j + 2]);
    }
    F4* dst = (F4*)(blob + WS_U) + (vg * 32 + lane) * 2;                // U: [vg][lane][n-tile]
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      F4 o;
      o.x = acc[j][0];
      o.y = acc[j][1];
      o.z = acc[j][2];
      o.w = acc[j][3];
      dst[j] = o;
    }
  }
}

#if PREP_COMPACT
#define PF_MIN_BLOCKS 6   // 35.5 KB of static smem: 6 blocks share an SM (44 KB: 5), at <= 80 registers
#define PF_KM_OVER_ROWS true
#else
#define PF_MIN_BLOCKS 4
#define PF_KM_OVER_ROWS false
#endif

extern "C" __global__ void __launch_bounds__(128, PF_MIN_BLOCKS)
kda_prepare(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
            const bf16_t* __restrict__ a,        // raw gate logits [T, HV, K]
            const float* __restrict__ g_in,      // unused (given gate: variant 0)
            const bf16_t* __restrict__ b,        // beta logits [T, HV]
            const float* __restrict__ A_log,     // [HV]
            const float* __restrict__ dt_bias,   // [HV, K]
            const int* __restrict__ chunk_start, const int* __restrict__ chunk_len,
            unsigned char* __restrict__ ws, float scale) {
  __shared__ __align__(16) bf16_t sIn[4][CH][PF_BS];             // q, k, a, v rows as loaded
#if PREP_COMPACT
  // prep_compact: Km (8448 B) over the k and a rows (8704 B), dead once step 2 has read them
  static_assert(CH * PF_FS * 4 <= 2 * CH * PF_BS * 2, "Km must fit over the k and a rows");
  __shared__ __align__(16) float sKp[CH][PF_FS], sQp[CH][PF_FS];
  float (*sKm)[PF_FS] = reinterpret_cast<float (*)[PF_FS]>(&sIn[1][0][0]);
#else
  __shared__ __align__(16) float sKp[CH][PF_FS], sQp[CH][PF_FS], sKm[CH][PF_FS];
#endif
  __shared__ float sCG[KDIM], sCL[KDIM], sRq[CH], sRk[CH], sB[CH];

  const int c = blockIdx.x, hv = blockIdx.y, h = hv / (HV / H);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int t0 = chunk_start[c], m = chunk_len[c];
  unsigned char* blob = ws + ((size_t)c * HV + hv) * WS_BLOB;

  // 0. load: 4 tensors x 16 rows x 16 pieces of 16 bytes, 8 per thread, all in flight at once
#pragma unroll
  for (int i = tid; i < 4 * CH * 16; i += 128) {
    const int x = i >> 8, r = (i >> 4) & 15, p = i & 15;
    const size_t row = t0 + min(r, m - 1);                       // a valid address; zero-filled past m
    // (a is [T, HV, K], v [T, HV, V]: K = V here)
    const bf16_t* src = x < 2 ? (x ? k : q) + (row * H + h) * KDIM : (x == 2 ? a : v) + (row * HV + hv) * KDIM;
    pf_cp_async16(&sIn[x][r][8 * p], src + 8 * p, r < m ? 16 : 0);
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
  const float bias = dt_bias[hv * KDIM + tid], A2 = expf(A_log[hv]) * PF_LOG2E;
  if (tid < CH) sB[tid] = tid < m ? rcp(1.f + ex2(-PF_LOG2E * bf16_to_f32(b[(size_t)(t0 + tid) * HV + hv]))) : 0.f;
  asm volatile("cp.async.wait_all;" ::: "memory");
  __syncthreads();
  pf_chunk<0, PF_KM_OVER_ROWS>(sIn, sKp, sQp, sKm, sCG, sCL, sRq, sRk, sB, blob, m, bias, A2, scale, tid, lane, warp, g, t);
}
