"""On a GPU (issue 29): the RMSNorm backward kernels through the build's own verifier (poisoned
outputs, inputs unmodified, two runs bit-identical, the op's tolerances, verify_problems' M = 1 / 199
and a persistent-loop M), for every mode and every regime; odd N (760, 1128) as problems of their own.

    python -m pytest -q -m gpu tests/test_rmsnorm_bwd_gpu.py
"""

from pathlib import Path

import pytest

from ptxbuild.gpu import gpu_available
from ptxbuild.oploader import load_op
from ptxbuild.problem import Problem

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not gpu_available(), reason="needs an NVIDIA GPU and cupy (pip install cupy-cuda13x)"
    ),
]

ROOT = Path(__file__).resolve().parents[1]
RES = {"residual": True, "dresidual_in": True}
MODES = {
    "plain": {},
    "residual": RES,
    "recompute": {"rstd_in": False},
    "recompute-precise": {"rstd_in": False},
    "fp32w-bias": {"weight": "fp32", "bias": True},
    "noweight": {"weight": "none"},
    "noweight-bias": {"weight": "none", "bias": True, "rstd_in": False},
    "residual-fp32w-recompute": {**RES, "weight": "fp32", "rstd_in": False},
    "residual-nodres": {"residual": True},
}
# (dtype, shape, params beyond the default): every regime, both stages, the vector widths, PDL
REGIMES = {
    "warp-256": ("bfloat16", (4096, 256), {}),
    "warp-8lanes": ("float16", (3000, 128), {"regime": "warp", "row_threads": 8, "threads": 128}),
    "warp-1024-fp32": ("float32", (2048, 1024), {}),
    "block-4096": ("bfloat16", (2048, 4096), {}),
    "block-4096-pdl": ("bfloat16", (2048, 4096), {"pdl": True}),
    "block-760": ("bfloat16", (199, 760), {"regime": "block", "threads": 64}),
    "block-1128-v8": ("float16", (199, 1128), {"regime": "block", "threads": 96, "vec_bytes": 8}),
    "warp-760-fp32": ("float32", (1, 760), {"regime": "warp", "row_threads": 32, "threads": 64}),
    "cluster4-16k": ("bfloat16", (600, 16384), {"regime": "cluster", "cluster": 4, "threads": 512}),
    "cluster16-pass2": (
        "float32",
        (300, 65536),
        {"regime": "cluster", "cluster": 16, "threads": 512, "stage": "pass2", "unroll": 2},
    ),
    "cluster4-pass2-bf16": (
        "bfloat16",
        (200, 65536),
        {"regime": "cluster", "cluster": 4, "threads": 512, "stage": "pass2"},
    ),
    # stage=smem: the row part staged in shared memory by bulk copies (a ring of `stages` buffers)
    "cluster4-smem-16k": (
        "bfloat16",
        (600, 16384),
        {"regime": "cluster", "cluster": 4, "threads": 256, "stage": "smem", "stages": 4},
    ),
    "block-smem-4096": (
        "bfloat16",
        (2048, 4096),
        {"regime": "block", "stage": "smem", "stages": 8},
    ),
    "smem-131072-default": ("bfloat16", (64, 131072), {}),
    "smem-262144-default": ("bfloat16", (40, 262144), {}),
    "smem-262144-fp32-one-buffer": ("float32", (40, 262144), {}),
    # 192 lanes over 512 vectors per CTA: a tail of 128 (the fault of run26a was pass2's, below)
    "cluster16-smem-tail": (
        "bfloat16",
        (300, 65536),
        {
            "regime": "cluster",
            "cluster": 16,
            "threads": 192,
            "stage": "smem",
            "stages": 6,
            "load_hint": "ef",
            "pdl": True,
        },
    ),
    "block-smem-tail-fp16": (
        "float16",
        (999, 8192),
        {"regime": "block", "threads": 384, "stage": "smem", "stages": 4},
    ),
    # run26a's cudaErrorIllegalAddress: pass2's shared-memory sums written past the part at the tail
    "cluster16-pass2-tail": (
        "bfloat16",
        (300, 65536),
        {
            "regime": "cluster",
            "cluster": 16,
            "threads": 192,
            "stage": "pass2",
            "load_hint": "ef",
            "pdl": True,
            "red_threads": 128,
        },
    ),
    "noprefetch-hints": (
        "bfloat16",
        (5000, 2048),
        {
            "regime": "block",
            "threads": 256,
            "prefetch": False,
            "load_hint": "ef",
            "store_cs": True,
            "red_split": 32,
        },
    ),
}


