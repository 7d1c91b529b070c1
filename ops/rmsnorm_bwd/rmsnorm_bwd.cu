// RMSNorm backward: dx, dweight, dbias from x (or the residual sum h), dy, weight, rstd.
//
//   r = rstd[row] (RSTD_IN) or rsqrt(mean(x^2) + eps)     g = dy * w     xh = x * r
//   dx = r * (g - xh * mean(g * xh)) = r * g - x * (r^3 * sum(g * x) / N)   (+ dres, the gradient
//        arriving at residual_out, HAS_DRES)
//   dweight = sum over rows of dy * xh,  dbias = sum over rows of dy       (fp32 accumulation)
//
// Rendered by ops/rmsnorm_bwd/op.py, which prepends a block of #defines:
//   DT        x / dy / dx / dres kind: 0 bf16, 1 f16, 2 f32 (16-bit kinds stored as u16 bits)
//   WT        weight: 0 none, 1 x's kind, 2 f32;  dweight has the weight's kind, dbias too (x's if none)
//   HAS_DB    write dbias;  RSTD_IN  read rstd [M] fp32 (else recomputed: sum x^2 in the same pass
//             as sum g*x, from the registers that already hold the row: no extra bytes)
//   HAS_DRES  add dres [M, N] (x's kind) to dx
//   THREADS, MIN_BLOCKS (__launch_bounds__), G lanes per row group (G <= 32: several groups per
//             block, shuffle reductions; G == THREADS: a block per row), CLUSTER CTAs per row (the
//             row split in CLUSTER contiguous parts, the two row sums exchanged in distributed
//             shared memory), NC = N (compiled in: the binary traps on another N)
//   VB        bytes per x vector (16 or 8);  STAGE 0: the row part held in registers (PREFETCH: the
//             next row's x, dy (, dres, rstd) loaded into a second register set before this row's
//             math); STAGE 1: two passes per row in batches of UNROLL vectors per lane, the second
//             re-reading x and dy (L2 hits: a row part is at most a few hundred KB), the weight
//             read with each batch (L1 / L2) instead of held, the fp32 sums of the CTA's columns in
//             dynamic shared memory (so the batch loop is a real loop: few registers); STAGE 2
//             (block and cluster regimes): the row part of x, dy (, dres) staged once in a ring of
//             NSTAGE shared-memory buffers by bulk copies (cp.async.bulk + mbarrier), NSTAGE - 1
//             rows ahead; both passes read shared memory; weight and sums in registers as STAGE 0
//   LDH       0 ld.global, 1 ld.global.nc, 2 .nc.L1::no_allocate, 3 that + L2 evict_first;  STCS st.global.cs
//   APPROX    rsqrt.approx.f32 (else 1 / sqrt.rn), only without RSTD_IN;  PDL  the reduce kernel is a
//             programmatic dependent launch (griddepcontrol)
// Persistent grid: row group q of Q (a group of G lanes, a block, or a cluster) handles rows
// q, q + Q, ...; the weight stays in registers, dweight / dbias partials accumulate in registers
// (fp32) across the group's rows. At the end each block (cluster: each CTA, its columns) writes
// one partial row to scratch; rmsnorm_bwd_reduce sums the partial rows in a fixed order (no
// atomics: bit-identical run to run) and casts them to dweight's / dbias's kind.
// Scratch (fp32): [0] the number of partial rows P (as an int, written by block 0), then
// dweight partials [PSTRIDE][N] from float 4 (weight given), then dbias partials [PSTRIDE][N].
// 64-bit element offsets throughout (the largest rows hold 2^31 elements).

typedef unsigned int u32;
typedef unsigned short u16;
typedef long long i64;

#define XB (DT == 2 ? 4 : 2)                       // bytes per x element
#define VEC (VB / XB)                              // elements per x vector
#define XW (VB / 4)                                // 32-bit words per x vector
#define KW (WT == 2 ? 2 : DT)                      // weight / dweight / dbias kind
#define WB (KW == 2 ? 4 : 2)
#define WW (VEC * WB / 4)                          // words per weight vector
#define NG (THREADS / G)                           // row groups per block
#define NP (NC / CLUSTER)                          // elements of a CTA's row part
#define NVP (NP / VEC)                             // vectors of a CTA's row part
#define VPT ((NVP + G - 1) / G)                    // vectors per lane
#define FULL (NVP % G == 0)                        // every lane holds VPT vectors
#ifndef STAGE
#define STAGE 0
#endif
#ifndef NSTAGE
#define NSTAGE 1
#endif

// ---------------------------------------------------------------- conversions
template <int K> __device__ __forceinline__ float getf(const u32* w, int j) {
  if constexpr (K == 2) {
    return __uint_as_float(w[j]);
  } else if constexpr (K == 0) {
    return (j & 1) ? __uint_as_float(w[j >> 1] & 0xffff0000u) : __uint_as_float(w[j >> 1] << 16);
  } else {
    float f;
    if (j & 1) asm("{.reg .b16 lo, hi; mov.b32 {lo, hi}, %1; cvt.f32.f16 %0, hi;}" : "=f"(f) : "r"(w[j >> 1]));
    else       asm("{.reg .b16 lo, hi; mov.b32 {lo, hi}, %1; cvt.f32.f16 %0, lo;}" : "=f"(f) : "r"(w[j >> 1]));
    return f;
  }
}

