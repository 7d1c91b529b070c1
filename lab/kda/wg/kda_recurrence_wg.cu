// KDA forward, stage 2 with wgmma (lab, issue 30): the recurrence of ops/kda/kda_recurrence.cu with its
// three products per chunk as warpgroup MMAs, the workspace's B operands read from shared memory:
//   [V_new^T | O^T] = [U^T | 0] + S [-W | Qg]^T     8 x m64n32k16  (k = channel, n = 16 W + 16 Qg tokens)
//   O^T            += V_new^T A_qk^T                 1 x m64n16k16  (k = token s, n = token r)
//   S               = S * gamma_last + V_new^T Kd    1 x m64n128k16 (k = token, n = channel)
// against 200 mma.sync per 64 state rows and chunk. A operands (S, V_new^T) stay in registers in the
// m16n8k16 A-fragment order (one warp per 16 rows, as wgmma wants them); S is the accumulator of the
// third product in place. One warpgroup per 64 state rows, WG_SPLIT blocks per (segment, value head).
//
// Needs workspace "v2" (lab/kda/wg/probe_wg.py patches the x1w prepare's stores): WQ, KD and AQ with
// each fragment register of the 32 lanes stored together, [block][reg][lane] words instead of
// [block][lane][reg]. Lane (g, t)'s B-fragment word holds (n = g, k = 2t, 2t + 1), so one register of
// 32 lanes is one 8 x 8 core matrix of wgmma's K-major no-swizzle layout (rows n, 16 bytes of k each),
// and in every region core (n-block nb, k-block kb) sits at (2 nb + kb) * 128 bytes: k-adjacent cores
// 128 bytes apart, n-adjacent ones 256. GAM and U are unchanged.
//
// Defines from ops/kda (op.py's render): KDIM VDIM CH HV HAS_H0 HAS_HT OP_BF16, and kda_recurrence.cu's
// rec_load_state / rec_store_state; here: WG_SPLIT, WG_STAGES, WG_LBO_IS_K (the descriptor's leading
// byte offset holds the k-direction stride: lab/kda/wgmma_probe.py decides).

#ifndef WG_SPLIT
#define WG_SPLIT 2
#endif
#ifndef WG_STAGES
#define WG_STAGES 3
#endif
#ifndef WG_LBO_IS_K
#define WG_LBO_IS_K 1
#endif
#ifndef WG_OSTAGE
#define WG_OSTAGE 0                        // 1: O^T through shared memory (stmatrix.trans), 16-byte stores
#endif
#ifndef WG_UF16
#define WG_UF16 0                          // 1: U^T stored as f16 pairs (4 KB a chunk-head, not 8; probe_wg.py's uf16)
#endif
#define WG_OSTR 144                        // bytes per token row of a warpgroup's O tile (64 values + pad)
#define WG_OTILE (16 * WG_OSTR)
#if WG_OSTAGE
#define WG_OTILES (WG_NWARP / 4 * 2 * WG_OTILE)   // two O tiles per warpgroup
#else
#define WG_OTILES 0
#endif
#if KDIM != 128 || VDIM % (64 * WG_SPLIT)
#error "the wgmma recurrence is written for KDIM = 128 and 64-row warpgroups"
#endif
#define WG_VS (VDIM / WG_SPLIT)            // state rows per block
#define WG_NWARP (WG_VS / 16)
#define WG_THREADS (WG_NWARP * 32)
#define WG_NT (KDIM / 8)
#ifndef WG_UFROMV
#define WG_UFROMV 0   // 1: U^T = V^T (T_inv diag(beta))^T formed here from v; the blob holds T_inv diag(beta)
#endif
#if WG_UFROMV
// Stage: WQ..GAM (WS_U bytes) and T_inv diag(beta) (512 B, f16, the B operand [k = s][n = r] in core
// order) by one bulk copy, then 512 B of zeros (written once: the n = 16..31 half of the first k-step's
// B, whose A is V^T), then the chunk's v rows of this block, one bulk copy a token, rows padded by 16 B
// so that ldmatrix reads them without bank conflicts.
#if OP_BF16 || WG_UF16
#error "ufromv is written for op_dtype f16 and no uf16"
#endif
#define WG_U_LANE 0
#define WG_STAGE_U 0
#define WG_VROW (2 * WG_VS + 16)
#define WG_VTILE (WS_U + 1024)
#define WG_STAGE_BYTES (WG_VTILE + CH * WG_VROW)
#else
#define WG_U_LANE (WG_UF16 ? 16 : 32)      // bytes of U^T per lane and 16-row group
#define WG_STAGE_U (WG_NWARP * 32 * WG_U_LANE)   // this block's U^T rows per chunk
#define WG_STAGE_BYTES (WS_U + WG_STAGE_U)
#endif
#define WG_LBO (WG_LBO_IS_K ? 128 : 256)
#define WG_SBO (WG_LBO_IS_K ? 256 : 128)
#if OP_BF16
#define WG_AB "bf16.bf16"
#else
#define WG_AB "f16.f16"
#endif