@pytest.fixture(scope="module")
def gpu():
    from ptxbuild.gpu.runs import Gpu

    return Gpu(0)


def _verify(gpu, dtype, shape, opts, extra):
    from ptxbuild.compile.compiler import compile_kernel

    op = load_op("rmsnorm_bwd", ROOT)
    cc = gpu.fingerprint.cc  # "sm_90"
    arch = cc + ("a" if cc in ("sm_90", "sm_100") else "")
    prob = Problem.make("rmsnorm_bwd", dtype, shape, opts)
    # an explicit regime is a whole config (the default's other choices may not apply to it)
    params = op._full(extra) if "regime" in extra else {**op.default_params(prob), **extra}
    assert op.check(params, prob) is None, op.check(params, prob)
    b = compile_kernel(op.render(params, prob, arch), arch)
    assert b.spill_bytes == 0
    binary = {"entry": b.entry, "digest": b.digest, "arch": b.arch, "ptx": b.ptx, "cubin": b.cubin}
    res = gpu.verify(str(op.FOLDER), str(ROOT), params, prob, binary)
    assert res["outcome"] == "ok", (prob.label(), params, res["detail"])
    assert res["cases"] >= 3
    return res


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("regime", ["warp-256", "cluster16-pass2", "cluster4-smem-16k"])
def test_every_mode_verifies(gpu, mode, regime):
    dtype, shape, extra = REGIMES[regime]
    extra = dict(extra)
    if mode == "recompute-precise":
        extra["rsqrt"] = "precise"
    _verify(gpu, dtype, shape, MODES[mode], extra)


@pytest.mark.parametrize("regime", list(REGIMES))
@pytest.mark.parametrize("mode", ["residual"])
def test_every_regime_verifies(gpu, regime, mode):
    dtype, shape, extra = REGIMES[regime]
    _verify(gpu, dtype, shape, MODES[mode], extra)


@pytest.mark.parametrize(
    "regime",
    [
        "smem-131072-default",
        "smem-262144-default",
        "smem-262144-fp32-one-buffer",
        "cluster16-pass2-tail",
    ],
)
def test_long_rows_verify_plain(gpu, regime):
    dtype, shape, extra = REGIMES[regime]
    _verify(gpu, dtype, shape, MODES["plain"], extra)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("n", [760, 1128])
@pytest.mark.parametrize("m", [199])
def test_odd_rows_at_their_defaults(gpu, dtype, n, m):
    _verify(gpu, dtype, (m, n), RES, {})


def test_the_partials_reduce_in_a_fixed_order(gpu):
    """Bit-identical dweight across runs is part of verify (determinism); here also across two
    different input pools of the same problem: same bits for the same inputs, every time."""
    import cupy as cp

    from ptxbuild.compile.compiler import compile_kernel
    from ptxbuild.gpu import device

    op = load_op("rmsnorm_bwd", ROOT)
    prob = Problem.make("rmsnorm_bwd", "bfloat16", (32768, 1024), {"weight": "fp32", "bias": True})
    params = op.default_params(prob)
    arch = gpu.fingerprint.cc + ("a" if gpu.fingerprint.cc in ("sm_90", "sm_100") else "")
    b = compile_kernel(op.render(params, prob, arch), arch)
    binary = {"entry": b.entry, "digest": b.digest, "arch": b.arch, "ptx": b.ptx, "cubin": b.cubin}
    inputs = op.make_inputs(prob, 5, cp)
    outs = []
    for _ in range(5):
        o = op.make_outputs(prob, cp)
        gpu.sync()  # inputs drawn on cupy's stream, launched on the worker's
        for kern, geom, args in gpu.launches(op, params, prob, binary, inputs, o):
            device.launch(kern, geom, args, gpu.stream)
        gpu.sync()
        outs.append((cp.asnumpy(o["dweight"]), cp.asnumpy(o["dbias"])))
    for w, bb in outs[1:]:
        assert (w.view("u4") == outs[0][0].view("u4")).all()
        assert (bb.view("u4") == outs[0][1].view("u4")).all()