// The same values through volatile asm: neither hoisted out of the row loop (the weight stays
// packed across rows) nor shared between a row's two uses (x and dy are unpacked again after the
// row sum instead of living as floats across it: 2x the registers otherwise)
template <int K> __device__ __forceinline__ float getv(const u32* w, int j) {
  if constexpr (K == 2) {
    return __uint_as_float(w[j]);
  } else {
    float f;
    if constexpr (K == 0) {
      if (j & 1) asm volatile("and.b32 %0, %1, 0xffff0000;" : "=f"(f) : "r"(w[j >> 1]));
      else       asm volatile("shl.b32 %0, %1, 16;" : "=f"(f) : "r"(w[j >> 1]));
    } else {
      if (j & 1) asm volatile("{.reg .b16 lo, hi; mov.b32 {lo, hi}, %1; cvt.f32.f16 %0, hi;}" : "=f"(f) : "r"(w[j >> 1]));
      else       asm volatile("{.reg .b16 lo, hi; mov.b32 {lo, hi}, %1; cvt.f32.f16 %0, lo;}" : "=f"(f) : "r"(w[j >> 1]));
    }
    return f;
  }
}

// n floats (n even for 16-bit kinds) into kind K words, round to nearest even
template <int K, int n> __device__ __forceinline__ void pack(const float* f, u32* w) {
#pragma unroll
  for (int j = 0; j < n; j += (K == 2 ? 1 : 2)) {
    if constexpr (K == 2) w[j] = __float_as_uint(f[j]);
    else if constexpr (K == 0) asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(w[j >> 1]) : "f"(f[j + 1]), "f"(f[j]));
    else asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(w[j >> 1]) : "f"(f[j + 1]), "f"(f[j]));
  }
}

// ---------------------------------------------------------------- memory access
__device__ __forceinline__ u32 smem_u32(const void* p) { return (u32)__cvta_generic_to_shared(p); }

__device__ __forceinline__ unsigned long long policy_first() {
  unsigned long long pol;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  return pol;
}

// 16 or 8 bytes of streamed data (x, dy, dres) at p, with the LDH hint
__device__ __forceinline__ void ld4(const void* p, u32* w) {
#if LDH == 3
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
      : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3]) : "l"(p), "l"(policy_first()));
#elif LDH == 2
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3]) : "l"(p));
#elif LDH == 1
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3]) : "l"(p));
#else
  asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3]) : "l"(p));
#endif
}
__device__ __forceinline__ void ld2(const void* p, u32* w) {
#if LDH == 3
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v2.u32 {%0, %1}, [%2], %3;"
      : "=r"(w[0]), "=r"(w[1]) : "l"(p), "l"(policy_first()));
#elif LDH == 2
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(w[0]), "=r"(w[1]) : "l"(p));
#elif LDH == 1
  asm volatile("ld.global.nc.v2.u32 {%0, %1}, [%2];" : "=r"(w[0]), "=r"(w[1]) : "l"(p));
#else
  asm volatile("ld.global.v2.u32 {%0, %1}, [%2];" : "=r"(w[0]), "=r"(w[1]) : "l"(p));
#endif
}
// n words (a multiple of 2) from p: 16-byte loads, an 8-byte one for a remainder
template <int n> __device__ __forceinline__ void ldn(const void* p, u32* w) {
#pragma unroll
  for (int q = 0; q + 4 <= n; q += 4) ld4((const char*)p + 4 * q, w + q);
  if constexpr (n % 4) ld2((const char*)p + 4 * (n - 2), w + n - 2);
}
// the weight: read once per block, plain cached loads
template <int n> __device__ __forceinline__ void ldw(const void* p, u32* w) {
#pragma unroll
  for (int q = 0; q + 4 <= n; q += 4)
    asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(w[q]), "=r"(w[q + 1]), "=r"(w[q + 2]), "=r"(w[q + 3]) : "l"((const char*)p + 4 * q));
  if constexpr (n % 4)
    asm volatile("ld.global.nc.v2.u32 {%0, %1}, [%2];" : "=r"(w[n - 2]), "=r"(w[n - 1]) : "l"((const char*)p + 4 * (n - 2)));
}
template <int n> __device__ __forceinline__ void stn(void* p, const u32* w) {
#pragma unroll
  for (int q = 0; q + 4 <= n; q += 4) {
#if STCS
    asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};" :: "l"((char*)p + 4 * q), "r"(w[q]), "r"(w[q + 1]), "r"(w[q + 2]), "r"(w[q + 3]) : "memory");
#else
    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" :: "l"((char*)p + 4 * q), "r"(w[q]), "r"(w[q + 1]), "r"(w[q + 2]), "r"(w[q + 3]) : "memory");
#endif
  }
  if constexpr (n % 4) {
#if STCS
    asm volatile("st.global.cs.v2.u32 [%0], {%1, %2};" :: "l"((char*)p + 4 * (n - 2)), "r"(w[n - 2]), "r"(w[n - 1]) : "memory");
#else
    asm volatile("st.global.v2.u32 [%0], {%1, %2};" :: "l"((char*)p + 4 * (n - 2)), "r"(w[n - 2]), "r"(w[n - 1]) : "memory");
#endif
  }
}
// n fp32 partials (n = 2, 4 or 8) to p (16- or 8-byte aligned): plain stores, the reduce kernel reads them from L2
template <int n> __device__ __forceinline__ void stf(float* p, const float* f) {
#pragma unroll
  for (int q = 0; q + 4 <= n; q += 4)
    asm volatile("st.global.v4.f32 [%0], {%1, %2, %3, %4};" :: "l"(p + q), "f"(f[q]), "f"(f[q + 1]), "f"(f[q + 2]), "f"(f[q + 3]) : "memory");
  if constexpr (n % 4)
    asm volatile("st.global.v2.f32 [%0], {%1, %2};" :: "l"(p + n - 2), "f"(f[n - 2]), "f"(f[n - 1]) : "memory");
}
template <int n> __device__ __forceinline__ void zero(u32* w) {
#pragma unroll
  for (int q = 0; q < n; ++q) w[q] = 0u;
}

