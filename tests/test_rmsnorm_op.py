"""ops/rmsnorm: reference, constraints, bytes model, defaults (pure) and compiled variants (compile)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ptxbuild.dtypes import from_float, to_float
from ptxbuild.oploader import load_op
from ptxbuild.problem import Problem

ROOT = Path(__file__).resolve().parents[1]
op = load_op("rmsnorm", ROOT)

MATRIX_N = [256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144]
MATRIX_M = {131072: 16384, 262144: 8192}
MODES = [{}, {"residual": True}]


def prob(dtype="bfloat16", shape=(4, 64), **opts):
    return Problem.make("rmsnorm", dtype, shape, opts)


def matrix():
    for dt in op.DTYPES:
        for mode in MODES:
            for n in MATRIX_N:
                yield prob(dt, (MATRIX_M.get(n, 32768), n), **mode)


# ------------------------------------------------------------------ pure: reference
def naive(problem, inputs):
    """A straightforward float64 formula, written independently of op.reference."""
    o = {**op.OPTIONS, **problem.opts}
    dt = problem.dtype
    x = to_float(inputs["x"], dt, np).astype(np.float64)
    out = {}
    if o["residual"]:
        h32 = to_float(inputs["x"], dt, np) + to_float(inputs["residual"], dt, np)
        h = (
            h32.astype(np.float64)
            if o["residual_out_fp32"]
            else to_float(from_float(h32, dt, np), dt, np).astype(np.float64)
        )
        out["residual_out"] = h
    else:
        h = x
    wdt = "float32" if o["weight"] == "fp32" else dt
    w = to_float(inputs["weight"], wdt, np).astype(np.float64) if o["weight"] != "none" else 1.0
    b = to_float(inputs["bias"], wdt, np).astype(np.float64) if o["bias"] else 0.0
    y = np.empty_like(h)
    rstd = np.empty(h.shape[0])
    for i, row in enumerate(h):
        rstd[i] = 1.0 / np.sqrt(np.sum(row * row) / row.size + o["eps"])
        y[i] = row * rstd[i] * w + b
    out["y"] = y
    if o["rstd"]:
        out["rstd"] = rstd
    return out


MODE_CASES = [
    {},
    {"weight": "fp32"},
    {"weight": "none"},
    {"bias": True},
    {"weight": "none", "bias": True},
    {"residual": True},
    {"residual": True, "residual_out_fp32": True},
    {"rstd": True},
    {"residual": True, "rstd": True, "bias": True, "weight": "fp32", "eps": 1e-5},
]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize(
    "opts", MODE_CASES, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "plain"
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reference_matches_naive_formula(dtype, opts, seed):
    p = prob(dtype, (7, 40), **opts)
    inputs = op.make_inputs(p, seed, np)
    ref = op.reference(p, inputs, np)
    exp = naive(p, inputs)
    assert set(ref) == set(exp) == set(op.make_outputs(p, np))
    for k in exp:
        np.testing.assert_allclose(ref[k], exp[k], rtol=1e-12, atol=1e-12)


def test_inputs_are_seeded_varied_and_never_all_zero():
    p = prob("bfloat16", (9, 64), residual=True, bias=True)
    a, b = op.make_inputs(p, 0, np), op.make_inputs(p, 0, np)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["x"], op.make_inputs(p, 3, np)["x"])
    z = to_float(op.make_inputs(p, 1, np)["x"], "bfloat16", np)
    assert (np.abs(z).sum(axis=1) == 0).any() and np.abs(z).sum() > 0  # zero rows, not all zero
    big = to_float(op.make_inputs(p, 2, np)["x"], "bfloat16", np)
    assert np.abs(big).max() > 1e3
    assert op.reference(p, op.make_inputs(p, 1, np), np)["y"].std() > 0.1


def test_bf16_y_tolerance_covers_one_rounding_but_not_a_wrong_scale():
    p = prob("bfloat16", (16, 256))
    inputs = op.make_inputs(p, 0, np)
    ref = op.reference(p, inputs, np)["y"]
    atol, rtol = op.tolerance(p, "y")
    rounded = to_float(from_float(ref.astype(np.float32), "bfloat16", np), "bfloat16", np)
    assert np.all(np.abs(rounded - ref) <= atol + rtol * np.abs(ref))
    wrong = ref * 1.02
    assert not np.all(np.abs(wrong - ref) <= atol + rtol * np.abs(ref))
    assert op.tolerance(p, "residual_out") == (0.0, 0.0)


def test_kernel_args_order_and_types():
    p = prob("float16", (3, 64), residual=True, rstd=True)
    ins, outs = op.make_inputs(p, 0, np), op.make_outputs(p, np)
    args = op.kernel_args(op.default_params(p), p, ins, outs)
    assert args[0] is ins["x"] and args[1] is ins["residual"] and args[2] is ins["weight"]
    assert args[3] == np.uint64(0) and args[4] is outs["y"] and args[5] is outs["residual_out"]
    assert args[6] is outs["rstd"]
    assert [type(a) for a in args[7:]] == [np.int64, np.int64, np.float32]
    assert (int(args[7]), int(args[8])) == (3, 64)
    o2 = op.make_outputs(prob("bfloat16", (3, 64), residual=True, residual_out_fp32=True), np)
    assert o2["residual_out"].dtype == np.float32 and o2["y"].dtype == np.uint16


# ------------------------------------------------------------------ pure: bytes, check, defaults
def test_bytes_moved():
    assert op.bytes_moved(prob("bfloat16", (32768, 4096))) == 2 * 32768 * 4096 * 2 + 4096 * 2
    assert op.bytes_moved(prob("float32", (10, 100), weight="none")) == 2 * 10 * 100 * 4
    full = prob(
        "bfloat16",
        (10, 100),
        residual=True,
        residual_out_fp32=True,
        rstd=True,
        weight="fp32",
        bias=True,
    )
    assert op.bytes_moved(full) == 10 * 100 * (2 + 2 + 2 + 4) + 4 * 10 + 100 * 4 * 2


@pytest.mark.parametrize(
    "params,problem,words",
    [
        ({"threads": 100}, prob(shape=(4, 4096)), "multiple of 32"),
        ({"regime": "block", "threads": 1024, "min_blocks": 4}, prob(shape=(4, 65536)), "2048"),
        ({"regime": "cluster", "cluster": 4}, prob(shape=(4, 1024)), "long rows"),
        (
            {"regime": "cluster", "cluster": 16, "threads": 512},
            prob(shape=(4, 262144)),
            "NonPortable",
        ),
        ({"regime": "block", "cluster": 2}, prob(shape=(4, 4096)), "cluster regime"),
        ({"regime": "block", "threads": 128}, prob(shape=(4, 4095)), "N % 8"),
        ({"regime": "block", "threads": 64}, prob(shape=(4, 262144)), "vectors per lane"),
        (
            {"regime": "block", "threads": 1024},
            prob("float32", (4, 65536), residual=True),
            "registers",
        ),
        ({"regime": "block", "threads": 512}, prob(shape=(4, 2048)), "idle"),
        ({"regime": "warp", "row_threads": 32}, prob(shape=(4, 128)), "idle"),
        ({"regime": "warp", "exact": False}, prob(shape=(4, 65536)), "too long"),
        ({"regime": "block", "stage": "smem", "exact": False}, prob(shape=(4, 8192)), "smem"),
        (
            {"regime": "cluster", "cluster": 2, "threads": 1024, "stage": "smem", "unroll": 4},
            prob("float32", (4, 262144), residual=True),
            "shared memory",
        ),
        ({"regime": "block", "unroll": 4}, prob(shape=(4, 8192)), "unroll"),
        ({"regime": "block", "row_threads": 8}, prob(shape=(4, 8192)), "warp regime"),
        (
            {"regime": "warp", "threads": 256},
            prob(shape=(4, 1024), residual_out_fp32=True),
            "residual=True",
        ),
        # persistent clusters hold this row's and the next row's part: 2 x 32 words at 4 x 1024 threads
        (
            {"regime": "cluster", "threads": 1024, "cluster": 4, "stage": "pipe"},
            prob(shape=(4, 262144)),
            "registers per lane",
        ),
        (
            {"regime": "cluster", "threads": 512, "cluster": 8, "stage": "pipe"},
            prob(shape=(4, 262144), residual=True),
            "registers per lane",
        ),
        (
            {"regime": "block", "stage": "pipe", "exact": False},
            prob(shape=(4, 8192)),
            "only applies to exact variants",
        ),
        # integer parameters come from SPACE (a chunk's pass 2 works in whole rounds: unroll 5 would skip some)
        (
            {"regime": "block", "threads": 512, "stage": "chunk", "unroll": 5},
            prob(shape=(4, 65536)),
            "unroll=5 is not one of",
        ),
        (
            {"regime": "block", "threads": 512, "min_blocks": 5},
            prob(shape=(4, 8192)),
            "min_blocks=5 is not one of",
        ),
        (
            {"regime": "block", "threads": 128, "min_blocks": 32},
            prob(shape=(4, 1024)),
            "exceeds 2048 threads",
        ),
        (
            {"regime": "block", "threads": 128, "fast_front": True},
            prob(shape=(4, 1024)),
            "fast_front only applies",
        ),
        (
            {"regime": "warp", "threads": 256, "exact": False, "unroll": 2, "fast_front": True},
            prob(shape=(4, 1000)),
            "fast_front only applies",
        ),
        (
            {"regime": "warp", "threads": 256, "stage": "pipe", "fast_front": True},
            prob(shape=(4, 1024)),
            "fast_front only applies",
        ),
        (
            {"regime": "warp", "threads": 64, "fast_front": 1},
            prob(shape=(4, 512)),
            "fast_front=1 is not one of",
        ),
        (
            {"regime": "block", "threads": 512, "stage": "chunk", "w_el": True},
            prob(shape=(4, 8192)),
            "w_el only applies",
        ),
        (
            {"regime": "warp", "threads": 64, "w_el": True},
            prob(shape=(4, 512), weight="none"),
            "w_el is moot",
        ),
        (
            {"regime": "warp", "threads": 128, "rows_per_group": 3},
            prob(shape=(4, 512)),
            "rows_per_group=3",
        ),
        (
            {"regime": "warp", "threads": 256, "stage": "pipe", "weight_load": "early"},
            prob(shape=(4, 1024)),
            "places the weight",
        ),
        (
            {"regime": "block", "threads": 512, "stage": "pipe", "weight_load": "early"},
            prob(shape=(4, 8192)),
            "places the weight",
        ),
        (
            {"regime": "block", "threads": 512, "stage": "pipe", "min_blocks": 2},
            prob("float32", (4, 32768), residual=True),
            "two staged rows",
        ),
        (
            {"regime": "warp", "threads": 256, "stage": "chunk"},
            prob(shape=(4, 2048)),
            "exact block/cluster",
        ),
        (
            {"regime": "block", "threads": 256, "stage": "chunk", "exact": False},
            prob(shape=(4, 8192)),
            "exact block/cluster",
        ),
        (
            {"regime": "block", "threads": 512, "load_hint": "l2"},
            prob(shape=(4, 8192)),
            "only applies to stage=chunk",
        ),
        (
            {"regime": "block", "threads": 512, "stage": "chunk", "unroll": 4},
            prob(shape=(4, 8192)),
            "half the chunk would hold them all",
        ),
        # integers, not floats or bools that compare equal
        (
            {"regime": "block", "threads": 512, "stage": "chunk", "unroll": 2.0},
            prob(shape=(4, 8192)),
            "unroll=2.0 is not one of",
        ),
        (
            {"regime": "warp", "threads": 128, "rows_per_group": True},
            prob(shape=(4, 512)),
            "rows_per_group=True",
        ),
        ({"regime": "block", "threads": 512.0}, prob(shape=(4, 8192)), "must be an integer"),
        (
            {"regime": "block", "threads": 512, "exact": 1},
            prob(shape=(4, 8192)),
            "exact=1 is not one of",
        ),
        # stage=bulk: exact block/cluster, the part in shared memory, unroll within the part, weight late
        (
            {"regime": "warp", "threads": 256, "stage": "bulk"},
            prob(shape=(4, 2048)),
            "exact block/cluster",
        ),
        (
            {"regime": "block", "threads": 256, "stage": "bulk", "exact": False},
            prob(shape=(4, 8192)),
            "exact block/cluster",
        ),
        (
            {"regime": "block", "threads": 1024, "stage": "bulk", "unroll": 8},
            prob(shape=(4, 8192)),
            "unroll=8 > 1 vectors",
        ),
        (
            {"regime": "block", "threads": 256, "stage": "bulk", "weight_load": "early"},
            prob(shape=(4, 8192)),
            "register-resident",
        ),
        (
            {"regime": "cluster", "cluster": 8, "threads": 512, "stage": "bulk"},
            prob("float32", (4, 262144), residual=True),
            "bulk-copied row part needs 262144 bytes",
        ),
        (
            {"regime": "cluster", "cluster": 8, "threads": 256, "stage": "bulk", "min_blocks": 4},
            prob(shape=(4, 262144)),
            "min_blocks=4 CTAs exceed",
        ),
        (
            {
                "regime": "cluster",
                "cluster": 8,
                "threads": 512,
                "stage": "bulk",
                "unroll": 4,
                "min_blocks": 3,
            },
            prob(shape=(4, 262144)),
            "registers per lane",
        ),
        (
            {"regime": "block", "threads": 512, "bulk_reg": 4},
            prob(shape=(4, 65536)),
            "only applies to stage=bulk",
        ),
        (
            {"regime": "cluster", "cluster": 2, "threads": 1024, "stage": "bulk", "bulk_reg": 16},
            prob(shape=(4, 262144)),
            "at least one in shared memory",
        ),
        (
            {"regime": "block", "threads": 384, "stage": "bulk", "bulk_reg": 2},
            prob(shape=(4, 65536)),
            "whole iterations",
        ),
        # 256 KB per CTA: without a register tail the part does not fit shared memory
        (
            {"regime": "cluster", "cluster": 2, "threads": 1024, "stage": "bulk"},
            prob(shape=(4, 262144)),
            "262144 bytes",
        ),
        (
            {"regime": "block", "threads": 256, "stage": "chunk", "weight_load": "early"},
            prob(shape=(4, 8192)),
            "register-resident",
        ),
        (
            {"regime": "block", "threads": 1024, "stage": "chunk", "unroll": 8, "min_blocks": 2},
            prob(shape=(4, 262144)),
            "registers per lane",
        ),
    ],
)
def test_check_rejects(params, problem, words):
    reason = op.check(params, problem)
    assert reason is not None and words.lower() in reason.lower(), reason


@pytest.mark.parametrize(
    "params,problem",
    [
        (
            {"regime": "warp", "threads": 96, "row_threads": 8, "rows_per_group": 4},
            prob(shape=(199, 512)),
        ),
        ({"regime": "warp", "threads": 256, "exact": False, "unroll": 2}, prob(shape=(199, 4095))),
        ({"regime": "block", "threads": 448}, prob(shape=(1, 8192))),
        (
            {
                "regime": "warp",
                "threads": 32,
                "rows_per_group": 2,
                "min_blocks": 32,
                "fast_front": True,
                "w_el": True,
            },
            prob("float16", (199, 512), residual=True),
        ),
        (
            {"regime": "block", "threads": 64, "w_el": True},
            prob(shape=(1, 1024), weight="none", bias=True),
        ),
        (
            {"regime": "block", "threads": 1024, "exact": False, "unroll": 2},
            prob("float32", (3, 100003)),
        ),
        ({"regime": "cluster", "threads": 512, "cluster": 8}, prob("float32", (8192, 262144))),
        (
            {"regime": "cluster", "threads": 512, "cluster": 8, "stage": "smem", "unroll": 4},
            prob("float32", (8192, 262144), residual=True),
        ),
        ({"regime": "block", "threads": 512, "stage": "pipe"}, prob("float32", (32768, 8192))),
        (
            {
                "regime": "block",
                "threads": 512,
                "stage": "chunk",
                "min_blocks": 3,
                "load_hint": "l2",
            },
            prob("float32", (1, 8192)),
        ),
        # one chunk of 4 slots for 3 vectors per lane (bf16 8K at 384 threads: 1024 vectors)
        (
            {"regime": "block", "threads": 384, "stage": "chunk", "unroll": 4, "load_hint": "l2"},
            prob(shape=(1, 8192)),
        ),
        (
            {"regime": "cluster", "threads": 512, "cluster": 8, "stage": "pipe"},
            prob(shape=(8192, 262144)),
        ),
        (
            {"regime": "cluster", "threads": 512, "cluster": 8, "stage": "pipe"},
            prob(shape=(16384, 131072), residual=True),
        ),
        (
            {
                "regime": "cluster",
                "threads": 1024,
                "cluster": 8,
                "stage": "chunk",
                "unroll": 2,
                "load_hint": "l2",
            },
            prob("float32", (8192, 262144), residual=True),
        ),
        (
            {
                "regime": "cluster",
                "threads": 256,
                "cluster": 8,
                "stage": "bulk",
                "unroll": 4,
                "min_blocks": 3,
            },
            prob(shape=(8192, 262144)),
        ),
        (
            {"regime": "block", "threads": 128, "stage": "bulk", "unroll": 2},
            prob("float16", (199, 4000), residual=True, bias=True),
        ),
        (
            {"regime": "cluster", "cluster": 2, "threads": 1024, "stage": "bulk", "bulk_reg": 8},
            prob(shape=(8192, 262144)),
        ),
    ],
)
def test_check_accepts(params, problem):
    assert op.check(params, problem) is None


def test_default_params_valid_for_every_matrix_problem():
    for p in matrix():
        params = op.default_params(p)
        assert set(params) == set(op.SPACE), p.label()
        assert op.check(params, p) is None, p.label()
        assert params["exact"], p.label()  # power-of-two N: exact variants
        expect = "warp" if p.shape[1] * (2 if p.dtype == "float32" else 1) <= 2048 else None
        if expect:
            assert params["regime"] == expect, p.label()
        if p.shape[1] >= 65536:
            assert params["regime"] == "cluster", p.label()


def test_default_params_odd_n_is_generic():
    for n in (760, 1128, 4095, 100003):
        params = op.default_params(prob("bfloat16", (199, n)))
        assert op.check(params, prob("bfloat16", (199, n))) is None
        assert params["exact"] == (n % 8 == 0)


def test_launch_geometry_covers_every_row():
    p = prob("bfloat16", (199, 256))
    params = op._full({"regime": "warp", "threads": 96, "row_threads": 8, "rows_per_group": 2})
    L = op.launch(params, p, 132)
    assert L.grid[0] * (96 // 8) * 2 >= 199 > (L.grid[0] - 1) * (96 // 8) * 2
    Lc = op.launch(
        op._full({"regime": "cluster", "threads": 512, "cluster": 8}),
        prob(shape=(8192, 262144)),
        132,
    )
    assert Lc.grid == (8192 * 8, 1, 1) and Lc.cluster == (8, 1, 1) and Lc.smem_bytes == 0
    pr = prob("float32", (8192, 262144), residual=True)
    Ls = op.launch(op.default_params(pr), pr, 132)
    assert 0 < Ls.smem_bytes <= 227 * 1024


def test_render_is_independent_of_m_and_generic_independent_of_n():
    params = op._full({"regime": "block", "threads": 256, "exact": False, "unroll": 2})
    a = op.render(params, prob(shape=(1, 4096)), "sm_90a").source
    assert a == op.render(params, prob(shape=(77, 4095)), "sm_90a").source
    ex = op._full({"regime": "block", "threads": 256})
    assert (
        op.render(ex, prob(shape=(1, 4096)), "sm_90a").source
        == op.render(ex, prob(shape=(9999, 4096)), "sm_90a").source
    )
    assert "#include" not in a


def test_verify_problems():
    p = prob("bfloat16", (32768, 1024))
    assert {v.shape for v in op.verify_problems(p)} == {
        (1, 1024),
        (199, 1024),
    }  # same binary, same N
    exact = op.default_params(p)
    assert {v.shape for v in op.verify_problems(p, exact)} == {(1, 1024), (199, 1024)}
    pipe = op._full(
        {"regime": "block", "threads": 128, "stage": "pipe"}
    )  # persistent: blocks loop over rows
    assert {v.shape for v in op.verify_problems(p, pipe)} == {(1, 1024), (199, 1024), (1031, 1024)}
    # persistent lane groups: 8 groups x 2 rows = 16 rows per block; 160 SMs x 2 blocks loop twice, + 7
    wpipe = op._full(
        {
            "regime": "warp",
            "threads": 256,
            "row_threads": 32,
            "rows_per_group": 2,
            "stage": "pipe",
            "min_blocks": 2,
        }
    )
    shapes = {v.shape for v in op.verify_problems(p, wpipe)}
    assert shapes == {(1, 1024), (199, 1024), (2 * 160 * 2 * 16 + 7, 1024)}
    assert op.launch(wpipe, p.with_shape((2 * 160 * 2 * 16 + 7, 1024)), 160).grid == (320, 1, 1)
    # persistent clusters: 160 SMs / 8 = 20 clusters loop 4 times (both slot sets reach parity 1),
    # and 3 of them a fifth time
    cpipe = op._full({"regime": "cluster", "threads": 512, "cluster": 8, "stage": "pipe"})
    big = prob("bfloat16", (8192, 262144))
    assert {v.shape for v in op.verify_problems(big, cpipe)} == {
        (1, 262144),
        (199, 262144),
        (83, 262144),
    }
    generic = op._full({"regime": "warp", "threads": 256, "exact": False, "unroll": 2})
    odd = [v for v in op.verify_problems(p, generic) if v.shape[1] % 8]
    assert odd and all(op.check(generic, v) is None for v in odd)


# ------------------------------------------------------------------ compile
REPRESENTATIVE = [
    (
        "bfloat16",
        (32768, 256),
        {},
        {"regime": "warp", "threads": 256, "row_threads": 32, "rows_per_group": 2},
    ),
    (
        "float16",
        (32768, 1024),
        {"residual": True, "rstd": True},
        {
            "regime": "warp",
            "threads": 96,
            "row_threads": 16,
            "load_hint": "nc_na",
            "store_cs": True,
        },
    ),
    (
        "float32",
        (199, 760),
        {"bias": True},
        {"regime": "warp", "threads": 128, "row_threads": 8, "rows_per_group": 2},
    ),
    (
        "bfloat16",
        (199, 4095),
        {"residual": True, "residual_out_fp32": True, "weight": "fp32"},
        {"regime": "warp", "threads": 256, "exact": False, "unroll": 2, "rsqrt": "precise"},
    ),
    (
        "bfloat16",
        (32768, 8192),
        {"weight": "fp32"},
        {"regime": "block", "threads": 448, "weight_load": "early"},
    ),
    ("float32", (32768, 32768), {}, {"regime": "block", "threads": 1024, "load_hint": "nc"}),
    (
        "float16",
        (199, 20001),
        {"bias": True, "rstd": True},
        {"regime": "block", "threads": 384, "exact": False, "unroll": 4},
    ),
    (
        "bfloat16",
        (8192, 262144),
        {"rstd": True},
        {"regime": "cluster", "threads": 512, "cluster": 8, "load_hint": "nc"},
    ),
    (
        "float32",
        (8192, 262144),
        {"residual": True},
        {"regime": "cluster", "threads": 512, "cluster": 8, "stage": "smem", "unroll": 4},
    ),
    (
        "bfloat16",
        (3, 131075),
        {"residual": True},
        {"regime": "cluster", "threads": 1024, "cluster": 4, "exact": False, "unroll": 2},
    ),
    ("float32", (32768, 8192), {}, {"regime": "block", "threads": 512, "stage": "pipe"}),
    (
        "bfloat16",
        (32768, 4096),
        {"residual": True, "rstd": True, "bias": True},
        {"regime": "block", "threads": 256, "stage": "pipe", "min_blocks": 2, "load_hint": "nc_ef"},
    ),
    (
        "bfloat16",
        (32768, 512),
        {},
        {"regime": "warp", "threads": 256, "rows_per_group": 2, "stage": "pipe", "min_blocks": 2},
    ),
    (
        "float16",
        (32768, 1024),
        {"residual": True, "rstd": True},
        {
            "regime": "warp",
            "threads": 128,
            "row_threads": 32,
            "stage": "pipe",
            "min_blocks": 4,
            "store_cs": True,
        },
    ),
    (
        "bfloat16",
        (8192, 262144),
        {"rstd": True},
        {"regime": "cluster", "threads": 512, "cluster": 8, "stage": "pipe"},
    ),
    (
        "float16",
        (16384, 131072),
        {"residual": True, "bias": True},
        {"regime": "cluster", "threads": 512, "cluster": 8, "stage": "pipe"},
    ),
    (
        "bfloat16",
        (16384, 131072),
        {},
        {"regime": "cluster", "threads": 256, "cluster": 8, "stage": "pipe", "min_blocks": 2},
    ),
    (
        "bfloat16",
        (8192, 262144),
        {},
        {
            "regime": "cluster",
            "threads": 256,
            "cluster": 8,
            "stage": "bulk",
            "unroll": 4,
            "min_blocks": 3,
        },
    ),
    (
        "float16",
        (199, 4000),
        {"residual": True, "bias": True, "weight": "fp32"},
        {"regime": "block", "threads": 128, "stage": "bulk", "unroll": 2},
    ),
]


@pytest.mark.compile
def test_bulk_copies_the_part_in_four_pieces_and_holds_no_row_in_registers():
    """stage=bulk: one cp.async.bulk per quarter of the CTA's part (x and residual: 8), four mbarriers,
    and far fewer registers than the register-resident kernel of the same row (which holds the part)."""
    compiler = pytest.importorskip("ptxbuild.compile.compiler")
    p = prob("bfloat16", (8192, 262144), residual=True)
    bulk = op._full(
        {"regime": "cluster", "threads": 512, "cluster": 8, "stage": "bulk", "unroll": 2}
    )
    b = compiler.compile_kernel(op.render(bulk, p, "sm_90a"), "sm_90a")
    assert b.ptx.count("cp.async.bulk.shared::cluster.global") == 8
    assert b.ptx.count("mbarrier.init.shared::cta.b64") >= 4
    reg = compiler.compile_kernel(
        op.render({**bulk, "stage": "reg", "unroll": 1}, p, "sm_90a"), "sm_90a"
    )
    assert b.registers + 24 <= reg.registers, (b.registers, reg.registers)
    assert op.launch(bulk, p, 132).smem_bytes == 2 * 262144 // 8 * 2


@pytest.mark.compile
def test_bulk_register_tail_halves_shared_memory_and_fits_the_register_cap():
    """bulk_reg=8 at cluster 2 x 1024 threads (bf16 256K: 256 KB per CTA): 128 KB bulk-copied in 4
    parts, 8 vectors per lane (128 KB) loaded into registers, no spills at the 64-register cap."""
    compiler = pytest.importorskip("ptxbuild.compile.compiler")
    p = prob("bfloat16", (8192, 262144))
    hybrid = op._full(
        {
            "regime": "cluster",
            "threads": 1024,
            "cluster": 2,
            "stage": "bulk",
            "bulk_reg": 8,
            "load_hint": "nc",
        }
    )
    assert op.check(hybrid, p) is None
    assert op.launch(hybrid, p, 132).smem_bytes == 128 * 1024
    b = compiler.compile_kernel(op.render(hybrid, p, "sm_90a"), "sm_90a")
    assert b.ptx.count("cp.async.bulk.shared::cluster.global") == 4
    assert b.spill_bytes == 0 and b.registers <= 64
    assert b.ptx.count("ld.global.nc.v4") >= 8  # the register tail: 8 vectors of x per lane


@pytest.mark.compile
@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("case", REPRESENTATIVE, ids=lambda c: f"{c[3]['regime']}-{c[0]}-{c[1][1]}")
def test_compiles_without_spills(arch, case):
    compiler = pytest.importorskip("ptxbuild.compile.compiler")
    dtype, shape, opts, params = case
    p = prob(dtype, shape, **opts)
    params = op._full(params)
    assert op.check(params, p) is None
    kernel = op.render(params, p, arch)
    b = compiler.compile_kernel(kernel, arch)
    assert b.entry == "rmsnorm_fwd" and b.cubin
    assert b.spill_bytes == 0 and b.local_bytes == 0, b.log
    assert 0 < b.registers <= 65536 // (params["threads"] * params["min_blocks"])


@pytest.mark.compile
@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_nc_ef_streams_x_with_an_evict_first_policy_and_keeps_the_late_weight(arch):
    """load_hint=nc_ef: x (and residual) loads carry an L2 evict_first cache policy, the late weight
    loads an evict_last one; other hints emit no policy. Same registers as "nc"."""
    compiler = pytest.importorskip("ptxbuild.compile.compiler")
    p = prob("float32", (32768, 8192), residual=True)
    base = op._full({"regime": "block", "threads": 512, "weight_load": "late"})
    ef = compiler.compile_kernel(op.render({**base, "load_hint": "nc_ef"}, p, arch), arch)
    nc = compiler.compile_kernel(op.render({**base, "load_hint": "nc"}, p, arch), arch)
    assert (
        "createpolicy.fractional.L2::evict_first" in ef.ptx
        and "createpolicy.fractional.L2::evict_last" in ef.ptx
    )
    vpt = 8192 // 4 // 512  # 16-byte vectors per lane
    assert (
        ef.ptx.count("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32") == 2 * vpt
    )  # x and residual
    assert ef.ptx.count("ld.global.L2::cache_hint.v4.u32") == vpt  # the weight
    assert "createpolicy" not in nc.ptx and "cache_hint" not in nc.ptx
    assert ef.spill_bytes == 0 and ef.registers <= nc.registers + 4


@pytest.mark.compile
@pytest.mark.parametrize("residual", [False, True])
def test_chunk_reads_the_row_twice_and_h_back_from_residual_out(residual):
    """stage=chunk, load_hint=l2: pass 1 loads x (+ residual) with L1 and L2 evict_last, as Triton
    does; pass 2 loads x again with evict_first, or with a residual reads h back from residual_out with
    a coherent ld.global (never .nc: this kernel wrote it), plus the weight (evict_last). Two loops of
    one vector per lane, so ~24 registers, not the row."""
    compiler = pytest.importorskip("ptxbuild.compile.compiler")
    p = prob("float32", (32768, 8192), residual=residual)
    cfg = op._full(
        {"regime": "block", "threads": 512, "stage": "chunk", "min_blocks": 3, "load_hint": "l2"}
    )
    assert op.check(cfg, p) is None
    b = compiler.compile_kernel(op.render(cfg, p, "sm_90a"), "sm_90a")
    keep = b.ptx.count("ld.global.L1::evict_last.L2::cache_hint.v4.u32")
    assert keep == (2 if residual else 1) + 1  # pass 1 (x, residual), the weight
    if residual:  # h read back: coherent, no L1 priority
        assert (
            b.ptx.count("ld.global.L2::cache_hint.v4.u32") == 1 and "L1::evict_first" not in b.ptx
        )
    else:
        assert b.ptx.count("ld.global.L1::evict_first.L2::cache_hint.v4.u32") == 1
    assert "ld.global.nc" not in b.ptx
    assert b.ptx.count("createpolicy.fractional.L2::evict_first") == 1
    assert b.ptx.count("st.global.v4.u32") == (
        2 if residual else 1
    )  # residual_out in pass 1, y in pass 2
    assert b.spill_bytes == 0 and b.registers <= 32


@pytest.mark.compile
def test_chunk_unroll_8_is_one_pass_1_batch_and_two_pass_2_rounds():
    """Triton's shape at fp32 32K: all 8 vectors of a lane in flight in pass 1, then pass 2 in two
    rounds of 4 (x re-read with evict_first, weight, y stored), so 1024 threads fit without spills."""
    compiler = pytest.importorskip("ptxbuild.compile.compiler")
    p = prob("float32", (32768, 32768))
    cfg = op._full(
        {"regime": "block", "threads": 1024, "stage": "chunk", "unroll": 8, "load_hint": "l2"}
    )
    assert op.check(cfg, p) is None
    b = compiler.compile_kernel(op.render(cfg, p, "sm_90a"), "sm_90a")
    assert b.ptx.count("ld.global.L1::evict_first.L2::cache_hint.v4.u32") == 8
    assert (
        b.ptx.count("ld.global.L1::evict_last.L2::cache_hint.v4.u32") == 8 + 8
    )  # x, then the weight
    assert b.ptx.count("st.global.v4.u32") == 8
    text = b.ptx[b.ptx.index("bar.sync") :]  # pass 2: the first round's stores precede
    first_store, last_reload = text.index("st.global.v4.u32"), text.rindex("L1::evict_first")
    assert first_store < last_reload  # the second round's re-loads
    assert b.spill_bytes == 0 and b.registers <= 64


def test_default_is_chunked_where_no_register_or_shared_memory_variant_fits():
    """Rows too long for registers and for shared memory at a cluster of 8 get the chunked cluster
    default, not the generic kernel that re-reads x (and the residual) in pass 2."""
    assert op.default_params(prob("float32", (8192, 262144), residual=True))["stage"] == "smem"
    big = op.default_params(prob("float32", (8, 524288), residual=True))
    assert (big["regime"], big["cluster"], big["stage"], big["exact"]) == (
        "cluster",
        8,
        "chunk",
        True,
    )
    assert op.default_params(prob("bfloat16", (8, 1 << 20)))["stage"] == "chunk"


def test_pipe_launches_persistent_blocks_with_two_rows_of_shared_memory():
    """stage=pipe: min(M, SMs x min_blocks) blocks, each looping over rows; dynamic shared memory for
    two rows of x (+ residual). Without an SM count (a caller that does not know the GPU) it falls
    back to a block per row, which the kernel also serves."""
    p = prob("bfloat16", (32768, 4096), residual=True)
    cfg = op._full({"regime": "block", "threads": 256, "stage": "pipe", "min_blocks": 2})
    L = op.launch(cfg, p, 132)
    assert L.grid == (264, 1, 1) and L.block == (256, 1, 1) and L.smem_bytes == 2 * 4096 * 2 * 2
    assert op.launch(cfg, prob("bfloat16", (100, 4096), residual=True), 132).grid == (100, 1, 1)
    assert op.launch(cfg, p, 0).grid == (32768, 1, 1)


def test_cluster_pipe_launches_persistent_clusters():
    """stage=pipe in the cluster regime: at most SMs x min_blocks / cluster clusters (never more than
    rows), marked persistent so that the launcher lowers the grid to the clusters resident at once."""
    p = prob("bfloat16", (8192, 262144))
    cfg = op._full({"regime": "cluster", "threads": 512, "cluster": 8, "stage": "pipe"})
    L = op.launch(cfg, p, 132)
    assert L.grid == (128, 1, 1) and L.cluster == (8, 1, 1) and L.persistent and L.smem_bytes == 0
    two = op._full({**cfg, "threads": 256, "min_blocks": 2})
    assert op.launch(two, p, 132).grid == (33 * 8, 1, 1)
    assert op.launch(cfg, prob("bfloat16", (5, 262144)), 132).grid == (
        40,
        1,
        1,
    )  # 5 rows: 5 clusters
    assert op.launch(cfg, p, 0).grid == (8192 * 8, 1, 1)  # SM count unknown
    assert not op.launch({**cfg, "stage": "reg"}, p, 132).persistent


def test_warp_pipe_launches_min_blocks_persistent_blocks_per_sm():
    p = prob("bfloat16", (32768, 256))
    cfg = op._full(
        {"regime": "warp", "threads": 256, "rows_per_group": 2, "stage": "pipe", "min_blocks": 4}
    )
    assert op.check(cfg, p) is None
    L = op.launch(cfg, p, 132)
    assert L.grid == (528, 1, 1) and L.smem_bytes == 0  # 132 x 4; 2048 groups of 16 rows
    assert op.launch(cfg, prob("bfloat16", (100, 256)), 132).grid == (7, 1, 1)
    assert op.launch({**cfg, "stage": "reg"}, p, 132).grid == (2048, 1, 1)


@pytest.mark.compile
def test_warp_pipe_loads_the_next_group_before_it_stores_this_one():
    """Loads of the next row group are issued before the current group's reduction and stores: in
    the loop body, the first x load comes before the first shuffle and the first y store."""
    compiler = pytest.importorskip("ptxbuild.compile.compiler")
    p = prob("bfloat16", (32768, 512))
    cfg = op._full(
        {"regime": "warp", "threads": 256, "rows_per_group": 2, "stage": "pipe", "min_blocks": 2}
    )
    b = compiler.compile_kernel(op.render(cfg, p, "sm_90a"), "sm_90a")
    assert b.spill_bytes == 0 and b.local_bytes == 0, b.log
    body = b.ptx.split("shfl.sync")[0]
    assert (
        body.count("ld.global.v4.u32") == 2 * 2 * 2
    )  # prologue + next group: 2 rows x 2 vectors each
    assert "st.global" not in body


@pytest.mark.compile
def test_pipe_fetches_rows_with_bulk_copies_on_two_mbarriers():
    compiler = pytest.importorskip("ptxbuild.compile.compiler")
    p = prob("float32", (32768, 8192), residual=True)
    cfg = op._full({"regime": "block", "threads": 512, "stage": "pipe"})
    b = compiler.compile_kernel(op.render(cfg, p, "sm_90a"), "sm_90a")
    assert (
        b.ptx.count("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes") == 4
    )  # x, r; 2 sites
    assert b.ptx.count("mbarrier.init.shared::cta.b64") == 2 and "mbarrier.try_wait.parity" in b.ptx
    assert b.spill_bytes == 0 and b.local_bytes == 0, b.log


@pytest.mark.compile
def test_default_params_compile_for_the_matrix_on_sm90a():
    """Every matrix problem's default compiles with 0 spills (distinct sources only: ~50)."""
    compiler = pytest.importorskip("ptxbuild.compile.compiler")
    seen = {}
    for p in matrix():
        k = op.render(op.default_params(p), p, "sm_90a")
        if k.source not in seen:
            seen[k.source] = compiler.compile_kernel(k, "sm_90a")
        assert seen[k.source].spill_bytes == 0, p.label()


