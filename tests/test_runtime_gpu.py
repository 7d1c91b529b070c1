"""The runtime on an H200 (sm_90a builds): rmsnorm@h200 and kda@h200 through ptxbuild.load against
float references (and fla's chunk_kda where fla is installed), on the caller's stream, under CUDA-graph
capture and torch.compile(fullgraph=True), with both launchers. A missing build is made first with
`ptxbuild build --locked <target>` (the committed lock; compile only)."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="needs torch")

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
        reason="needs a CUDA GPU of compute capability 9.0 (the kernels are built for sm_90a)",
    ),
]
EPS = 1e-6


def _load(target):
    if not (ROOT / "build" / target / "manifest.json").is_file():
        cmd = [sys.executable, "-m", "ptxbuild.cli", "build", "--locked", target]
        subprocess.run(cmd, check=True, cwd=ROOT)
    import ptxbuild

    return ptxbuild.load(target, kernelfile=ROOT / "kernelfile.toml")


@pytest.fixture(scope="module")
def rms():
    return _load("rmsnorm@h200")


@pytest.fixture(scope="module")
def kda():
    return _load("kda@h200")


# ---------------------------------------------------------------- rmsnorm
def _rms_ref(x, w):
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * w.float()


def _check(y, ref, what):
    err = (y.float() - ref).abs()
    tol = 3e-2 + 1e-2 * ref.abs()  # the op's bf16 tolerance
    excess = (err - tol).max().item()
    print(f"{what}: max abs err {err.max().item():.3e}, worst excess over tolerance {excess:.3e}")
    assert y.dtype == torch.bfloat16 and y.is_contiguous() and bool((err <= tol).all()), what


def _xw(m, n, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, n, device="cuda", generator=g).mul_(3).bfloat16()
    w = (1 + 0.1 * torch.randn(n, device="cuda", generator=g)).bfloat16()
    return x, w


@pytest.mark.parametrize("m,n", [(32768, 256), (8192, 262144), (1, 4096), (7, 4096), (33, 8192)])
def test_rmsnorm_matches_reference(rms, m, n):
    x, w = _xw(m, n, m + n)
    _check(rms(x, w), _rms_ref(x, w), f"rmsnorm {m}x{n}")
    _check(rms(x, w), _rms_ref(x, w), f"rmsnorm {m}x{n} (second call: the prepared launch)")


def test_rmsnorm_both_launchers_agree_bitwise(monkeypatch):
    x, w = _xw(64, 4096)
    ys = {}
    for name in ("ctypes", "bindings"):
        monkeypatch.setenv("PTXBUILD_LAUNCHER", name)
        k = _load(
            "rmsnorm@h200"
        )  # a fresh callable: the launcher is chosen when a shape is prepared
        ys[name] = k(x, w)
    assert torch.equal(ys["ctypes"], ys["bindings"])


def test_rmsnorm_on_a_side_stream(rms):
    x, w = _xw(8192, 4096)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        rms(x, w)  # the first call of this shape resolves it here
        y = rms(x, w)
    s.synchronize()
    _check(y, _rms_ref(x, w), "side stream")


def test_rmsnorm_under_cuda_graph_capture(rms):
    x, w = _xw(16, 4096)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        rms(x, w)  # warm up (resolve and load outside the capture, as torch asks)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = rms(x, w)
    x2, _ = _xw(16, 4096, seed=5)
    x.copy_(x2)
    graph.replay()
    torch.cuda.synchronize()
    _check(y, _rms_ref(x2, w), "graph replay")


def test_rmsnorm_custom_op_under_torch_compile_fullgraph(rms):
    from ptxbuild.torch_ops import register

    op = register(rms)
    x, w = _xw(64, 8192)
    before = rms.calls
    f = torch.compile(lambda a, b: op(a, b) * 2, fullgraph=True)
    y = f(x, w)
    assert rms.calls > before
    _check(y / 2, _rms_ref(x, w), "torch.compile(fullgraph=True)")


# ---------------------------------------------------------------- KDA
FLAGS = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
             safe_gate=True, lower_bound=-5.0)  # fmt: skip


_REFS: dict = {}


def _case(kda, H, lengths, seed=0):
    """(fla-layout torch inputs, float64 reference {o, hT}) of the op's own input distributions
    (the reference computed once per case)."""
    from ptxbuild.problem import Problem

    T = sum(lengths)
    opts = {"lengths": tuple(lengths)} if len(lengths) > 1 else {}
    problem = Problem.make("kda", "bfloat16", (T, H), opts)
    ins = kda.op.make_inputs(problem, seed, np)
    key = (H, tuple(lengths), seed)
    if key not in _REFS:
        _REFS[key] = kda.op.reference(problem, ins, np)
    ref = _REFS[key]

    def t(name, shape=None):
        a = ins[name]
        x = (
            torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
            if a.dtype == np.uint16
            else torch.from_numpy(a)
        )
        return (x.reshape(shape) if shape else x).cuda()

    K = V = 128
    fla = dict(
        q=t("q", (1, T, H, K)), k=t("k", (1, T, H, K)), v=t("v", (1, T, H, V)),
        g=t("a", (1, T, H, K)), beta=t("b", (1, T, H)), A_log=t("A_log"),
        dt_bias=t("dt_bias", (H * K,)), initial_state=t("h0"),
    )  # fmt: skip
    if len(lengths) > 1:
        fla["cu_seqlens"] = t("cu_seqlens")
    return fla, ref


def _rel_rms(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.sqrt(np.mean((got - want) ** 2)) / np.sqrt(np.mean(want**2)))


# T and lengths the build never saw (the kernels take them as data): one sequence, varlen, two
# equal segments, an empty segment; H64 and H96 as built
CASES = [(64, (300,)), (64, (17, 100, 183)), (96, (128, 128)), (96, (0, 31, 96, 160))]


@pytest.mark.parametrize("H,lengths", CASES)
@pytest.mark.parametrize("v_first", [True, False])
def test_kda_matches_the_float64_reference(kda, H, lengths, v_first):
    ins, ref = _case(kda, H, lengths)
    if not v_first:
        ins["initial_state"] = ins["initial_state"].transpose(-1, -2).contiguous()
    o, hT = kda(**ins, output_final_state=True, state_v_first=v_first, **FLAGS)
    torch.cuda.synchronize()
    if not v_first:
        hT = hT.transpose(-1, -2)
    e_o = _rel_rms(o[0].float().cpu().numpy(), ref["o"])
    e_h = _rel_rms(hT.cpu().numpy(), ref["hT"])
    print(f"kda H{H} lengths {lengths} v_first={v_first}: relative RMS o {e_o:.2e}, hT {e_h:.2e}")
    assert e_o <= 5e-3 and e_h <= 5e-3


def test_kda_under_cuda_graph_capture_and_compile(kda):
    from ptxbuild.torch_ops import register

    ins, ref = _case(kda, 64, (17, 100, 183))
    cu_cpu = ins["cu_seqlens"].cpu()
    kw = dict(ins, output_final_state=True, state_v_first=True, cu_seqlens_cpu=cu_cpu, **FLAGS)
    o0, h0 = kda(**kw)  # warm up: resolve, load, upload the chunk layout
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o, hT = kda(**kw)
    graph.replay()
    torch.cuda.synchronize()
    assert _rel_rms(o.float().cpu().numpy(), o0.float().cpu().numpy()) < 1e-6
    op = register(kda)
    args = [ins[n] for n in ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state")]
    f = torch.compile(lambda *a: op(*a, [17, 100, 183], True), backend="aot_eager", fullgraph=True)
    o2, h2 = f(*args)
    torch.cuda.synchronize()
    assert _rel_rms(o2[0].float().cpu().numpy(), ref["o"]) <= 5e-3
    assert _rel_rms(h2.cpu().numpy(), ref["hT"]) <= 5e-3