__device__ __forceinline__ u32 wg_smem(const void* p) { return (u32)__cvta_generic_to_shared(p); }

// no swizzle: start >> 4 (bits 0-13), leading byte offset >> 4 (16-29), stride byte offset >> 4 (32-45)
__device__ __forceinline__ unsigned long long wg_desc(u32 addr) {
  return (unsigned long long)((addr & 0x3FFFF) >> 4) | ((unsigned long long)(WG_LBO >> 4) << 16) |
         ((unsigned long long)(WG_SBO >> 4) << 32);
}

// two floats -> bf16x2, `lo` at the lower address
__device__ __forceinline__ u32 wg_bf16x2(float lo, float hi) {
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }

// WG_MMA_INC: wg_n16, wg_n32, wg_n128 (wg_mma.inc, pasted here by probe_wg.py)

__device__ __forceinline__ void wg_bulk_issue(unsigned char* dst, const unsigned char* blob, int vg0,
                                              unsigned long long* bar) {
  const u32 b = wg_smem(bar), d = wg_smem(dst);
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(WG_STAGE_BYTES) : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(d), "l"(blob), "r"(WS_U), "r"(b) : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(d + WS_U), "l"(blob + WS_U + vg0 * 32 * WG_U_LANE), "r"(WG_STAGE_U), "r"(b) : "memory");
}

#if WG_UFROMV
// the blob's WQ..GAM and T_inv diag(beta), then `rows` v rows (tokens tok0 ..) of this block's values
__device__ __forceinline__ void wg_bulk_issue_v(unsigned char* dst, const unsigned char* blob, const bf16_t* v,
                                                long long tok0, int rows, int hv, int vs0, unsigned long long* bar) {
  const u32 b = wg_smem(bar), d = wg_smem(dst);
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(WS_U + 512 + rows * 2 * WG_VS)
               : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(d), "l"(blob), "r"(WS_U + 512), "r"(b) : "memory");
  for (int r = 0; r < rows; ++r)
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(d + WG_VTILE + r * WG_VROW), "l"(v + ((size_t)(tok0 + r) * HV + hv) * VDIM + vs0),
                 "r"(2 * WG_VS), "r"(b) : "memory");
}

