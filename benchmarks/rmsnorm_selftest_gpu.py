"""Run every rmsnorm regime / mode on small and odd shapes on this machine's GPU.

    python3 benchmarks/rmsnorm_selftest_gpu.py [-k substring] [-D NAME=VALUE ...]

Needs cupy and cuda-bindings. Compiles with ptxbuild.compile.compiler for this GPU's arch, launches with
cuLaunchKernelEx (cluster dims as a launch attribute), compares with op.reference(), prints one
line per case; the exit code is the number of failures (capped at 1). -D NAME=VALUE compiles every
case with that macro: a path of rmsnorm.cu that op.py does not select yet (e.g. -D FAST_FRONT=1) is
verified over the same cases before a parameter exposes it.
"""

from __future__ import annotations

import ctypes
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ptxbuild.compile.compiler import compile_kernel  # noqa: E402
from ptxbuild.gpu import check  # noqa: E402
from ptxbuild.launch import resident_grid  # noqa: E402
from ptxbuild.oploader import load_op  # noqa: E402
from ptxbuild.problem import Problem  # noqa: E402

op = load_op("rmsnorm", ROOT)

W = {"regime": "warp", "threads": 128}
B = {"regime": "block"}
C = {"regime": "cluster"}
CASES = [
    # (dtype, (M, N), options, params)
    ("bfloat16", (199, 256), {}, {**W, "row_threads": 32, "rows_per_group": 2, "load_hint": "nc"}),
    (
        "float16",
        (1, 512),
        {"rstd": True},
        {**W, "threads": 96, "row_threads": 16, "rows_per_group": 4},
    ),
    ("float32", (199, 760), {"bias": True, "weight": "fp32"}, {**W, "row_threads": 8}),
    (
        "bfloat16",
        (199, 1128),
        {"residual": True, "rstd": True},
        {**W, "row_threads": 32, "store_cs": True},
    ),
    (
        "bfloat16",
        (199, 2048),
        {"residual": True, "residual_out_fp32": True, "weight": "fp32"},
        {**W, "weight_load": "early", "rsqrt": "precise"},
    ),
    (
        "float16",
        (199, 4095),
        {"residual": True},
        {**W, "threads": 256, "exact": False, "unroll": 2},
    ),
    (
        "float32",
        (37, 13),
        {"weight": "none", "bias": True},
        {**W, "threads": 64, "row_threads": 4, "exact": False},
    ),
    (
        "bfloat16",
        (199, 1000),
        {"rstd": True},
        {**W, "exact": False, "unroll": 4, "load_hint": "nc_na"},
    ),
    ("bfloat16", (199, 4096), {}, {**B, "threads": 128, "load_hint": "nc"}),
    ("float32", (199, 8192), {"rstd": True}, {**B, "threads": 512, "load_hint": "nc_ef"}),
    (
        "float16",
        (199, 8192),
        {"residual": True},
        {**B, "threads": 256, "load_hint": "nc_ef", "weight_load": "early"},
    ),
    # stage=pipe: persistent blocks (SMs x min_blocks), several rows each, both mbarrier parities
    ("float32", (1031, 8192), {"rstd": True}, {**B, "threads": 512, "stage": "pipe"}),
    (
        "bfloat16",
        (1031, 4096),
        {"residual": True, "bias": True, "weight": "fp32"},
        {**B, "threads": 256, "stage": "pipe", "min_blocks": 2, "load_hint": "nc_ef"},
    ),
    (
        "float16",
        (5, 1024),
        {"residual": True, "residual_out_fp32": True, "rstd": True},
        {**B, "threads": 128, "stage": "pipe", "min_blocks": 4},
    ),
    # warp-regime pipe: persistent lane groups; 132 SMs x 2 blocks x 16 rows loop twice at M = 9000
    (
        "bfloat16",
        (9000, 512),
        {"rstd": True},
        {**W, "threads": 256, "rows_per_group": 2, "stage": "pipe", "min_blocks": 2},
    ),
    (
        "float16",
        (2500, 1024),
        {"residual": True, "residual_out_fp32": True, "bias": True},
        {**W, "threads": 128, "stage": "pipe", "min_blocks": 4, "store_cs": True},
    ),
    (
        "float32",
        (3, 256),
        {"weight": "fp32"},
        {**W, "threads": 64, "row_threads": 16, "stage": "pipe"},
    ),
    (
        "float16",
        (199, 4000),
        {"residual": True, "bias": True},
        {**B, "threads": 96, "weight_load": "early"},
    ),
    ("float32", (1, 32768), {"rstd": True}, {**B, "threads": 1024}),
    ("bfloat16", (199, 8192), {"residual": True, "residual_out_fp32": True}, {**B, "threads": 448}),
    (
        "bfloat16",
        (64, 16384),
        {"residual": True, "rstd": True},
        {**B, "threads": 256, "stage": "smem", "unroll": 4},
    ),
    ("float32", (199, 4097), {"rstd": True}, {**B, "threads": 256, "exact": False, "unroll": 2}),
    (
        "bfloat16",
        (33, 20000),
        {"weight": "fp32"},
        {**B, "threads": 512, "exact": False, "unroll": 4},
    ),
    (
        "bfloat16",
        (64, 65536),
        {"rstd": True},
        {**C, "threads": 512, "cluster": 2, "load_hint": "nc"},
    ),
    ("float16", (16, 131072), {"residual": True}, {**C, "threads": 512, "cluster": 4}),
    ("float32", (8, 262144), {"rstd": True, "bias": True}, {**C, "threads": 512, "cluster": 8}),
    (
        "float32",
        (8, 262144),
        {"residual": True, "rstd": True},
        {**C, "threads": 512, "cluster": 8, "stage": "smem", "unroll": 4},
    ),
    (
        "bfloat16",
        (5, 100003),
        {"residual": True, "rstd": True},
        {**C, "threads": 256, "cluster": 4, "exact": False, "unroll": 2},
    ),
    (
        "bfloat16",
        (7, 131072),
        {"residual": True, "residual_out_fp32": True},
        {**C, "threads": 1024, "cluster": 8, "exact": False, "unroll": 1},
    ),
    # stage=chunk: two passes in chunks (a partial last chunk at N = 4000; h read back from
    # residual_out, also as fp32; the cluster regime; the l2 load policies)
    (
        "float32",
        (199, 8192),
        {"rstd": True},
        {**B, "threads": 512, "stage": "chunk", "min_blocks": 3, "load_hint": "l2"},
    ),
    (
        "bfloat16",
        (199, 4000),
        {"residual": True, "bias": True, "weight": "fp32"},
        {**B, "threads": 128, "stage": "chunk", "load_hint": "nc"},
    ),
    (
        "float16",
        (64, 16384),
        {"residual": True, "residual_out_fp32": True, "rstd": True},
        {**B, "threads": 256, "stage": "chunk", "unroll": 2, "load_hint": "l2", "store_cs": True},
    ),
    (
        "float32",
        (8, 262144),
        {"residual": True, "rstd": True},
        {**C, "threads": 512, "cluster": 8, "stage": "chunk", "unroll": 2, "load_hint": "l2"},
    ),
    (
        "bfloat16",
        (16, 131072),
        {"weight": "none", "bias": True, "rstd": True},
        {**C, "threads": 256, "cluster": 4, "stage": "chunk", "unroll": 4, "load_hint": "none"},
    ),
    # one chunk: every pass-1 load in flight, x re-read from L1 after the reduction (Triton's shape)
    (
        "float32",
        (199, 8192),
        {"residual": True, "bias": True},
        {**B, "threads": 512, "stage": "chunk", "unroll": 4, "min_blocks": 2, "load_hint": "l2"},
    ),
    (
        "bfloat16",
        (3, 8192),
        {"rstd": True},
        {**B, "threads": 512, "stage": "chunk", "unroll": 2, "min_blocks": 3, "load_hint": "l2"},
    ),
    # unroll 8: pass 2 in two rounds of 4 vectors (a partial last chunk at N = 65544 with a residual)
    (
        "float32",
        (199, 32768),
        {"rstd": True, "weight": "fp32"},
        {**B, "threads": 1024, "stage": "chunk", "unroll": 8, "load_hint": "l2"},
    ),
    (
        "bfloat16",
        (64, 65544),
        {"residual": True},
        {**B, "threads": 512, "stage": "chunk", "unroll": 8, "load_hint": "nc"},
    ),
    # a cluster CTA's part with a partial last chunk (lo > 0 and FULL false); added after run 14,
    # not yet run on a GPU
    (
        "bfloat16",
        (8, 100000),
        {"residual": True, "rstd": True},
        {**C, "threads": 384, "cluster": 2, "stage": "chunk", "unroll": 2, "load_hint": "l2"},
    ),
    # stage=pipe in the cluster regime: persistent clusters (the launcher clamps the grid to those
    # resident), each looping over several rows, both slot sets and mbarrier parities; M not a
    # multiple of the cluster count; a residual (two register sets of x and residual); 2 CTAs per SM
    (
        "bfloat16",
        (203, 262144),
        {"rstd": True},
        {**C, "threads": 512, "cluster": 8, "stage": "pipe"},
    ),
    (
        "float16",
        (301, 131072),
        {"residual": True, "rstd": True, "bias": True},
        {**C, "threads": 512, "cluster": 8, "stage": "pipe", "store_cs": True},
    ),
    (
        "bfloat16",
        (1001, 65536),
        {"weight": "fp32"},
        {**C, "threads": 256, "cluster": 4, "stage": "pipe", "min_blocks": 2},
    ),
    (
        "float32",
        (77, 65536),
        {"residual": True, "residual_out_fp32": True},
        {**C, "threads": 512, "cluster": 8, "stage": "pipe"},
    ),
    # stage=bulk: the CTA's row part bulk-copied into shared memory in 4 parts (NV % threads == 0) or
    # one (a partial last iteration); block and cluster; residual (+ fp32 residual_out), bias, no weight
    ("bfloat16", (199, 4096), {}, {**B, "threads": 128, "stage": "bulk", "unroll": 2}),
    (
        "float16",
        (199, 4000),
        {"residual": True, "bias": True, "weight": "fp32"},
        {**B, "threads": 128, "stage": "bulk", "unroll": 2, "store_cs": True},
    ),
    (
        "bfloat16",
        (64, 65536),
        {"rstd": True},
        {**C, "threads": 256, "cluster": 2, "stage": "bulk", "unroll": 4, "min_blocks": 3},
    ),
    (
        "float32",
        (16, 131072),
        {"residual": True, "residual_out_fp32": True, "rstd": True},
        {**C, "threads": 512, "cluster": 8, "stage": "bulk", "unroll": 1},
    ),
    (
        "float16",
        (33, 131072),
        {"weight": "none", "bias": True, "rstd": True},
        {**C, "threads": 384, "cluster": 4, "stage": "bulk", "unroll": 8},
    ),
    (
        "bfloat16",
        (203, 262144),
        {"residual": True},
        {**C, "threads": 512, "cluster": 8, "stage": "bulk", "unroll": 2},
    ),
    # stage=bulk with a register tail (bulk_reg vectors per lane loaded into registers)
    (
        "bfloat16",
        (17, 262144),
        {"rstd": True},
        {**C, "threads": 1024, "cluster": 2, "stage": "bulk", "bulk_reg": 8},
    ),
    (
        "float16",
        (33, 262144),
        {"residual": True, "bias": True},
        {**C, "threads": 1024, "cluster": 4, "stage": "bulk", "bulk_reg": 2},
    ),
    (
        "float32",
        (199, 16384),
        {"residual": True, "weight": "fp32", "rstd": True},
        {
            **B,
            "threads": 256,
            "stage": "bulk",
            "bulk_reg": 4,
            "unroll": 2,
            "min_blocks": 2,
            "store_cs": True,
        },
    ),
    # M*N past 2^31 elements: 64-bit indexing in every regime (one seed, compared in row chunks)
    ("bfloat16", (1048577, 2048), {}, {**W, "threads": 256, "row_threads": 32, "load_hint": "nc"}),
    ("bfloat16", (65537, 32768), {"rstd": True}, {**B, "threads": 1024, "load_hint": "nc"}),
    ("bfloat16", (65540, 32767), {}, {**B, "threads": 512, "exact": False, "unroll": 4}),
    ("bfloat16", (16385, 131072), {"residual": True}, {**C, "threads": 512, "cluster": 4}),
    (
        "bfloat16",
        (65537, 32768),
        {"residual": True},
        {**B, "threads": 512, "stage": "chunk", "load_hint": "l2"},
    ),
    ("bfloat16", (8193, 262144), {}, {**C, "threads": 512, "cluster": 8, "stage": "pipe"}),
    (
        "bfloat16",
        (8193, 262144),
        {},
        {**C, "threads": 256, "cluster": 8, "stage": "bulk", "unroll": 4, "min_blocks": 3},
    ),
    (
        "bfloat16",
        (8193, 262144),
        {},
        {**C, "threads": 1024, "cluster": 2, "stage": "bulk", "bulk_reg": 8},
    ),
]
BIG = 1 << 31  # cases with more elements run one seed and compare ROWS rows at a time
ROW_ARRAYS = ("x", "residual", "y", "residual_out", "rstd")


