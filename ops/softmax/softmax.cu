// softmax: y = softmax(x) over each row of a [rows, COLS] bfloat16 array, float32 inside.
// A deliberately plain first kernel (issue 31: the factory's proposers start from it): one block a
// row, three sweeps over the row in global memory (its max, the sum of exponentials, the outputs),
// one element a thread a step. render() replaces $COLS and $THREADS one for one (same lines).
// NVRTC from pip has no CUDA headers: bfloat16 is unsigned short bits (ptxbuild/dtypes.py).
#define COLS $COLS
#define THREADS $THREADS

__device__ __forceinline__ float ld_bf16(const unsigned short* p) { return __uint_as_float(((unsigned)*p) << 16); }

__device__ __forceinline__ unsigned short to_bf16(float f) {
  unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN stays a NaN
  u += 0x7fffu + ((u >> 16) & 1u);                        // round to nearest even
  return (unsigned short)(u >> 16);
}

// every thread's v combined over the block (max or sum), the result in every thread
__device__ float block_reduce(float v, bool is_max, float* sh) {
  for (int o = 16; o > 0; o >>= 1) {
    float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, w) : v + w;
  }
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) sh[wid] = v;
  __syncthreads();
  if (wid == 0) {
    v = lane < THREADS / 32 ? sh[lane] : (is_max ? -3.402823466e38f : 0.0f);
    for (int o = 16; o > 0; o >>= 1) {
      float w = __shfl_xor_sync(0xffffffffu, v, o);
      v = is_max ? fmaxf(v, w) : v + w;
    }
    if (lane == 0) sh[0] = v;
  }
  __syncthreads();
  return sh[0];
}

extern "C" __global__ void __launch_bounds__(THREADS)
softmax_kernel(const unsigned short* __restrict__ x, unsigned short* __restrict__ y, int rows) {
  __shared__ float sh[32];
  const int row = blockIdx.x;
  if (row >= rows) return;
  const unsigned short* xr = x + (long long)row * COLS;
  unsigned short* yr = y + (long long)row * COLS;
  float m = -3.402823466e38f;
  for (int j = threadIdx.x; j < COLS; j += THREADS) m = fmaxf(m, ld_bf16(xr + j));
  m = block_reduce(m, true, sh);
  float s = 0.0f;
  for (int j = threadIdx.x; j < COLS; j += THREADS) s += expf(ld_bf16(xr + j) - m);
  s = block_reduce(s, false, sh);
  const float inv = 1.0f / s;
  for (int j = threadIdx.x; j < COLS; j += THREADS) yr[j] = to_bf16(expf(ld_bf16(xr + j) - m) * inv);
}
