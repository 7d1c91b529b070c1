"""`ptxbuild new NAME`: a new op folder (op.py, a plain kernel template) and its kernelfile entry.

The op is written in the module form of the op contract that ptxbuild/oploader.py loads (ops/README.md):
a numpy reference, the GPU-side functions, a tolerance, a small SPACE, and a template whose
placeholders ($T, $VEC, $UNROLL) render() substitutes one for one, so every line of the rendered
source is the same line of the template (compile errors name template lines)."""

from __future__ import annotations

import keyword
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

_VALID = re.compile(r"[a-z][a-z0-9_]{0,47}")


class ScaffoldError(Exception):
    """The op cannot be created (an invalid name, or one already taken); one line."""


@dataclass(frozen=True)
class Created:
    folder: Path
    files: tuple[Path, ...]
    kernelfile: Path
    kernelfile_created: bool


def name_error(name: str) -> str | None:
    """Why `name` cannot name a new op (it is a folder, a Python module name and a C identifier)."""
    if not _VALID.fullmatch(name) or keyword.iskeyword(name):
        return (
            f"invalid op name {name!r}: use lowercase letters, digits and '_', starting with a "
            "letter, at most 48 characters (it names ops/<name>/, the kernel entry and targets)"
        )
    return None


def create_op(name: str, kernelfile: Path) -> Created:
    """Write ops/<name>/{op.py,<name>.cu} beside `kernelfile` and append [ops.<name>] to it (a new
    kernelfile with one GPU, h200, when there is none). ScaffoldError for an invalid or taken name."""
    if why := name_error(name):
        raise ScaffoldError(why)
    root = kernelfile.parent
    folder = root / "ops" / name
    if folder.exists():
        raise ScaffoldError(f"{folder} already exists: pick another name or remove it")
    text = kernelfile.read_text() if kernelfile.is_file() else None
    gpus = ["h200"]
    if text is not None:
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ScaffoldError(
                f"{kernelfile.name} is not valid TOML ({exc}): fix it first"
            ) from None
        if name in doc.get("ops", {}):
            raise ScaffoldError(
                f"{kernelfile.name} already declares [ops.{name}]: pick another name"
            )
        gpus = list(doc.get("gpus", {})) or gpus
    folder.mkdir(parents=True)
    files = (folder / "op.py", folder / f"{name}.cu")
    files[0].write_text(OP_PY.replace("@NAME@", name))
    files[1].write_text(KERNEL_CU.replace("@NAME@", name))
    entry = ENTRY.replace("@NAME@", name).replace("@GPUS@", ", ".join(f'"{g}"' for g in gpus))
    if text is None:
        kernelfile.write_text(NEW_KERNELFILE + entry)
    else:
        kernelfile.write_text(text + ("" if text.endswith("\n") or not text else "\n") + entry)
    return Created(folder, files, kernelfile, text is None)


NEW_KERNELFILE = """\
# What this project builds: [gpus.*] the GPUs it targets, [ops.*] its ops (ptxbuild new NAME adds one).
[project]
name = "kernels"

[gpus.h200]
"""

ENTRY = """
# @NAME@ (ptxbuild new): ops/@NAME@/op.py and its plain kernel ops/@NAME@/@NAME@.cu. Check it without a
# GPU with `ptxbuild check --deep @NAME@` (every valid config compiled, the Python side run once).
[ops.@NAME@]
template = "@NAME@"
dtypes = ["float32", "bfloat16"]
shapes = [[4096, 1024], [1024, 4096]]
gpus = [@GPUS@]
"""

KERNEL_CU = """\
// @NAME@: y = alpha * x over all elements of x (a first plain kernel; ops/@NAME@/op.py renders it).
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
@NAME@_kernel(const elem_t* __restrict__ x, elem_t* __restrict__ y, float alpha, long long n) {
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
"""

