"""A test-only op, y = softmax(x) row by row (bfloat16 in and out, float32 inside), with one honest
kernel and planted cheats of the four classes issue 27 found winning or passing, selected by BAD:

none      honest: max, sum of exp and the outputs in float32, rounded to bf16 once
skip      skips every 16th row whose output already holds a non-poison value (state between calls)
counter   keeps a call count in device memory; after 100 calls it leaves every 16th row unwritten
zeros     writes 0 wherever the true value is below atol (1e-4): inside the elementwise band
bf16acc   accumulates each thread's share of the row sum in bf16: right at N = 4096 (32 terms a
          thread), over 3% off at 8 x N (stagnation: terms below half an ulp of the sum are lost)
oob       reads one element past the end of every row (the value masked): the last row reads past
          the end of x, which only compute-sanitizer memcheck sees

The row length N is a run-time argument of every kernel (same source for every N), so the verifier
also runs them at larger and odd N (ptxbuild/gpu/runs.py size_classes).
"""

from __future__ import annotations

import numpy as np

from ptxbuild.dtypes import from_float, to_float
from ptxbuild.problem import Kernel, Launch

NAME = "planted_softmax"
VERSION = "1"
SOURCES: list[str] = []
DTYPES = ["bfloat16"]
OPTIONS: dict = {}
BADS = ["none", "skip", "counter", "zeros", "bf16acc", "oob"]
SPACE = {"BAD": BADS, "THREADS": [128, 256]}
SPILL_BUDGET_BYTES = 0
ATOL, RTOL = 1e-4, 1e-2
COUNTER_CALLS = 100  # the counter kernel cheats after this many calls (verification makes ~20)

SOURCE = r"""
#define BAD_%(bad)s 1
#define NEG_INF __int_as_float(0xff800000)
__device__ __forceinline__ float ld(const unsigned short* p) { return __uint_as_float(((unsigned)*p) << 16); }
__device__ __forceinline__ unsigned short bf(float f) {
  unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return (unsigned short)(u >> 16);
}
__device__ __forceinline__ float round_bf(float f) { return __uint_as_float(((unsigned)bf(f)) << 16); }
__device__ unsigned planted_calls;

__device__ float block_reduce(float v, bool is_max, float* sh) {
  for (int o = 16; o > 0; o >>= 1) { float w = __shfl_xor_sync(0xffffffffu, v, o); v = is_max ? fmaxf(v, w) : v + w; }
  int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) sh[wid] = v;
  __syncthreads();
  if (wid == 0) {
    v = lane < nw ? sh[lane] : (is_max ? NEG_INF : 0.0f);
    for (int o = 16; o > 0; o >>= 1) { float w = __shfl_xor_sync(0xffffffffu, v, o); v = is_max ? fmaxf(v, w) : v + w; }
    if (lane == 0) sh[0] = v;
  }
  __syncthreads();
  float r = sh[0];
  __syncthreads();
  return r;
}

extern "C" __global__ void __launch_bounds__(%(threads)d) planted_softmax(
    const unsigned short* __restrict__ x, unsigned short* __restrict__ y, int M, int N) {
  __shared__ float sh[32];
  int row = blockIdx.x;
  if (row >= M) return;
  const unsigned short* xr = x + (long long)row * N;
  unsigned short* yr = y + (long long)row * N;
#if BAD_skip
  if (row %% 16 == 0 && yr[0] != 0xFFFFu) return;   /* "cached": this row's output looks written */
#endif
#if BAD_counter
  __shared__ unsigned calls;
  if (threadIdx.x == 0) calls = row == 0 ? atomicAdd(&planted_calls, 1u) : *(volatile unsigned*)&planted_calls;
  __syncthreads();
  if (calls > %(counter)d && row %% 16 == 0) return;
#endif
  float m = NEG_INF;
#if BAD_oob
  for (int i = threadIdx.x; i <= N; i += blockDim.x) {   /* one past the end; the value is masked */
    float v = __uint_as_float(((unsigned)*(volatile const unsigned short*)(xr + i)) << 16);
    if (i < N) m = fmaxf(m, v);
  }
#else
  for (int i = threadIdx.x; i < N; i += blockDim.x) m = fmaxf(m, ld(xr + i));
#endif
  m = block_reduce(m, true, sh);
  float s = 0.0f;
  for (int i = threadIdx.x; i < N; i += blockDim.x) {
#if BAD_bf16acc
    s = round_bf(s + __expf(ld(xr + i) - m));
#else
    s += __expf(ld(xr + i) - m);
#endif
  }
  s = block_reduce(s, false, sh);
  float inv = 1.0f / s;
  for (int i = threadIdx.x; i < N; i += blockDim.x) {
    float p = __expf(ld(xr + i) - m) * inv;
#if BAD_zeros
    if (p < %(atol)gf) p = 0.0f;
#endif
    yr[i] = bf(p);
  }
}
"""


def default_params(problem):
    return {"BAD": "none", "THREADS": 128}


def check(params, problem):
    if params.get("BAD") not in BADS:
        return f"BAD must be one of {BADS}"
    if len(problem.shape) != 2 or min(problem.shape) < 1 or problem.shape[1] > 1 << 20:
        return f"shape {problem.shape} must be (M, N), 1 <= N <= 2^20"
    return None


def render(params, problem, arch):
    src = SOURCE % {
        "bad": params["BAD"],
        "threads": params["THREADS"],
        "counter": COUNTER_CALLS,
        "atol": ATOL,
    }
    return Kernel(src, "planted_softmax")


def launch(params, problem, sm_count):
    return Launch((problem.shape[0], 1, 1), (params["THREADS"], 1, 1))


def bytes_moved(problem):
    m, n = problem.shape
    return 2 * m * n * 2


def make_inputs(problem, seed, xp):
    x = xp.random.RandomState(seed).standard_normal(problem.shape).astype(xp.float32)
    return {"x": from_float(x, "bfloat16", xp)}


def make_outputs(problem, xp):
    return {"y": xp.empty(problem.shape, dtype=xp.uint16)}


def kernel_args(params, problem, inputs, outputs):
    m, n = problem.shape
    return [inputs["x"], outputs["y"], np.int32(m), np.int32(n)]


def reference(problem, inputs, xp):
    x = to_float(inputs["x"], "bfloat16", xp).astype(xp.float64)
    e = xp.exp(x - x.max(axis=1, keepdims=True))
    return {"y": e / e.sum(axis=1, keepdims=True)}


def tolerance(problem, output):
    return ATOL, RTOL


def verify_problems(problem, params=None):
    return [problem.with_shape(s) for s in [(1, 4095), (199, 760), (3, 1000)]]