def arch_of(cp) -> str:
    cc = cp.cuda.Device().compute_capability  # "90", "100", ...
    return f"sm_{cc}" + ("a" if cc in ("90", "100") else "")


def launch(cp, driver, kern, L, args):
    types, values = [], []
    for a in args:
        if isinstance(a, cp.ndarray):
            types.append(ctypes.c_void_p)
            values.append(a.data.ptr)
        elif isinstance(a, np.int64):
            types.append(ctypes.c_int64)
            values.append(int(a))
        elif isinstance(a, np.float32):
            types.append(ctypes.c_float)
            values.append(float(a))
        else:
            types.append(ctypes.c_void_p)
            values.append(int(a))
    # opt in past 48 KB of static + dynamic shared memory (48 KB of dynamic plus a few mbarriers does
    # not launch without it), and allow clusters above 8: as ptxbuild.launch.set_function_attributes
    if L.smem_bytes and L.smem_bytes + kern.attributes["shared_size_bytes"] > 48 * 1024:
        kern.max_dynamic_shared_size_bytes = L.smem_bytes
    if L.cluster[0] > 8:
        attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED
        (err,) = driver.cuFuncSetAttribute(driver.CUfunction(kern.kernel.ptr), attr, 1)
        if int(err) != 0:
            raise RuntimeError(f"cuFuncSetAttribute(non-portable cluster): {err}")
    cfg = driver.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = L.grid
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = L.block
    cfg.sharedMemBytes = L.smem_bytes
    cfg.hStream = driver.CUstream(cp.cuda.get_current_stream().ptr)
    attrs = []
    if L.cluster != (1, 1, 1):
        at = driver.CUlaunchAttribute()
        at.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        at.value.clusterDim.x, at.value.clusterDim.y, at.value.clusterDim.z = L.cluster
        attrs.append(at)
    cfg.attrs = attrs
    cfg.numAttrs = len(attrs)
    fn = driver.CUfunction(kern.kernel.ptr)
    cfg.gridDimX = resident_grid(driver, fn, cfg, L)  # persistent clusters: those resident at once
    if L.persistent and cfg.gridDimX != L.grid[0]:
        print(
            f"  persistent: {cfg.gridDimX // L.cluster[0]} clusters resident of {L.grid[0] // L.cluster[0]} asked",
            flush=True,
        )
    (err,) = driver.cuLaunchKernelEx(cfg, fn, (tuple(values), tuple(types)), 0)
    if int(err) != 0:
        raise RuntimeError(f"cuLaunchKernelEx: {err}")
    cp.cuda.get_current_stream().synchronize()


