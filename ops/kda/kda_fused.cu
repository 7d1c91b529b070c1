// KDA forward, prep_variant 2: prepare fused into the recurrence, one kernel, no workspace in memory.
// Rendered after kda_prepare_fast.cu and kda_recurrence.cu (their helpers and macros are reused:
// PF_*, pf_cp_async16, tf32, rcp, mma1688, bf16_lo/hi, VS, NWARP, NT).
//
// Why (measured on the H200, kernelfile build of kda@h200): the two-kernel forward spends ~0.78 ms
// in prepare (memory-bound, 1.06 GB of workspace written, then read back) and ~0.66 ms in the
// recurrence (bound by mma.sync issue on the tensor cores) at H96 1 x 8192. They use different
// resources, so they can overlap: here each block runs the prepare of chunk i + 1 in 4 producer
// warps while its consumer warps (one per 16 state rows, as in kda_recurrence) run chunk i.
//
// One block per (segment, value head, V-slice); threads [0, NCONS) are consumers, the next 128 the
// producer. Per iteration i, in lockstep (one __syncthreads per chunk, so no protocol can deadlock):
//   consumers: the recurrence step on ring[i % 2];
//   producer:  issues the loads of chunk i + 2 into in[i % 2] (cp.async, zero-filled past the chunk),
//              then computes chunk i + 1 from in[(i + 1) % 2] into ring[(i + 1) % 2].
// The producer's steps synchronise on named barrier 1 (its 128 threads only). The blob in the ring
// has the layout of the workspace (kda_common.cuh): the consumer code reads it as kda_recurrence does,
// U for all V rows (the block reads its slice). beta logits for chunk j are loaded with its cp.async
// wave, one iteration early, so no global load sits on a chunk's critical path.
// Needs: the safe gate, K = V = 128, C = 16, prep_threads = 128 (checked in kda_host.py).
//
// Outcome on the H200 (kernelfile build of kda@h200, recording reports/kda/kda-h200.recording.jsonl):
// correct on every problem and verification case, but SLOWER than the two kernels: 3.04 ms at H96
// 1 x 8192 (two kernels 1.44), 2.80 ms at H64 (1.05), 2.26 / 1.50 ms on the varlen scenarios
// (1.29 / 0.86-0.89). Predicted ~0.8 ms. The miss: the prediction took prepare's critical path as
// ~2.5k cycles per chunk, but one chunk's prepare is a chain of 4 barriers, a 32-deep tf32 mma chain
// (L), a 16-step serial cumsum of ex2/rcp and the one-warp triangular solve: ~5.9 us per chunk here
// (11.7k cycles). The standalone prepare hid that latency with 5 blocks (chunks) in flight per SM;
// a single producer per block serialises it. To win, a block needs several producer groups working
// on consecutive chunks (3-4 to cover ~6 us with ~1.6 us of consumer work per chunk), which the
// register budget (161 per thread now, 384 threads) does not leave room for at split 1.

#define FNCONS (NWARP * 32)
#define FNTHREADS (FNCONS + 128)

struct FusedSmem {
  unsigned char ring[2][WS_BLOB];          // the blob of chunk i (consumers) and of chunk i + 1 (producer)
  bf16_t in[2][4][CH][PF_BS];              // q, k, a, v rows of chunks i + 1 and i + 2
  float Kp[CH][PF_FS], Qp[CH][PF_FS], Km[CH][PF_FS];
  float CG[KDIM], CL[KDIM], Rq[CH], Rk[CH], B[CH];
};

__device__ __forceinline__ void fz_bar() { asm volatile("bar.sync 1, 128;" ::: "memory"); }