// bf16x2 -> f16x2 (exact for values in f16's range), the token halves at or past m zeroed
__device__ __forceinline__ u32 wg_bf2h(u32 x, int tok_lo, int m) {
  const float lo = tok_lo < m ? __uint_as_float(x << 16) : 0.f;
  const float hi = tok_lo + 1 < m ? __uint_as_float(x & 0xFFFF0000u) : 0.f;
  u32 r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
#endif

__device__ __forceinline__ void wg_bulk_wait(unsigned long long* bar, u32 parity) {
  asm volatile("{\n .reg .pred P1;\n WG_WAIT:\n"
               " mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
               " @P1 bra WG_DONE;\n bra WG_WAIT;\n WG_DONE:\n}" ::"r"(wg_smem(bar)), "r"(parity) : "memory");
}

// One chunk for this warp's 16 state rows (v0 ..) of its warpgroup's 64: st is the chunk's stage in
// shared memory, us this warp's U^T (8 floats per lane), tok0 the chunk's first token.
__device__ __forceinline__ void wg_chunk(float (&S)[WG_NT][4], const unsigned char* st, const F4* us,
                                         bf16_t* __restrict__ o, long long tok0, const long long* seg_end,
                                         int hv, int v0, int lane, const unsigned char* otile, int tok_par) {
  const int g = lane >> 2, t = lane & 3;
  const int m = (int)min((long long)CH, *seg_end - tok0);   // the chunk's tokens (short at a segment's end)
  float d1[16];                                    // n-tiles 0-1: V_new^T (tokens 0-15), 2-3: O^T
  {
#if WG_UFROMV
#pragma unroll
    for (int i = 0; i < 8; ++i) d1[i] = 0.f;
    (void)us;
#elif WG_UF16
    const U4 uu = *(const U4*)us;                  // f16 pairs, in the fp32 layout's order
    const u32 w4[4] = {uu.x, uu.y, uu.z, uu.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      unsigned short lo = (unsigned short)(w4[e] & 0xFFFF), hi = (unsigned short)(w4[e] >> 16);
      asm("cvt.f32.f16 %0, %1;" : "=f"(d1[2 * e]) : "h"(lo));
      asm("cvt.f32.f16 %0, %1;" : "=f"(d1[2 * e + 1]) : "h"(hi));
    }
#else
    const F4 u0 = us[0], u1 = us[1];
    d1[0] = u0.x; d1[1] = u0.y; d1[2] = u0.z; d1[3] = u0.w;
    d1[4] = u1.x; d1[5] = u1.y; d1[6] = u1.z; d1[7] = u1.w;
#endif
#pragma unroll
    for (int i = 8; i < 16; ++i) d1[i] = 0.f;
  }
  u32 a[KDIM / 16][4];                             // S as the A operand, k-step ks = channels 16 ks ..
#pragma unroll
  for (int ks = 0; ks < KDIM / 16; ++ks) {
    a[ks][0] = pack2(S[2 * ks][0], S[2 * ks][1]);
    a[ks][1] = pack2(S[2 * ks][2], S[2 * ks][3]);
    a[ks][2] = pack2(S[2 * ks + 1][0], S[2 * ks + 1][1]);
    a[ks][3] = pack2(S[2 * ks + 1][2], S[2 * ks + 1][3]);
  }
  // every pack before the group: without this the compiler sinks each k-step's packs between the
  // wgmmas, and ptxas then waits for each wgmma before the next (8 serialized, seen in the SASS)
#pragma unroll
  for (int ks = 0; ks < KDIM / 16; ++ks)
    asm volatile("" : "+r"(a[ks][0]), "+r"(a[ks][1]), "+r"(a[ks][2]), "+r"(a[ks][3]));
  const unsigned long long d0 = wg_desc(wg_smem(st));   // + (byte offset >> 4): the start field, no carry
#if WG_UFROMV
  // V^T as the A operand of one more k-step (k = the chunk's tokens), by ldmatrix.trans from the v rows:
  // matrix i = (token block i >> 1, value block i & 1), row lane & 7 of it from lane 8 i + (lane & 7)
  u32 av[4];
  {
    const int i = lane >> 3, r = lane & 7, wv = (threadIdx.x >> 5) * 16;   // this warp's values in the block
    const u32 addr = wg_smem(st) + WG_VTILE + (8 * (i >> 1) + r) * WG_VROW + (wv + 8 * (i & 1)) * 2;
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(av[0]), "=r"(av[1]), "=r"(av[2]), "=r"(av[3]) : "r"(addr));
    av[0] = wg_bf2h(av[0], 2 * t, m);
    av[1] = wg_bf2h(av[1], 2 * t, m);
    av[2] = wg_bf2h(av[2], 2 * t + 8, m);
    av[3] = wg_bf2h(av[3], 2 * t + 8, m);
  }
  asm volatile("" : "+r"(av[0]), "+r"(av[1]), "+r"(av[2]), "+r"(av[3]));
#endif
  wg_fence();
#if WG_UFROMV
  wg_n32(d1, av[0], av[1], av[2], av[3], d0 + (WS_U >> 4));   // [U^T | 0] = V^T [(T_inv diag(beta))^T | 0]
#endif
#pragma unroll
  for (int ks = 0; ks < KDIM / 16; ++ks) wg_n32(d1, a[ks][0], a[ks][1], a[ks][2], a[ks][3], d0 + ((WS_WQ + 1024 * ks) >> 4));
  wg_commit();
  {                                                // S * gamma_last while the group runs (S is not its operand)
    const float* gam = (const float*)(st + WS_GAM);
#pragma unroll
    for (int nt = 0; nt < WG_NT; ++nt) {
      const F2 gg = *(const F2*)(gam + 8 * nt + 2 * t);
      S[nt][0] *= gg.x; S[nt][1] *= gg.y; S[nt][2] *= gg.x; S[nt][3] *= gg.y;
    }
  }
  wg_wait0();
  const u32 p0 = pack2(d1[0], d1[1]), p1 = pack2(d1[2], d1[3]);
  const u32 p2 = pack2(d1[4], d1[5]), p3 = pack2(d1[6], d1[7]);
  // A_qk V_new into fresh accumulators, added to d1's O^T half after the group: with a slice of d1 as
  // its accumulator ptxas serializes every wgmma of the chunk (C7511, seen in run 2's SASS)
  float oq[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) oq[e] = 0.f;
  wg_fence();
  wg_n16(oq, p0, p1, p2, p3, d0 + (WS_AQ >> 4));
  wg_n128(&S[0][0], p0, p1, p2, p3, d0 + (WS_KD >> 4));
  wg_commit();
  wg_wait0();
  float oc[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) oc[e] = d1[8 + e] + oq[e];
#if WG_OSTAGE
  // O^T -> O: the four 8 x 8 bf16 blocks (value block vb, token block j) stored transposed (rows = tokens)
  // into this warpgroup's tile (the chunk's parity picks one of two; the loop's block barrier orders
  // a tile's reads before its next writes), then one 16-byte store per thread: token row tid / 8
  {
    const int w = (threadIdx.x >> 5) & 3, wgi = threadIdx.x >> 7, i = lane >> 3, r = lane & 7;
    const u32 tile = wg_smem(otile) + wgi * 2 * WG_OTILE + (tok_par & 1) * WG_OTILE;
    const u32 addr = tile + (8 * (i >> 1) + r) * WG_OSTR + (16 * w + 8 * (i & 1)) * 2;
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};"
                 ::"r"(addr), "r"(wg_bf16x2(oc[0], oc[1])), "r"(wg_bf16x2(oc[2], oc[3])),
                 "r"(wg_bf16x2(oc[4], oc[5])), "r"(wg_bf16x2(oc[6], oc[7])) : "memory");
    asm volatile("bar.sync %0, 128;" ::"r"(1 + wgi) : "memory");
    const int tw = (threadIdx.x & 127), tok = tw >> 3, seg = tw & 7;
    if (tok < m) {
      U4 val;
      asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(val.x), "=r"(val.y), "=r"(val.z), "=r"(val.w)
                   : "r"(tile + tok * WG_OSTR + seg * 16));
      *(U4*)(o + ((size_t)(tok0 + tok) * HV + hv) * VDIM + (v0 & ~63) + seg * 8) = val;
    }
  }
