"""Training through ptxbuild.patch_rmsnorm on the CPU (issue 28, item 1): the real rmsnorm and
rmsnorm_bwd ops, built compile-only with the fake compiler, loaded with allow_fallback=True so
that a call runs the op's float64 reference (the CPU's stand-in for the kernel): gradients of a
patched model match torch's autograd of the stock model; the backward goes to the built backward
target where it covers the call and to torch's closed form where none does; under a fake driver
the backward launches the two backward kernels with the saved tensors' pointers."""

import copy
import warnings
from pathlib import Path

import pytest

from ptxbuild.build.run import build

from . import runtime_fakes as fakes
from .conftest import make_ctx

torch = pytest.importorskip("torch", reason="torch is not installed (pip install -e '.[test]')")
from .tiny_decoder import TinyDecoder  # noqa: E402 (needs torch, skipped above)

ROOT = Path(__file__).resolve().parents[1]
N = 64


def _project(d: Path, bwd_shapes=((64, N),), dtypes=("float32", "bfloat16"), options="") -> Path:
    d.mkdir(parents=True, exist_ok=True)
    dt = ", ".join(f'"{t}"' for t in dtypes)
    (d / "kernelfile.toml").write_text(
        '[project]\nname = "train-test"\n\n[gpus.h200]\n\n'
        f'[ops.rmsnorm]\ntemplate = "{ROOT / "ops" / "rmsnorm"}"\ndtypes = [{dt}]\n'
        f"shapes = [[64, {N}]]\n{options}\n"
        f'[ops.rmsnorm_bwd]\ntemplate = "{ROOT / "ops" / "rmsnorm_bwd"}"\ndtypes = [{dt}]\n'
        f"shapes = {[list(s) for s in bwd_shapes]}\n{options}"
    )
    assert all(r.status == "built" for r in build(make_ctx(d)))
    return d / "kernelfile.toml"


@pytest.fixture(scope="module")
def kf(tmp_path_factory):
    return _project(tmp_path_factory.mktemp("train"))


def _load(kf, target):
    import ptxbuild

    return ptxbuild.load(target, kernelfile=kf, allow_fallback=True)


@pytest.fixture
def ran(monkeypatch):
    """target -> the problems whose calls ran its reference (on the CPU: what a launch computes)."""
    from ptxbuild.runtime.kernel import BuiltKernel

    calls: dict = {}
    orig = BuiltKernel._fallback

    def counted(self, problem, arrays, why):
        calls.setdefault(self.target, []).append(problem)
        return orig(self, problem, arrays, why)

    monkeypatch.setattr(BuiltKernel, "_fallback", counted)
    return calls


def Net(dtype):
    return TinyDecoder(N, dtype)


def _grads(model, x, dy):
    x = x.clone().requires_grad_(True)
    (model(x).float() * dy).sum().backward()
    return [x.grad] + [p.grad for p in model.parameters()]


TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (3e-2, 2e-2)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gradients_of_a_patched_model_match_torch_and_run_the_built_backward(kf, dtype, ran):
    import ptxbuild

    fwd = _load(kf, "rmsnorm@h200")
    stock = Net(dtype)
    patched = copy.deepcopy(stock)
    assert ptxbuild.patch_rmsnorm(patched, kernel=fwd, kernelfile=kf, cuda_only=False) == 3
    assert "backward=rmsnorm_bwd@h200" in repr(patched.norms[0])  # found through the kernelfile
    x = torch.randn(4, 16, N, dtype=dtype)  # M = 64 rows per norm
    dy = torch.randn(4, 16, N)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the reference fallback says it is slow
        want, got = _grads(stock, x, dy), _grads(patched, x, dy)
    # every norm: ptxbuild's forward and backward
    assert len(ran["rmsnorm@h200"]) == 3 and len(ran["rmsnorm_bwd@h200"]) == 3
    assert all(p.shape == (64, N) and p.dtype == str(dtype)[6:] for p in ran["rmsnorm_bwd@h200"])
    atol, rtol = TOL[dtype]
    for w, g in zip(want, got):
        assert g is not None and g.dtype == w.dtype
        torch.testing.assert_close(g.float(), w.float(), atol=atol, rtol=rtol)
    # the weights' gradients are real values, not zeros that would also be "close"
    assert float(got[-1].abs().max()) > 1e-3