// ---------------------------------------------------------------- reductions
__device__ __forceinline__ float group_sum(float s) {     // butterfly over G (<= 32) aligned lanes
#pragma unroll
  for (int o = (G < 32 ? G : 32) >> 1; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  return s;
}

#if G == THREADS && THREADS > 32
// Block sum of two values; every thread gets the same bits (the warp totals are added in warp
// order). One __syncthreads per call: slot set it & 1 alternates, so a warp that runs ahead into
// the next row writes the other set (and it cannot get two rows ahead past the barrier).
__shared__ float2 red2[2][THREADS / 32];
__device__ __forceinline__ float2 block_sum2(float a, float b, int it) {
  a = group_sum(a);
  b = group_sum(b);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) red2[it & 1][warp] = make_float2(a, b);
  __syncthreads();
  float2 s = red2[it & 1][0];
#pragma unroll
  for (int w = 1; w < THREADS / 32; ++w) { s.x += red2[it & 1][w].x; s.y += red2[it & 1][w].y; }
  return s;
}
#else
__device__ __forceinline__ float2 block_sum2(float a, float b, int) {
  return make_float2(group_sum(a), group_sum(b));
}
#endif

#if CLUSTER > 1
#if __CUDA_ARCH__ < 900
#error "CLUSTER > 1 needs sm_90 or newer"
#endif
// Cluster sum of two values, one-way, as rmsnorm's persistent clusters (ops/rmsnorm/rmsnorm.cu,
// cluster_sum): each CTA owns two mbarriers and two slot sets (row iteration it uses set it % 2,
// phase parity (it / 2) % 2); lane r < CLUSTER pushes this CTA's float2 into slot `rank` of CTA r
// with st.async (complete_tx: 8 bytes on CTA r's mbarrier); thread 0 expects CLUSTER x 8 bytes on
// its own. Every CTA adds the same slots in rank order: bit-identical totals. A CTA pushes row
// it + 2 into set it % 2 only after its wait for row it + 1, which needs every CTA's push of row
// it + 1, made after that CTA's block_sum2 barrier of row it + 1, after all of its threads read
// set it % 2 for row it. Every CTA of a cluster runs the same rows, so no exit barrier is needed.
__shared__ __align__(8) unsigned long long cl_bar[2];
__shared__ __align__(8) float2 cl_part[2][CLUSTER];
__device__ __forceinline__ u32 cluster_rank() { u32 r; asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r)); return r; }
__device__ __forceinline__ u32 cluster_size() { u32 r; asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(r)); return r; }
__device__ __forceinline__ u32 cluster_id() { u32 r; asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(r)); return r; }
__device__ __forceinline__ u32 cluster_count() { u32 r; asm volatile("mov.u32 %0, %%nclusterid.x;" : "=r"(r)); return r; }

__device__ __forceinline__ void cluster_prologue() {
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(&cl_bar[0])) : "memory");
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(&cl_bar[1])) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  asm volatile("barrier.cluster.arrive.relaxed;" ::: "memory");
}

