// KDA forward, stage 1 ("prepare"), prep_variant 4 ("x1w"): persistent warps, next inputs by cp.async,
// the workspace written in whole 32-byte sectors. Writes exactly ops/kda's workspace (kda_common.cuh's
// WS_* layout, mma fragment order), so kda_recurrence reads it unchanged. Same signature role as
// kda_prepare.cu's kernel, other arguments (op.py's stage_args "kda_prepare_x1w").
//
// Moved from lab/kda/kda_s27_prepare.cu (sessions 27-29) with the lab's x1w defines fixed on
// (S27_FASTADDR 1, S27_PIPE 2, S27_WSTORE 1, one warp per block, launch bound 7) and every other
// variant removed; with the same #defines in front it compiles to the lab x1w cubin byte for byte
// (up to the entry name, tests/test_kda_x1w.py). Measured on the H200 (run 30a, lab/kda/plan-session29.md):
// prepare 0.605 ms at H96 1 x 8192 (today's variant 1: 0.753), 0.450 ms at H64 mixed6.
//
// Launch (ops/kda/op.py, launches): grid (min(NC * HV, 7 * SMs), 1, 1), 32 threads, 29,504 B dynamic shared
// memory per block: 7 warps per SM (7 x (29,504 + 1,024) B of the 233,472; 255 registers x 32 x 7 fit
// 64K). Warp w takes chunk-heads (items) w, w + gridDim.x, ..., item = hv * nc + c; any grid is correct,
// a grid past what is resident only runs a second, partial wave.
// Needs: the safe gate (factored exponentials: |G_r - G_ref| <= 8 x 5 nats), K = V = 128, C = 16,
// HV a multiple of H, every chunk length >= 1.
//
// Per chunk-head, one warp, two layouts:
// - phase A, per channel: lane l owns channels 4l .. 4l+3 of all 16 rows. The gates are an in-thread
//   running sum: rows 7 .. 0 backwards and 8 .. 15 forwards give D_r = G_r - G_7 directly (G_ref =
//   G of row 7). D goes to shared memory ([token][channel]), 2^G_ref, 2^(G_15 - G_7) per channel beside
//   it; GAM is stored from here.
// - phase B, fragment layout: lane (g, t) owns rows g, g + 8 and the channels 16 ks + 8 e + 2 t + h.
//   q, k fragment words by ldmatrix from the staged rows; the L2 norms from the diagonal of two bf16
//   Gram products; Kp, Km, Qp rounded to tf32 feed the L and A_qk products from registers; Kd reaches
//   its KD fragment order by movmatrix.trans.
// - W = (T_inv diag(beta) Kp) * 2^G_ref per channel: Kp's tf32 words staged over the dead D buffer as
//   [channel][token] (swizzled), read back by ldmatrix; U^T's V^T fragments by ldmatrix.trans of the
//   staged v rows.
// - Pipelining: the next item's q, k, a rows go into a second buffer (iqk, ia) by 16-byte cp.async as
//   soon as this item's are read out, its v rows right after U, its beta logit / A_log / dt_bias into
//   registers, chunk_start / chunk_len two items ahead. One IN group and one v group are committed
//   per item (empty where there is none), so "wait_group 1" always means this item's group.
// - Whole-sector stores: a lane owns one 32-byte sector [W | Qg] of WQ per ks and one [n-tile 0 | 1]
//   of U per vg but stores 16 B per instruction, so Qg's words are held in registers until W, both
//   halves of all 32 sectors are staged in the 1 KB of Kp^T that ks just read (dead from then on), and
//   lane L stores chunks L and 32 + L: 512 contiguous bytes per STG.128. U likewise per vg.
// Shared memory: 29,504 B per warp (X1W_WARP_BYTES, op.X1W_SMEM). Registers: 255 (0 spills with the L2 norm; with
// the L2 norm off ptxas spills 56 B, so op.py's x1w_error refuses that case).