// the cp.async wave of chunk rows [t0, t0 + m) into in[buf]; one group per call (empty when m <= 0)
__device__ __forceinline__ void fz_load(FusedSmem& sm, int buf, const bf16_t* __restrict__ q, const bf16_t* __restrict__ k,
                                        const bf16_t* __restrict__ v, const bf16_t* __restrict__ a,
                                        long long t0, int m, int h, int hv, int ptid) {
  if (m > 0) {
#pragma unroll
    for (int i = ptid; i < 4 * CH * 16; i += 128) {
      const int x = i >> 8, r = (i >> 4) & 15, p = i & 15;
      const size_t row = t0 + min(r, m - 1);
      const bf16_t* src = x < 2 ? (x ? k : q) + (row * H + h) * KDIM : (x == 2 ? a : v) + (row * HV + hv) * KDIM;
      pf_cp_async16(&sm.in[buf][x][r][8 * p], src + 8 * p, r < m ? 16 : 0);
    }
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
}

// prepare of one chunk (m valid rows) from in[buf] into blob; the steps of kda_prepare_fast.cu
__device__ __forceinline__ void fz_prepare(FusedSmem& sm, int buf, unsigned char* blob, int m, float beta_logit,
                                           float bias, float A2, float scale, int ptid) {
  const int lane = ptid & 31, warp = ptid >> 5, g = lane >> 2, t = lane & 3;
  bf16_t (*sIn)[CH][PF_BS] = sm.in[buf];
  float (*sL)[PF_TS] = reinterpret_cast<float (*)[PF_TS]>(&sIn[0][0][0]);   // over the q rows, after step 2
  float (*sTb)[PF_TS] = sL + CH;
  if (ptid < CH) sm.B[ptid] = ptid < m ? rcp(1.f + ex2(-PF_LOG2E * beta_logit)) : 0.f;
  asm volatile("cp.async.wait_group 1;" ::: "memory");   // this chunk's wave; the next one may fly
  fz_bar();

  // 1. L2 norms of q and k rows, scale folded into q
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
      sm.Rq[r] = rsqrtf(sq + 1e-6f) * scale;
      sm.Rk[r] = rsqrtf(sk + 1e-6f);
#else
      sm.Rq[r] = scale;
      sm.Rk[r] = 1.f;
#endif
    }
  }
  fz_bar();

  // 2. one thread per channel: gate, cumsum, factored exponentials (G_ref = G of row 7)
  {
    const int d = ptid;
    float G[CH], acc = 0.f;
#pragma unroll
    for (int r = 0; r < CH; ++r) {
      const float x = bf16_to_f32(sIn[2][r][d]) + bias;
      acc += r < m ? (LOWER_BOUND * PF_LOG2E) * rcp(1.f + ex2(-A2 * x)) : 0.f;
      G[r] = acc;
    }
    const float Gref = G[7];
#pragma unroll
    for (int r = 0; r < CH; ++r) {
      const float e = ex2(G[r] - Gref), kh = bf16_to_f32(sIn[1][r][d]) * sm.Rk[r];
      sm.Kp[r][d] = kh * e;
      sm.Qp[r][d] = bf16_to_f32(sIn[0][r][d]) * sm.Rq[r] * e;
      sm.Km[r][d] = kh * ex2(Gref - G[r]);
    }
    sm.CG[d] = ex2(Gref);
    sm.CL[d] = ex2(G[CH - 1] - Gref);
    ((float*)(blob + WS_GAM))[d] = ex2(G[CH - 1]);
  }
  fz_bar();

  // 3. warp 0: L then T_inv diag(beta); warp 1: A_qk; warps 2, 3: Kd
  if (warp < 2) {
    float (*src)[PF_FS] = warp ? sm.Qp : sm.Kp;
    float acc[2][4] = {};
#pragma unroll
    for (int ks = 0; ks < KDIM / 8; ++ks) {
      const int c0 = 8 * ks + t;
      const u32 a0 = tf32(src[g][c0]), a1 = tf32(src[g + 8][c0]), a2 = tf32(src[g][c0 + 4]), a3 = tf32(src[g + 8][c0 + 4]);
#pragma unroll
      for (int j = 0; j < 2; ++j)
        mma1688(acc[j], a0, a1, a2, a3, tf32(sm.Km[8 * j + g][c0]), tf32(sm.Km[8 * j + g][c0 + 4]));
    }
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
          sL[r][s] = s < r ? sm.B[r] * acc[j][e] : 0.f;
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
        const float bj = sm.B[lane];
#pragma unroll
        for (int r = 0; r < CH; ++r) sTb[r][lane] = x[r] * bj;
      }
    }
  } else {
    for (int u = ptid - 64; u < (KDIM / 16) * 32; u += 64) {
      const int p = u >> 5, ca = 16 * p + g, cb = ca + 8;
      const float la = sm.CL[ca], lb = sm.CL[cb];
      U4 o;
      o.x = pack2(sm.Km[2 * t][ca] * la, sm.Km[2 * t + 1][ca] * la);
      o.y = pack2(sm.Km[2 * t + 8][ca] * la, sm.Km[2 * t + 9][ca] * la);
      o.z = pack2(sm.Km[2 * t][cb] * lb, sm.Km[2 * t + 1][cb] * lb);
      o.w = pack2(sm.Km[2 * t + 8][cb] * lb, sm.Km[2 * t + 9][cb] * lb);
      ((U4*)(blob + WS_KD))[u] = o;
    }
  }
  fz_bar();

  // 4. W and Qg for channel blocks 2w, 2w+1; U^T for value blocks 2w, 2w+1
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
      const float cg = sm.CG[ch];
