"""On a GPU (issue 29, item 2): the built RMSNorm backward as the forward custom op's autograd
formula. A small project (one row length, the forward and backward targets) is built compile-only
in a temporary folder (`ptxbuild build --no-gpu`: default configs, a few seconds), loaded, and its
gradients compared with float64 autograd of the eager formula for every mode; then forward +
backward under torch.compile(fullgraph=True) (a graph break fails it).

    python -m pytest -q -m gpu tests/test_rmsnorm_bwd_autograd_gpu.py
"""

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ptxbuild.gpu import gpu_available

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not gpu_available(), reason="needs an NVIDIA GPU and cupy (pip install cupy-cuda13x)"
    ),
]
torch = pytest.importorskip("torch")
from .tiny_decoder import TinyDecoder  # noqa: E402 (needs torch, skipped above)

ROOT = Path(__file__).resolve().parents[1]
N = 1024
FWD_MODES = {
    "rstd": {"rstd": True},
    "residual": {"residual": True, "rstd": True},
    "fp32w-bias": {"weight": "fp32", "bias": True, "rstd": True},
    "no-rstd": {},
}
BWD_MODES = [
    {},
    {"residual": True, "dresidual_in": True},
    {"weight": "fp32", "bias": True},
    {"rstd_in": False},
]
DX_TOL = {"bfloat16": (3e-2, 1e-2), "float16": (5e-3, 2e-3), "float32": (1e-4, 1e-4)}