__device__ __forceinline__ float2 row_sum2(float a, float b, int it) {
  float2 s = block_sum2(a, b, it);
  if (it == 0) asm volatile("barrier.cluster.wait.acquire;" ::: "memory");   // every CTA's mbarriers are initialized
  const u32 rank = cluster_rank();
  const int k = it & 1;
  const u32 parity = (u32)(it >> 1) & 1u;
  if (threadIdx.x == 0)
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                 ::"r"(smem_u32(&cl_bar[k])), "r"((u32)(CLUSTER * 8)) : "memory");
  if (threadIdx.x < CLUSTER) {
    u32 slot, bar;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(slot) : "r"(smem_u32(&cl_part[k][rank])), "r"((u32)threadIdx.x));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(bar) : "r"(smem_u32(&cl_bar[k])), "r"((u32)threadIdx.x));
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.b32 [%0], {%1, %2}, [%3];"
                 ::"r"(slot), "r"(__float_as_uint(s.x)), "r"(__float_as_uint(s.y)), "r"(bar) : "memory");
  }
  asm volatile("{\n .reg .pred P1;\n CL_WAIT:\n"
               " mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 P1, [%0], %1;\n"
               " @P1 bra CL_DONE;\n bra CL_WAIT;\n CL_DONE:\n}" ::"r"(smem_u32(&cl_bar[k])), "r"(parity) : "memory");
  float2 v = cl_part[k][0];
#pragma unroll
  for (int r = 1; r < CLUSTER; ++r) { v.x += cl_part[k][r].x; v.y += cl_part[k][r].y; }
  return v;
}
#else
__device__ __forceinline__ float2 row_sum2(float a, float b, int it) { return block_sum2(a, b, it); }
#endif

__device__ __forceinline__ float rstd_of(float ss, float eps) {
#if APPROX
  float v = ss * (1.0f / (float)NC) + eps, r;
  asm("rsqrt.approx.f32 %0, %1;" : "=f"(r) : "f"(v));
  return r;
#else
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)NC), eps)));
#endif
}

// ---------------------------------------------------------------- the per-lane state
struct Args {
  const void* x; const void* dy; const void* w; const float* rstd; const void* dres;
  void* dx; float* part; i64 M; i64 pstride; float eps;
};

// The row buffers a lane holds (STAGE 0: its whole part; STAGE 1: one batch of UNROLL vectors)
#if STAGE == 0
#define BV VPT
#else
#define BV UNROLL
#endif
struct Rows {
  u32 x[BV][XW];
  u32 d[BV][XW];
#if HAS_DRES
  u32 r[BV][XW];
#endif
#if STAGE == 1
  u32 w[BV][WW];                                   // STAGE 1: the weight re-read per batch (L1 / L2)
#endif
  float rs;
};

// Column (element) index of vector i of lane t within the CTA's part, and whether it exists
__device__ __forceinline__ int vcol(int i, int t) { return (i * G + t) * VEC; }
__device__ __forceinline__ bool vok(int i, int t) { return FULL || (i + 1) * G <= NVP || i * G + t < NVP; }

// Load vectors [i0, i0 + n) of lane t of `row` (part offset lo) into slots 0..n-1 of b;
// missing vectors (and rows, ok == false) read as zeros.
template <int n> __device__ __forceinline__ void load_vecs(const Args& a, i64 row, bool ok, int t, i64 lo, int i0, Rows& b) {
  const i64 base = row * (i64)NC + lo;
#pragma unroll
  for (int u = 0; u < n; ++u) {
    const int i = i0 + u;
    if (ok && i < VPT && vok(i, t)) {
      const i64 e = base + vcol(i, t);
      ldn<XW>((const char*)a.x + e * XB, b.x[u]);
      ldn<XW>((const char*)a.dy + e * XB, b.d[u]);
#if HAS_DRES
      ldn<XW>((const char*)a.dres + e * XB, b.r[u]);
#endif
#if STAGE == 1
      if (WT != 0) ldw<WW>((const char*)a.w + (lo + vcol(i, t)) * WB, b.w[u]);
#endif
    } else {
      zero<XW>(b.x[u]);
      zero<XW>(b.d[u]);
#if HAS_DRES
      zero<XW>(b.r[u]);
#endif
#if STAGE == 1
      zero<WW>(b.w[u]);
#endif
    }
  }
}

__device__ __forceinline__ void load_rstd(const Args& a, i64 row, bool ok, Rows& b) {
#if RSTD_IN
  b.rs = __ldg(a.rstd + (ok ? row : 0));          // (a row past M: any row's, unused)
#else
  b.rs = 0.f;
#endif
}

// sum(g * x) into s2 and sum(x * x) into s1 over slots 0..n-1 of b (vectors i0..)
template <int n> __device__ __forceinline__ void sums(Rows& b, u32 (*ww)[WW], int i0, float& s1, float& s2) {
#pragma unroll
  for (int u = 0; u < n; ++u) {
    const int i = i0 + u;
    if (i >= VPT) break;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float xv = getf<DT>(b.x[u], j);
      float g = getf<DT>(b.d[u], j);
#if WT != 0
      g *= getv<KW>(ww[STAGE == 0 ? i : u], j);
#endif
      s2 = fmaf(g, xv, s2);
#if !RSTD_IN
      s1 = fmaf(xv, xv, s1);
#endif
    }
  }
}