#if KDIM != 128 || VDIM != 128 || CH != 16
#error "kda_prepare_x1w: K = V = 128, C = 16"
#endif
#if GATE != 0
#error "kda_prepare_x1w: the factored exponentials need the bounded (safe) gate"
#endif


// every workspace store stays under a runtime condition (blob_mask != 0: always true, op.py passes all
// ones), as in the kernel measured in the lab. Without it ptxas (NVRTC 13.0) schedules the stores
// differently and spills 56-80 B at 255 registers; with it, 0 B (the cubin is the lab's, byte for byte)
#define X1W_ST (blob_mask != 0)

#define X1W_WARPS_PER_SM 7   // warps per SM the registers are bounded for (7 x 29.5 KB of shared memory)
#define X1W_WARP_BYTES 29504  // shared memory per warp (= per block): op.py's X1W_SMEM
#define X1W_LOG2E 1.4426950408889634f
#define X1W_DS 136         // fp32 row stride of D [token][channel]: 64-bit fragment reads conflict-free
#define X1W_VS 136         // bf16 row stride of staged v: ldmatrix.trans rows conflict-free
#define X1W_TS 20          // fp32 row stride of L^T and Tb

struct __align__(8) X1wU2 { u32 x, y; };

struct X1wWarp {
  union {
    float d[CH][X1W_DS];           // 8704 B: D = G - G_ref (log2 units), phase A -> phase B
    u32 kpt[KDIM * CH];            // 8192 B: Kp tf32 words [channel][token], 16-byte chunks swizzled
  } u;
  bf16_t v[CH][X1W_VS];            // 4352 B
  float cgcl[KDIM][2];             // 1024 B: 2^G_ref, 2^(G_last - G_ref) per channel
  float lt[CH][X1W_TS];            // 1280 B: L^T [s][r]
  float tb[CH][X1W_TS];            // 1280 B: T_inv diag(beta) [r][s]
  float beta[CH];                  // 64 B
  bf16_t iqk[2 * CH][X1W_VS];      // 8704 B: the next chunk-head's q rows 0..15, k rows 16..31 (x1c's layout)
  X1wU2 ia[CH][32];                // 4096 B: its gate-logit rows, lane l's channels 4l .. 4l+3 at [r][l]
};
static_assert(sizeof(X1wWarp) == X1W_WARP_BYTES, "ops/kda/op.py X1W_SMEM is sizeof(X1wWarp)");

__device__ __forceinline__ void x1w_cp_async16(void* smem, const void* gmem, int bytes) {
  const u32 s = (u32)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(bytes) : "memory");
}

// fp32 -> tf32, round to nearest (ties away): the mma reads only the top 19 bits. Finite inputs only.
__device__ __forceinline__ u32 x1w_tf32(float x) { return __float_as_uint(x) + 0x1000u; }

__device__ __forceinline__ float x1w_rcp(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

__device__ __forceinline__ float x1w_lo(u32 w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float x1w_hi(u32 w) { return __uint_as_float(w & 0xffff0000u); }

// D (16x8 fp32) += A (16x8 tf32, row) * B (8x8 tf32, col)
__device__ __forceinline__ void x1w_mma1688(float* d, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// D (16x8 fp32) += A (16x16 bf16) * B (16x8 bf16): the Gram products of the raw q, k words
__device__ __forceinline__ void x1w_mma_bf16(float* d, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ u32 x1w_movt(u32 x) {
  u32 r;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(r) : "r"(x));
  return r;
}

__device__ __forceinline__ void x1w_ldsm4(u32* r, const void* p) {
  const u32 s = (u32)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s) : "memory");
}

__device__ __forceinline__ void x1w_ldsm4t(u32* r, const void* p) {
  const u32 s = (u32)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s) : "memory");
}

// word index of Kp^T[ch][tok] in X1wWarp::u.kpt: 16-byte chunk tok / 4 XOR (ch / 2) % 4, so that
// ldmatrix's 8 rows (8 channels, one chunk) fall in 8 distinct bank groups
__device__ __forceinline__ int x1w_kpt(int ch, int tok) {
  return ch * CH + 4 * ((tok >> 2) ^ ((ch >> 1) & 3)) + (tok & 3);
}

