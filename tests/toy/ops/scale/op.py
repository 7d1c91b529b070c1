"""A tiny op for tests: y = alpha * x over a [M, N] tensor, with a vector-width and threads space."""
from ptxbuild.dtypes import from_float, storage_dtype, to_float
from ptxbuild.problem import Kernel, Launch

NAME = "scale"
VERSION = "1"
SOURCES = ["scale.cu"]
DTYPES = ["float32", "bfloat16"]
OPTIONS = {"alpha": 2.0}
SPACE = {"threads": [64, 128, 256], "vec": [1, 2, 4]}
SPILL_BUDGET_BYTES = 0


def default_params(problem):
    return {"threads": 128, "vec": 1}


def check(params, problem):
    if problem.shape[-1] % params["vec"]:
        return f"N={problem.shape[-1]} is not a multiple of vec={params['vec']}"
    return None


def render(params, problem, arch):
    src = (FOLDER / "scale.cu").read_text()
    ctype = "float" if problem.dtype == "float32" else "unsigned short"
    head = f"#define VEC {params['vec']}\n#define ELEM {ctype}\n#define IS_BF16 {int(problem.dtype == 'bfloat16')}\n"
    return Kernel(head + src, "scale")


def launch(params, problem, sm_count):
    n = problem.shape[0] * problem.shape[1] // params["vec"]
    return Launch(((n + params["threads"] - 1) // params["threads"], 1, 1), (params["threads"], 1, 1))


def bytes_moved(problem):
    return 2 * problem.shape[0] * problem.shape[1] * (4 if problem.dtype == "float32" else 2)


def make_inputs(problem, seed, xp):
    rng = xp.random.RandomState(seed)
    return {"x": from_float(rng.standard_normal(problem.shape).astype(xp.float32), problem.dtype, xp)}


def make_outputs(problem, xp):
    return {"y": xp.empty(problem.shape, storage_dtype(problem.dtype, xp))}


def kernel_args(params, problem, inputs, outputs):
    import numpy as np
    return [outputs["y"], inputs["x"], np.int64(problem.shape[0] * problem.shape[1]),
            np.float32(problem.opts.get("alpha", 2.0))]


def reference(problem, inputs, xp):
    return {"y": to_float(inputs["x"], problem.dtype, xp).astype(xp.float64) * problem.opts.get("alpha", 2.0)}


def tolerance(problem, output):
    return (1e-6, 1e-6) if problem.dtype == "float32" else (1e-2, 1e-2)


def verify_problems(problem):
    return [problem.with_shape((1, problem.shape[1])), problem.with_shape((3, problem.shape[1]))]
