"""The per-call launch path on the CPU, through a fake driver (tests/runtime_fakes.py): a call shape
is resolved and checked once, later calls only patch pointers into the packed argument buffer and
launch; the custom op traces under torch.compile(fullgraph=True) and launches the same way."""

import struct

import numpy as np
import pytest

from ptxbuild.build.run import build
from ptxbuild.problem import Problem
from ptxbuild.runtime import LoaderError, load

from . import runtime_fakes as fakes
from .conftest import make_ctx
from .test_runtime import BAKED

torch = pytest.importorskip("torch", reason="torch is not installed (pip install -e '.[torch]')")


@pytest.fixture
def scale(proj, monkeypatch):
    with open(proj / "ops" / "scale" / "op.py", "a") as f:
        f.write(BAKED)  # N compiled in: another N cannot reuse a binary
    assert all(r.status == "built" for r in build(make_ctx(proj)))
    launches = fakes.install(monkeypatch)
    return load(proj / "build" / "scale@h100"), launches


def _count(monkeypatch, cls, name):
    calls = []
    orig = getattr(cls, name)

    def wrapped(self, *a, **kw):
        calls.append(a)
        return orig(self, *a, **kw)

    monkeypatch.setattr(cls, name, wrapped)
    return calls


def test_a_call_shape_is_resolved_once_then_only_pointers_change(scale, monkeypatch):
    k, launches = scale
    from ptxbuild.runtime.kernel import BuiltKernel

    resolves = _count(monkeypatch, BuiltKernel, "_resolve")
    selects = _count(monkeypatch, BuiltKernel, "select")
    x = torch.randn(64, 1024)
    y = k(x)
    assert y.shape == x.shape and y.dtype == x.dtype and y.data_ptr() != x.data_ptr()
    (first,) = launches
    problem = Problem.make("scale", "float32", (64, 1024))
    geom = k.op.launch(k.select(problem).params, problem, 132)
    assert first["handle"] == 1000 and first["stream"] == 77
    assert first["grid"] == tuple(geom.grid) and first["block"] == tuple(geom.block)
    assert fakes.ptr(first, 0) == y.data_ptr() and fakes.ptr(first, 1) == x.data_ptr()
    assert struct.unpack("<q", fakes.arg(first, 2))[0] == 64 * 1024
    assert struct.unpack("<f", fakes.arg(first, 3, 4))[0] == 2.0
    n_resolves, n_selects = len(resolves), len(selects)
    x2 = torch.randn(64, 1024)
    y2 = k(x2)
    assert len(resolves) == n_resolves and len(selects) == n_selects  # a dictionary hit
    assert fakes.ptr(launches[1], 0) == y2.data_ptr() and fakes.ptr(launches[1], 1) == x2.data_ptr()
    assert launches[1]["params"] == first["params"]  # the same buffer, patched
    k(torch.randn(5, 1024))  # another M: resolved (the binary is reused), another grid
    assert len(resolves) == n_resolves + 1 and launches[2]["grid"] != first["grid"]
    assert k.calls == 3


def test_checks_run_at_the_first_call_of_a_shape(scale):
    k, launches = scale
    x = torch.randn(64, 1024)
    for call, want in [
        (lambda: k(torch.randn(1024, 64).t()), "input x is not contiguous"),
        (
            lambda: k(torch.randn(64 * 1024 + 1)[1:].view(64, 1024)),
            "input x is not 16-byte aligned",
        ),
        (lambda: k(x.double()), "dtype float64 of input x is not built"),
        (lambda: k(torch.randn(5, 1000)), "no built variant covers float32[5x1000]"),
        (lambda: k(x, x), "match no built mode"),
    ]:
        with pytest.raises(LoaderError) as exc:
            call()
        assert want in str(exc.value) and "\n" not in str(exc.value), str(exc.value)
    assert launches == []