// dx of slots 0..n-1 (vectors i0..) stored; dweight / dbias accumulated (r: rstd, c = r^3 s2 / N)
template <int n> __device__ __forceinline__ void finish(const Args& a, i64 row, bool ok, int t, i64 lo, int i0, Rows& b,
                                                    u32 (*ww)[WW], float r, float c,
                                                    float (*acc)[VEC], float (*accb)[VEC], float* sacc) {
  const i64 base = row * (i64)NC + lo;
#pragma unroll
  for (int u = 0; u < n; ++u) {
    const int i = i0 + u;
    if (i >= VPT) break;
    float f[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float xv = getv<DT>(b.x[u], j);
      const float dv = getv<DT>(b.d[u], j);
      float g = dv;
#if WT != 0
      g *= getv<KW>(ww[STAGE == 0 ? i : u], j);
#if STAGE == 0
      acc[i][j] = fmaf(dv, xv * r, acc[i][j]);
#else
      // a lane's last vector may lie past the part (NVP % G != 0): its column does not exist, and
      // shared memory ends at NP (the fault of run26a, 192 threads at cluster 16)
      if (vok(i, t)) sacc[vcol(i, t) + j] = fmaf(dv, xv * r, sacc[vcol(i, t) + j]);
#endif
#endif
#if HAS_DB
#if STAGE == 0
      accb[i][j] += dv;
#else
      if (vok(i, t)) sacc[(WT != 0) * NP + vcol(i, t) + j] += dv;
#endif
#endif
      float v = fmaf(-c, xv, r * g);
#if HAS_DRES
      v += getf<DT>(b.r[u], j);
#endif
      f[j] = v;
    }
    if (ok && vok(i, t)) {
      u32 o[XW];
      pack<DT, VEC>(f, o);
      stn<XW>((char*)a.dx + (base + vcol(i, t)) * XB, o);
    }
  }
}

#if STAGE == 0
// One row of a register-resident row group: (PREFETCH) the next row's loads into `nxt` first, then
// the row sums, the rstd, dx and the partial sums from `cur`; without PREFETCH the next row is
// loaded into `cur` after (nxt is cur).
__device__ __forceinline__ void row_step(const Args& a, i64 r0, i64 Q, int gw, int t, i64 lo, int& it,
                                         Rows& cur, Rows& nxt, u32 (*ww)[WW], float (*acc)[VEC],
                                         float (*accb)[VEC]) {
  const i64 row = r0 + gw;
  const bool ok = row < a.M;
#if PREFETCH
  load_vecs<VPT>(a, row + Q, row + Q < a.M, t, lo, 0, nxt);
  load_rstd(a, row + Q, row + Q < a.M, nxt);
#endif
  float s1 = 0.f, s2 = 0.f;
  sums<VPT>(cur, ww, 0, s1, s2);
  const float2 s = row_sum2(s1, s2, it);
#if RSTD_IN
  const float r = cur.rs;
#else
  const float r = rstd_of(s.x, a.eps);
#endif
  const float c = (r * r) * (r * s.y) * (1.0f / (float)NC);
  finish<VPT>(a, row, ok, t, lo, 0, cur, ww, r, c, acc, accb, nullptr);
#if !PREFETCH
  load_vecs<VPT>(a, row + Q, row + Q < a.M, t, lo, 0, cur);
  load_rstd(a, row + Q, row + Q < a.M, cur);
#endif
  ++it;
}
#endif


#if STAGE == 2
// STAGE 2: a ring of NSTAGE buffers in dynamic shared memory, each holding one row's part of the
// NSTR streams (x, dy, dres), [NSTAGE][NSTR][NP] elements. Thread 0 fills a buffer with one bulk
// copy per stream (cp.async.bulk, completing on the buffer's `full` mbarrier: NSTR x PB bytes of
// transactions); every thread waits on `full` (phase parity (k / NSTAGE) & 1 for the CTA's k-th
// row), reads the part twice from shared memory (the row sums, then dx), and each warp arrives
// on the buffer's `empty` mbarrier when done; thread 0 waits there before it refills the buffer
// with the row NSTAGE rows on. Up to NSTAGE - 1 rows are in flight while one row is computed.
#define NSTR (2 + HAS_DRES)
#define PB (NP * XB)                                  // bytes of one stream's part (a multiple of 16)
#define NWARP (THREADS / 32)
__shared__ __align__(8) unsigned long long st_full[NSTAGE];
__shared__ __align__(8) unsigned long long st_empty[NSTAGE];

__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
  asm volatile("{\n .reg .pred P1;\n ST_WAIT:\n"
               " mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
               " @P1 bra ST_DONE;\n bra ST_WAIT;\n ST_DONE:\n}" ::"r"(bar), "r"(parity) : "memory");
}

__device__ __forceinline__ void bulk_load(u32 dst, const void* src, u32 bar) {
#if LDH == 3
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
               ::"r"(dst), "l"(src), "r"((u32)PB), "r"(bar), "l"(policy_first()) : "memory");
#else
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(dst), "l"(src), "r"((u32)PB), "r"(bar) : "memory");
#endif
}