def test_without_a_built_backward_the_closed_form_gives_the_same_gradients(kf):
    import ptxbuild

    fwd = _load(kf, "rmsnorm@h200")
    stock = Net(torch.float32)
    patched = copy.deepcopy(stock)
    ptxbuild.patch_rmsnorm(patched, kernel=fwd, backward=None, cuda_only=False)
    assert "backward=torch closed form" in repr(patched.norms[0])
    x, dy = torch.randn(64, N), torch.randn(64, N)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for w, g in zip(_grads(stock, x, dy), _grads(patched, x, dy)):
            torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def test_a_declared_backward_never_built_is_named_not_skipped_in_silence(tmp_path):
    import shutil

    import ptxbuild

    kfp = _project(tmp_path / "p", dtypes=("float32",))
    shutil.rmtree(kfp.parent / "build" / "rmsnorm_bwd@h200")  # declared, not (or no longer) built
    fwd = _load(kfp, "rmsnorm@h200")
    patched = Net(torch.float32)
    with pytest.warns(UserWarning, match="rmsnorm_bwd@h200: declared but not built") as seen:
        ptxbuild.patch_rmsnorm(patched, kernel=fwd, kernelfile=kfp, cuda_only=False)
    assert "ptxbuild build rmsnorm_bwd@h200" in str(seen[0].message)
    assert "backward=torch closed form" in repr(patched.norms[0])
    with warnings.catch_warnings():  # built again: no warning, the built backward is found
        warnings.simplefilter("error")
        build(make_ctx(kfp.parent))
        assert (kfp.parent / "build" / "rmsnorm_bwd@h200" / "manifest.json").is_file()
        again = Net(torch.float32)
        ptxbuild.patch_rmsnorm(again, kernel=fwd, kernelfile=kfp, cuda_only=False)
    assert "backward=rmsnorm_bwd@h200" in repr(again.norms[0])


def test_a_shape_no_backward_covers_takes_the_closed_form(tmp_path, ran):
    """The backward is built for N = 32 only: calls of N = 64 get torch's closed form."""
    import ptxbuild
    from ptxbuild.runtime.autograd import reference_backward

    kf = _project(tmp_path / "p", bwd_shapes=((64, 32),), dtypes=("float32",))
    fwd, bwd = _load(kf, "rmsnorm@h200"), _load(kf, "rmsnorm_bwd@h200")
    stock = Net(torch.float32)
    patched = copy.deepcopy(stock)
    ptxbuild.patch_rmsnorm(patched, kernel=fwd, backward=[bwd], cuda_only=False)
    x, dy = torch.randn(64, N), torch.randn(64, N)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for w, g in zip(_grads(stock, x, dy), _grads(patched, x, dy)):
            torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
    assert len(ran["rmsnorm@h200"]) == 3 and "rmsnorm_bwd@h200" not in ran
    # the closed form itself, against autograd in float64, with a residual gradient and a bias
    h = torch.randn(9, 40, dtype=torch.float64, requires_grad=True)
    w = (torch.rand(40, dtype=torch.float64) + 0.5).requires_grad_(True)
    b = torch.zeros(40, dtype=torch.float64, requires_grad=True)
    g, dres = torch.randn(9, 40, dtype=torch.float64), torch.randn(9, 40, dtype=torch.float64)
    y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * w + b
    ((y * g).sum() + (h * dres).sum()).backward()
    dx, dw, db = reference_backward(h.detach(), g, w.detach(), dres=dres, eps=1e-6, bias=True)
    for got, want in ((dx, h.grad), (dw, w.grad), (db, b.grad)):
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_compiled_forward_and_backward_trace_with_no_graph_break(kf, ran):
    import ptxbuild

    fwd, bwd = _load(kf, "rmsnorm@h200"), _load(kf, "rmsnorm_bwd@h200")
    stock = Net(torch.float32)
    patched = copy.deepcopy(stock)
    ptxbuild.patch_rmsnorm(
        patched, kernel=fwd, backward=[bwd], compiled="ptxbuild", cuda_only=False
    )
    torch._dynamo.reset()
    step = torch.compile(patched, backend="aot_eager", fullgraph=True)  # a graph break raises
    x, dy = torch.randn(64, N), torch.randn(64, N)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        want, got = _grads(stock, x, dy), _grads(step, x, dy)
    assert len(ran["rmsnorm@h200"]) == 3 and len(ran["rmsnorm_bwd@h200"]) == 3
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def test_compiled_regions_take_the_stock_norm_by_default(kf, ran):
    """compiled="stock": inside torch.compile the replaced module's own forward runs (inductor can
    fuse it with its neighbours); the built kernel is not called there."""
    import ptxbuild

    fwd = _load(kf, "rmsnorm@h200")
    patched = Net(torch.float32)
    ptxbuild.patch_rmsnorm(patched, kernel=fwd, cuda_only=False)
    torch._dynamo.reset()
    x = torch.randn(64, N)
    with torch.no_grad():
        want = Net(torch.float32)(x)
        got = torch.compile(patched, backend="aot_eager", fullgraph=True)(x)
    torch.testing.assert_close(got, want)
    assert ran == {}
    with pytest.raises(ValueError, match="compiled='both': use 'stock' or 'ptxbuild'"):
        ptxbuild.patch_rmsnorm(Net(torch.float32), kernel=fwd, compiled="both")


