"""ops/rmsnorm_bwd (issue 29): the reference against finite differences of the float64 forward,
constraints, geometry and bytes (pure), and the rendered kernels compiled for sm_90a (compile)."""

import itertools
import math
import random
from pathlib import Path

import numpy as np
import pytest

from ptxbuild.dtypes import to_float
from ptxbuild.oploader import load_op
from ptxbuild.problem import Problem

ROOT = Path(__file__).resolve().parents[1]
op = load_op("rmsnorm_bwd", ROOT)

MATRIX = [
    (32768, 256),
    (32768, 512),
    (32768, 1024),
    (32768, 2048),
    (32768, 4096),
    (32768, 8192),
    (32768, 16384),
    (32768, 32768),
    (32768, 65536),
    (16384, 131072),
    (8192, 262144),
]
RES = {"residual": True, "dresidual_in": True}
MODES = [
    {},
    RES,
    {"rstd_in": False},
    {"weight": "fp32", "bias": True},
    {"weight": "none"},
    {"weight": "none", "bias": True, "rstd_in": False},
    {**RES, "weight": "fp32", "rstd_in": False},
]


def P(dtype, shape, opts=None):
    return Problem.make("rmsnorm_bwd", dtype, shape, opts or {})


# ------------------------------------------------------------------ the reference
def _loss(x, w, b, dy, dres, eps):
    """sum(dy * y) + sum(dres * h): its gradient is what the backward returns (h = x here)."""
    r = 1.0 / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + eps)
    y = x * r * (w[None, :] if w is not None else 1.0) + (b[None, :] if b is not None else 0.0)
    return float(np.sum(dy * y) + (np.sum(dres * x) if dres is not None else 0.0))