// thread 0: buffer s <- row `row`'s part (offset lo) of every stream
__device__ __forceinline__ void fill(const Args& a, i64 row, i64 lo, int s, u32 buf) {
  const u32 bar = smem_u32(&st_full[s]);
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"((u32)(NSTR * PB)) : "memory");
  const i64 off = (row * (i64)NC + lo) * XB;
  const u32 d = buf + (u32)(s * NSTR * PB);
  bulk_load(d, (const char*)a.x + off, bar);
  bulk_load(d + PB, (const char*)a.dy + off, bar);
#if HAS_DRES
  bulk_load(d + 2 * PB, (const char*)a.dres + off, bar);
#endif
}

// n words (XW: 4 or 2) from shared address p
__device__ __forceinline__ void lds(u32 p, u32* w) {
  if constexpr (XW == 4)
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3]) : "r"(p));
  else
    asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(w[0]), "=r"(w[1]) : "r"(p));
}
#endif

#if NG > 1 && CLUSTER == 1 && STAGE == 0
// The warp regime's block partial of one sum (src: a lane's [VPT][VEC] fp32 sums) written to dst.
__device__ __forceinline__ void combine_groups(const float (*src)[VEC], float* dst, int t) {
  extern __shared__ __align__(16) float wsum[];
  constexpr int NWARP = THREADS / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int i = 0; i < VPT; ++i)
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      float v = src[i][j];
#pragma unroll
      for (int o = G; o < 32; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane < G && vok(i, t)) wsum[warp * NP + vcol(i, t) + j] = v;
    }
  __syncthreads();
  for (int c4 = threadIdx.x; c4 < NP / 4; c4 += THREADS) {
    // scalar shared-memory reads: with float4 reinterpret_casts here NVRTC 13.0 emitted this
    // kernel's PTX with nondeterministic register numbering (a few % of compiles, NOTES.md)
    float s[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      s[q] = wsum[4 * c4 + q];
#pragma unroll
      for (int wi = 1; wi < NWARP; ++wi) s[q] += wsum[wi * NP + 4 * c4 + q];
    }
    stf<4>(dst + 4 * c4, s);
  }
}
#endif

// ---------------------------------------------------------------- main kernel
extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS)
rmsnorm_bwd(const void* __restrict__ x, const void* __restrict__ dy, const void* __restrict__ w,
            const float* __restrict__ rstd, const void* __restrict__ dres, void* __restrict__ dx,
            float* __restrict__ part, i64 M, i64 N, i64 pstride, float eps) {
  if (N != NC) asm volatile("trap;");   // an exact binary only serves its own N
  Args a{x, dy, w, rstd, dres, dx, part, M, pstride, eps};
#if CLUSTER > 1
  if (cluster_size() != CLUSTER) asm volatile("trap;");   // launched without the cluster dims
  cluster_prologue();
  const int t = threadIdx.x;
  const i64 lo = (i64)cluster_rank() * NP;
  const i64 Q = cluster_count();
  const i64 first = cluster_id();
  const int gw = 0;                                    // group within the warp
  const i64 prow = first;                              // this CTA's partial row
#else
  const int t = threadIdx.x % G, g = threadIdx.x / G;
  const i64 lo = 0;
  const i64 Q = (i64)gridDim.x * NG;
  // rows of a warp's groups are consecutive: the loop runs while the warp's first group has a row
  // (groups past M run with ok == false, so every lane of the warp joins every shuffle)
  constexpr int GPW = G < 32 ? 32 / G : 1;             // groups per warp
  const int gw = g % GPW;
  const i64 first = (i64)blockIdx.x * NG + (g - gw);
  const i64 prow = blockIdx.x;
#endif
  // the weight, in registers for every row (STAGE 1: loaded with each batch instead)
  u32 ww[STAGE != 1 ? VPT : 1][WW];
#pragma unroll
  for (int i = 0; i < (STAGE != 1 ? VPT : 1); ++i) {
    if (WT != 0 && STAGE != 1 && vok(i, t)) ldw<WW>((const char*)w + (lo + vcol(i, t)) * WB, ww[i]);
    else zero<WW>(ww[i]);
  }
  // fp32 partial sums: registers (STAGE 0), or this CTA's columns in shared memory (STAGE 1: each
  // lane only ever touches its own columns, so no barrier is needed)
  constexpr int AV = STAGE != 1 ? VPT : 1;
  float acc[WT != 0 ? AV : 1][VEC], accb[HAS_DB ? AV : 1][VEC];
#pragma unroll
  for (int i = 0; i < (WT != 0 ? AV : 1); ++i)
#pragma unroll
    for (int j = 0; j < VEC; ++j) acc[i][j] = 0.f;
#pragma unroll
  for (int i = 0; i < (HAS_DB ? AV : 1); ++i)
#pragma unroll
    for (int j = 0; j < VEC; ++j) accb[i][j] = 0.f;
#if STAGE == 1
  extern __shared__ __align__(16) float sacc[];        // [dweight NP][dbias NP]
#pragma unroll 1
  for (int i = 0; i < VPT; ++i)
    if (vok(i, t))
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        if (WT != 0) sacc[vcol(i, t) + j] = 0.f;
        if (HAS_DB) sacc[(WT != 0) * NP + vcol(i, t) + j] = 0.f;
      }