// the staging of one 1 KB block (32 sectors, 64 16-byte chunks): chunk c at c ^ ((c >> 3) & 1), so that
// both the writes (lane l: chunks 2l, 2l + 1) and the reads (lane L: chunks L, 32 + L) are conflict-free
__device__ __forceinline__ int x1w_wsw(int c) { return c ^ ((c >> 3) & 1); }

// one chunk-head's q, k, a rows into the IN buffer by 16-byte cp.async (one piece per lane and row,
// zero-filled past m, a row past m copies nothing from row 0), as x1c stages q, k
__device__ __forceinline__ void x1w_issue_in(X1wWarp& sm, const bf16_t* q, const bf16_t* k, const bf16_t* a,
                                             long long t0, int m, int h, int hv, int lane) {
  const int p = lane & 15;
  const bf16_t* qb = q + ((size_t)t0 * H + h) * KDIM + 8 * p;
  const bf16_t* kb = k + ((size_t)t0 * H + h) * KDIM + 8 * p;
  const bf16_t* ab = a + ((size_t)t0 * HV + hv) * KDIM + 8 * p;
#pragma unroll
  for (int j = 0; j < CH / 2; ++j) {
    const int r = (lane >> 4) + 2 * j, n = r < m ? 16 : 0;
    const int oqk = r < m ? r * (H * KDIM) : 0, oa = r < m ? r * (HV * KDIM) : 0;
    x1w_cp_async16(&sm.iqk[r][8 * p], qb + oqk, n);
    x1w_cp_async16(&sm.iqk[CH + r][8 * p], kb + oqk, n);
    x1w_cp_async16(&sm.ia[r][2 * p], ab + oa, n);
  }
}

// one chunk-head's v rows into sm.v (x1a's addressing)
__device__ __forceinline__ void x1w_issue_v(X1wWarp& sm, const bf16_t* v, long long t0, int m, int hv, int lane) {
  const bf16_t* vbase = v + ((size_t)t0 * HV + hv) * VDIM + 8 * (lane & 15);
#pragma unroll
  for (int j = 0; j < CH / 2; ++j) {
    const int r = (lane >> 4) + 2 * j;
    x1w_cp_async16(&sm.v[r][8 * (lane & 15)], vbase + (r < m ? r * (HV * VDIM) : 0), r < m ? 16 : 0);
  }
}