def test_run_returns_outputs_by_name_through_the_same_launch(scale):
    k, launches = scale
    x = torch.randn(7, 100)
    out = k.run(x)
    assert list(out) == ["y"] and fakes.ptr(launches[0], 0) == out["y"].data_ptr()


def test_custom_op_traces_with_fullgraph_and_launches(scale):
    k, launches = scale
    from ptxbuild.torch_ops import register

    op = register(k)
    x = torch.randn(64, 1024)
    f = torch.compile(lambda t: op(t) * 1.0, backend="aot_eager", fullgraph=True)
    y = f(x)
    assert y.shape == x.shape and len(launches) == 1
    assert fakes.ptr(launches[0], 1) == x.data_ptr()


def test_bindings_launcher_is_selectable(scale, monkeypatch):
    from ptxbuild.runtime import fast

    monkeypatch.setenv("PTXBUILD_LAUNCHER", "nope")
    with pytest.raises(LoaderError, match="PTXBUILD_LAUNCHER='nope': use one of ctypes, bindings"):
        fast.launcher()
    monkeypatch.setenv("PTXBUILD_LAUNCHER", "bindings")
    assert fast.launcher() == "bindings"


# ---------------------------------------------------------------- KDA: chunk_kda's interface
H, K = 64, 128
MIXED = [1300, 547, 2048, 963, 271, 3063]


def variant1(op, problem):
    """The locked kda@h200 configs' prepare (variant 1, compact): the argument layout checked below."""
    return {**op.with_prep_variant(op.default_params(problem), 1), "prep_compact": 1}


@pytest.fixture
def kda(tmp_path, monkeypatch):
    build_dir = fakes.fake_kda_build(
        tmp_path, [((8192, H), {}), ((8192, H), {"lengths": MIXED})], params_of=variant1
    )
    launches = fakes.install(monkeypatch)
    return load(build_dir, op_folder=fakes.ROOT / "ops" / "kda"), launches


def test_kda_with_the_persistent_x1w_prepare(tmp_path, monkeypatch):
    """prep_variant 4 (the op's default where it applies): kda_prepare_x1w's persistent grid and its
    own argument list, then the same recurrence on the workspace it wrote."""
    build_dir = fakes.fake_kda_build(tmp_path, [((8192, H), {})])
    launches = fakes.install(monkeypatch)
    k = load(build_dir, op_folder=fakes.ROOT / "ops" / "kda")
    t = _inputs(1, 40)
    o, hT = k(**t, output_final_state=True, state_v_first=True, **FLAGS)
    prep, rec = launches
    problem = Problem.make("kda", "bfloat16", (40, H))
    params = k.select(problem).params
    assert params["prep_variant"] == k.op.X1W
    geoms = k.op.launches(params, problem, fakes.DEV.sm_count)
    assert list(geoms) == ["kda_prepare_x1w", "kda_recurrence"]
    assert (
        prep["grid"] == (3 * H, 1, 1) == tuple(geoms["kda_prepare_x1w"].grid)
    )  # 3 chunks x 64 heads
    assert prep["smem"] == 29504 and rec["grid"] == tuple(geoms["kda_recurrence"].grid)
    # kda_prepare_x1w(q, k, v, a, b, A_log, dt_bias, chunk_start, chunk_len, ws, scale, nc, mask)
    for j, name in [
        (0, "q"),
        (1, "k"),
        (2, "v"),
        (3, "g"),
        (4, "beta"),
        (5, "A_log"),
        (6, "dt_bias"),
    ]:
        assert fakes.ptr(prep, j) == t[name].data_ptr(), name
    assert struct.unpack("<f", fakes.arg(prep, 10, 4))[0] == np.float32(K**-0.5)
    assert struct.unpack("<ii", fakes.arg(prep, 11, 4) + fakes.arg(prep, 12, 4)) == (3, 0x7FFFFFFF)
    assert fakes.ptr(rec, 0) == fakes.ptr(prep, 9) and fakes.ptr(rec, 1) == o.data_ptr()


