// KDA forward, stage 1 ("prepare"), session 26 probe: ONE WARP PER (chunk, value head), no block
// barrier, registers instead of staging (lab/kda/plan-session26.md says why). Writes exactly the
// workspace of ops/kda (kda_common.cuh's WS_* layout, workspace.py), so the locked kda_recurrence
// reads it unchanged and workspace.decode checks it field by field.
//
// Rendered by lab/kda/probe_s26.py after ops/kda's defines (host.defines) and kda_common.cuh.
// Needs the safe gate (factored exponentials, |G_r - G_ref| <= 8 * 5 nats), K = V = 128, C = 16.
//
// Lane (g = lane / 4, t = lane % 4) owns token rows g and g + 8 of its chunk and the 32 channels
// c(ks, e, h) = 16 ks + 8 e + 2 t + h (ks < 8, e, h < 2): exactly the positions of its -W and Qg
// fragments in the workspace (wq_index), so Qg is stored from registers. The same assignment is a
// valid k-order of the tf32 m16n8k8 products L = Kp Km^T and A_qk = Qp Km^T (k-step j = 2 ks + e,
// fragment column t <-> h = 0, t + 4 <-> h = 1), and there the B fragment Km[s = 8 jn + g][c] is the
// lane's own row jn: L and A_qk need no data movement at all. The cumsum over tokens is a shuffle
// scan over g (3 steps) plus the row-7 total. Only Kd (KD fragment order: token pairs x channel),
// K * Gamma (B operand of W) and v (A operand of U^T) go through this warp's shared memory.

#if KDIM != 128 || VDIM != 128 || CH != 16
#error "kda_s26_prepare: K = V = 128, C = 16"
#endif
#if GATE != 0
#error "kda_s26_prepare: the factored exponentials need the bounded (safe) gate"
#endif
#ifndef S26_WPB
#define S26_WPB 4          // warps (= chunks) per block
#endif
#ifndef S26_MINB
#define S26_MINB 3         // blocks per SM the registers are bounded for
#endif

#ifndef S26_REGS
#define S26_REGS 0         // 1: q, k, a words kept in registers (see S26_LOAD)
#endif
#ifndef S26_KS_UNROLL
#if S26_REGS
#define S26_KS_UNROLL 8    // the register arrays need static indices
#else
#define S26_KS_UNROLL 2    // step 2's channel blocks in flight (full unrolling spills at 168 registers)
#endif
#endif

#define S26_LOG2E 1.4426950408889634f
#define S26_VS 136         // bf16 row stride of staged v (as kda_prepare_fast's PF_BS: conflict-free)
#define S26_GS 136         // fp32 row stride of K * Gamma: reads [8 kk + t][16 ks + 8 j + g] conflict-free
#define S26_DS 24          // 16-bit column stride of Kd, stored [channel][token]: writes and reads conflict-free
#define S26_TS 20          // fp32 row stride of L and T_inv diag(beta)

// 19200 B per warp: 4 warps per block and 3 blocks (12 warps) fill an SM's 228 KB exactly
struct S26Warp {
  bf16_t v[CH][S26_VS];                        // 4352 B
  float kg[CH][S26_GS];                        // 8704 B; column KDIM (padding) holds beta of the row
  union {                                      // Kd until the KD fragments are out, then L and Tb
    unsigned short kd[KDIM][S26_DS];           // 6144 B
    float lt[2][CH][S26_TS];                   // 2560 B
  } u;
};
#define S26_BETA(r) sm.kg[r][KDIM]

__device__ __forceinline__ void s26_cp_async16(void* smem, const void* gmem, int bytes) {
  const u32 s = (u32)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(bytes) : "memory");
}

__device__ __forceinline__ u32 s26_tf32(float x) {
  u32 r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}

__device__ __forceinline__ float s26_rcp(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

// one float -> the 16-bit operand type, rounded as pack2 rounds (RN)
__device__ __forceinline__ unsigned short s26_half(float x) {
  unsigned short r;
#if OP_BF16
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(x));
#else
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(x));
#endif
  return r;
}