#endif

  int it = 0;
#if STAGE == 0
  // two register sets used in turn (the loop unrolled by two: no copy of one into the other)
  Rows A;
#if PREFETCH
  Rows B;
#else
#define B A
#endif
  {
    const i64 row = first + gw;
    load_vecs<VPT>(a, row, row < M, t, lo, 0, A);
    load_rstd(a, row, row < M, A);
  }
#pragma unroll 1
  for (i64 r0 = first; r0 < M; r0 += 2 * Q) {
    row_step(a, r0, Q, gw, t, lo, it, A, B, ww, acc, accb);
    if (r0 + Q >= M) break;
    row_step(a, r0 + Q, Q, gw, t, lo, it, B, A, ww, acc, accb);
  }
#undef B
#elif STAGE == 1   // two passes over the row part per row
#pragma unroll 1
  for (i64 r0 = first; r0 < M; r0 += Q, ++it) {
    const i64 row = r0 + gw;
    const bool ok = row < M;
    Rows b;
    load_rstd(a, row, ok, b);
    const float rs_in = b.rs;
    float s1 = 0.f, s2 = 0.f;
#pragma unroll 1
    for (int i0 = 0; i0 < VPT; i0 += UNROLL) {
      load_vecs<UNROLL>(a, row, ok, t, lo, i0, b);
      sums<UNROLL>(b, b.w, i0, s1, s2);
    }
    const float2 s = row_sum2(s1, s2, it);
#if RSTD_IN
    const float r = rs_in;
#else
    const float r = rstd_of(s.x, eps);
#endif
    const float c = (r * r) * (r * s.y) * (1.0f / (float)NC);
#pragma unroll 1
    for (int i0 = 0; i0 < VPT; i0 += UNROLL) {
      load_vecs<UNROLL>(a, row, ok, t, lo, i0, b);
      finish<UNROLL>(a, row, ok, t, lo, i0, b, b.w, r, c, acc, accb, sacc);
    }
  }
#else   // STAGE 2: the row parts staged in shared memory by bulk copies, NSTAGE rows ahead
  extern __shared__ __align__(128) unsigned char sbuf[];
  const u32 buf = smem_u32(sbuf);
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < NSTAGE; ++s) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(&st_full[s])) : "memory");
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(&st_empty[s])), "r"((u32)NWARP) : "memory");
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x == 0)
#pragma unroll 1
    for (int s = 0; s < NSTAGE; ++s)
      if (first + s * Q < M) fill(a, first + s * Q, lo, s, buf);
#pragma unroll 1
  for (i64 row = first; row < M; row += Q, ++it) {      // gw == 0: every row of the loop exists
    const int s = it % NSTAGE;
    const u32 ph = (u32)(it / NSTAGE) & 1u;
#if RSTD_IN
    const float rs_in = __ldg(rstd + row);
#endif
    const u32 xs = buf + (u32)(s * NSTR * PB), ds = xs + PB;
    mbar_wait(smem_u32(&st_full[s]), ph);
    float s1 = 0.f, s2 = 0.f;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      if (!vok(i, t)) continue;
      u32 xv[XW], dv[XW];
      lds(xs + vcol(i, t) * XB, xv);
      lds(ds + vcol(i, t) * XB, dv);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float xf = getf<DT>(xv, j);
        float g = getf<DT>(dv, j);
#if WT != 0
        g *= getv<KW>(ww[i], j);
#endif
        s2 = fmaf(g, xf, s2);
#if !RSTD_IN
        s1 = fmaf(xf, xf, s1);
#endif
      }
    }
    const float2 sm = row_sum2(s1, s2, it);
#if RSTD_IN
    const float r = rs_in;
#else
    const float r = rstd_of(sm.x, eps);
#endif
    const float c = (r * r) * (r * sm.y) * (1.0f / (float)NC);
    const i64 base = row * (i64)NC + lo;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      if (!vok(i, t)) continue;
      u32 xv[XW], dv[XW];
      lds(xs + vcol(i, t) * XB, xv);
      lds(ds + vcol(i, t) * XB, dv);
#if HAS_DRES
      u32 rv[XW];
      lds(ds + PB + vcol(i, t) * XB, rv);
#endif
      float f[VEC];
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float xf = getv<DT>(xv, j);
        const float df = getv<DT>(dv, j);
        float g = df;
#if WT != 0
        g *= getv<KW>(ww[i], j);
        acc[i][j] = fmaf(df, xf * r, acc[i][j]);
#endif
#if HAS_DB
        accb[i][j] += df;
#endif
        float v = fmaf(-c, xf, r * g);
#if HAS_DRES
        v += getf<DT>(rv, j);