def _inputs(B, T, HV=H, N=None, v_first=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    bf = lambda *s: torch.randn(*s, generator=g).bfloat16()  # noqa: E731
    N = N or B
    state = (N, HV, K, K)
    return dict(
        q=bf(B, T, H, K), k=bf(B, T, H, K), v=bf(B, T, HV, K), g=bf(B, T, HV, K), beta=bf(B, T, HV),
        A_log=torch.rand(HV, generator=g), dt_bias=torch.randn(HV * K, generator=g),
        initial_state=torch.randn(*state, generator=g),
    )  # fmt: skip


FLAGS = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
             safe_gate=True, lower_bound=-5.0)  # fmt: skip


def test_kda_is_callable_like_chunk_kda_and_launches_prepare_then_recurrence(kda):
    k, launches = kda
    assert [m.options for m in k.modes()] == [{}, {"lengths": MIXED}]  # no longer raises
    t = _inputs(1, 40)
    o, hT = k(**t, output_final_state=True, state_v_first=True, **FLAGS)
    assert o.shape == t["v"].shape and o.dtype == torch.bfloat16
    assert hT.shape == (1, H, K, K) and hT.dtype == torch.float32
    prep, rec = launches
    problem = Problem.make("kda", "bfloat16", (40, H))
    params = k.select(problem).params
    geoms = k.op.launches(params, problem, 132)
    assert list(geoms) == ["kda_prepare", "kda_recurrence"]
    assert (prep["handle"], rec["handle"]) == (1000, 1001)
    assert prep["grid"] == tuple(geoms["kda_prepare"].grid)
    assert (
        rec["grid"] == tuple(geoms["kda_recurrence"].grid)
        and rec["smem"] == geoms["kda_recurrence"].smem_bytes
    )
    # prepare(q, k, v, a, g, b, A_log, dt_bias, chunk_start, chunk_len, ws, scale)
    for j, name in [
        (0, "q"),
        (1, "k"),
        (2, "v"),
        (3, "g"),
        (5, "beta"),
        (6, "A_log"),
        (7, "dt_bias"),
    ]:
        assert fakes.ptr(prep, j) == t[name].data_ptr(), name
    assert struct.unpack("<f", fakes.arg(prep, 11, 4))[0] == np.float32(K**-0.5)
    # recurrence(ws, o, h0, hT, cu_seqlens, chunk_offsets, seq_order)
    assert fakes.ptr(rec, 0) == fakes.ptr(prep, 10)  # the workspace prepare wrote
    assert fakes.ptr(rec, 1) == o.data_ptr() and fakes.ptr(rec, 3) == hT.data_ptr()
    assert fakes.ptr(rec, 2) == t["initial_state"].data_ptr()  # V-first: no copy


def test_kda_varlen_uses_a_built_variant_of_other_lengths_with_its_layout(kda):
    k, launches = kda
    t = _inputs(1, 40, N=2)
    cu = torch.tensor([0, 10, 40])
    o, hT = k(**t, output_final_state=True, state_v_first=True, cu_seqlens=cu, **FLAGS)
    assert hT.shape == (2, H, K, K)
    prep, rec = launches
    host = k.op.host
    want = host._layout(np.array([0, 10, 40], np.int64))
    ((prepared, names, _),) = k._prepared.values()
    held = {n: a for n, a in prepared_held(prepared)}
    assert (
        fakes.ptr(prep, 8) in held
        and held[fakes.ptr(prep, 8)].tolist() == want["chunk_start"].tolist()
    )
    assert held[fakes.ptr(rec, 4)].tolist() == [0, 10, 40]
    assert prep["grid"][0] == want["chunk_start"].size  # one prepare block row per chunk


def prepared_held(prepared):
    """(pointer, tensor) of the tensors a prepared launch holds (kept alive by the ChunkKDA key)."""
    return [(int(t.data_ptr()), t) for t in prepared.held.values()]