// D (16x8 fp32) += A (16x8 tf32, row) * B (8x8 tf32, col)
__device__ __forceinline__ void s26_mma1688(float* d, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float s26_lo(u32 w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float s26_hi(u32 w) { return __uint_as_float(w & 0xffff0000u); }

// One chunk-head's prepare by one warp: rows [t0, t0 + m) of head hv into `blob` (global memory, or a
// ring slot in shared memory in kda_s26_fused.cu: generic stores), U^T only for value blocks
// [vg_lo, vg_hi). sm is this warp's scratch. Leaves no cp.async in flight.
__device__ __forceinline__ void s26_chunk(S26Warp& sm, unsigned char* blob, const bf16_t* __restrict__ q,
                                          const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
                                          const bf16_t* __restrict__ a, const bf16_t* __restrict__ b,
                                          const float* __restrict__ A_log, const float* __restrict__ dt_bias,
                                          long long t0, int m, int hv, int h, float scale, int lane, int vg_lo,
                                          int vg_hi) {
  const int g = lane >> 2, t = lane & 3;
  const unsigned FULL = 0xffffffffu;
  __syncwarp();   // a warp that runs several chunks (kda_s26_fused.cu): every lane is done with the last one's smem

  // 0. v rows (for U^T) by cp.async into this warp's smem, zero-filled past m; in flight until step 5
#pragma unroll
  for (int i = lane; i < CH * 16; i += 32) {
    const int r = i >> 4, p = i & 15;
    const size_t row = (size_t)t0 + min(r, m - 1);
    s26_cp_async16(&sm.v[r][8 * p], v + (row * HV + hv) * VDIM + 8 * p, r < m ? 16 : 0);
  }
  asm volatile("cp.async.commit_group;" ::: "memory");

  // rows g, g + 8 of q, k, a (word w = 2 ks + e holds channels c(ks, e, 0..1)); rows past m read as 0
  const u32* qrow[2];
  const u32* krow[2];
  const u32* arow[2];
  bool rok[2];
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int r = g + 8 * rr;
    rok[rr] = r < m;
    const size_t row = (size_t)t0 + (rok[rr] ? r : 0);
    qrow[rr] = reinterpret_cast<const u32*>(q + (row * H + h) * KDIM) + t;
    krow[rr] = reinterpret_cast<const u32*>(k + (row * H + h) * KDIM) + t;
    arow[rr] = reinterpret_cast<const u32*>(a + (row * HV + hv) * KDIM) + t;
  }
#define S26_LOAD(ptrs, rr, w) (rok[rr] ? __ldg((ptrs)[rr] + 8 * ((w) >> 1) + 4 * ((w) & 1)) : 0u)
#if S26_REGS
  // S26_REGS: the 96 q, k, a words loaded once, up front, and kept in registers (no
  // re-read: run 26b's probe measured this prepare 1.5x slower than kda@h200's, and with ~230 KB of
  // shared memory per SM the L1 left for the re-reads of step 2 is small). Needs S26_KS_UNROLL 8 and
  // 255 registers (8 B spill in NVRTC 13.0): 8 warps per SM (S26_MINB 2). Compiled, not yet run.
  u32 wq_[2][16], wk_[2][16], wa_[2][16];                // a too: left in the loop, its loads still hoist
#pragma unroll
  for (int rr = 0; rr < 2; ++rr)
#pragma unroll
    for (int w = 0; w < 16; ++w) {
      wq_[rr][w] = S26_LOAD(qrow, rr, w);
      wk_[rr][w] = S26_LOAD(krow, rr, w);
      wa_[rr][w] = S26_LOAD(arow, rr, w);
    }
#define S26_REG_qrow(rr, w) wq_[rr][w]
#define S26_REG_krow(rr, w) wk_[rr][w]
#define S26_REG_arow(rr, w) wa_[rr][w]
#define S26_WORD(ptrs, rr, w) S26_REG_##ptrs(rr, w)
#else
#define S26_WORD(ptrs, rr, w) S26_LOAD(ptrs, rr, w)
#endif
  if (lane < CH) {
    S26_BETA(lane) = lane < m ? s26_rcp(1.f + ex2(-S26_LOG2E * bf16_to_f32(b[((size_t)t0 + lane) * HV + hv]))) : 0.f;
  }
  const float A2 = expf(A_log[hv]) * S26_LOG2E;
  const float* bias = dt_bias + (size_t)hv * KDIM;

  if (t < 2) {                                           // the gate rows' two 128-byte lines, for step 2
#pragma unroll
    for (int rr = 0; rr < 2; ++rr)
      if (rok[rr]) asm volatile("prefetch.global.L1 [%0];" ::"l"(arow[rr] - t + 32 * t));
  }

  // 1. L2 norms of rows g, g + 8 (32 channels here, the rest in lanes t' of the same g); scale into q.
  //    The words are read again in step 2 (L1 hits): keeping all 96 live costs spills.
  float rq[2], rk[2];
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    float sq = 0.f, sk = 0.f;
#pragma unroll
    for (int w = 0; w < 16; ++w) {
      const u32 qx = S26_WORD(qrow, rr, w), kx = S26_WORD(krow, rr, w);
      sq += s26_lo(qx) * s26_lo(qx) + s26_hi(qx) * s26_hi(qx);
      sk += s26_lo(kx) * s26_lo(kx) + s26_hi(kx) * s26_hi(kx);
    }
    sq += __shfl_xor_sync(FULL, sq, 1);
    sk += __shfl_xor_sync(FULL, sk, 1);
    sq += __shfl_xor_sync(FULL, sq, 2);
    sk += __shfl_xor_sync(FULL, sk, 2);
#if L2NORM
    rq[rr] = rsqrtf(sq + 1e-6f) * scale;
    rk[rr] = rsqrtf(sk + 1e-6f);
#else
    rq[rr] = scale;
    rk[rr] = 1.f;
#endif
  }

  // 2. per 16-channel block ks: gates, cumsum (shuffle scan over g), factored exponentials, the
  //    L / A_qk k-steps 2 ks, 2 ks + 1, Qg out, Kd and K * Gamma to smem
  float accL[2][4] = {}, accA[2][4] = {};
  U4* wq = (U4*)(blob + WS_WQ);
#pragma unroll S26_KS_UNROLL
  for (int ks = 0; ks < KDIM / 16; ++ks) {
    float qgv[2][2][2];                                  // [e][rr][h]
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int c0 = 16 * ks + 8 * e + 2 * t;             // this lane's channels c0, c0 + 1
      const F2 bb = *reinterpret_cast<const F2*>(bias + c0);
      const int w = 2 * ks + e;
      const u32 qwd[2] = {S26_WORD(qrow, 0, w), S26_WORD(qrow, 1, w)};
      const u32 kwd[2] = {S26_WORD(krow, 0, w), S26_WORD(krow, 1, w)};
      const u32 awd[2] = {S26_WORD(arow, 0, w), S26_WORD(arow, 1, w)};
      float kp[2][2], km[2][2], qp[2][2];                // [rr][h]
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const float bia = hh ? bb.y : bb.x;
        float x[2];
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
          const float av = hh ? s26_hi(awd[rr]) : s26_lo(awd[rr]);
          x[rr] = g + 8 * rr < m ? (LOWER_BOUND * S26_LOG2E) * s26_rcp(1.f + ex2(-A2 * (av + bia))) : 0.f;
        }
        // inclusive scan over g of rows g (x[0]) and g + 8 (x[1]); lanes 4 d apart are d rows apart
#pragma unroll
        for (int d = 1; d < 8; d <<= 1) {
          const float y0 = __shfl_up_sync(FULL, x[0], 4 * d), y1 = __shfl_up_sync(FULL, x[1], 4 * d);
          if (g >= d) {
            x[0] += y0;
            x[1] += y1;
          }
        }
        const float gref = __shfl_sync(FULL, x[0], 28 + t);      // G of row 7
        const float tail = __shfl_sync(FULL, x[1], 28 + t);      // sum over rows 8..15
        const float glast = gref + tail;                          // G of row 15
        const float G[2] = {x[0], gref + x[1]};
        const float cg = ex2(gref), cl = ex2(glast - gref);
        if (g == 0) ((float*)(blob + WS_GAM))[c0 + hh] = ex2(glast);
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
          const u32 kword = kwd[rr], qword = qwd[rr];
          const float kh = (hh ? s26_hi(kword) : s26_lo(kword)) * rk[rr];
          const float qh = (hh ? s26_hi(qword) : s26_lo(qword)) * rq[rr];
          const float ep = ex2(G[rr] - gref), em = ex2(gref - G[rr]);
          kp[rr][hh] = kh * ep;
          km[rr][hh] = kh * em;
          qp[rr][hh] = qh * ep;
          qgv[e][rr][hh] = qp[rr][hh] * cg;
          sm.kg[g + 8 * rr][c0 + hh] = kp[rr][hh] * cg;
          sm.u.kd[c0 + hh][g + 8 * rr] = s26_half(km[rr][hh] * cl);
        }
      }
      // k-step j = 2 ks + e: A = Kp / Qp (rows g, g + 8; columns t <-> h 0, t + 4 <-> h 1),
      // B for n-tile jn = Km of this lane's row jn
      const u32 ka0 = s26_tf32(kp[0][0]), ka1 = s26_tf32(kp[1][0]), ka2 = s26_tf32(kp[0][1]), ka3 = s26_tf32(kp[1][1]);
      const u32 qa0 = s26_tf32(qp[0][0]), qa1 = s26_tf32(qp[1][0]), qa2 = s26_tf32(qp[0][1]), qa3 = s26_tf32(qp[1][1]);