extern "C" __global__ void __launch_bounds__(32, X1W_WARPS_PER_SM)
kda_prepare_x1w(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
                const bf16_t* __restrict__ a,        // raw gate logits [T, HV, K]
                const bf16_t* __restrict__ b,        // beta logits [T, HV]
                const float* __restrict__ A_log,     // [HV]
                const float* __restrict__ dt_bias,   // [HV, K]
                const int* __restrict__ chunk_start, const int* __restrict__ chunk_len,
                unsigned char* __restrict__ ws, float scale, int nc,
                int blob_mask) {                     // all ones (0x7FFFFFFF): see X1W_ST
  extern __shared__ __align__(16) unsigned char x1w_smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  X1wWarp& sm = reinterpret_cast<X1wWarp*>(x1w_smem)[warp];
  const int g = lane >> 2, t = lane & 3;
  const unsigned FULL = 0xffffffffu;
  // persistent (grid (warps, 1, 1)): warp `it` takes items it, it + stride, ..., item = hv * nc + c (c
  // fastest, the one-shot grid's order); chunk_start / chunk_len are loaded two items ahead, the
  // inputs (shared memory and registers) one item ahead
  const int items = nc * HV, stride = gridDim.x;
  int it = blockIdx.x + warp;
  if (it >= items) return;                               // no block barrier anywhere: safe
  long long t0 = chunk_start[it % nc], t0n = 0;
  int m = chunk_len[it % nc], mn = 0;
  if (it + stride < items) {
    t0n = chunk_start[(it + stride) % nc];
    mn = chunk_len[(it + stride) % nc];
  }
  bf16_t braw;                                           // this item's beta logit (lane < CH), A_log, dt_bias
  float alog;
  F4 bbv;
  {
    const int hv = it / nc;
    x1w_issue_in(sm, q, k, a, t0, m, hv / (HV / H), hv, lane);
    asm volatile("cp.async.commit_group;" ::: "memory");
    x1w_issue_v(sm, v, t0, m, hv, lane);
    asm volatile("cp.async.commit_group;" ::: "memory");
    braw = lane < min(m, CH) ? b[((size_t)t0 + lane) * HV + hv] : (bf16_t)0;
    alog = A_log[hv];
    bbv = *reinterpret_cast<const F4*>(dt_bias + (size_t)hv * KDIM + 4 * lane);
  }
  for (; it < items; it += stride) {
  const int c = it % nc, hv = it / nc, h = hv / (HV / H);
  const int itn = it + stride, hvn = itn / nc;
  long long t0nn = 0;
  int mnn = 0;
  if (itn + stride < items) {
    t0nn = chunk_start[(itn + stride) % nc];
    mnn = chunk_len[(itn + stride) % nc];
  }
  unsigned char* blob = ws + (size_t)((c * HV + hv) & blob_mask) * WS_BLOB;

  // 0. v rows by cp.async (zero-filled past m), in flight until U (x1p: issued one item ahead)

  // q, k words of rows g, g + 8 (word (ks, e) = channels 16 ks + 8 e + 2 t, + 1), rows past m read 0
  u32 qw[8][2][2], kw[8][2][2];                          // [ks][e][rr]
  if (lane < CH) {
    sm.beta[lane] = lane < m ? x1w_rcp(1.f + ex2(-X1W_LOG2E * bf16_to_f32(braw))) : 0.f;
  }

  // 1. phase A (lane: channels 4 lane .. 4 lane + 3, all rows): gates, running sums, D to smem
  {
    const float nA2 = -expf(alog) * X1W_LOG2E;
    const F4 bb = bbv;
    const float nb[4] = {nA2 * bb.x, nA2 * bb.y, nA2 * bb.z, nA2 * bb.w};
    const float CG = LOWER_BOUND * X1W_LOG2E;          // gate in log2 units = CG * sigmoid
    X1wU2 aw[CH];
    asm volatile("cp.async.wait_group 1;" ::: "memory");   // q, k, a rows landed (v may still be in flight)
    __syncwarp();
    bf16_t (*sqk)[X1W_VS] = sm.iqk;
#pragma unroll
    for (int r = 0; r < CH; ++r) aw[r] = sm.ia[r][lane];  // zero past m (zero-filled)
    {
      // matrix i = (rr = i & 1, e = i >> 1): rows 8 rr + (lane & 7), channels 16 ks + 8 e ..: lane (g, t)
      // gets row g's channels 2t, 2t + 1, i.e. word (ks, e, rr)
      const int i = lane >> 3, rI = lane & 7;
#pragma unroll
      for (int ks = 0; ks < 8; ++ks) {
        u32 x[4], y[4];
        x1w_ldsm4(x, &sqk[8 * (i & 1) + rI][16 * ks + 8 * (i >> 1)]);
        x1w_ldsm4(y, &sqk[CH + 8 * (i & 1) + rI][16 * ks + 8 * (i >> 1)]);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          qw[ks][j >> 1][j & 1] = x[j];
          kw[ks][j >> 1][j & 1] = y[j];
        }
      }
    }
    __syncwarp();                                      // every lane's words are out: D (x1p: the next item) may overwrite them
    // the IN buffer is free: the next item's q, k, a rows into it, its beta logit, A_log, dt_bias into
    // registers, all in flight for one item (an empty group where there is none, so the counts hold)
    if (itn < items) {
      x1w_issue_in(sm, q, k, a, t0n, mn, hvn / (HV / H), hvn, lane);
      braw = lane < min(mn, CH) ? b[((size_t)t0n + lane) * HV + hvn] : (bf16_t)0;
      alog = A_log[hvn];
      bbv = *reinterpret_cast<const F4*>(dt_bias + (size_t)hvn * KDIM + 4 * lane);
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
#define X1W_SIG(r, j)                                                                                   \
  x1w_rcp(1.f + ex2(fmaf(((j) & 1) ? x1w_hi((j) < 2 ? aw[r].x : aw[r].y) : x1w_lo((j) < 2 ? aw[r].x : aw[r].y), \
                         nA2, nb[j])))
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    F4* drow = reinterpret_cast<F4*>(&sm.u.d[0][4 * lane]);
    drow[7 * (X1W_DS / 4)] = F4{0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int r = 6; r >= 0; --r) {                       // D_r = -(gates r+1 .. 7)
      if (r + 1 < m) {
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[j] = fmaf(-CG, X1W_SIG(r + 1, j), acc[j]);
      }
      drow[r * (X1W_DS / 4)] = F4{acc[0], acc[1], acc[2], acc[3]};
    }
    float gref[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) gref[j] = fmaf(CG, X1W_SIG(0, j), -acc[j]);   // row 0 is always < m
    float acc2[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int r = 8; r < CH; ++r) {                       // D_r = gates 8 .. r
      if (r < m) {
#pragma unroll
        for (int j = 0; j < 4; ++j) acc2[j] = fmaf(CG, X1W_SIG(r, j), acc2[j]);
      }
      drow[r * (X1W_DS / 4)] = F4{acc2[0], acc2[1], acc2[2], acc2[3]};
    }
#undef X1W_SIG
    F4 gam, c01, c23;
    gam.x = ex2(gref[0] + acc2[0]);
    gam.y = ex2(gref[1] + acc2[1]);
    gam.z = ex2(gref[2] + acc2[2]);
    gam.w = ex2(gref[3] + acc2[3]);
    c01 = F4{ex2(gref[0]), ex2(acc2[0]), ex2(gref[1]), ex2(acc2[1])};
    c23 = F4{ex2(gref[2]), ex2(acc2[2]), ex2(gref[3]), ex2(acc2[3])};
    reinterpret_cast<F4*>(&sm.cgcl[4 * lane][0])[0] = c01;
    reinterpret_cast<F4*>(&sm.cgcl[4 * lane][0])[1] = c23;
    if (X1W_ST) reinterpret_cast<F4*>(blob + WS_GAM)[lane] = gam;
  }

  // 2. L2 norms: ||row||^2 is the diagonal of the bf16 Gram product (exact products, fp32 sums);
  //    lane 4 g + g / 2 holds rows g and g + 8 of it
  float rq[2], rk[2];
  {
    float gq[2][4] = {}, gk[2][4] = {};
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) {
#pragma unroll
      for (int jn = 0; jn < 2; ++jn) {
        x1w_mma_bf16(gq[jn], qw[ks][0][0], qw[ks][0][1], qw[ks][1][0], qw[ks][1][1], qw[ks][0][jn], qw[ks][1][jn]);
        x1w_mma_bf16(gk[jn], kw[ks][0][0], kw[ks][0][1], kw[ks][1][0], kw[ks][1][1], kw[ks][0][jn], kw[ks][1][jn]);
      }
    }
    const int src = 4 * g + (g >> 1), odd = g & 1;
    const float sq0 = __shfl_sync(FULL, odd ? gq[0][1] : gq[0][0], src);
    const float sq1 = __shfl_sync(FULL, odd ? gq[1][3] : gq[1][2], src);
    const float sk0 = __shfl_sync(FULL, odd ? gk[0][1] : gk[0][0], src);
    const float sk1 = __shfl_sync(FULL, odd ? gk[1][3] : gk[1][2], src);
#if L2NORM
    rq[0] = rsqrtf(sq0 + 1e-6f) * scale;
    rq[1] = rsqrtf(sq1 + 1e-6f) * scale;
    rk[0] = rsqrtf(sk0 + 1e-6f);
    rk[1] = rsqrtf(sk1 + 1e-6f);
#else
    rq[0] = rq[1] = scale;
    rk[0] = rk[1] = 1.f;
    (void)sq0, (void)sq1, (void)sk0, (void)sk1;
#endif
  }
  __syncwarp();                                          // D, 2^G_ref, 2^(G_last - G_ref), beta visible

  // 3. phase B (fragment layout): exponentials, Kp / Km / Qp, the L and A_qk k-steps, Qg and Kd out
  float accL[2][4] = {}, accA[2][4] = {};
  u32 ka[8][2][2][2];                                    // Kp tf32 [ks][e][rr][h], kept for W
  u32 qgs[8][4];                                         // Qg's words [ks], kept for step 6 (stored beside W)
  U4* wq = (U4*)(blob + WS_WQ);
#pragma unroll
  for (int ks = 0; ks < 8; ++ks) {
    u32 qgw[2][2], kdw[2][2];                            // [e][rr]
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int c0 = 16 * ks + 8 * e + 2 * t;
      const F4 cc = *reinterpret_cast<const F4*>(&sm.cgcl[c0][0]);   // cg0, cl0, cg1, cl1
      u32 qa[2][2], kb[2][2];                            // [rr][h]
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const F2 dd = *reinterpret_cast<const F2*>(&sm.u.d[g + 8 * rr][c0]);
        float qg[2], kd[2];
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const float D = hh ? dd.y : dd.x;
          const float ep = ex2(D), em = ex2(-D);
          const float kh = (hh ? x1w_hi(kw[ks][e][rr]) : x1w_lo(kw[ks][e][rr])) * rk[rr];
          const float qh = (hh ? x1w_hi(qw[ks][e][rr]) : x1w_lo(qw[ks][e][rr])) * rq[rr];
          const float kp = kh * ep, km = kh * em, qp = qh * ep;
          ka[ks][e][rr][hh] = x1w_tf32(kp);
          kb[rr][hh] = x1w_tf32(km);
          qa[rr][hh] = x1w_tf32(qp);
          qg[hh] = qp * (hh ? cc.z : cc.x);
          kd[hh] = km * (hh ? cc.w : cc.y);
        }
        qgw[e][rr] = pack2(qg[0], qg[1]);
        kdw[e][rr] = pack2(kd[0], kd[1]);
      }
      // k-step 2 ks + e: A = Kp / Qp (rows g, g + 8; column t <-> h 0, t + 4 <-> h 1), B of n-tile jn =
      // Km of this lane's row jn
