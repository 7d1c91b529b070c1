// KDA forward, stage 2 ("recurrence"): one block per (segment, value head, V-slice), one warp per
// 16 rows of the V-first state (16 x KDIM fp32 in registers: KDIM / 2 floats per thread; ksplit 2:
// two warps, half the channels each). Warps share the workspace ring in shared memory, filled
// STAGES - 1 chunks ahead (cp.async by every thread, or two cp.async.bulk by one); only a ksplit
// pair exchanges partial sums. Per chunk of 16 tokens (state S^T = S, V-first):
//   V_new^T = U^T - S W^T            (A = S as operand: accumulators 2j, 2j+1 form k-step j)
//   O^T     = S Qg^T + V_new^T A^T   (V_new^T accumulators become the A operand directly)
//   S       = S * gamma_last + V_new^T Kd
// Defines from op.py: KDIM VDIM CH H HV SPLIT STAGES HAS_H0 HAS_HT OP_BF16; REC_BULK (rec_copy "bulk":
// TMA bulk copies on mbarriers instead of cp.async); REC_OROWS (o_store "rows": O = Qg S^T + A_qk V_new
// with tokens as rows, stored as bf16 pairs, instead of O^T's 2-byte stores); KSPLIT (2: two warps per
// 16 state rows, see rec_chunk_ks); PDL_FLAGS (prep_variant 3,
// kda_prepare_ovl.cu): this kernel runs beside prepare and acquires flags[chunk * HV + hv] before it
// copies a chunk's blob.

#ifndef KSPLIT
#define KSPLIT 1                          // warps per 16 state rows (2: each owns half the channels)
#endif
#define VS (VDIM / SPLIT)                 // V rows per block
#define NWARP (VS / 16)                   // 16-row groups per block
#define NTHREADS (NWARP * 32 * KSPLIT)
#define NT (KDIM / 8)                     // n-tiles of the state
#define NTL (NT / KSPLIT)                 // n-tiles one warp holds
#define STAGE_U (NWARP * 32 * 32)         // bytes of U^T this block reads per chunk
#define STAGE_BYTES (WS_U + STAGE_U)      // WQ, KD, AQ, GAM are contiguous at the blob's start

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const u32 s = (u32)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(STAGES - 2) : "memory");
}

__device__ __forceinline__ void issue_stage(unsigned char* dst, const unsigned char* blob, int vg0, int tid) {
  for (int i = tid * 16; i < WS_U; i += NTHREADS * 16) cp_async16(dst + i, blob + i);
  const unsigned char* us = blob + WS_U + vg0 * 32 * 32;
  for (int i = tid * 16; i < STAGE_U; i += NTHREADS * 16) cp_async16(dst + WS_U + i, us + i);
}

#if REC_BULK
// rec_copy "bulk": one thread copies a chunk's stage with two cp.async.bulk (the shared WQ/KD/AQ/GAM
// part and this block's U^T rows), completion counted in bytes on the stage's mbarrier; instead of
// STAGE_BYTES / 16 cp.async spread over the block (15 per thread and chunk at split 4, 28 per lane
// at split 8: ~60-110 of the ~490 warp instructions a chunk costs, ncu on the H200).
__device__ __forceinline__ u32 smem_u32(const void* p) { return (u32)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void bulk_issue(unsigned char* dst, const unsigned char* blob, int vg0,
                                           unsigned long long* bar) {
  const u32 b = smem_u32(bar), d = smem_u32(dst);
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(STAGE_BYTES) : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(d), "l"(blob), "r"(WS_U), "r"(b) : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(d + WS_U), "l"(blob + WS_U + vg0 * 32 * 32), "r"(STAGE_U), "r"(b) : "memory");
}

__device__ __forceinline__ void bulk_wait(unsigned long long* bar, u32 parity) {
  asm volatile("{\n .reg .pred P1;\n LAB_WAIT:\n"
               " mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
               " @P1 bra DONE;\n bra LAB_WAIT;\n DONE:\n}" ::"r"(smem_u32(bar)), "r"(parity) : "memory");
}
#endif

#if PDL_FLAGS
// Wait until prepare has published a chunk's blob (kda_prepare_ovl.cu: fence, barrier, release store).
// Every thread acquires for itself, so its own cp.async reads are ordered after the flag.
__device__ __forceinline__ void rec_acquire(const unsigned* flag) {
  unsigned x;
  for (;;) {
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(x) : "l"(flag) : "memory");
    if (x == 1u) break;
    __nanosleep(64);
  }
}
#endif