#pragma unroll
      for (int jn = 0; jn < 2; ++jn) {
        const u32 b0 = s26_tf32(km[jn][0]), b1 = s26_tf32(km[jn][1]);
        s26_mma1688(accL[jn], ka0, ka1, ka2, ka3, b0, b1);
        s26_mma1688(accA[jn], qa0, qa1, qa2, qa3, b0, b1);
      }
    }
    U4 qg;                                               // WQ fragment registers x, y, z, w (wq_index)
    qg.x = pack2(qgv[0][0][0], qgv[0][0][1]);
    qg.y = pack2(qgv[1][0][0], qgv[1][0][1]);
    qg.z = pack2(qgv[0][1][0], qgv[0][1][1]);
    qg.w = pack2(qgv[1][1][0], qgv[1][1][1]);
    wq[(ks * 32 + lane) * 2 + 1] = qg;
  }

  // 3. A_qk (s <= r) straight to its fragment: accA[j][e]: row g + 8 (e >> 1), column 8 j + 2 t + (e & 1)
  {
    float x[2][4];
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) x[j][e] = 8 * j + 2 * t + (e & 1) <= g + 8 * (e >> 1) ? accA[j][e] : 0.f;
    U4 o;
    o.x = pack2(x[0][0], x[0][1]);
    o.y = pack2(x[1][0], x[1][1]);
    o.z = pack2(x[0][2], x[0][3]);
    o.w = pack2(x[1][2], x[1][3]);
    ((U4*)(blob + WS_AQ))[lane] = o;
  }
  __syncwarp();                                          // every lane's Kd and K * Gamma are in smem

  // KD fragments: [pair of n-tiles p][lane] = {Kd[2t, 2t+1][16p + g], Kd[2t+8, 2t+9][..], same for + 8}
  {
    const u32* kdw = reinterpret_cast<const u32*>(&sm.u.kd[0][0]);
#pragma unroll
    for (int p = 0; p < KDIM / 16; ++p) {
      const int ca = 16 * p + g, cb = ca + 8;
      U4 o;
      o.x = kdw[(ca * S26_DS) / 2 + t];
      o.y = kdw[(ca * S26_DS) / 2 + 4 + t];
      o.z = kdw[(cb * S26_DS) / 2 + t];
      o.w = kdw[(cb * S26_DS) / 2 + 4 + t];
      ((U4*)(blob + WS_KD))[p * 32 + lane] = o;
    }
  }
  __syncwarp();                                          // Kd is read: L and Tb may overwrite it

  // 4. L = diag(beta) (Kp Km^T), strictly lower, then T_inv diag(beta) by column forward substitution
  float (*sL)[S26_TS] = sm.u.lt[0];
  float (*sTb)[S26_TS] = sm.u.lt[1];
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = g + 8 * (e >> 1), s = 8 * j + 2 * t + (e & 1);
      sL[r][s] = s < r ? S26_BETA(r) * accL[j][e] : 0.f;
    }
  __syncwarp();
  if (lane < CH) {
    float x[CH];
#pragma unroll
    for (int r = 0; r < CH; ++r) x[r] = r == lane ? 1.f : 0.f;
#pragma unroll
    for (int s = 0; s < CH; ++s)
#pragma unroll
      for (int r = s + 1; r < CH; ++r) x[r] -= sL[r][s] * x[s];
    const float bj = S26_BETA(lane);
#pragma unroll
    for (int r = 0; r < CH; ++r) sTb[r][lane] = x[r] * bj;
  }
  __syncwarp();

  // 5. W = Tb (K * Gamma) for all 8 channel blocks; U^T = V^T Tb^T for all 8 value blocks (tf32)
  u32 ta[2][4];
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) {
    const int s0 = 8 * kk + t;
    ta[kk][0] = s26_tf32(sTb[g][s0]);
    ta[kk][1] = s26_tf32(sTb[g + 8][s0]);
    ta[kk][2] = s26_tf32(sTb[g][s0 + 4]);
    ta[kk][3] = s26_tf32(sTb[g + 8][s0 + 4]);
  }
