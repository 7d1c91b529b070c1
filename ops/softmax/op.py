"""softmax: y = softmax(x) over the last axis of a [rows, cols] bfloat16 array (float32 inside).

A lab op for the factory (issue 31): its template (softmax.cu) is deliberately plain, one block a row
and three sweeps over the row in global memory, one element a thread a step, and its SPACE is only
the block size. What a better kernel does (the row read once into registers with 16-byte loads) is
outside what this SPACE can express: a proposer has to write that source (benchmarks/factory/).
The row length is compiled in (COLS), so every N renders its own source."""

from __future__ import annotations

from pathlib import Path
from string import Template

import numpy as np

from ptxbuild.dtypes import from_float, storage_dtype, to_float
from ptxbuild.problem import Kernel, Launch, Problem

NAME = "softmax"
VERSION = "1"  # bump when the reference, make_inputs or the tolerance change (re-verifies)
SOURCES = ["softmax.cu"]
DTYPES = ["bfloat16"]
OPTIONS: dict = {}
SPILL_BUDGET_BYTES = 0
DETERMINISTIC = True
SPACE = {"threads": [256, 128, 512, 1024]}
SRC = Path(__file__).with_name("softmax.cu")


def default_params(problem: Problem) -> dict:
    return {"threads": 256}


def check(params: dict, problem: Problem) -> str | None:
    if problem.dtype not in DTYPES:
        return f"dtype {problem.dtype} not supported (one of {DTYPES})"
    if len(problem.shape) != 2 or min(problem.shape) < 1:
        return f"shape {problem.shape} must be (rows, cols) with rows, cols >= 1"
    if set(params) - set(SPACE):
        return f"unknown parameter {sorted(set(params) - set(SPACE))[0]}"
    if params.get("threads") not in SPACE["threads"]:
        return f"threads={params.get('threads')!r} is not one of {SPACE['threads']}"
    if problem.shape[0] >= 2**31 or problem.shape[1] >= 2**31:
        return "rows and cols must be below 2^31"
    return None


def render(params: dict, problem: Problem, arch: str) -> Kernel:
    source = Template(SRC.read_text()).substitute(
        COLS=problem.shape[1], THREADS=params["threads"]
    )
    return Kernel(source=source, entry="softmax_kernel")


def launch(params: dict, problem: Problem, sm_count: int) -> Launch:
    return Launch(grid=(problem.shape[0], 1, 1), block=(params["threads"], 1, 1))


def bytes_moved(problem: Problem) -> int:
    return 2 * problem.shape[0] * problem.shape[1] * 2


# ---------------------------------------------------------------- GPU side (xp: numpy or cupy)
def make_inputs(problem: Problem, seed: int, xp) -> dict:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(problem.shape, dtype=np.float32) * 3.0
    x[:, ::97] += 20.0  # large logits: the max must be subtracted before exp
    return {"x": xp.asarray(from_float(x, problem.dtype, np))}


def make_outputs(problem: Problem, xp) -> dict:
    return {"y": xp.empty(problem.shape, dtype=storage_dtype(problem.dtype, xp))}


def kernel_args(params: dict, problem: Problem, inputs: dict, outputs: dict) -> list:
    return [inputs["x"], outputs["y"], np.int32(problem.shape[0])]


def reference(problem: Problem, inputs: dict, xp) -> dict:
    x = to_float(inputs["x"], problem.dtype, xp).astype(xp.float64)
    e = xp.exp(x - x.max(axis=1, keepdims=True))
    return {"y": e / e.sum(axis=1, keepdims=True)}


def tolerance(problem: Problem, output: str) -> tuple[float, float]:
    return (1e-6, 2.0**-7)


def verify_problems(problem: Problem, params: dict | None = None) -> list[Problem]:
    """Adversarial shapes the same binary is verified at: one row, an odd number of rows."""
    rows, cols = problem.shape
    return [problem.with_shape((1, cols)), problem.with_shape((min(rows, 7), cols))]