// The warp's 16 rows of the fp32 state, V-first [V, K], channels col0 .. col0 + 8 N - 1: from h0
// (zeros without one), and to hT.
template <int N>
__device__ __forceinline__ void rec_load_state(float (&S)[N][4], const float* __restrict__ h0, size_t sbase,
                                               int v0, int g, int t, int col0 = 0) {
#pragma unroll
  for (int nt = 0; nt < N; ++nt) {
#if HAS_H0
    const F2 lo = *(const F2*)(h0 + sbase + (size_t)(v0 + g) * KDIM + col0 + 8 * nt + 2 * t);
    const F2 hi = *(const F2*)(h0 + sbase + (size_t)(v0 + g + 8) * KDIM + col0 + 8 * nt + 2 * t);
    S[nt][0] = lo.x; S[nt][1] = lo.y; S[nt][2] = hi.x; S[nt][3] = hi.y;
#else
    S[nt][0] = S[nt][1] = S[nt][2] = S[nt][3] = 0.f;
#endif
  }
}

template <int N>
__device__ __forceinline__ void rec_store_state(const float (&S)[N][4], float* __restrict__ hT, size_t sbase,
                                                int v0, int g, int t, int col0 = 0) {
#if HAS_HT
#pragma unroll
  for (int nt = 0; nt < N; ++nt) {
    F2 lo, hi;
    lo.x = S[nt][0]; lo.y = S[nt][1]; hi.x = S[nt][2]; hi.y = S[nt][3];
    *(F2*)(hT + sbase + (size_t)(v0 + g) * KDIM + col0 + 8 * nt + 2 * t) = lo;
    *(F2*)(hT + sbase + (size_t)(v0 + g + 8) * KDIM + col0 + 8 * nt + 2 * t) = hi;
  }
#endif
}

#if KSPLIT == 2
#if !REC_BULK || !REC_OROWS || PDL_FLAGS
#error "ksplit 2 is written for rec_copy bulk and o_store rows"
#endif
#if KDIM % 32 || NWARP > 15
#error "ksplit 2 halves whole 16-channel k-steps (KDIM % 32 == 0); pairs use named barriers 1..15"
#endif
__device__ __forceinline__ F4 make_f4(const float (&a)[4]) {
  F4 r;
  r.x = a[0]; r.y = a[1]; r.z = a[2]; r.w = a[3];
  return r;
}
__device__ __forceinline__ void add_f4(float (&a)[4], const F4& b) {
  a[0] += b.x; a[1] += b.y; a[2] += b.z; a[3] += b.w;
}
#endif

#if REC_OROWS
// two floats -> bf16x2 (the output type, whatever the mma operand type); `lo` at the lower address
__device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
#endif

// Channel pair p (n-tiles 2p, 2p + 1, held in sa, sb) of the state update S = S * gamma_last + V_new^T Kd;
// p0..p3 are V_new^T's packed accumulators (the A operand), Kd's fragment and gamma come from the stage.
__device__ __forceinline__ void rec_update_pair(float (&sa)[4], float (&sb)[4], const unsigned char* st, int p, int lane,
                                                u32 p0, u32 p1, u32 p2, u32 p3) {
  const int t = lane & 3;
  const float* gam = (const float*)(st + WS_GAM);
  const U4 b = ((const U4*)(st + WS_KD))[p * 32 + lane];
  const F2 ga = *(const F2*)(gam + 16 * p + 2 * t), gb = *(const F2*)(gam + 16 * p + 8 + 2 * t);
  sa[0] *= ga.x; sa[1] *= ga.y; sa[2] *= ga.x; sa[3] *= ga.y;
  sb[0] *= gb.x; sb[1] *= gb.y; sb[2] *= gb.x; sb[3] *= gb.y;
  mma16816(sa, p0, p1, p2, p3, b.x, b.y);
  mma16816(sb, p0, p1, p2, p3, b.z, b.w);
}