#pragma unroll
      for (int jn = 0; jn < 2; ++jn) {
        x1w_mma1688(accL[jn], ka[ks][e][0][0], ka[ks][e][1][0], ka[ks][e][0][1], ka[ks][e][1][1], kb[jn][0], kb[jn][1]);
        x1w_mma1688(accA[jn], qa[0][0], qa[1][0], qa[0][1], qa[1][1], kb[jn][0], kb[jn][1]);
      }
    }
    qgs[ks][0] = qgw[0][0];
    qgs[ks][1] = qgw[1][0];
    qgs[ks][2] = qgw[0][1];
    qgs[ks][3] = qgw[1][1];
    // KD [pair ks][lane] = {Kd[2t, 2t+1][16 ks + g], Kd[2t+8, 2t+9][..], same for channel + 8}: the
    // transposes of the 8x8 blocks (tokens 8 rr .., channels 16 ks + 8 e ..)
    if (X1W_ST) ((U4*)(blob + WS_KD))[ks * 32 + lane] =
        U4{x1w_movt(kdw[0][0]), x1w_movt(kdw[0][1]), x1w_movt(kdw[1][0]), x1w_movt(kdw[1][1])};
  }

  // 4. A_qk (s <= r) straight to its fragment: accA[j][e]: row g + 8 (e >> 1), column 8 j + 2 t + (e & 1)
  {
    float x[2][4];
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) x[j][e] = 8 * j + 2 * t + (e & 1) <= g + 8 * (e >> 1) ? accA[j][e] : 0.f;
    if (X1W_ST) ((U4*)(blob + WS_AQ))[lane] =
        U4{pack2(x[0][0], x[0][1]), pack2(x[1][0], x[1][1]), pack2(x[0][2], x[0][3]), pack2(x[1][2], x[1][3])};
  }
  // L = diag(beta) (Kp Km^T), strictly lower, stored transposed (column s of L is row s of lt)
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = g + 8 * (e >> 1), s = 8 * j + 2 * t + (e & 1);
      sm.lt[s][r] = s < r ? sm.beta[r] * accL[j][e] : 0.f;
    }
  __syncwarp();                                          // L^T visible; every lane is done reading D

  // Kp's tf32 words to [channel][token] over D (dead): W's B operand, read back by ldmatrix
