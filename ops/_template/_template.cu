// _template: y = alpha * x over all elements of x (a first plain kernel; ops/_template/op.py renders it).
// render() replaces $T, $VEC and $UNROLL one for one: the rendered source has this file's lines.
// NVRTC from pip has no CUDA headers: no <cuda_fp16.h>, <cuda_bf16.h> or <cstdint>; built in are
// the device intrinsics (__float_as_uint, __ldg, ...), threadIdx and friends, and inline PTX.

typedef $T elem_t;  // float, or unsigned short holding bfloat16 bits (see ptxbuild/dtypes.py)

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(unsigned short b) { return __uint_as_float(((unsigned)b) << 16); }

__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(unsigned short* p, float v) {
  unsigned u = __float_as_uint(v);
  if ((u & 0x7fffffffu) > 0x7f800000u) { *p = 0x7fc0; return; }  // NaN stays a NaN
  u += 0x7fffu + ((u >> 16) & 1u);                                 // round to nearest even
  *p = (unsigned short)(u >> 16);
}

// Grid-stride: each thread takes $VEC neighbouring elements, $UNROLL times a step, in every sweep.
extern "C" __global__ void __launch_bounds__(1024)
_template_kernel(const elem_t* __restrict__ x, elem_t* __restrict__ y, float alpha, long long n) {
  const long long threads = (long long)gridDim.x * blockDim.x;
  const long long first = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * $VEC;
  for (long long i0 = first; i0 < n; i0 += threads * $VEC * $UNROLL) {
#pragma unroll
    for (int u = 0; u < $UNROLL; ++u) {
      const long long j = i0 + (long long)u * threads * $VEC;
#pragma unroll
      for (int v = 0; v < $VEC; ++v) {
        if (j + v < n) store(&y[j + v], alpha * to_f(x[j + v]));
      }
    }
  }
}
