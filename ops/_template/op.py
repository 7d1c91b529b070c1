"""_template: y = alpha * x elementwise over a [rows, cols] array (the class form of the op contract).

A first plain kernel to start from: grid-stride, `vec` neighbouring elements a thread, `unroll`
steps a sweep. `ptxbuild new NAME` writes a copy of this op (this file and its kernel, renamed).
The contract is `ptxbuild.contract.Op`: every required member, every optional hook with its
default (ops/README.md says what each means). `ptxbuild check --deep` compiles every valid config
of SPACE and runs the GPU side once with numpy, without a GPU."""

from __future__ import annotations

import math
import string
from pathlib import Path

import numpy as np

from ptxbuild.contract import Op
from ptxbuild.dtypes import SIZE_BYTES, from_float, storage_dtype, to_float
from ptxbuild.problem import Kernel, Launch, Problem

SRC = Path(__file__).with_name("_template.cu")
CTYPE = {"float32": "float", "bfloat16": "unsigned short"}


class Template(Op):
    NAME = "_template"
    VERSION = "1"  # bump when the reference, make_inputs or the tolerance change (re-verifies)
    SOURCES = ("_template.cu",)
    DTYPES = ("float32", "bfloat16")
    OPTIONS = {"alpha": 2.0}
    SPILL_BUDGET_BYTES = 0
    SPACE = {  # the first value of each list is what a stored config without the parameter means
        "threads": [256, 128, 512],
        "vec": [1, 2, 4],
        "unroll": [1, 2, 4],
    }
    # optional (Op's defaults): DEPENDS, SCRATCH, KERNELS + launches() + stage_args(),
    # deterministic(), compare(), error_bound(), size_classes(), baselines()

    def alpha(self, problem: Problem) -> float:
        return float({**self.OPTIONS, **problem.opts}["alpha"])

    # ---------------------------------------------------------------- host side
    def default_params(self, problem: Problem) -> dict:
        return {"threads": 256, "vec": 4, "unroll": 1}

    def check(self, params: dict, problem: Problem) -> str | None:
        if params["vec"] * params["unroll"] > 8:
            return "more than 8 elements a thread a step"
        return None

    def render(self, params: dict, problem: Problem, arch: str) -> Kernel:
        source = string.Template(SRC.read_text()).substitute(
            T=CTYPE[problem.dtype], VEC=params["vec"], UNROLL=params["unroll"]
        )
        return Kernel(source=source, entry="_template_kernel")

    def launch(self, params: dict, problem: Problem, sm_count: int) -> Launch:
        per_block = params["threads"] * params["vec"] * params["unroll"]
        blocks = max(1, min(-(-math.prod(problem.shape) // per_block), 32 * sm_count))
        return Launch(grid=(blocks, 1, 1), block=(params["threads"], 1, 1))

    def bytes_moved(self, problem: Problem) -> int:
        return 2 * math.prod(problem.shape) * SIZE_BYTES[problem.dtype]

    # ---------------------------------------------------------------- GPU side (xp: numpy or cupy)
    def make_inputs(self, problem: Problem, seed: int, xp) -> dict:
        x = np.random.default_rng(seed).standard_normal(problem.shape, dtype=np.float32)
        return {"x": xp.asarray(from_float(x, problem.dtype, np))}

    def make_outputs(self, problem: Problem, xp) -> dict:
        return {"y": xp.empty(problem.shape, dtype=storage_dtype(problem.dtype, xp))}

    def kernel_args(self, params: dict, problem: Problem, inputs: dict, outputs: dict) -> list:
        # a Python float would be passed as a double: the kernel's `float alpha` needs np.float32
        n = np.int64(math.prod(problem.shape))
        return [inputs["x"], outputs["y"], np.float32(self.alpha(problem)), n]

    def reference(self, problem: Problem, inputs: dict, xp) -> dict:
        return {"y": to_float(inputs["x"], problem.dtype, xp) * xp.float32(self.alpha(problem))}

    def tolerance(self, problem: Problem, output: str) -> tuple[float, float]:
        return (0.0, 1e-6) if problem.dtype == "float32" else (1e-6, 2.0**-8)

    def verify_problems(self, problem: Problem, params: dict | None = None) -> list[Problem]:
        """Adversarial shapes the same binary is verified at: one element, odd sizes."""
        rows, cols = problem.shape
        return [problem.with_shape((1, 1)), problem.with_shape((min(rows, 7), cols + 3))]