#pragma unroll
  for (int ks = 0; ks < 8; ++ks)
#pragma unroll
    for (int e = 0; e < 2; ++e)
#pragma unroll
      for (int rr = 0; rr < 2; ++rr)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) sm.u.kpt[x1w_kpt(16 * ks + 8 * e + 2 * t + hh, g + 8 * rr)] = ka[ks][e][rr][hh];

  // 5. T_inv diag(beta) by column forward substitution (lane j < 16: column j), fp32
  if (lane < CH) {
    float x[CH];
#pragma unroll
    for (int r = 0; r < CH; ++r) x[r] = r == lane ? 1.f : 0.f;
#pragma unroll
    for (int s = 0; s < CH - 1; ++s) {
      float col[CH];
#pragma unroll
      for (int i = 0; i < CH / 4; ++i) {
        const F4 w4 = reinterpret_cast<const F4*>(&sm.lt[s][0])[i];
        col[4 * i] = w4.x;
        col[4 * i + 1] = w4.y;
        col[4 * i + 2] = w4.z;
        col[4 * i + 3] = w4.w;
      }
#pragma unroll
      for (int r = s + 1; r < CH; ++r) x[r] = fmaf(-col[r], x[s], x[r]);
    }
    const float bj = sm.beta[lane];
#pragma unroll
    for (int r = 0; r < CH; ++r) sm.tb[r][lane] = x[r] * bj;
  }
  __syncwarp();                                          // Tb and Kp^T visible

  // 6. W = (Tb Kp) * 2^G_ref per channel (tf32), out as -W fragments beside Qg
  u32 ta[2][4];
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) {
    const int s0 = 8 * kk + t;
    ta[kk][0] = x1w_tf32(sm.tb[g][s0]);
    ta[kk][1] = x1w_tf32(sm.tb[g + 8][s0]);
    ta[kk][2] = x1w_tf32(sm.tb[g][s0 + 4]);
    ta[kk][3] = x1w_tf32(sm.tb[g + 8][s0 + 4]);
  }
