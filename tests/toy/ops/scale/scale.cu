// y = alpha * x, VEC elements per thread, 64-bit indexing.
__device__ __forceinline__ float load_f(const ELEM* p) {
#if IS_BF16
    float f; asm("mov.b32 %0, {0, %1};" : "=f"(f) : "h"(*p)); return f;
#else
    return *p;
#endif
}
__device__ __forceinline__ void store_f(ELEM* p, float v) {
#if IS_BF16
    unsigned short h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v)); *p = h;
#else
    *p = v;
#endif
}
extern "C" __global__ void scale(ELEM* __restrict__ y, const ELEM* __restrict__ x, long long n, float alpha) {
    long long i = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * VEC;
#pragma unroll
    for (int v = 0; v < VEC; ++v)
        if (i + v < n) store_f(y + i + v, alpha * load_f(x + i + v));
}