#else
  // O^T: oc[4 j + q] = (state row v0 + g + 8 (q >> 1), token 8 j + 2 t + (q & 1))
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int r = 8 * j + 2 * t + (q & 1);
      if (r < m) o[((size_t)(tok0 + r) * HV + hv) * VDIM + v0 + g + 8 * (q >> 1)] = f32_to_bf16(oc[4 * j + q]);
    }
#endif
}

extern "C" __global__ void __launch_bounds__(WG_THREADS, 1)
kda_recurrence_wg(const unsigned char* __restrict__ ws, bf16_t* __restrict__ o, const float* __restrict__ h0,
                  float* __restrict__ hT, const long long* __restrict__ cu_seqlens,
                  const int* __restrict__ chunk_offsets, const int* __restrict__ seq_order
#if WG_UFROMV
                  , const bf16_t* __restrict__ v
#endif
                  ) {
  // No static shared memory: the dynamic part would start after it, 32-byte aligned (0x420 in run 2's
  // SASS), while the compiler trusts __align__(128) and masks the descriptor's start address with
  // ~127. The stages start at the first 128-byte boundary (the launch gives 128 bytes of slack), the
  // mbarriers after the stages and O tiles.
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((128 - (wg_smem(smem_raw) & 127)) & 127);
  unsigned long long* bars = (unsigned long long*)(smem + WG_STAGES * WG_STAGE_BYTES + WG_OTILES);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int sp = blockIdx.x % WG_SPLIT, hv = (blockIdx.x / WG_SPLIT) % HV;
  const int n = seq_order[blockIdx.x / (WG_SPLIT * HV)];
  const int vg0 = sp * WG_NWARP;                   // first 16-row group of this block
  const int v0 = 16 * (vg0 + warp);
  const long long bos = cu_seqlens[n];
  const int c0 = chunk_offsets[n], nc = chunk_offsets[n + 1] - c0;

  float S[WG_NT][4];
  const size_t sbase = ((size_t)n * HV + hv) * VDIM * KDIM;
  rec_load_state(S, h0, sbase, v0, g, t, 0);

#if WG_UFROMV
  const long long seg_len = cu_seqlens[n + 1] - bos;
#define WG_ISSUE(j)                                                                                          \
  wg_bulk_issue_v(smem + ((j) % WG_STAGES) * WG_STAGE_BYTES, ws + ((size_t)(c0 + (j)) * HV + hv) * WS_BLOB, v, \
                  bos + (long long)(j) * CH, (int)min((long long)CH, seg_len - (long long)(j) * CH), hv, 16 * vg0,  \
                  &bars[(j) % WG_STAGES])
  // the zero half of the first k-step's B, in every stage (generic writes, read by wgmma: proxy fence)
  for (int s = 0; s < WG_STAGES; ++s)
    for (int e = tid; e < 128; e += WG_THREADS) ((u32*)(smem + s * WG_STAGE_BYTES + WS_U + 512))[e] = 0u;
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#else
#define WG_ISSUE(j) \
  wg_bulk_issue(smem + ((j) % WG_STAGES) * WG_STAGE_BYTES, ws + ((size_t)(c0 + (j)) * HV + hv) * WS_BLOB, vg0, \
                &bars[(j) % WG_STAGES])
#endif
  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < WG_STAGES; ++s) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(wg_smem(&bars[s])));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#pragma unroll
    for (int i = 0; i < WG_STAGES - 1; ++i)
      if (i < nc) WG_ISSUE(i);
  }
  __syncthreads();
  for (int i = 0; i < nc; ++i) {
    wg_bulk_wait(&bars[i % WG_STAGES], (i / WG_STAGES) & 1);
    __syncthreads();                               // every warp is done with chunk i - 1's stage
    const int j = i + WG_STAGES - 1;
    if (tid == 0 && j < nc)
      WG_ISSUE(j);
    const unsigned char* st = smem + (i % WG_STAGES) * WG_STAGE_BYTES;
    wg_chunk(S, st, (const F4*)(st + WS_U + (warp * 32 + lane) * WG_U_LANE), o, bos + (long long)i * CH, cu_seqlens + n + 1,
             hv, v0, lane, smem + WG_STAGES * WG_STAGE_BYTES, i);
  }
  rec_store_state(S, hT, sbase, v0, g, t, 0);
}