def test_baselines_come_from_baselines_py_and_are_not_build_inputs():
    from ptxbuild.oploader import source_files

    assert (
        op.BASELINES_VERSION == "3"
    )  # 3: static torch.compile per shape (2 let dynamo go dynamic)
    assert "baselines.py" not in {p.name for p in source_files(op)}


@pytest.mark.parametrize("opts", [{}, {"residual": True}])
def test_torch_eager_baseline_returns_native_dtype_and_matches_reference(opts):
    torch = pytest.importorskip("torch", reason="the baselines need torch")
    p = Problem.make("rmsnorm", "bfloat16", (8, 256), opts)
    ins = op.make_inputs(p, 1, np)
    ref = op.reference(p, ins, np)
    out = op.baselines(p)["torch_eager"](ins)
    assert out["y"].dtype == torch.bfloat16  # no upcast inside the timed call
    got = to_float(out["y"].view(torch.int16).numpy().view(np.uint16), "bfloat16", np)
    atol, rtol = op.tolerance(p, "y")
    assert np.all(np.abs(got - ref["y"]) <= atol + rtol * np.abs(ref["y"]))


@pytest.mark.compile
@pytest.mark.parametrize("stage", ["reg", "smem"])
def test_cluster_sum_pushes_partials_with_st_async_and_one_cluster_barrier(stage):
    """The cluster regime reduces one-way: each CTA pushes its partial into every CTA's slot with
    st.async (complete_tx on that CTA's mbarrier) and waits on its own mbarrier; the only cluster
    barrier is the start-up one (arrive at kernel start, wait before the first push), none at exit."""
    compiler = pytest.importorskip("ptxbuild.compile.compiler")
    p = prob("bfloat16", (16384, 131072), residual=True)
    extra = {"unroll": 4} if stage == "smem" else {}
    cfg = op._full({"regime": "cluster", "cluster": 4, "threads": 512, "stage": stage, **extra})
    assert op.check(cfg, p) is None
    b = compiler.compile_kernel(op.render(cfg, p, "sm_90a"), "sm_90a")
    ptx = b.ptx
    assert ptx.count("barrier.cluster.arrive") == 1 and ptx.count("barrier.cluster.wait") == 1
    assert (
        ptx.index("barrier.cluster.arrive")
        < ptx.index("barrier.cluster.wait")
        < ptx.index("st.async")
    )
    assert ptx.count("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32") == 1
    assert "mbarrier.arrive.expect_tx" in ptx and "ld.shared::cluster" not in ptx
    assert b.spill_bytes == 0, b.log