#pragma unroll
  for (int ks = 0; ks < 8; ++ks) {
    float acc[2][4] = {};
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      // matrix i (lanes 8 i .. 8 i + 7 give its rows): channels 16 ks + 8 j + (lane & 7), tokens 4 i .. 4 i + 3
      const int ch = 16 * ks + 8 * j + (lane & 7), i = lane >> 3;
      u32 bq[4];
      x1w_ldsm4(bq, &sm.u.kpt[ch * CH + 4 * (i ^ ((ch >> 1) & 3))]);
      x1w_mma1688(acc[j], ta[0][0], ta[0][1], ta[0][2], ta[0][3], bq[0], bq[1]);
      x1w_mma1688(acc[j], ta[1][0], ta[1][1], ta[1][2], ta[1][3], bq[2], bq[3]);
    }
    const int c0 = 16 * ks + 2 * t;
    const F4 c0v = *reinterpret_cast<const F4*>(&sm.cgcl[c0][0]);
    const F4 c8v = *reinterpret_cast<const F4*>(&sm.cgcl[c0 + 8][0]);
    // [W | Qg] of lane l = chunks 2l, 2l + 1 of Kp^T's block ks (words 256 ks ..: this ks's ldmatrix
    // rows, read by now, never again), then chunks L, 32 + L out: 16 whole sectors per STG.128
    if (X1W_ST) {
      U4* st = reinterpret_cast<U4*>(&sm.u.kpt[256 * ks]);
      __syncwarp();                                      // every lane's ldmatrix of block ks is done
      st[x1w_wsw(2 * lane)] = U4{pack2(-acc[0][0] * c0v.x, -acc[0][1] * c0v.z), pack2(-acc[1][0] * c8v.x, -acc[1][1] * c8v.z),
                                 pack2(-acc[0][2] * c0v.x, -acc[0][3] * c0v.z), pack2(-acc[1][2] * c8v.x, -acc[1][3] * c8v.z)};
      st[x1w_wsw(2 * lane + 1)] = U4{qgs[ks][0], qgs[ks][1], qgs[ks][2], qgs[ks][3]};
      __syncwarp();
      wq[64 * ks + lane] = st[x1w_wsw(lane)];
      wq[64 * ks + 32 + lane] = st[x1w_wsw(32 + lane)];
    }
  }

  // 7. U^T = V^T Tb^T (tf32): A = V^T by ldmatrix.trans, k-order token 8 kk + 2 t (col t), + 1 (col t + 4)
  u32 tbb[2][2][2];                                      // [jn][kk][0: token 8kk + 2t, 1: + 1]