def run_case(cp, driver, arch, dtype, shape, opts, params, defines: tuple = ()) -> tuple[bool, str]:
    problem = Problem.make("rmsnorm", dtype, shape, opts)
    params = op._full(params)
    why = op.check(params, problem)
    if why:
        return False, f"check: {why}"
    binary = compile_kernel(op.render(params, problem, arch).with_defines(*defines), arch)
    if binary.spill_bytes:
        return False, f"spills {binary.spill_bytes} bytes"
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(binary.cubin)
    try:
        kern = cp.RawModule(path=f.name).get_function(binary.entry)
    finally:
        os.unlink(f.name)
    worst, ok = [], True
    m, n = shape
    big = m * n > BIG
    step = max(1, (1 << 26) // n) if big else m
    for seed in (0,) if big else (0, 1, 2):
        inputs = op.make_inputs(problem, seed, cp)
        saved = {k: v.copy() for k, v in inputs.items()}
        outputs = op.make_outputs(problem, cp)
        for v in outputs.values():
            v.view(cp.uint8).fill(0xFF)  # NaN poison
        sms = cp.cuda.Device().attributes[
            "MultiProcessorCount"
        ]  # persistent variants size their grid by it
        launch(
            cp,
            driver,
            kern,
            op.launch(params, problem, sms),
            op.kernel_args(params, problem, inputs, outputs),
        )
        for r0 in range(0, m, step):  # the float64 reference, a slab of rows at a time

            def rows(d):
                return {k: (v[r0 : r0 + step] if k in ROW_ARRAYS else v) for k, v in d.items()}

            part = problem.with_shape((min(step, m - r0), n))
            ref = op.reference(part, rows(saved), cp)
            got_rows = rows(outputs)
            for name, expect in ref.items():
                kind = (
                    "float32"
                    if (
                        name == "rstd" or (name == "residual_out" and opts.get("residual_out_fp32"))
                    )
                    else dtype
                )
                atol, rtol = op.tolerance(problem, name)
                c = check.compare(got_rows[name], expect, kind, atol, rtol, cp)
                worst.append((name, c["max_abs"]))
                if c["bad"]:
                    ok = False
                    at = (c["worst"][0] + r0, *c["worst"][1:]) if c["worst"] else None
                    worst.append(
                        (f"FIRST-BAD {name}{at} got {c.get('got')} want {c.get('want')}", None)
                    )
            del ref
        if any(not bool((inputs[k] == saved[k]).all()) for k in inputs):
            ok = False
            worst.append(("INPUT MODIFIED", None))
        del inputs, saved, outputs
        cp.get_default_memory_pool().free_all_blocks()
    top: dict = {}
    for name, err in worst:
        top[name] = err if err is None else max(err, top.get(name) or 0.0)
    return ok, " ".join(name if err is None else f"{name}:{err:.2e}" for name, err in top.items())


def main() -> int:
    import cupy as cp
    from cuda.bindings import driver

    pick = sys.argv[sys.argv.index("-k") + 1] if "-k" in sys.argv else ""
    defines = tuple(
        v for i, v in enumerate(sys.argv[1:]) if sys.argv[i] == "-D"
    )  # -D NAME=V and -DNAME=V
    defines += tuple(v[2:] for v in sys.argv[1:] if v.startswith("-D") and len(v) > 2)
    arch = arch_of(cp)
    fails = 0
    for dtype, shape, opts, params in CASES:
        label = f"{params['regime']:7s} {dtype:8s} {shape[0]}x{shape[1]} {opts} {params}"
        if pick not in label:
            continue
        try:
            ok, msg = run_case(cp, driver, arch, dtype, shape, opts, params, defines)
        except Exception as exc:  # a launch error or compile error is a FAIL, keep going
            ok, msg = False, f"{type(exc).__name__}: {exc}"[:400]
        fails += not ok
        print(f"{'PASS' if ok else 'FAIL'} {label} {msg}", flush=True)
    print(f"{fails} failed")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
