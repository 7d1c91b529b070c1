"""A test-only op, y = 2*x row by row (float32), with planted bad kernels selected by the BAD param.

BAD: none (correct), unwritten (skips every 7th row), tail (wrong only when N % 8 != 0), input (writes
into x), nondet (flips the last bit by the clock), hang (spins on a volatile read), illegal (writes
1<<40 elements past y), skip (does nothing when y already holds a value: passes verification, whose
outputs are poisoned, but times impossibly fast on reused outputs).
"""

from __future__ import annotations

import numpy as np

from ptxbuild.problem import Kernel, Launch

NAME = "planted_op"
VERSION = "1"
SOURCES: list[str] = []
DTYPES = ["float32"]
OPTIONS: dict = {}
BADS = ["none", "unwritten", "tail", "input", "nondet", "hang", "illegal", "skip"]
SPACE = {"BAD": BADS, "THREADS": [128, 256]}
SPILL_BUDGET_BYTES = 0

SOURCE = r"""
#define BAD_%(bad)s 1
extern "C" __global__ void __launch_bounds__(%(threads)d) planted(const float* __restrict__ x, float* __restrict__ y, int M, int N) {
  int row = blockIdx.x;
  if (row >= M) return;
  const float* xr = x + (long long)row * N;
  float* yr = y + (long long)row * N;
#if BAD_skip
  if (__float_as_uint(yr[0]) != 0xFFFFFFFFu) return;   /* "cached": output already written */
#endif
#if BAD_unwritten
  if (row %% 7 == 3) return;
#endif
#if BAD_hang
  if (row == 0 && threadIdx.x == 0) { volatile const unsigned* v = (volatile const unsigned*)x; while (v[0] != 0x7FFFFFFFu) { } }
#endif
#if BAD_illegal
  if (row == 0 && threadIdx.x == 0) y[1LL << 40] = 1.0f;
#endif
  for (int i = threadIdx.x; i < N; i += blockDim.x) {
    float v = 2.0f * xr[i];
#if BAD_tail
    if ((N & 7) != 0 && i >= (N & ~7)) v = xr[i];
#endif
#if BAD_nondet
    unsigned long long t; unsigned g;
    asm volatile("mov.u64 %%0, %%%%clock64;" : "=l"(t));
    asm volatile("mov.u32 %%0, %%%%globaltimer_lo;" : "=r"(g));
    v = __uint_as_float(__float_as_uint(v) ^ (unsigned)((t ^ (t >> 7) ^ g ^ (g >> 5)) & 1ull));
#endif
#if BAD_input
    ((float*)xr)[i] = v;
#endif
    yr[i] = v;
  }
}
"""


def default_params(problem):
    return {"BAD": "none", "THREADS": 256}


def check(params, problem):
    return None if params.get("BAD") in BADS else f"BAD must be one of {BADS}"


def render(params, problem, arch):
    return Kernel(SOURCE % {"bad": params["BAD"], "threads": params["THREADS"]}, "planted")


def launch(params, problem, sm_count):
    return Launch((problem.shape[0], 1, 1), (params["THREADS"], 1, 1))


def bytes_moved(problem):
    m, n = problem.shape
    return 2 * m * n * 4


def make_inputs(problem, seed, xp):
    return {"x": xp.random.RandomState(seed).standard_normal(problem.shape).astype(xp.float32)}


def make_outputs(problem, xp):
    return {"y": xp.empty(problem.shape, dtype=xp.float32)}


def kernel_args(params, problem, inputs, outputs):
    m, n = problem.shape
    return [inputs["x"], outputs["y"], np.int32(m), np.int32(n)]


def reference(problem, inputs, xp):
    return {"y": inputs["x"].astype(xp.float64) * 2}


def tolerance(problem, output):
    return 1e-6, 1e-6


def verify_problems(problem):
    return [problem.with_shape(s) for s in [(1, 4095), (199, 760), (3, 1128)]]


def baselines(problem):
    return {
        "xp_2x": lambda inputs: {"y": inputs["x"] * 2},
        "wrong_copy": lambda inputs: {"y": inputs["x"].copy()},
    }