#pragma unroll
  for (int jn = 0; jn < 2; ++jn)
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      const F2 x = *reinterpret_cast<const F2*>(&sm.tb[8 * jn + g][8 * kk + 2 * t]);
      tbb[jn][kk][0] = x1w_tf32(x.x);
      tbb[jn][kk][1] = x1w_tf32(x.y);
    }
  asm volatile("cp.async.wait_group 1;" ::: "memory");  // v landed (the next item's IN group may not have)
  __syncwarp();                                          // every lane's v pieces have landed
#pragma unroll 2
  for (int vg = 0; vg < VDIM / 16; ++vg) {
    // matrix i = (kk = i >> 1, value half vh = i & 1): rows tokens 8 kk + (lane & 7), values 16 vg + 8 vh ..
    const int i = lane >> 3;
    u32 vv[4];
    x1w_ldsm4t(vv, &sm.v[8 * (i >> 1) + (lane & 7)][16 * vg + 8 * (i & 1)]);
    float acc[2][4] = {};
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      const u32 w0 = vv[2 * kk], w1 = vv[2 * kk + 1];    // values 16 vg + g, 16 vg + 8 + g
      const u32 a0 = w0 << 16, a1 = w1 << 16, a2 = w0 & 0xffff0000u, a3 = w1 & 0xffff0000u;
#pragma unroll
      for (int jn = 0; jn < 2; ++jn) x1w_mma1688(acc[jn], a0, a1, a2, a3, tbb[jn][kk][0], tbb[jn][kk][1]);
    }
    // lane l's sector [n-tile 0 | 1] = chunks 2l, 2l + 1 of block vg of the dead D / Kp^T buffer (the step 7
    // __syncwarp above: every lane is done with step 6's staging), then chunks L, 32 + L out
    if (X1W_ST) {
      F4* st = reinterpret_cast<F4*>(&sm.u.kpt[256 * vg]);
#pragma unroll
      for (int jn = 0; jn < 2; ++jn) st[x1w_wsw(2 * lane + jn)] = F4{acc[jn][0], acc[jn][1], acc[jn][2], acc[jn][3]};
      __syncwarp();
      F4* dst = (F4*)(blob + WS_U) + vg * 64;
      dst[lane] = st[x1w_wsw(lane)];
      dst[32 + lane] = st[x1w_wsw(32 + lane)];
    }
  }
  __syncwarp();                                          // every lane is done with v, D / Kp^T, cgcl, Tb, beta
  if (itn < items) x1w_issue_v(sm, v, t0n, mn, hvn, lane);
  asm volatile("cp.async.commit_group;" ::: "memory");
  t0 = t0n;
  m = mn;
  t0n = t0nn;
  mn = mnn;
  }                                                      // items
  asm volatile("cp.async.wait_all;" ::: "memory");
}
