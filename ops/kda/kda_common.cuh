// KDA forward: helpers shared by the prepare and recurrence kernels (rendered by op.py, which
// prepends the #defines: KDIM, VDIM, CH (chunk = 16), H, HV, OP_BF16, ...).
// No CUDA headers (NVRTC from pip has none): bf16 is an unsigned short bit pattern, conversions
// and mma.sync are inline PTX.

typedef unsigned short bf16_t;
typedef unsigned int u32;

struct __align__(16) U4 { u32 x, y, z, w; };
struct __align__(16) F4 { float x, y, z, w; };
struct __align__(8) F2 { float x, y; };

__device__ __forceinline__ float bf16_to_f32(bf16_t v) { return __uint_as_float(((u32)v) << 16); }

__device__ __forceinline__ bf16_t f32_to_bf16(float f) {
  unsigned short r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
  return r;
}

// two floats -> one 32-bit register of the MMA operand type; `lo` is the element with the
// smaller index (cvt.rn.*x2.f32 d, a, b puts a in the upper half)
__device__ __forceinline__ u32 pack2(float lo, float hi) {
  u32 r;
#if OP_BF16
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#else
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#endif
  return r;
}

// D (16x8 fp32) += A (16x16, row) * B (16x8, col)
__device__ __forceinline__ void mma16816(float* d, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
#if OP_BF16
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

__device__ __forceinline__ float ex2(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

// Workspace: one blob of WS_BLOB bytes per (chunk, value head), operands in mma fragment order
// (lane = 4 * g + t; see workspace.py, which encodes/decodes the same layout on the CPU):
//   WQ  [KDIM/16][32 lanes] x {uint4 -W frag, uint4 Qg frag}    B operands (k = channel, n = token)
//   KD  [KDIM/16][32 lanes] uint4 (n-tiles 2p, 2p+1)            B operand (k = token, n = channel)
//   AQ  [32 lanes] uint4                                         B operand (k = s, n = r) of A_qk
//   GAM [KDIM] float                                             exp(G of the last token)
//   U   [VDIM/16][32 lanes] 8 floats                             fp32 accumulator tile U^T
#define WS_WQ 0
#define WS_KD (WS_WQ + (KDIM / 16) * 32 * 32)
#define WS_AQ (WS_KD + (KDIM / 16) * 32 * 16)
#define WS_GAM (WS_AQ + 32 * 16)
#define WS_U (WS_GAM + KDIM * 4)
#define WS_BLOB (WS_U + (VDIM / 16) * 32 * 32)