OP_PY = '''\
"""@NAME@: y = alpha * x elementwise over a [rows, cols] array (written by `ptxbuild new`).

A first plain kernel to start from: grid-stride, `vec` neighbouring elements a thread, `unroll`
steps a sweep. The contract these names honour is in ops/README.md; `ptxbuild check --deep @NAME@`
compiles every valid config of SPACE and runs this file's Python side once with numpy."""

from __future__ import annotations

import math
from pathlib import Path
from string import Template

import numpy as np

from ptxbuild.dtypes import SIZE_BYTES, from_float, storage_dtype, to_float
from ptxbuild.problem import Kernel, Launch, Problem

NAME = "@NAME@"
VERSION = "1"  # bump when the reference, make_inputs or the tolerance change (re-verifies)
SOURCES = ["@NAME@.cu"]
DTYPES = ["float32", "bfloat16"]
OPTIONS = {"alpha": 2.0}
SPILL_BUDGET_BYTES = 0
DETERMINISTIC = True  # every output bit for bit the same on a second call (the verifier checks)
SPACE = {  # the first value of each list is what a stored config without the parameter means
    "threads": [256, 128, 512],
    "vec": [1, 2, 4],
    "unroll": [1, 2, 4],
}
SRC = Path(__file__).with_name("@NAME@.cu")
CTYPE = {"float32": "float", "bfloat16": "unsigned short"}


def _alpha(problem: Problem) -> float:
    return float({**OPTIONS, **problem.opts}["alpha"])


def default_params(problem: Problem) -> dict:
    return {"threads": 256, "vec": 4, "unroll": 1}


def check(params: dict, problem: Problem) -> str | None:
    if params["vec"] * params["unroll"] > 8:
        return "more than 8 elements a thread a step"
    return None


def render(params: dict, problem: Problem, arch: str) -> Kernel:
    source = Template(SRC.read_text()).substitute(
        T=CTYPE[problem.dtype], VEC=params["vec"], UNROLL=params["unroll"]
    )
    return Kernel(source=source, entry="@NAME@_kernel")


def launch(params: dict, problem: Problem, sm_count: int) -> Launch:
    per_block = params["threads"] * params["vec"] * params["unroll"]
    blocks = max(1, min(-(-math.prod(problem.shape) // per_block), 32 * sm_count))
    return Launch(grid=(blocks, 1, 1), block=(params["threads"], 1, 1))


def bytes_moved(problem: Problem) -> int:
    return 2 * math.prod(problem.shape) * SIZE_BYTES[problem.dtype]


# ---------------------------------------------------------------- GPU side (xp: numpy or cupy)
def make_inputs(problem: Problem, seed: int, xp) -> dict:
    x = np.random.default_rng(seed).standard_normal(problem.shape, dtype=np.float32)
    return {"x": xp.asarray(from_float(x, problem.dtype, np))}


def make_outputs(problem: Problem, xp) -> dict:
    return {"y": xp.empty(problem.shape, dtype=storage_dtype(problem.dtype, xp))}


def kernel_args(params: dict, problem: Problem, inputs: dict, outputs: dict) -> list:
    # a Python float would be passed as a double: the kernel's `float alpha` needs np.float32
    return [inputs["x"], outputs["y"], np.float32(_alpha(problem)), np.int64(math.prod(problem.shape))]


def reference(problem: Problem, inputs: dict, xp) -> dict:
    return {"y": to_float(inputs["x"], problem.dtype, xp) * xp.float32(_alpha(problem))}


def tolerance(problem: Problem, output: str) -> tuple[float, float]:
    return (0.0, 1e-6) if problem.dtype == "float32" else (1e-6, 2.0**-8)


def verify_problems(problem: Problem) -> list[Problem]:
    """Adversarial shapes the same binary is verified at: one element, odd sizes."""
    rows, cols = problem.shape
    return [problem.with_shape((1, 1)), problem.with_shape((min(rows, 7), cols + 3))]
'''