// One chunk of the recurrence for one warp's 16 state rows (v0 .. v0 + 15): st is the chunk's blob
// in shared memory (WQ, KD, AQ, GAM at their workspace offsets), us this warp's U^T fragment,
// tok0 the chunk's first token, *seg_end the end of its segment. Shared with kda_fused.cu.
__device__ __forceinline__ void rec_chunk(float (&S)[NT][4], const unsigned char* st, const F4* us,
                                          bf16_t* __restrict__ o, long long tok0, const long long* seg_end,
                                          int hv, int v0, int lane) {
  const int g = lane >> 2, t = lane & 3;
  float vn[2][4], oc[2][4];
  {
    const F4 u0 = us[0], u1 = us[1];
    vn[0][0] = u0.x; vn[0][1] = u0.y; vn[0][2] = u0.z; vn[0][3] = u0.w;
    vn[1][0] = u1.x; vn[1][1] = u1.y; vn[1][2] = u1.z; vn[1][3] = u1.w;
  }
#pragma unroll
  for (int j = 0; j < 2; ++j) oc[j][0] = oc[j][1] = oc[j][2] = oc[j][3] = 0.f;

  // V_new^T = U^T + S (-W)^T ;  O^T = S Qg^T
  const U4* wq = (const U4*)(st + WS_WQ);
#pragma unroll
  for (int ks = 0; ks < KDIM / 16; ++ks) {
    const u32 a0 = pack2(S[2 * ks][0], S[2 * ks][1]), a1 = pack2(S[2 * ks][2], S[2 * ks][3]);
    const u32 a2 = pack2(S[2 * ks + 1][0], S[2 * ks + 1][1]), a3 = pack2(S[2 * ks + 1][2], S[2 * ks + 1][3]);
    const U4 w = wq[(ks * 32 + lane) * 2], qg = wq[(ks * 32 + lane) * 2 + 1];
    mma16816(vn[0], a0, a1, a2, a3, w.x, w.y);
    mma16816(vn[1], a0, a1, a2, a3, w.z, w.w);
#if REC_OROWS
    // O = Qg S^T: the Qg fragment is this product's A operand (registers x, z, y, w), S's packed
    // registers its B operand (v rows 0-7: a0, a2; rows 8-15: a1, a3)
    mma16816(oc[0], qg.x, qg.z, qg.y, qg.w, a0, a2);
    mma16816(oc[1], qg.x, qg.z, qg.y, qg.w, a1, a3);
#else
    mma16816(oc[0], a0, a1, a2, a3, qg.x, qg.y);
    mma16816(oc[1], a0, a1, a2, a3, qg.z, qg.w);
#endif
  }
  const u32 p0 = pack2(vn[0][0], vn[0][1]), p1 = pack2(vn[0][2], vn[0][3]);
  const u32 p2 = pack2(vn[1][0], vn[1][1]), p3 = pack2(vn[1][2], vn[1][3]);

#if REC_OROWS
  // O += A_qk V_new (A_qk's fragment as A: x, z, y, w; V_new^T's accumulators as B), then each thread
  // stores two bf16 pairs per token row g, g + 8: v0 + 8 vt + 2t (+1)
  {
    const U4 aq = ((const U4*)(st + WS_AQ))[lane];
    mma16816(oc[0], aq.x, aq.z, aq.y, aq.w, p0, p2);
    mma16816(oc[1], aq.x, aq.z, aq.y, aq.w, p1, p3);
    const int m = (int)min((long long)CH, *seg_end - tok0);
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int r = g + 8 * e;
      if (r < m) {
        u32* orow = (u32*)(o + ((size_t)(tok0 + r) * HV + hv) * VDIM + v0 + 2 * t);
        orow[0] = pack_bf16x2(oc[0][2 * e], oc[0][2 * e + 1]);
        orow[4] = pack_bf16x2(oc[1][2 * e], oc[1][2 * e + 1]);
      }
    }
  }
#else
  // O^T += V_new^T A_qk^T, then store rows of this chunk
  {
    const U4 aq = ((const U4*)(st + WS_AQ))[lane];
    mma16816(oc[0], p0, p1, p2, p3, aq.x, aq.y);
    mma16816(oc[1], p0, p1, p2, p3, aq.z, aq.w);
    const int m = (int)min((long long)CH, *seg_end - tok0);
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
#endif

  // S = S * gamma_last + V_new^T Kd
#pragma unroll
  for (int p = 0; p < NT / 2; ++p) rec_update_pair(S[2 * p], S[2 * p + 1], st, p, lane, p0, p1, p2, p3);
}