def _toml(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    return f'"{v}"' if isinstance(v, str) else str(v)


def _modes(ms):
    return (
        "["
        + ", ".join("{" + ", ".join(f"{k} = {_toml(v)}" for k, v in m.items()) + "}" for m in ms)
        + "]"
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from ptxbuild.runtime import _device

    if _device(0).cc != 90:
        pytest.skip("the temporary project targets h200 (sm_90a)")
    d = tmp_path_factory.mktemp("bwd_project")
    (d / "kernelfile.toml").write_text(
        '[project]\nname = "bwd-autograd-test"\n\n[gpus.h200]\n\n'
        f'[ops.rmsnorm]\ntemplate = "{ROOT / "ops" / "rmsnorm"}"\n'
        f'dtypes = ["bfloat16", "float16", "float32"]\nshapes = [[512, {N}]]\n'
        f"modes = {_modes(FWD_MODES.values())}\n\n"
        f'[ops.rmsnorm_bwd]\ntemplate = "{ROOT / "ops" / "rmsnorm_bwd"}"\n'
        f'dtypes = ["bfloat16", "float16", "float32"]\nshapes = [[512, {N}]]\n'
        f"modes = {_modes(BWD_MODES)}\n"
    )
    # in a fresh process (not CliRunner in this one, where CUDA is initialized already and the
    # compile pool would fork it), not quiet: a failure shows each problem's outcome
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    res = subprocess.run(
        [sys.executable, "-m", "ptxbuild.cli", "build", "--no-gpu"],
        cwd=d, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert res.returncode == 0, f"exit {res.returncode}\n{res.stdout}\n{res.stderr}"
    import ptxbuild

    return (
        ptxbuild.load(d / "build" / "rmsnorm@h200", op_folder=ROOT / "ops" / "rmsnorm"),
        ptxbuild.load(d / "build" / "rmsnorm_bwd@h200", op_folder=ROOT / "ops" / "rmsnorm_bwd"),
    )


def _eager64(x, w, b, r, eps=1e-6):
    h = x if r is None else x + r
    y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if w is not None:
        y = y * w
    if b is not None:
        y = y + b
    return y, h


def _case(built, dtype, mode, m=77):
    from ptxbuild.runtime.autograd import register_rmsnorm_training

    fwd, bwd = built
    opts = FWD_MODES[mode]
    rms = register_rmsnorm_training(fwd, bwd, opts)
    dt = getattr(torch, dtype)
    wdt = torch.float32 if opts.get("weight") == "fp32" else dt
    g = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randn(m, N, device="cuda", generator=g).to(dt).requires_grad_()
    r = (
        torch.randn(m, N, device="cuda", generator=g).to(dt).requires_grad_()
        if opts.get("residual")
        else None
    )
    w = (1 + 0.1 * torch.randn(N, device="cuda", generator=g)).to(wdt).requires_grad_()
    b = (
        (0.1 * torch.randn(N, device="cuda", generator=g)).to(wdt).requires_grad_()
        if opts.get("bias")
        else None
    )
    dy = torch.randn(m, N, device="cuda", generator=g).to(dt)
    dres = torch.randn(m, N, device="cuda", generator=g).to(dt) if r is not None else None
    args = [t for t in (x, r, w, b) if t is not None]
    return rms, opts, args, (x, r, w, b), dy, dres


def _loss(outs, dy, dres):
    y = outs[0]
    loss = (y.float() * dy.float()).sum()
    if dres is not None:
        loss = loss + (outs[1].float() * dres.float()).sum()
    return loss


def _check(dtype, leaves, dy, dres, m):
    x, r, w, b = leaves
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    b64 = b.detach().double().requires_grad_() if b is not None else None
    # the kernels normalize the stored h (rounded to x's dtype), as the forward does
    h_stored = None if r is None else (x.detach().float() + r.detach().float()).to(x.dtype).double()
    if r is None:
        y, h = _eager64(x64, w64, b64, None)
        loss = (y * dy.double()).sum()
        loss.backward()
        gx = x64.grad
    else:
        h = h_stored.requires_grad_()
        y, _ = _eager64(h, w64, b64, None)
        loss = (y * dy.double()).sum() + (h * dres.double()).sum()
        loss.backward()
        gx = h.grad
    atol, rtol = DX_TOL[dtype]
    torch.testing.assert_close(x.grad.double(), gx, atol=atol, rtol=rtol)
    if r is not None:
        torch.testing.assert_close(r.grad.double(), gx, atol=atol, rtol=rtol)
    sums_atol = {torch.bfloat16: 2e-3, torch.float16: 5e-4, torch.float32: 3e-5}[
        w.dtype
    ] * math.sqrt(m)
    sums_rtol = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-4}[w.dtype]
    torch.testing.assert_close(w.grad.double(), w64.grad, atol=sums_atol, rtol=sums_rtol)
    if b is not None:
        torch.testing.assert_close(b.grad.double(), b64.grad, atol=sums_atol, rtol=sums_rtol)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("mode", list(FWD_MODES))
def test_gradients_match_float64(built, dtype, mode):
    rms, opts, args, leaves, dy, dres = _case(built, dtype, mode)
    before = built[1].calls
    outs = rms(*args)
    _loss(outs, dy, dres).backward()
    assert built[1].calls == before + 1  # the built backward ran (not a fallback)
    _check(dtype, leaves, dy, dres, 77)


@pytest.mark.parametrize("mode", ["rstd", "residual"])
def test_torch_compile_fullgraph_forward_and_backward(built, mode):
    torch._dynamo.reset()
    rms, opts, args, leaves, dy, dres = _case(built, "bfloat16", mode, m=64)

    def step(*a):
        return _loss(rms(*a), dy, dres)

    compiled = torch.compile(step, fullgraph=True)  # a graph break raises here
    before = built[1].calls
    compiled(*args).backward()
    assert built[1].calls == before + 1
    _check("bfloat16", leaves, dy, dres, 64)


def _Net(dtype):
    return TinyDecoder(N, dtype)


def _net_grads(model, x, dy):
    x = x.clone().requires_grad_(True)
    (model(x).double() * dy.double()).sum().backward()
    return [x.grad] + [p.grad for p in model.parameters()]


@pytest.mark.parametrize("compiled", [False, True])
def test_patch_rmsnorm_trains_on_the_built_forward_and_backward(built, compiled):
    """ptxbuild.patch_rmsnorm (issue 28, item 1): every norm of a bf16 model runs the built
    forward and, in backward, the built backward (rstd from the forward's rstd mode); gradients
    are as close to float64 autograd as torch's own bf16 autograd is (at most 2x its error + a
    small floor); under torch.compile(fullgraph=True) with compiled="ptxbuild" too."""
    import copy

    import ptxbuild

    fwd, bwd = built
    stock = _Net(torch.bfloat16).cuda()
    ref = copy.deepcopy(stock).double()
    patched = copy.deepcopy(stock)
    mode = "ptxbuild" if compiled else "stock"
    assert ptxbuild.patch_rmsnorm(patched, kernel=fwd, backward=[bwd], compiled=mode) == 3
    run = patched
    if compiled:
        torch._dynamo.reset()
        run = torch.compile(patched, fullgraph=True)
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(4, 77, N, device="cuda", generator=g).bfloat16()
    dy = torch.randn(4, 77, N, device="cuda", generator=g).bfloat16()
    f0, b0 = fwd.calls, bwd.calls
    got = _net_grads(run, x, dy)
    assert fwd.calls - f0 == 3 and bwd.calls - b0 == 3, (fwd.calls - f0, bwd.calls - b0)
    want = _net_grads(ref, x.double(), dy)
    base = _net_grads(stock, x, dy)
    for name, w, gp, gs in zip(["x"] + [n for n, _ in stock.named_parameters()], want, got, base):
        err_p = float((gp.double() - w).abs().max())
        err_s = float((gs.double() - w).abs().max())
        floor = 2e-3 * float(w.abs().max())
        print(
            f"{name}: ptxbuild {err_p:.3g}, torch bf16 {err_s:.3g} (max |grad| {float(w.abs().max()):.3g})"
        )
        assert err_p <= 2 * err_s + floor, (name, err_p, err_s)