def test_kda_state_k_first_is_transposed_and_a_missing_state_is_zero(kda):
    k, launches = kda
    t = _inputs(1, 33)
    t["initial_state"] = t["initial_state"].transpose(-1, -2).contiguous()  # fla's [N, HV, K, V]
    o, hT = k(**t, output_final_state=True, **FLAGS)
    assert hT.shape == (1, H, K, K) and not hT.is_contiguous()  # a view of the V-first state
    assert fakes.ptr(launches[1], 2) != t["initial_state"].data_ptr()  # a V-first copy went in
    o, none = k(**{**t, "initial_state": None}, **FLAGS)
    assert none is None and o.shape == t["v"].shape


def test_kda_refusals_are_one_line(kda):
    k, launches = kda
    t = _inputs(1, 40)
    cases = [
        (dict(FLAGS, safe_gate=False), t, "safe_gate=False"),
        (dict(FLAGS, use_beta_sigmoid_in_kernel=False), t, "use_beta_sigmoid_in_kernel=False"),
        (dict(FLAGS, lower_bound=-3.0), t, "lower_bound=-3.0: the kernels are built for -5.0"),
        (dict(FLAGS, scale=0.5), t, "scale=0.5: the kernels are built for K^-1/2"),
        (dict(FLAGS, allow_neg_eigval=True), t, "allow_neg_eigval"),
        (FLAGS, {**t, "q": t["q"].float()}, "q is float32[1, 40, 64, 128], expected bfloat16"),
        (
            FLAGS,
            {**_inputs(1, 40, HV=H), "A_log": torch.rand(3)},
            "A_log has 3 values, expected 64",
        ),
        (dict(FLAGS, cu_seqlens=torch.tensor([0, 20, 80])), _inputs(2, 40), "batch size 1"),
        (dict(FLAGS, cu_seqlens=torch.tensor([0, 20, 30])), t, "cu_seqlens sums to 30"),
    ]
    for flags, ins, want in cases:
        with pytest.raises(LoaderError) as exc:
            k(**ins, **flags)
        assert want in str(exc.value) and "\n" not in str(exc.value), (want, str(exc.value))
    h32 = {
        **_inputs(1, 40),
        "q": torch.zeros(1, 40, 32, K).bfloat16(),
        "k": torch.zeros(1, 40, 32, K).bfloat16(),
    }
    ok, why = k.covers(**h32, **FLAGS)
    assert not ok and "no built variant covers bfloat16[40x32]" in why and "8192x64" in why
    # q and k not normalised in the kernel: only the l2norm variant is built, so no silent normalising
    ok, why = k.covers(**t, **dict(FLAGS, use_qk_l2norm_in_kernel=False))
    assert not ok and "covers bfloat16[40x64] with use_qk_l2norm_in_kernel=False" in why, why
    assert k.covers(**t, **FLAGS) == (True, None) and launches == []


def test_kda_custom_op_traces_with_fullgraph(kda):
    k, launches = kda
    from ptxbuild.torch_ops import register

    op = register(k)
    t = _inputs(1, 40)

    def f(q, kk, v, g, beta, A_log, dt_bias, h0):
        o, hT = op(q, kk, v, g, beta, A_log, dt_bias, h0, None, True)
        return o.float().sum() + hT.sum()

    c = torch.compile(f, backend="aot_eager", fullgraph=True)
    c(t["q"], t["k"], t["v"], t["g"], t["beta"], t["A_log"], t["dt_bias"], t["initial_state"])
    assert [la["handle"] for la in launches] == [1000, 1001]