#if KSPLIT == 2
// ksplit 2: two warps share 16 state rows, warp kh holding channels 64 kh .. 64 kh + 63 (NTL = NT / 2
// n-tiles). Each computes its half of the k-sums of V_new and O, writes V_new's and the partner's O
// half to its slot of the pair's exchange buffer (xmine: 12 floats per lane), syncs with its partner
// on the pair's named barrier and adds the partner's (xpart). One buffer is enough: the block barrier
// at the top of the next chunk orders the partner's reads before this warp's next writes. Both then
// hold V_new; warp kh finishes and stores O's value columns 8 kh .. 8 kh + 7 and updates its own
// channels of S. Needs REC_OROWS (O with tokens as rows).
__device__ __forceinline__ void rec_chunk_ks(float (&S)[NTL][4], const unsigned char* st, const F4* us, float* xmine,
                                             const float* xpart, int bar_id, bf16_t* __restrict__ o, long long tok0,
                                             const long long* seg_end, int hv, int v0, int lane, int kh) {
  const int g = lane >> 2, t = lane & 3;
  float vn[2][4], oc[2][4];
  if (kh == 0) {                       // U^T enters once, with the first half
    const F4 u0 = us[0], u1 = us[1];
    vn[0][0] = u0.x; vn[0][1] = u0.y; vn[0][2] = u0.z; vn[0][3] = u0.w;
    vn[1][0] = u1.x; vn[1][1] = u1.y; vn[1][2] = u1.z; vn[1][3] = u1.w;
  } else {
#pragma unroll
    for (int j = 0; j < 2; ++j) vn[j][0] = vn[j][1] = vn[j][2] = vn[j][3] = 0.f;
  }
#pragma unroll
  for (int j = 0; j < 2; ++j) oc[j][0] = oc[j][1] = oc[j][2] = oc[j][3] = 0.f;

  // this half's k-steps: V_new^T = U^T + S (-W)^T and O = Qg S^T, as in rec_chunk
  const U4* wq = (const U4*)(st + WS_WQ);
#pragma unroll
  for (int kl = 0; kl < NTL / 2; ++kl) {
    const int ks = kh * (NTL / 2) + kl;
    const u32 a0 = pack2(S[2 * kl][0], S[2 * kl][1]), a1 = pack2(S[2 * kl][2], S[2 * kl][3]);
    const u32 a2 = pack2(S[2 * kl + 1][0], S[2 * kl + 1][1]), a3 = pack2(S[2 * kl + 1][2], S[2 * kl + 1][3]);
    const U4 w = wq[(ks * 32 + lane) * 2], qg = wq[(ks * 32 + lane) * 2 + 1];
    mma16816(vn[0], a0, a1, a2, a3, w.x, w.y);
    mma16816(vn[1], a0, a1, a2, a3, w.z, w.w);
    mma16816(oc[0], qg.x, qg.z, qg.y, qg.w, a0, a2);
    mma16816(oc[1], qg.x, qg.z, qg.y, qg.w, a1, a3);
  }

  // exchange: V_new's two partial tiles and the O half the partner finishes go out, the partner's
  // come in (slots [3][32 lanes] x 16 B: conflict-free); fin is the O half this warp finishes
  float give[4], fin[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    give[e] = kh ? oc[0][e] : oc[1][e];
    fin[e] = kh ? oc[1][e] : oc[0][e];
  }
  F4* mine = (F4*)xmine + lane;
  mine[0] = make_f4(vn[0]); mine[32] = make_f4(vn[1]); mine[64] = make_f4(give);
  asm volatile("bar.sync %0, 64;" ::"r"(bar_id) : "memory");
  const F4* theirs = (const F4*)xpart + lane;
  add_f4(vn[0], theirs[0]); add_f4(vn[1], theirs[32]); add_f4(fin, theirs[64]);
  const u32 p0 = pack2(vn[0][0], vn[0][1]), p1 = pack2(vn[0][2], vn[0][3]);
  const u32 p2 = pack2(vn[1][0], vn[1][1]), p3 = pack2(vn[1][2], vn[1][3]);

  // O (value columns 8 kh .. 8 kh + 7) += A_qk V_new, stored as bf16 pairs for token rows g, g + 8
  {
    const U4 aq = ((const U4*)(st + WS_AQ))[lane];
    mma16816(fin, aq.x, aq.z, aq.y, aq.w, kh ? p1 : p0, kh ? p3 : p2);
    const int m = (int)min((long long)CH, *seg_end - tok0);
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int r = g + 8 * e;
      if (r < m) {
        u32* orow = (u32*)(o + ((size_t)(tok0 + r) * HV + hv) * VDIM + v0 + 8 * kh + 2 * t);
        orow[0] = pack_bf16x2(fin[2 * e], fin[2 * e + 1]);
      }
    }
  }

  // this half of S = S * gamma_last + V_new^T Kd
#pragma unroll
  for (int pl = 0; pl < NTL / 2; ++pl)
    rec_update_pair(S[2 * pl], S[2 * pl + 1], st, kh * (NTL / 2) + pl, lane, p0, p1, p2, p3);
}
#endif