def test_a_shape_the_forward_does_not_cover_runs_the_stock_module_once_refused(kf):
    import ptxbuild

    fwd = ptxbuild.load("rmsnorm@h200", kernelfile=kf)  # no fallback: N = 128 is refused
    seq = torch.nn.Sequential(torch.nn.RMSNorm(2 * N, 1e-6))
    seq[0].weight.data.uniform_(0.5, 1.5)
    ptxbuild.patch_rmsnorm(seq, kernel=fwd, cuda_only=False)
    x = torch.randn(4, 2 * N)
    with pytest.warns(UserWarning, match=r"no built variant covers float32\[4x128\]"):
        y = seq(x)
    torch.testing.assert_close(y, torch.nn.functional.rms_norm(x, (2 * N,), seq[0].weight, 1e-6))
    assert (x.shape, x.dtype) in seq[0]._refused
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # remembered: no second attempt, no second warning
        seq(x)


def test_backward_launches_both_kernels_with_the_saved_tensors(kf, monkeypatch):
    """Under the fake driver: the backward's two kernels (rmsnorm_bwd, rmsnorm_bwd_reduce) are
    launched on the current stream, the first reading x, dy, the weight and rstd (computed from
    x: this forward mode writes none)."""
    from ptxbuild.runtime.autograd import register_rmsnorm_training

    launches = fakes.install(monkeypatch)
    import ptxbuild

    fwd = ptxbuild.load("rmsnorm@h200", kernelfile=kf)
    bwd = ptxbuild.load("rmsnorm_bwd@h200", kernelfile=kf)
    op = register_rmsnorm_training(fwd, [bwd])
    x = torch.randn(64, N, requires_grad=True)
    w = torch.rand(N, requires_grad=True)
    y = op(x, w)
    assert len(launches) == 1 and fakes.ptr(launches[0], 0) == x.data_ptr()
    dy = torch.randn(64, N)
    y.backward(dy)
    first, reduce = launches[1:]
    assert first["handle"] != reduce["handle"] and first["stream"] == reduce["stream"] == 77
    assert fakes.ptr(first, 0) == x.data_ptr() and fakes.ptr(first, 1) == dy.data_ptr()
    assert fakes.ptr(first, 2) == w.data_ptr()
    assert fakes.ptr(first, 3) not in (0, x.data_ptr(), dy.data_ptr())  # rstd, made from x
    assert bwd.calls == 1 and x.grad.shape == x.shape and w.grad.shape == w.shape


def test_two_projects_backwards_of_one_target_name_keep_their_own_ops(kf, tmp_path, ran):
    """A second project's rmsnorm_bwd@h200 whose first mode has a bias (three gradients) gets a
    custom op of its own: it does not run through the op that the first project's (two gradients,
    the same name) defined, and both projects' gradients stay right."""
    from ptxbuild.runtime.autograd import reference_backward, register_rmsnorm_training

    kb = _project(tmp_path / "b", dtypes=("float32",), options="options = { bias = true }\n")
    x, dy, w = torch.randn(64, N), torch.randn(64, N), torch.rand(N) + 0.5
    for kfile, bias in ((kf, False), (kb, True), (kf, False)):
        op = register_rmsnorm_training(
            _load(kfile, "rmsnorm@h200"), [_load(kfile, "rmsnorm_bwd@h200")]
        )
        ins = [x.clone().requires_grad_(True), w.clone().requires_grad_(True)]
        ins += [torch.zeros(N, requires_grad=True)] * bias
        op(*ins).backward(dy)
        want = reference_backward(x, dy, w, eps=1e-6, bias=bias)
        for t, g in zip(ins, want):
            torch.testing.assert_close(t.grad, g, atol=1e-5, rtol=1e-5)
    assert len(ran["rmsnorm_bwd@h200"]) == 3  # each backward ran the built kernel's path