def test_with_defines_adds_compiler_flags_and_refuses_what_is_not_a_macro():
    k = op.render(op._full({"regime": "warp"}), prob("bfloat16", (8, 512)), "sm_90a")
    d = k.with_defines("FAST_FRONT=1", "W_EL")
    assert (
        d.flags == k.flags + ("-DFAST_FRONT=1", "-DW_EL")
        and d.source == k.source
        and d.entry == k.entry
    )
    with pytest.raises(ValueError, match="NAME=VALUE"):
        k.with_defines("-DFAST_FRONT=1")


@pytest.mark.compile
def test_fast_front_and_w_el_render_only_when_on_and_change_the_warp_kernel():
    """fast_front / w_el (FAST_FRONT / W_EL in rmsnorm.cu, runs 17f-g, 18e): off, the source is the
    one rendered before they existed (no define; defining them 0 changes nothing); fast_front adds
    the 32-bit unpredicated path (a second copy of the loads), w_el asks L1 to keep the weight."""
    compiler = pytest.importorskip("ptxbuild.compile.compiler")
    p = prob("bfloat16", (32768, 512))
    cfg = op._full(
        {
            "regime": "warp",
            "threads": 32,
            "rows_per_group": 2,
            "load_hint": "none",
            "weight_load": "early",
            "store_cs": True,
        }
    )
    k = op.render(cfg, p, "sm_90a")
    assert "FAST_FRONT 1" not in k.source and "W_EL 1" not in k.source
    assert (
        k.source
        == op.render(
            {n: v for n, v in cfg.items() if n not in ("fast_front", "w_el")}, p, "sm_90a"
        ).source
    )
    base = compiler.compile_kernel(k, "sm_90a")
    off = compiler.compile_kernel(
        k.with_defines("FAST_FRONT=0", "W_EL=0", "H_LATE=0", "RSQ_FTZ=0"), "sm_90a"
    )
    assert off.ptx == base.ptx
    ftz = compiler.compile_kernel(k.with_defines("RSQ_FTZ=1"), "sm_90a")  # experimental, run 19e
    assert "rsqrt.approx.ftz.f32" in ftz.ptx and "rsqrt.approx.ftz" not in base.ptx
    fk = op.render({**cfg, "fast_front": True}, p, "sm_90a")
    assert fk.source.replace("#define FAST_FRONT 1\n", "", 1) == k.source
    fast = compiler.compile_kernel(fk, "sm_90a")
    x_loads = "ld.global.v4.u32"
    assert base.ptx.count(x_loads) == 2 * 2 + 2 and fast.ptx.count(x_loads) == 2 * (2 * 2 + 2)
    assert fast.spill_bytes == 0 and "mul.wide.u32" in fast.ptx
    wel = compiler.compile_kernel(op.render({**cfg, "w_el": True}, p, "sm_90a"), "sm_90a")
    assert "L1::evict_last" in wel.ptx and "L1::evict_last" not in base.ptx
    # H_LATE (experimental, run 19d): residual_out stored after the reduction; the same stores, moved
    pr = prob("float16", (32768, 512), residual=True)
    rk = op.render(cfg, pr, "sm_90a")
    early, late = (
        compiler.compile_kernel(rk.with_defines(f"H_LATE={v}"), "sm_90a") for v in (0, 1)
    )
    assert early.ptx == compiler.compile_kernel(rk, "sm_90a").ptx and late.ptx != early.ptx
    stores = lambda b: b.ptx.count("st.global")  # noqa: E731
    assert stores(late) == stores(early) == 2 * 2 * 2 and late.spill_bytes == 0
    first_store, last_shfl = (
        lambda b: b.ptx.index("st.global"),
        lambda b: b.ptx.rindex("shfl.sync"),
    )
    assert first_store(early) < last_shfl(early) and first_store(late) > last_shfl(late)