#pragma unroll
  for (int ks = 0; ks < KDIM / 16; ++ks) {
    float acc[2][4] = {};
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int ch = 16 * ks + 8 * j + g;
#pragma unroll
      for (int kk = 0; kk < 2; ++kk)
        s26_mma1688(acc[j], ta[kk][0], ta[kk][1], ta[kk][2], ta[kk][3], s26_tf32(sm.kg[8 * kk + t][ch]),
                    s26_tf32(sm.kg[8 * kk + t + 4][ch]));
    }
    U4 w;
    w.x = pack2(-acc[0][0], -acc[0][1]);
    w.y = pack2(-acc[1][0], -acc[1][1]);
    w.z = pack2(-acc[0][2], -acc[0][3]);
    w.w = pack2(-acc[1][2], -acc[1][3]);
    wq[(ks * 32 + lane) * 2] = w;
  }
  asm volatile("cp.async.wait_all;" ::: "memory");
  __syncwarp();                                          // every lane's v pieces have landed
#pragma unroll 2
  for (int vg = vg_lo; vg < vg_hi; ++vg) {
    const int col = 16 * vg + g;
    float acc[2][4] = {};
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      const int s0 = 8 * kk + t;
      const u32 a0 = __float_as_uint(bf16_to_f32(sm.v[s0][col])), a1 = __float_as_uint(bf16_to_f32(sm.v[s0][col + 8]));
      const u32 a2 = __float_as_uint(bf16_to_f32(sm.v[s0 + 4][col])), a3 = __float_as_uint(bf16_to_f32(sm.v[s0 + 4][col + 8]));
#pragma unroll
      for (int j = 0; j < 2; ++j) s26_mma1688(acc[j], a0, a1, a2, a3, ta[kk][j], ta[kk][j + 2]);
    }
    F4* dst = (F4*)(blob + WS_U) + (vg * 32 + lane) * 2;  // U: [vg][lane][n-tile]
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

extern "C" __global__ void __launch_bounds__(32 * S26_WPB, S26_MINB)
kda_s26_prepare(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
                const bf16_t* __restrict__ a,        // raw gate logits [T, HV, K]
                const bf16_t* __restrict__ b,        // beta logits [T, HV]
                const float* __restrict__ A_log,     // [HV]
                const float* __restrict__ dt_bias,   // [HV, K]
                const int* __restrict__ chunk_start, const int* __restrict__ chunk_len,
                unsigned char* __restrict__ ws, float scale, int nc) {
  extern __shared__ __align__(16) unsigned char s26_smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int c = blockIdx.x * S26_WPB + warp, hv = blockIdx.y, h = hv / (HV / H);
  if (c >= nc) return;                                   // no block barrier anywhere: safe
  S26Warp& sm = reinterpret_cast<S26Warp*>(s26_smem)[warp];
  s26_chunk(sm, ws + ((size_t)c * HV + hv) * WS_BLOB, q, k, v, a, b, A_log, dt_bias, chunk_start[c], chunk_len[c],
            hv, h, scale, lane, 0, VDIM / 16);
}