#pragma unroll
      for (int kk = 0; kk < 2; ++kk)
        mma1688(acc[j], ta[kk][0], ta[kk][1], ta[kk][2], ta[kk][3],
                tf32(sm.Kp[8 * kk + t][ch] * cg), tf32(sm.Kp[8 * kk + t + 4][ch] * cg));
    }
    const int c0 = 16 * ks + 2 * t;
    const float g0 = sm.CG[c0], g1 = sm.CG[c0 + 1], g8 = sm.CG[c0 + 8], g9 = sm.CG[c0 + 9];
    U4 w, qg;
    w.x = pack2(-acc[0][0], -acc[0][1]);
    w.y = pack2(-acc[1][0], -acc[1][1]);
    w.z = pack2(-acc[0][2], -acc[0][3]);
    w.w = pack2(-acc[1][2], -acc[1][3]);
    qg.x = pack2(sm.Qp[g][c0] * g0, sm.Qp[g][c0 + 1] * g1);
    qg.y = pack2(sm.Qp[g][c0 + 8] * g8, sm.Qp[g][c0 + 9] * g9);
    qg.z = pack2(sm.Qp[g + 8][c0] * g0, sm.Qp[g + 8][c0 + 1] * g1);
    qg.w = pack2(sm.Qp[g + 8][c0 + 8] * g8, sm.Qp[g + 8][c0 + 9] * g9);
    U4* dst = (U4*)(blob + WS_WQ) + (ks * 32 + lane) * 2;
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
    F4* dst = (F4*)(blob + WS_U) + (vg * 32 + lane) * 2;
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

// the beta logit of row `ptid` of a chunk (0 past its end); loaded one iteration before its use
__device__ __forceinline__ float fz_beta(const bf16_t* __restrict__ b, long long t0, int m, int hv, int ptid) {
  return ptid < CH && ptid < m ? bf16_to_f32(b[(size_t)(t0 + ptid) * HV + hv]) : 0.f;
}