def test_fla_drop_in_patches_the_layer_and_falls_back(kda, monkeypatch):
    import sys
    import types
    import warnings

    k, launches = kda
    from ptxbuild.runtime import fla as ptxfla

    calls = []

    def fla_chunk_kda(q, k_, v, g, beta, **kw):
        calls.append(kw)
        return torch.zeros_like(v), None

    layer = types.ModuleType("fla.layers.kda")
    layer.chunk_kda = fla_chunk_kda
    for name, m in [("fla", types.ModuleType("fla")), ("fla.layers", types.ModuleType("fla.layers")),
                    ("fla.layers.kda", layer)]:  # fmt: skip
        monkeypatch.setitem(sys.modules, name, m)
    assert "replaced fla.layers.kda.chunk_kda" in ptxfla.install(k)
    t = _inputs(1, 40)
    o, _ = layer.chunk_kda(**t, state_v_first=True, **FLAGS)
    assert len(launches) == 2 and calls == []
    with pytest.warns(RuntimeWarning, match="safe_gate=False.*running fla's chunk_kda instead"):
        layer.chunk_kda(**t, **dict(FLAGS, safe_gate=False))
    assert len(calls) == 1 and calls[0]["safe_gate"] is False
    t["q"].requires_grad_(True)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        layer.chunk_kda(**t, **FLAGS)
    assert len(calls) == 2 and "forward only" in str(w[0].message)
    ptxfla.uninstall()
    assert layer.chunk_kda is fla_chunk_kda


def test_fla_backend_registers_in_flas_registry(kda, monkeypatch):
    import sys
    import threading
    import types

    k, launches = kda
    from ptxbuild.runtime import fla as ptxfla

    class BaseBackend:
        pass

    class Registry:
        def __init__(self):
            self._backends, self._lock, self.active = {}, threading.RLock(), None

        def register(self, b):
            self._backends[b.backend_type] = b
            self._update_active_backend()

        def _update_active_backend(self):
            self.active = min(self._backends.values(), key=lambda b: b.priority, default=None)

    registry = Registry()
    backends = types.ModuleType("fla.ops.backends")
    backends.BaseBackend = BaseBackend
    kda_backends = types.ModuleType("fla.ops.kda.backends")
    kda_backends.kda_registry = registry
    for name, m in [("fla", types.ModuleType("fla")), ("fla.ops", types.ModuleType("fla.ops")),
                    ("fla.ops.backends", backends), ("fla.ops.kda", types.ModuleType("fla.ops.kda")),
                    ("fla.ops.kda.backends", kda_backends)]:  # fmt: skip
        monkeypatch.setitem(sys.modules, name, m)
    assert "registered backend 'ptxbuild'" in ptxfla.install(k)
    be = registry.active
    assert be.backend_type == "ptxbuild" and be.priority == 0
    t = _inputs(1, 40)
    assert be.chunk_kda_verifier(**t, **FLAGS) == (True, None)
    ok, why = be.chunk_kda_verifier(**t, **dict(FLAGS, safe_gate=False))
    assert not ok and "safe_gate=False" in why
    o, hT = be.chunk_kda(**t, output_final_state=True, state_v_first=True, **FLAGS)
    assert len(launches) == 2 and hT.shape == (1, H, K, K)
    with torch.enable_grad():
        t["v"].requires_grad_(True)
        assert be.chunk_kda_verifier(**t, **FLAGS) == (
            False,
            "ptxbuild's KDA kernels are forward only",
        )
    ptxfla.uninstall()
    assert registry._backends == {}


def test_torch_op_is_direct_in_eager_and_the_custom_op_when_compiling(scale, monkeypatch):
    k, launches = scale
    from ptxbuild.runtime.kernel import BuiltKernel

    fn = k.torch_op
    assert fn is k.torch_op and fn.kernel is k
    ops = _count(monkeypatch, type(fn.op), "__call__")
    x = torch.randn(64, 1024)
    fn(x)
    assert len(launches) == 1 and ops == []  # eager: no dispatcher round trip
    f = torch.compile(lambda t: fn(t) + 1, backend="aot_eager", fullgraph=True)
    f(x)
    assert len(launches) == 2 and len(ops) >= 1
    with torch.enable_grad():
        y = fn(x.clone().requires_grad_(True))
    assert y.requires_grad  # through the custom op: backward raises, never a silent cut
    assert isinstance(k, BuiltKernel)