#endif
        f[j] = v;
      }
      u32 o[XW];
      pack<DT, VEC>(f, o);
      stn<XW>((char*)dx + (base + vcol(i, t)) * XB, o);
    }
    // buffer s is free once every warp has read it; thread 0 refills it with the row NSTAGE on
    __syncwarp();
    if ((threadIdx.x & 31) == 0)
      asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(&st_empty[s])) : "memory");
    if (threadIdx.x == 0 && row + NSTAGE * Q < M) {
      mbar_wait(smem_u32(&st_empty[s]), ph);
      fill(a, row + NSTAGE * Q, lo, s, buf);
    }
  }
#endif

#if PDL
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  // ---- the block's partial row(s): P = number of partial rows, written once
  if (blockIdx.x == 0 && threadIdx.x == 0) ((int*)part)[0] = (int)(gridDim.x / CLUSTER);
  float* pw = part + 4 + prow * (i64)NC + lo;
  float* pb = part + 4 + ((WT != 0 ? pstride : 0) + prow) * (i64)NC + lo;   // dbias after dweight's rows, if any
#if STAGE == 1
#pragma unroll 1
  for (int i = 0; i < VPT; ++i) {
    if (!vok(i, t)) continue;
    if (WT != 0) stf<VEC>(pw + vcol(i, t), sacc + vcol(i, t));
    if (HAS_DB) stf<VEC>(pb + vcol(i, t), sacc + (WT != 0) * NP + vcol(i, t));
  }
#elif NG == 1 || CLUSTER > 1
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    if (!vok(i, t)) continue;
    if (WT != 0) stf<VEC>(pw + vcol(i, t), acc[WT != 0 ? i : 0]);
    if (HAS_DB) stf<VEC>(pb + vcol(i, t), accb[HAS_DB ? i : 0]);
  }
#else
  // several row groups per block: first the groups of a warp (same columns, lanes G apart) by a
  // butterfly, then the warps through shared memory [warps][NP], added in warp order
  if (WT != 0) combine_groups(acc, pw, t);
  if (HAS_DB) {
    if (WT != 0) __syncthreads();                     // the dweight pass's reads are done
    combine_groups(accb, pb, t);
  }
#endif
}

// ---------------------------------------------------------------- reduce kernel
// Block b sums column vectors (4 floats) [b * RC, (b + 1) * RC) over the P partial rows: thread
// (s, c) adds rows s, s + RS, s + 2 RS, ... in order, then thread (0, c) adds the RS slices in
// order: a fixed order for a given P, so the result is bit-identical run to run. RT = RS x RC.
#define RC (RT / RS)
__device__ __forceinline__ float4 add4(float4 a, float4 b) { return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w); }

template <int K> __device__ __forceinline__ void store_cast4(void* out, i64 c, float4 v) {
  const float f[4] = {v.x, v.y, v.z, v.w};
  if constexpr (K == 2) {
    *reinterpret_cast<float4*>((float*)out + c) = v;
  } else {
    u32 o[2];
    pack<K, 4>(f, o);
    *reinterpret_cast<uint2*>((u16*)out + c) = make_uint2(o[0], o[1]);
  }
}

extern "C" __global__ void __launch_bounds__(RT)
rmsnorm_bwd_reduce(const float* __restrict__ part, void* __restrict__ dweight, void* __restrict__ dbias,
                   i64 N, i64 pstride) {
#if PDL
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  __shared__ float4 sl[RS][RC];
  const int c = threadIdx.x % RC, s = threadIdx.x / RC;
  const i64 cv = (i64)blockIdx.x * RC + c;             // column vector
  const bool ok = cv * 4 < N;
  const int P = ((const int*)part)[0];
#pragma unroll 1
  for (int pass = 0; pass < (WT != 0) + HAS_DB; ++pass) {
    const float* src = part + 4 + (pass == 1 ? pstride : 0) * N;   // pass 1 (dbias) follows dweight
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    if (ok) {
      int p = s;
#pragma unroll 1
      for (; p + 3 * RS < P; p += 4 * RS) {            // four rows in flight
        const float4 v0 = *reinterpret_cast<const float4*>(src + (i64)p * N + cv * 4);
        const float4 v1 = *reinterpret_cast<const float4*>(src + (i64)(p + RS) * N + cv * 4);
        const float4 v2 = *reinterpret_cast<const float4*>(src + (i64)(p + 2 * RS) * N + cv * 4);
        const float4 v3 = *reinterpret_cast<const float4*>(src + (i64)(p + 3 * RS) * N + cv * 4);
        acc = add4(add4(add4(add4(acc, v0), v1), v2), v3);
      }
#pragma unroll 1
      for (; p < P; p += RS) acc = add4(acc, *reinterpret_cast<const float4*>(src + (i64)p * N + cv * 4));
    }
    if (pass) __syncthreads();
    sl[s][c] = acc;
    __syncthreads();
    if (s == 0 && ok) {
      float4 v = sl[0][c];
#pragma unroll
      for (int k = 1; k < RS; ++k) v = add4(v, sl[k][c]);
      store_cast4<KW>(pass == 0 && WT != 0 ? dweight : dbias, cv * 4, v);
    }
  }
}
