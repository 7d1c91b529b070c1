// softmax, proposed source (benchmarks/factory/softmax_proposer.py sends it; COLS, THREADS and the
// store hint are filled in by that proposer): the row is read from global memory once, with 16-byte
// loads (8 bfloat16 a load), and kept in registers for the max, the exponentials and the outputs;
// the exponentials are computed once. Same arguments and launch as ops/softmax (one block a row).
#define COLS 4096
#define THREADS 128
#define PER (COLS / (THREADS * 8))  // 16-byte vectors a thread holds
static_assert(COLS % (THREADS * 8) == 0, "a row must split into whole 16-byte vectors per thread");

__device__ __forceinline__ unsigned short to_bf16(float f) {
  unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN stays a NaN
  u += 0x7fffu + ((u >> 16) & 1u);                        // round to nearest even
  return (unsigned short)(u >> 16);
}

__device__ __forceinline__ unsigned pack2(float lo, float hi) {
  return (unsigned)to_bf16(lo) | ((unsigned)to_bf16(hi) << 16);
}

__device__ __forceinline__ uint4 load16(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

__device__ __forceinline__ void store16(uint4* p, uint4 v) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};"
               :: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

extern "C" __global__ void __launch_bounds__(THREADS)
softmax_kernel(const unsigned short* __restrict__ x, unsigned short* __restrict__ y, int rows) {
  __shared__ float red[2][THREADS / 32];
  const int row = blockIdx.x;
  if (row >= rows) return;
  const uint4* xr = reinterpret_cast<const uint4*>(x + (long long)row * COLS);
  uint4* yr = reinterpret_cast<uint4*>(y + (long long)row * COLS);
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;

  float v[PER * 8];
#pragma unroll
  for (int p = 0; p < PER; ++p) {
    const uint4 w = load16(xr + p * THREADS + threadIdx.x);
    const unsigned u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      v[p * 8 + 2 * k] = __uint_as_float(u[k] << 16);
      v[p * 8 + 2 * k + 1] = __uint_as_float(u[k] & 0xffff0000u);
    }
  }

  float m = v[0];
#pragma unroll
  for (int i = 1; i < PER * 8; ++i) m = fmaxf(m, v[i]);
  m = warp_max(m);
  if (lane == 0) red[0][wid] = m;
  __syncthreads();
  m = red[0][0];
#pragma unroll
  for (int w = 1; w < THREADS / 32; ++w) m = fmaxf(m, red[0][w]);

  const float l2e = 1.4426950408889634f;
  const float ml = m * l2e;
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < PER * 8; ++i) {
    v[i] = exp2f(fmaf(v[i], l2e, -ml));
    s += v[i];
  }
  s = warp_sum(s);
  if (lane == 0) red[1][wid] = s;
  __syncthreads();
  s = 0.0f;
#pragma unroll
  for (int w = 0; w < THREADS / 32; ++w) s += red[1][w];
  const float inv = 1.0f / s;

#pragma unroll
  for (int p = 0; p < PER; ++p) {
    uint4 o;
    o.x = pack2(v[p * 8 + 0] * inv, v[p * 8 + 1] * inv);
    o.y = pack2(v[p * 8 + 2] * inv, v[p * 8 + 3] * inv);
    o.z = pack2(v[p * 8 + 4] * inv, v[p * 8 + 5] * inv);
    o.w = pack2(v[p * 8 + 6] * inv, v[p * 8 + 7] * inv);
    store16(yr + p * THREADS + threadIdx.x, o);
  }
}