extern "C" __global__ void __launch_bounds__(NTHREADS)
kda_recurrence(const unsigned char* __restrict__ ws, bf16_t* __restrict__ o,
               const float* __restrict__ h0, float* __restrict__ hT,
               const long long* __restrict__ cu_seqlens, const int* __restrict__ chunk_offsets,
               const int* __restrict__ seq_order
#if PDL_FLAGS
               , const unsigned* __restrict__ flags
#endif
               ) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int sp = blockIdx.x % SPLIT, hv = (blockIdx.x / SPLIT) % HV;
  const int n = seq_order[blockIdx.x / (SPLIT * HV)];
  const int vg0 = sp * NWARP;                       // first 16-row group of this block
  const int rg = warp / KSPLIT, kh = warp % KSPLIT; // this warp's row group and channel part
  const int v0 = 16 * (vg0 + rg);                   // first state row of this warp
  const long long bos = cu_seqlens[n];
  const int c0 = chunk_offsets[n], nc = chunk_offsets[n + 1] - c0;

  float S[NTL][4];                                  // S[v0 + g (+8)][col0 + 8 nt + 2t (+1)]
  const size_t sbase = ((size_t)n * HV + hv) * VDIM * KDIM;
  rec_load_state(S, h0, sbase, v0, g, t, kh * (KDIM / KSPLIT));

#if REC_BULK
  __shared__ __align__(8) unsigned long long bars[STAGES];   // one per stage: the k-th fill is phase k
  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < STAGES; ++s) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(&bars[s])));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#pragma unroll
    for (int i = 0; i < STAGES - 1; ++i)
      if (i < nc) bulk_issue(smem + i * STAGE_BYTES, ws + ((size_t)(c0 + i) * HV + hv) * WS_BLOB, vg0, &bars[i]);
  }
  __syncthreads();
  for (int i = 0; i < nc; ++i) {
    bulk_wait(&bars[i % STAGES], (i / STAGES) & 1);
    __syncthreads();                 // every warp is done with chunk i - 1, whose stage is refilled now
    const int j = i + STAGES - 1;
    if (tid == 0 && j < nc)
      bulk_issue(smem + (j % STAGES) * STAGE_BYTES, ws + ((size_t)(c0 + j) * HV + hv) * WS_BLOB, vg0, &bars[j % STAGES]);
    const unsigned char* st = smem + (i % STAGES) * STAGE_BYTES;
#if KSPLIT == 2
    float* xb = (float*)(smem + STAGES * STAGE_BYTES) + rg * 2 * 384;    // [pair][half][3][32 lanes] x float4
    rec_chunk_ks(S, st, (const F4*)(st + WS_U) + (rg * 32 + lane) * 2, xb + kh * 384, xb + (1 - kh) * 384, 1 + rg, o,
                 bos + (long long)i * CH, cu_seqlens + n + 1, hv, v0, lane, kh);
#else
    rec_chunk(S, st, (const F4*)(st + WS_U) + (warp * 32 + lane) * 2, o, bos + (long long)i * CH, cu_seqlens + n + 1,
              hv, v0, lane);
#endif
  }
#else
#pragma unroll
  for (int i = 0; i < STAGES - 1; ++i) {
    if (i < nc) {
#if PDL_FLAGS
      rec_acquire(flags + (size_t)(c0 + i) * HV + hv);
#endif
      issue_stage(smem + i * STAGE_BYTES, ws + ((size_t)(c0 + i) * HV + hv) * WS_BLOB, vg0, tid);
    }
    cp_async_commit();
  }

  for (int i = 0; i < nc; ++i) {
    cp_async_wait();
    __syncthreads();
    {
      const int j = i + STAGES - 1;
      if (j < nc) {
#if PDL_FLAGS
        rec_acquire(flags + (size_t)(c0 + j) * HV + hv);
#endif
        issue_stage(smem + (j % STAGES) * STAGE_BYTES, ws + ((size_t)(c0 + j) * HV + hv) * WS_BLOB, vg0, tid);
      }
      cp_async_commit();
    }
    const unsigned char* st = smem + (i % STAGES) * STAGE_BYTES;

    rec_chunk(S, st, (const F4*)(st + WS_U) + (warp * 32 + lane) * 2, o, bos + (long long)i * CH, cu_seqlens + n + 1,
              hv, v0, lane);
  }
  cp_async_wait();
#endif

  rec_store_state(S, hT, sbase, v0, g, t, kh * (KDIM / KSPLIT));
}
