"""The model repository's test: the built rmsnorm through the loader, eagerly and under torch.compile,
against a float reference. Run on the GPU machine from the repository root:

    ptxbuild -f examples/model_repo/kernelfile.toml build rmsnorm@h200     # or: build --locked
    python3 -m pytest -q -m gpu examples/model_repo -rA -s

Without the build this test builds it (the same command); without an H200 it skips with the reason.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the model needs torch")

import model  # noqa: E402

HERE = Path(__file__).resolve().parent
EPS = 1e-6

needs_h200 = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
    reason="needs a CUDA GPU of compute capability 9.0 (the kernels are built for sm_90a, H200)",
)


@pytest.fixture(scope="module")
def kernel():
    if not (HERE / "build" / model.TARGET / "manifest.json").is_file():
        locked = (
            ["--locked"]
            if (HERE / "kernelfile.lock").is_file() and os.environ.get("LOCKED")
            else []
        )
        subprocess.run(
            [
                sys.executable,
                "-m",
                "ptxbuild.cli",
                "-f",
                str(HERE / "kernelfile.toml"),
                "build",
                *locked,
                model.TARGET,
            ],
            check=True,
            cwd=HERE,
        )
    op, k = model.load_kernel()
    assert op is not None, model.kernel_status()
    print(model.kernel_status())
    return k


def reference(x, w, eps=EPS):
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()


def _check(y, ref, what):
    err = (y.float() - ref).abs()
    tol = 3e-2 + 1e-2 * ref.abs()  # the op's bf16 tolerance
    print(
        f"{what}: max abs err {err.max().item():.3e}, worst excess {(err - tol).max().item():.3e}"
    )
    assert y.dtype == torch.bfloat16 and y.is_contiguous() and bool((err <= tol).all()), what


@needs_h200
@pytest.mark.gpu
@pytest.mark.parametrize("m", [64, 8192, 51, 1])  # built shapes, and M the build never saw (same N)
def test_loader_matches_reference(kernel, m):
    g = torch.Generator(device="cuda").manual_seed(m)
    x = torch.randn(m, 2048, device="cuda", generator=g).mul_(3).bfloat16()
    w = (1 + 0.1 * torch.randn(2048, device="cuda", generator=g)).bfloat16()
    _check(kernel(x, w), reference(x, w), f"loader M={m}")


@needs_h200
@pytest.mark.gpu
def test_runs_on_the_callers_stream(kernel):
    x = torch.randn(8192, 2048, device="cuda").bfloat16()
    w = torch.ones(2048, device="cuda").bfloat16()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y = kernel(x, w)
    s.synchronize()
    _check(y, reference(x, w), "side stream")


@needs_h200
@pytest.mark.gpu
def test_compiled_model_matches_reference(kernel):
    torch.manual_seed(0)
    net = model.TinyModel().cuda().bfloat16().eval()
    ref_net = model.TinyModel(use_kernel=False).cuda().bfloat16().eval()
    ref_net.load_state_dict(net.state_dict())
    tokens = torch.randint(0, 256, (4, 16), device="cuda")
    with torch.no_grad():
        h = net.embed(tokens)
        _check(net.norms[0](h), reference(h, net.norms[0].weight), "RMSNorm module")
        compiled = torch.compile(net, fullgraph=True)
        before = kernel.calls
        out = compiled(tokens)
        want = ref_net(tokens)
    assert kernel.calls - before >= 3  # the three RMSNorms ran the built kernel
    err = (out.float() - want.float()).abs().max().item()
    print(f"compiled TinyModel vs torch rms_norm model: max abs logit err {err:.3e}")
    assert torch.allclose(out.float(), want.float(), atol=0.1, rtol=0.05)


@needs_h200
@pytest.mark.gpu
def test_errors_on_the_gpu_are_one_line(kernel):
    from ptxbuild.runtime import LoaderError

    x = torch.randn(64, 2048, device="cuda").bfloat16()
    w = torch.ones(2048, device="cuda").bfloat16()
    for call, want in [
        (lambda: kernel(x.float(), w.float()), "dtype float32 of input x is not built"),
        (lambda: kernel(x[:, ::2], w[::2]), "not contiguous"),
        (lambda: kernel(x[:, :1000].contiguous(), w[:1000]), "no built variant covers"),
        (lambda: kernel(x.cpu(), w), "input x is on cpu"),
    ]:
        with pytest.raises(LoaderError) as exc:
            call()
        assert want in str(exc.value) and "\n" not in str(exc.value), str(exc.value)


def test_model_falls_back_without_kernels():
    net = model.TinyModel(dim=64, use_kernel=False)
    out = net(torch.randint(0, 256, (2, 3)))
    assert out.shape == (2, 3, 256)