@pytest.mark.parametrize(
    "opts", MODES, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "plain"
)
def test_reference_matches_finite_differences_of_the_forward(opts):
    prob = P("float32", (3, 12), opts)
    o = {**op.OPTIONS, **opts}
    inputs = op.make_inputs(prob, 3, np)
    x = inputs["x"].astype(np.float64)
    if o["rstd_in"]:  # the exact rstd of x, so that the gradient through rstd is the closed form's
        inputs["rstd"] = 1.0 / np.sqrt(np.mean(x * x, axis=1) + o["eps"])
    w = inputs["weight"].astype(np.float64) if "weight" in inputs else None
    b = np.linspace(-0.3, 0.2, 12) if o["bias"] else None
    dy, dres = inputs["dy"].astype(np.float64), inputs.get("dres")
    dres = None if dres is None else dres.astype(np.float64)
    ref = op.reference(prob, inputs, np)
    h = 1e-6

    def fd(fn, arr):
        g = np.zeros_like(arr)
        for idx in np.ndindex(arr.shape):
            a1, a2 = arr.copy(), arr.copy()
            a1[idx] += h
            a2[idx] -= h
            g[idx] = (fn(a1) - fn(a2)) / (2 * h)
        return g

    eps = o["eps"]
    gx = fd(lambda a: _loss(a, w, b, dy, dres, eps), x)
    np.testing.assert_allclose(ref["dx"], gx, rtol=1e-5, atol=1e-6)
    if w is not None:
        np.testing.assert_allclose(
            ref["dweight"], fd(lambda a: _loss(x, a, b, dy, dres, eps), w), rtol=1e-6, atol=1e-7
        )
    else:
        assert "dweight" not in ref
    if b is not None:
        np.testing.assert_allclose(
            ref["dbias"], fd(lambda a: _loss(x, w, a, dy, dres, eps), b), rtol=1e-6, atol=1e-7
        )
    else:
        assert "dbias" not in ref


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("shape", [(1, 760), (199, 1128), (5, 256)])
def test_reference_in_chunks_equals_one_float64_pass(dtype, shape, monkeypatch):
    """Odd N (760, 1128), M in {1, 199}: the row-chunked reference (bounded temporaries at 2^31
    elements) gives the same numbers as the formula over the whole tensor at once."""
    prob = P(dtype, shape, {**RES, "bias": True})
    inputs = op.make_inputs(prob, 2, np)
    monkeypatch.setattr(
        op, "_row_chunks", lambda m, n, elems=1 << 25: [slice(r, r + 1) for r in range(m)]
    )
    chunked = op.reference(prob, inputs, np)
    monkeypatch.undo()
    whole = op.reference(prob, inputs, np)
    x = to_float(inputs["x"], dtype, np).astype(np.float64)
    dy = to_float(inputs["dy"], dtype, np).astype(np.float64)
    w = to_float(inputs["weight"], dtype, np).astype(np.float64)
    r = inputs["rstd"].astype(np.float64)[:, None]
    dx = r * dy * w - x * r**3 * np.sum(dy * w * x, axis=1, keepdims=True) / shape[1]
    dx += to_float(inputs["dres"], dtype, np)
    for ref in (chunked, whole):
        np.testing.assert_allclose(ref["dx"], dx, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(
            ref["dweight"], np.sum(dy * x * r, axis=0), rtol=1e-12, atol=1e-9
        )
        np.testing.assert_allclose(ref["dbias"], np.sum(dy, axis=0), rtol=1e-12, atol=1e-9)


def test_make_inputs_rstd_is_the_forwards_and_zero_rows_are_kept():
    prob = P("bfloat16", (9, 64))
    inputs = op.make_inputs(prob, 1, np)  # seed % 3 == 1: zero rows
    x = to_float(inputs["x"], "bfloat16", np).astype(np.float64)
    want = (1.0 / np.sqrt(np.mean(x * x, axis=1) + 1e-6)).astype(np.float32)
    assert inputs["rstd"].dtype == np.float32 and np.array_equal(inputs["rstd"], want)
    assert np.all(x[0] == 0) and inputs["rstd"][0] == np.float32(1e3)
    assert set(inputs) == {"x", "dy", "weight", "rstd"}
    assert set(op.make_inputs(P("float16", (4, 64), RES), 0, np)) == {
        "x",
        "dy",
        "weight",
        "rstd",
        "dres",
    }
    assert set(
        op.make_inputs(P("float16", (4, 64), {"weight": "none", "rstd_in": False}), 0, np)
    ) == {"x", "dy"}


def test_fp32_blocked_sums_stay_inside_the_sqrt_m_band():
    """dweight's tolerance atol = A * sqrt(M): the kernel's fp32 order (sequential per block over its
    rows, then the partial rows in slices) against float64, at the benchmark's largest M."""
    m, n, blocks, split = 32768, 64, 528, 8
    rng = np.random.default_rng(0)
    terms = (rng.standard_normal((m, n)) * rng.standard_normal((m, n))).astype(np.float32)
    part = np.zeros((blocks, n), np.float32)
    for row in range(m):  # block b handles rows b, b + blocks, ...
        part[row % blocks] += terms[row]
    sl = [np.zeros(n, np.float32) for _ in range(split)]
    for p in range(blocks):
        sl[p % split] += part[p]
    got = sl[0].copy()
    for s in sl[1:]:
        got += s
    want = terms.astype(np.float64).sum(axis=0)
    atol, rtol = op.tolerance(P("float32", (m, n), {"weight": "fp32"}), "dweight")
    assert atol == pytest.approx(op.SUM_ATOL["float32"] * math.sqrt(m))
    err = np.abs(got - want)
    assert np.all(err <= atol + rtol * np.abs(want)), float(err.max())
    assert err.max() > 0  # fp32 does differ: the band is not vacuous


# ------------------------------------------------------------------ configs, geometry, bytes
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("shape", MATRIX)
@pytest.mark.parametrize("opts", [{}, RES], ids=["plain", "residual"])
def test_every_benchmark_row_has_a_valid_default(dtype, shape, opts):
    prob = P(dtype, shape, opts)
    d = op.default_params(prob)
    assert op.check(d, prob) is None
    g = op.launches(d, prob, 132)
    main = g["rmsnorm_bwd"]
    ctas = main.grid[0]
    assert ctas % d["cluster"] == 0 and ctas // d["cluster"] <= op.pstride(prob)
    red = g["rmsnorm_bwd_reduce"]
    assert red.grid[0] * (d["red_threads"] // d["red_split"]) * 4 >= shape[1]


def test_bytes_moved_is_the_streams_plus_weight_and_rstd():
    m, n = 32768, 4096
    assert op.bytes_moved(P("bfloat16", (m, n))) == 3 * m * n * 2 + 2 * n * 2 + 4 * m
    assert op.bytes_moved(P("bfloat16", (m, n), RES)) == 4 * m * n * 2 + 2 * n * 2 + 4 * m
    assert (
        op.bytes_moved(P("float32", (m, n), {"weight": "none", "rstd_in": False})) == 3 * m * n * 4
    )
    assert (
        op.bytes_moved(P("bfloat16", (m, n), {"weight": "fp32", "bias": True}))
        == 3 * m * n * 2 + 3 * n * 4 + 4 * m
    )


def test_tolerances():
    assert op.tolerance(P("bfloat16", (199, 760)), "dx") == (3e-2, 1e-2)
    a1, _ = op.tolerance(P("bfloat16", (1, 760)), "dweight")
    a4, r4 = op.tolerance(P("bfloat16", (4, 760)), "dweight")
    assert a4 == pytest.approx(2 * a1) and r4 == 1e-2
    assert op.tolerance(P("bfloat16", (4, 760), {"weight": "fp32"}), "dweight")[1] == 1e-4


def test_check_refuses_what_the_kernel_cannot_do():
    prob = P("bfloat16", (32768, 4096))
    full = op._full
    assert "row_threads" in op.check(full({"row_threads": 8}), prob)
    assert "cluster >= 2" in op.check(full({"regime": "cluster"}), prob)
    assert "long rows" in op.check(full({"regime": "cluster", "cluster": 2}), prob)
    assert "idle" in op.check(full({"threads": 1024}), P("bfloat16", (8, 2048)))
    assert "moot" in op.check(full({"rsqrt": "precise"}), prob)
    assert (
        op.check(full({"rsqrt": "precise"}), P("bfloat16", (32768, 4096), {"rstd_in": False}))
        is None
    )
    assert "multiple" in op.check(full({}), P("bfloat16", (4, 4100)))
    assert "dresidual_in needs" in op.check(
        full({}), P("bfloat16", (4, 4096), {"dresidual_in": True})
    )
    assert "registers" in op.check(
        full({"threads": 128, "blocks_per_sm": 4}), P("float32", (8, 8192))
    )
    assert "reduce" in op.check(full({"pdl": True}), P("bfloat16", (4, 4096), {"weight": "none"}))
    smem = {"stage": "smem", "stages": 2}
    assert op.check(full(smem), prob) is None
    assert "stages only" in op.check(full({"stages": 2}), prob)
    assert "block and cluster" in op.check(full({**smem, "regime": "warp"}), prob)
    assert "moot" in op.check(full({**smem, "load_hint": "none"}), prob)
    assert "use more threads" in op.check(full({**smem, "threads": 32}), prob)
    assert "16-byte" in op.check(full({**smem, "vec_bytes": 8}), P("bfloat16", (4, 4100)))
    # 8 buffers of a residual 16384-row (96 KB each) do not fit; 2 do, but not at 2 blocks per SM
    big = P("bfloat16", (4, 16384), RES)
    assert "do not fit" in op.check(full({**smem, "threads": 512, "stages": 8}), big)
    assert op.check(full({**smem, "threads": 512}), big) is None
    assert "do not fit" in op.check(full({**smem, "threads": 512, "blocks_per_sm": 2}), big)


@pytest.mark.parametrize(
    "shape,opts,want",
    [
        ((8192, 262144), {}, ("cluster", 16, "smem", 3)),
        ((16384, 131072), {}, ("cluster", 8, "smem", 3)),
        ((8192, 262144), RES, ("cluster", 16, "smem", 2)),
        ((16384, 131072), RES, ("cluster", 8, "smem", 2)),
        ((32768, 4096), RES, ("block", 1, "smem", 4)),
        ((32768, 8192), RES, ("block", 1, "smem", 2)),
        ((32768, 32768), RES, ("cluster", 2, "smem", 2)),
        ((32768, 65536), {}, ("cluster", 8, "reg", 1)),
        ((32768, 4096), {}, ("block", 1, "reg", 1)),
    ],
)
def test_defaults_stage_rows_in_shared_memory_where_registers_hold_too_little(shape, opts, want):
    """run26a (H200): the register-held rows reached 72-80% of the floor with a residual from N =
    4096 on, pass2 36-48% at N >= 131072; there the default stages the row part in shared memory
    with >= 64 KB of rows in flight per SM; elsewhere it keeps the register configs that won."""
    prob = P("bfloat16", shape, opts)
    d = op.default_params(prob)
    assert (d["regime"], d["cluster"], d["stage"], d["stages"]) == want
    if d["stage"] == "smem":
        per = op._smem_bytes(d, prob) // d["stages"]
        assert d["blocks_per_sm"] * (d["stages"] - 1) * per >= 64 * 1024
        assert op._geometry(d, prob)[2] <= 4


def test_launches_leave_out_the_reduce_without_sums():
    prob = P("bfloat16", (1000, 4096), {"weight": "none"})
    assert list(op.launches(op.default_params(prob), prob, 132)) == ["rmsnorm_bwd"]
    assert op.make_outputs(prob, np)["partials"].size == 4


def _coverage(p, prob, sm):
    """Python mirror of the kernel's row / column partition: (row, element) -> visits, and the
    partial row each CTA writes."""
    m, n = prob.shape
    grid = op.launches(p, prob, sm)["rmsnorm_bwd"].grid[0]
    g = op._group(p)
    vec = op._vec(p, prob)
    np_, nvp, vpt = op._geometry(p, prob)
    seen = np.zeros((m, n), np.int32)
    parts = set()
    if p["regime"] == "cluster":
        c = p["cluster"]
        q_total = grid // c
        for cta in range(grid):
            cid, rank = divmod(cta, c)
            parts.add((cid, rank))
            for row in range(cid, m, q_total):
                for t in range(p["threads"]):
                    for i in range(vpt):
                        v = i * g + t
                        if v < nvp:
                            lo = rank * np_ + v * vec
                            seen[row, lo : lo + vec] += 1
        return seen, {c_ for c_, _ in parts}
    ng = p["threads"] // g
    q_total = grid * ng
    gpw = 32 // g if g < 32 else 1
    for blk in range(grid):
        parts.add(blk)
        for thr in range(p["threads"]):
            t, grp = thr % g, thr // g
            gw = grp % gpw
            first = blk * ng + (grp - gw)
            r0 = first
            while r0 < m:
                row = r0 + gw
                if row < m:
                    for i in range(vpt):
                        v = i * g + t
                        if v < nvp:
                            seen[row, v * vec : (v + 1) * vec] += 1
                r0 += q_total
    return seen, parts


@pytest.mark.parametrize(
    "case",
    [
        (
            "bfloat16",
            (1031, 256),
            {"regime": "warp", "row_threads": 32, "threads": 256, "blocks_per_sm": 2},
        ),
        ("bfloat16", (77, 128), {"regime": "warp", "row_threads": 8, "threads": 96}),
        ("float32", (45, 760), {"regime": "block", "threads": 64}),
        ("bfloat16", (13, 1128), {"regime": "block", "threads": 128, "vec_bytes": 8}),
        ("bfloat16", (21, 8192), {"regime": "cluster", "cluster": 4, "threads": 256}),
        # stage=smem: the same partition over the staged part; 192 lanes leave a tail of 64 vectors
        (
            "bfloat16",
            (21, 8192),
            {"regime": "cluster", "cluster": 4, "threads": 192, "stage": "smem", "stages": 3},
        ),
        ("float16", (9, 4096), {"regime": "block", "threads": 384, "stage": "smem", "stages": 8}),
    ],
)
def test_every_element_of_every_row_is_handled_once(case):
    dtype, shape, params = case
    prob = P(dtype, shape)
    p = op._full(params)
    assert op.check(p, prob) is None
    seen, parts = _coverage(p, prob, 7)
    assert seen.min() == 1 and seen.max() == 1
    assert len(parts) <= op.pstride(prob)


# ------------------------------------------------------------------ compile
STRUCT = [
    "regime",
    "threads",
    "row_threads",
    "cluster",
    "stage",
    "prefetch",
    "unroll",
    "vec_bytes",
    "blocks_per_sm",
    "stages",
]
HINTS = {
    "load_hint": ["none", "nc_na", "ef"],
    "store_cs": [True],
    "pdl": [True],
    "red_threads": [128, 512],
    "red_split": [4, 32],
}
COMPILE_PROBLEMS = [
    ("bfloat16", (32768, 256), {}),
    ("float16", (32768, 2048), RES),
    ("float32", (32768, 4096), {"weight": "fp32", "bias": True}),
    ("bfloat16", (32768, 65536), {}),
    ("float32", (8192, 262144), RES),
    ("bfloat16", (199, 760), {"rstd_in": False, "bias": True}),
]
SAMPLE = (
    20  # structural configs per problem (seeded sample of all check() accepts) + every hint flip
)
SMEM_SAMPLE = 10  # and this many stage=smem configs more


def _configs(dtype, shape, opts):
    prob = P(dtype, shape, opts)
    ok = []
    for vals in itertools.product(*(op.SPACE[k] for k in STRUCT)):
        p = op._full(dict(zip(STRUCT, vals)))
        if op.check(p, prob) is None:
            ok.append(p)
    random.Random(29).shuffle(ok)
    d = op.default_params(prob)
    flips = [{**d, k: v} for k, vs in HINTS.items() for v in vs]
    if not opts.get("rstd_in", True):
        flips.append({**d, "rsqrt": "precise"})
    smem = [p for p in ok if p["stage"] == "smem"]  # the bulk-copy ring: its own sample
    return (
        prob,
        ok,
        ok[:SAMPLE] + smem[:SMEM_SAMPLE] + [f for f in flips if op.check(f, prob) is None],
    )


@pytest.mark.parametrize("case", COMPILE_PROBLEMS, ids=lambda c: f"{c[0]}-{c[1][1]}-{len(c[2])}")
def test_the_space_has_configs_for_every_regime_that_fits(case):
    _, ok, _ = _configs(*case)
    assert len(ok) >= 4
    n = case[1][1]
    regimes = {p["regime"] for p in ok}
    assert ("cluster" in regimes) == (n >= 8192)
    stages = {p["stage"] for p in ok}
    assert "smem" in stages and ("pass2" in stages) == (n >= 8192)


@pytest.mark.compile
@pytest.mark.parametrize("case", COMPILE_PROBLEMS, ids=lambda c: f"{c[0]}-{c[1][1]}-{len(c[2])}")
def test_configs_compile_for_sm90a_without_spills(case):
    compiler = pytest.importorskip("ptxbuild.compile.compiler")
    from ptxbuild.compile import cubin

    prob, _, cfgs = _configs(*case)
    seen = set()
    for p in cfgs:
        k = op.render(p, prob, "sm_90a")
        if k.source in seen:
            continue
        seen.add(k.source)
        b = compiler.compile_kernel(k, "sm_90a")
        assert b.spill_bytes == 0 and b.local_bytes == 0, (p, b.registers, b.spill_bytes)
        assert f".entry {k.entry}(" in b.ptx and ".entry rmsnorm_bwd_reduce(" in b.ptx
        red = cubin.resources(b.cubin, "rmsnorm_bwd_reduce")
        assert red is not None and red["stack"] == 0
        assert b.registers <= op._reg_cap(p)