extern "C" __global__ void __launch_bounds__(FNTHREADS)
kda_fused(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
          const bf16_t* __restrict__ a, const bf16_t* __restrict__ b, const float* __restrict__ A_log,
          const float* __restrict__ dt_bias, bf16_t* __restrict__ o, const float* __restrict__ h0,
          float* __restrict__ hT, const long long* __restrict__ cu_seqlens, const int* __restrict__ seq_order,
          float scale) {
  extern __shared__ __align__(16) unsigned char fz_smem[];
  FusedSmem& sm = *reinterpret_cast<FusedSmem*>(fz_smem);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int sp = blockIdx.x % SPLIT, hv = (blockIdx.x / SPLIT) % HV, h = hv / (HV / H);
  const int n = seq_order[blockIdx.x / (SPLIT * HV)];
  const long long bos = cu_seqlens[n], eos = cu_seqlens[n + 1];
  const int nc = (int)((eos - bos + CH - 1) / CH);
  const bool producer = tid >= FNCONS;
  const int ptid = tid - FNCONS;
  const int vg0 = sp * NWARP, v0 = 16 * (vg0 + warp);
  auto rows = [&](int j) { return (int)min((long long)CH, eos - bos - (long long)j * CH); };

  float S[NT][4];
  const size_t sbase = ((size_t)n * HV + hv) * VDIM * KDIM;
  float bias = 0.f, A2 = 0.f, beta_next = 0.f;
  if (producer) {
    bias = dt_bias[hv * KDIM + ptid];
    A2 = expf(A_log[hv]) * PF_LOG2E;
    if (nc > 0) {
      fz_load(sm, 0, q, k, v, a, bos, rows(0), h, hv, ptid);
      const float beta0 = fz_beta(b, bos, rows(0), hv, ptid);
      fz_load(sm, 1, q, k, v, a, bos + CH, nc > 1 ? rows(1) : 0, h, hv, ptid);
      beta_next = nc > 1 ? fz_beta(b, bos + CH, rows(1), hv, ptid) : 0.f;
      fz_prepare(sm, 0, sm.ring[0], rows(0), beta0, bias, A2, scale, ptid);
    }
  } else {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#if HAS_H0
      const F2 lo = *(const F2*)(h0 + sbase + (size_t)(v0 + g) * KDIM + 8 * nt + 2 * t);
      const F2 hi = *(const F2*)(h0 + sbase + (size_t)(v0 + g + 8) * KDIM + 8 * nt + 2 * t);
      S[nt][0] = lo.x; S[nt][1] = lo.y; S[nt][2] = hi.x; S[nt][3] = hi.y;
#else
      S[nt][0] = S[nt][1] = S[nt][2] = S[nt][3] = 0.f;
#endif
    }
  }
  __syncthreads();

  for (int i = 0; i < nc; ++i) {
    if (producer) {
      const int j = i + 2;
      fz_load(sm, i & 1, q, k, v, a, bos + (long long)j * CH, j < nc ? rows(j) : 0, h, hv, ptid);
      const float beta_after = j < nc ? fz_beta(b, bos + (long long)j * CH, rows(j), hv, ptid) : 0.f;
      if (i + 1 < nc) fz_prepare(sm, (i + 1) & 1, sm.ring[(i + 1) & 1], rows(i + 1), beta_next, bias, A2, scale, ptid);
      beta_next = beta_after;
    } else {
      const unsigned char* st = sm.ring[i & 1];
      float vn[2][4], oc[2][4];
      {
        const F4* us = (const F4*)(st + WS_U) + ((vg0 + warp) * 32 + lane) * 2;
        const F4 u0 = us[0], u1 = us[1];
        vn[0][0] = u0.x; vn[0][1] = u0.y; vn[0][2] = u0.z; vn[0][3] = u0.w;
        vn[1][0] = u1.x; vn[1][1] = u1.y; vn[1][2] = u1.z; vn[1][3] = u1.w;
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) oc[j][0] = oc[j][1] = oc[j][2] = oc[j][3] = 0.f;
      const U4* wq = (const U4*)(st + WS_WQ);
#pragma unroll
      for (int ks = 0; ks < KDIM / 16; ++ks) {
        const u32 a0 = pack2(S[2 * ks][0], S[2 * ks][1]), a1 = pack2(S[2 * ks][2], S[2 * ks][3]);
        const u32 a2 = pack2(S[2 * ks + 1][0], S[2 * ks + 1][1]), a3 = pack2(S[2 * ks + 1][2], S[2 * ks + 1][3]);
        const U4 w = wq[(ks * 32 + lane) * 2], qg = wq[(ks * 32 + lane) * 2 + 1];
        mma16816(vn[0], a0, a1, a2, a3, w.x, w.y);
        mma16816(vn[1], a0, a1, a2, a3, w.z, w.w);
        mma16816(oc[0], a0, a1, a2, a3, qg.x, qg.y);
        mma16816(oc[1], a0, a1, a2, a3, qg.z, qg.w);
      }
      const u32 p0 = pack2(vn[0][0], vn[0][1]), p1 = pack2(vn[0][2], vn[0][3]);
      const u32 p2 = pack2(vn[1][0], vn[1][1]), p3 = pack2(vn[1][2], vn[1][3]);
      {
        const U4 aq = ((const U4*)(st + WS_AQ))[lane];
        mma16816(oc[0], p0, p1, p2, p3, aq.x, aq.y);
        mma16816(oc[1], p0, p1, p2, p3, aq.z, aq.w);
        const long long tok0 = bos + (long long)i * CH;
        const int m = rows(i);
#pragma unroll
        for (int j = 0; j < 2; ++j) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int r = 8 * j + 2 * t + e;
            if (r < m) {
              bf16_t* orow = o + ((size_t)(tok0 + r) * HV + hv) * VDIM + v0 + g;
              orow[0] = f32_to_bf16(oc[j][e]);
              orow[8] = f32_to_bf16(oc[j][2 + e]);
            }
          }
        }
      }
      const float* gam = (const float*)(st + WS_GAM);
      const U4* kd = (const U4*)(st + WS_KD);
#pragma unroll
      for (int p = 0; p < NT / 2; ++p) {
        const U4 bb = kd[p * 32 + lane];
        const F2 ga = *(const F2*)(gam + 16 * p + 2 * t), gb = *(const F2*)(gam + 16 * p + 8 + 2 * t);
        S[2 * p][0] *= ga.x; S[2 * p][1] *= ga.y; S[2 * p][2] *= ga.x; S[2 * p][3] *= ga.y;
        S[2 * p + 1][0] *= gb.x; S[2 * p + 1][1] *= gb.y; S[2 * p + 1][2] *= gb.x; S[2 * p + 1][3] *= gb.y;
        mma16816(S[2 * p], p0, p1, p2, p3, bb.x, bb.y);
        mma16816(S[2 * p + 1], p0, p1, p2, p3, bb.z, bb.w);
      }
    }
    __syncthreads();
  }
  if (producer) {
    asm volatile("cp.async.wait_all;" ::: "memory");
    return;
  }
#if HAS_HT
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    F2 lo, hi;
    lo.x = S[nt][0]; lo.y = S[nt][1]; hi.x = S[nt][2]; hi.y = S[nt][3];
    *(F2*)(hT + sbase + (size_t)(v0 + g) * KDIM + 8 * nt + 2 * t) = lo;
    *(F2*)(hT + sbase + (size_t)(v0 + g + 8) * KDIM + 8 * nt + 2 * t) = hi;
  }
#endif
}
