"""The runtime loader without a GPU: artifact checks, dispatch, one-line errors, the reference fallback,
and the torch custom op under torch.compile (through the fallback). Torch tests skip without torch."""

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from ptxbuild.build.run import build
from ptxbuild.runtime import LoaderError, arch_runs_on, load, load_choice

from .conftest import make_ctx

ROOT = Path(__file__).resolve().parents[1]

# The toy op with N baked into the source (as rmsnorm's exact variants do): other N cannot reuse a binary.
BAKED = """
_render = render
def render(params, problem, arch):
    k = _render(params, problem, arch)
    return Kernel(f"#define NC {problem.shape[1]}\\n" + k.source, k.entry)
"""


@pytest.fixture
def built(proj):
    with open(proj / "ops" / "scale" / "op.py", "a") as f:
        f.write(BAKED)
    assert all(r.status == "built" for r in build(make_ctx(proj)))
    return proj


def _torch():
    return pytest.importorskip(
        "torch", reason="torch is not installed (pip install torch==2.13.0, CPU is enough)"
    )


def _no_gpu(torch):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: these tests check the no-GPU paths")


def _one_line(exc):
    msg = str(exc.value)
    assert "\n" not in msg and len(msg) < 400, msg
    return msg


def test_import_needs_no_compiler_torch_or_cupy():
    code = (
        "import sys, ptxbuild, ptxbuild.runtime; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'cupy', 'cuda') "
        "or m in ('ptxbuild.compile.compiler', 'ptxbuild.build.run')]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_arch_and_driver_rules():
    assert (
        arch_runs_on("sm_90a", 90)
        and not arch_runs_on("sm_90a", 100)
        and not arch_runs_on("sm_90a", 80)
    )
    assert arch_runs_on("sm_80", 90) and not arch_runs_on("sm_100a", 90)
    assert arch_runs_on("sm_100f", 103) and not arch_runs_on("sm_100f", 120)
    assert load_choice("9.0", 13000) is None
    assert (
        load_choice("9.0", 12080)
        == "PTX ISA 9.0 needs a driver for CUDA >= 13.0, this driver supports CUDA 12.8"
    )


def test_load_by_target_and_by_directory(built):
    k = load("scale@h100", kernelfile=built / "kernelfile.toml")
    assert k.target == "scale@h100" and k.arch == "sm_90a" and k.dtypes == ["bfloat16", "float32"]
    assert [m.names for m in k.modes()] == [("x",)]
    k2 = load(built / "build" / "scale@b200")
    assert k2.arch == "sm_100a"


def test_not_built_and_not_a_target(proj):
    with pytest.raises(LoaderError) as exc:
        load("scale@h100", kernelfile=proj / "kernelfile.toml")
    assert "never built; run: ptxbuild build scale@h100" in _one_line(exc)
    with pytest.raises(LoaderError) as exc:
        load("scale@a100", kernelfile=proj / "kernelfile.toml")
    assert "scale@a100 is not a target of" in _one_line(exc)


def test_a_build_directory_away_from_its_project_finds_the_installed_op(
    built, tmp_path, monkeypatch
):
    """A build directory copied where there is no kernelfile and no ops/ (a deployment) gets its op
    through the shipped-op lookup (an installed wheel's ptxbuild/_ops), not the repository layout."""
    import shutil

    from ptxbuild import oploader

    away = tmp_path / "deploy" / "build" / "scale@h100"
    shutil.copytree(built / "build" / "scale@h100", away)
    with pytest.raises(LoaderError):  # nothing ships an op named scale: refused, in one line
        load(away)
    wheel_ops = tmp_path / "site-packages" / "ptxbuild" / "_ops"
    shutil.copytree(built / "ops" / "scale", wheel_ops / "scale")
    monkeypatch.setattr(oploader, "shipped_ops", lambda: wheel_ops)
    k = load(away)
    assert k.op.FOLDER.resolve() == (wheel_ops / "scale").resolve()
    assert k.target == "scale@h100" and [m.names for m in k.modes()] == [("x",)]


def test_tampered_cubin_is_refused(built):
    d = built / "build" / "scale@h100"
    cubin = next(d.glob("*.cubin"))
    cubin.write_bytes(cubin.read_bytes() + b"\0")
    with pytest.raises(LoaderError) as exc:
        load(d)
    assert "does not match its digest in manifest.json" in _one_line(exc) and "refusing it" in str(
        exc.value
    )


def test_tampered_ptx_is_refused(built):
    d = built / "build" / "scale@h100"
    ptx = next(d.glob("*.ptx"))
    ptx.write_text(ptx.read_text().replace("scale", "scalf"))
    with pytest.raises(LoaderError, match="does not match its digest"):
        load(d)


def test_changed_op_is_refused(built):
    cu = built / "ops" / "scale" / "scale.cu"
    cu.write_text(cu.read_text() + "// edited\n")
    with pytest.raises(LoaderError) as exc:
        load(built / "build" / "scale@h100")
    assert "scale.cu changed since scale@h100 was built" in _one_line(exc)


def test_select_reuses_a_binary_only_where_it_renders_the_same(built):
    from ptxbuild.problem import Problem

    k = load(built / "build" / "scale@h100")
    built_64 = k.select(Problem.make("scale", "float32", (64, 1024)))
    assert built_64.label == "float32[64x1024]"
    other_m = k.select(Problem.make("scale", "float32", (5, 1024)))
    assert other_m.binary == built_64.binary  # N baked in, M free: reusable
    assert k.select(Problem.make("scale", "float32", (5, 1000))) is None
    assert k.select(Problem.make("scale", "float16", (64, 1024))) is None


def test_errors_are_one_line(built):
    torch = _torch()
    _no_gpu(torch)
    k = load(built / "build" / "scale@h100")
    x = torch.randn(64, 1024)
    cases = [
        (lambda: k(x), "scale@h100: no CUDA GPU is visible"),
        (
            lambda: k(x.double()),
            "dtype float64 of input x is not built; built dtypes: bfloat16, float32",
        ),
        (lambda: k(x.half()), "dtype float16 of input x is not built"),
        (
            lambda: k(torch.randn(1024, 64).t()),
            "input x is not contiguous (strides (1, 64)); pass x.contiguous()",
        ),
        (
            lambda: k(torch.randn(5, 1000)),
            "no built variant covers float32[5x1000]; built shapes for float32: 64x1024, 7x100",
        ),
        (lambda: k(x, x), "arguments (2 positional) match no built mode; built: (x)"),
        (lambda: k(y=x), "arguments (0 positional, y) match no built mode"),
        (lambda: k(x, alpha=3.0), "alpha=3.0) match no built mode"),
        (lambda: k(x.numpy()), "inputs must all be torch tensors or all cupy arrays"),
    ]
    for call, want in cases:
        with pytest.raises(LoaderError) as exc:
            call()
        assert want in _one_line(exc), (want, str(exc.value))


def test_wrong_input_shape_names_expected(tmp_path):
    torch = _torch()
    from ptxbuild.runtime import BuiltKernel

    k = BuiltKernel.__new__(BuiltKernel)
    k.target, k.dtypes, k._specs = "t@g", ["float32"], {}
    k.op = type(
        "Op",
        (),
        {
            "NAME": "t",
            "make_inputs": staticmethod(
                lambda p, s, xp: {
                    "x": xp.zeros(p.shape, xp.float32),
                    "w": xp.zeros(p.shape[-1:], xp.float32),
                }
            ),
        },
    )
    from ptxbuild.runtime import _Mode

    mode = _Mode({}, ("x", "w"))
    with pytest.raises(LoaderError) as exc:
        k.problem_of(mode, {"x": torch.zeros(4, 8), "w": torch.zeros(7)})
    assert "input w is float32[7], expected float32[8] for float32[4x8]" in _one_line(exc)


def test_a_per_row_input_scales_with_m_and_a_per_column_one_does_not(tmp_path):
    """rmsnorm_bwd's rstd is one value per row ([M]), its weight one per column ([N]): the input
    check scales the first with the problem's M (it used to expect the tiny problem's [3])."""
    torch = _torch()
    from ptxbuild.oploader import load_op
    from ptxbuild.problem import Problem
    from ptxbuild.runtime import BuiltKernel

    k = BuiltKernel.__new__(BuiltKernel)
    k.target, k.dtypes, k._specs = "rmsnorm_bwd@h200", ["bfloat16"], {}
    k.op = load_op("rmsnorm_bwd", ROOT)
    specs = k._input_specs(Problem.make("rmsnorm_bwd", "bfloat16", (32768, 4096)))
    assert specs == {
        "x": ((32768, 4096), "bfloat16"),
        "dy": ((32768, 4096), "bfloat16"),
        "weight": ((4096,), "bfloat16"),
        "rstd": ((32768,), "float32"),
    }
    mode = _Mode_of(("x", "dy", "weight", "rstd"))
    m, n = 77, 256
    x, dy = torch.zeros(m, n, dtype=torch.bfloat16), torch.zeros(m, n, dtype=torch.bfloat16)
    w, rstd = torch.ones(n, dtype=torch.bfloat16), torch.ones(m)
    p = k.problem_of(mode, {"x": x, "dy": dy, "weight": w, "rstd": rstd})
    assert p.shape == (m, n)
    with pytest.raises(LoaderError) as exc:
        k.problem_of(mode, {"x": x, "dy": dy, "weight": w, "rstd": torch.ones(3)})
    assert "input rstd is float32[3], expected float32[77] for bfloat16[77x256]" in _one_line(exc)
    with pytest.raises(
        LoaderError, match=r"input weight is bfloat16\[77\], expected bfloat16\[256\]"
    ):
        k.problem_of(mode, {"x": x, "dy": dy, "weight": w[:1].expand(m).clone(), "rstd": rstd})


def _Mode_of(names):
    from ptxbuild.runtime import _Mode

    return _Mode({}, tuple(names))


def test_fallback_is_explicit_and_warned(built):
    torch = _torch()
    _no_gpu(torch)
    k = load(built / "build" / "scale@h100", allow_fallback=True)
    x = torch.randn(5, 1000, dtype=torch.bfloat16)
    with pytest.warns(
        RuntimeWarning,
        match=r"no built variant covers bfloat16\[5x1000\].*running scale's reference",
    ):
        y = k(x)
    assert y.dtype == torch.bfloat16 and y.shape == x.shape
    assert torch.equal(y, (x.float() * 2).bfloat16())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        k(torch.randn(5, 1000, dtype=torch.bfloat16))  # warned once per reason


def test_torch_custom_op_under_compile(built):
    torch = _torch()
    _no_gpu(torch)
    from ptxbuild.torch_ops import op_name, register

    k = load(built / "build" / "scale@h100", allow_fallback=True)
    assert op_name(k) == "scale_h100"
    op = register(k)
    assert register(k) is op and torch.ops.ptxbuild.scale_h100 is not None
    x = torch.randn(64, 1024)
    from torch import library as torch_library

    torch_library.opcheck(op, (x,), test_utils=("test_schema", "test_faketensor"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        f = torch.compile(lambda t: op(t) + 1, backend="aot_eager", fullgraph=True)
        y = f(x)
    assert torch.allclose(y, x * 2 + 1)


def test_another_build_with_other_modes_gets_its_own_custom_op(built, monkeypatch):
    # seen on the H200: a test's own rmsnorm@h200 (rstd modes) defined ptxbuild::rmsnorm_h200 first;
    # the repository's build then got that op back, whose call asked for rstd=True
    torch = _torch()
    _no_gpu(torch)
    from ptxbuild.runtime import torch_ops

    k = load(built / "build" / "scale@h100", allow_fallback=True)
    qual = f"{torch_ops.NAMESPACE}::{torch_ops.op_name(k)}"
    other = ("(Tensor x, Tensor rstd) -> Tensor", (("rstd", True),))
    monkeypatch.setitem(torch_ops._signatures, qual, other)
    op = torch_ops.register(k)
    assert op._qualname.startswith(qual + "_") and torch_ops._signatures[qual] == other
    assert torch_ops.register(k) is op  # the same build again: the same op
    x = torch.randn(64, 1024)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert torch.allclose(op(x), x * 2)


def test_manifest_records_ptx_digest_and_op_files(built):
    m = json.loads((built / "build" / "scale@h100" / "manifest.json").read_text())
    assert set(m["op_files"]) == {"op.py", "scale.cu"}
    assert all(len(v["ptx_sha256"]) == 64 for v in m["variants"].values())


def test_a_tensor_is_an_input_even_when_an_option_has_its_name(built, monkeypatch):
    # rmsnorm has an option `weight` ("x" | "fp32" | "none") and an input `weight`: seen on the H200
    torch = _torch()
    _no_gpu(torch)
    k = load(built / "build" / "scale@h100", allow_fallback=True)
    monkeypatch.setattr(k.op, "OPTIONS", {**k.op.OPTIONS, "x": "some option value"})
    x = torch.randn(5, 1000, dtype=torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        y = k(x=x)
    assert torch.equal(y, (x.float() * 2).bfloat16())


def test_launch_attributes_for_clusters_and_programmatic_dependent_launches():
    """cuLaunchKernelEx's attributes of a Launch: none for a plain one (cuLaunchKernel does), the
    cluster shape, and programmatic stream serialization for pdl=True (KDA's prep_variant 3)."""
    cu = pytest.importorskip("cuda.bindings.driver", reason="needs cuda-bindings")
    from ptxbuild.launch import launch_attributes
    from ptxbuild.problem import Launch

    plain = Launch((4, 1, 1), (128, 1, 1))
    assert plain.plain and launch_attributes(cu, plain) == []
    both = Launch((4, 1, 1), (128, 1, 1), 0, (2, 1, 1), pdl=True)
    attrs = launch_attributes(cu, both)
    assert not both.plain and [a.id for a in attrs] == [
        cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
        cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
    ]
    assert (attrs[0].value.clusterDim.x, attrs[0].value.clusterDim.y) == (2, 1)
    assert attrs[1].value.programmaticStreamSerializationAllowed == 1
    pdl_only = launch_attributes(cu, Launch((4, 1, 1), (128, 1, 1), pdl=True))
    assert [a.id for a in pdl_only] == [
        cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    ]


def test_resident_grid_lowers_a_persistent_cluster_grid_to_the_clusters_resident_at_once():
    """A persistent cluster Launch's grid is an upper bound: the launcher asks the driver how many
    clusters fit at once (once per function, registers, shape) and launches that many; other
    launches keep their grid; a reused handle with other registers asks again; a shape of which no
    cluster fits is an error, not a hang; a persistent launch must be one-dimensional."""
    from types import SimpleNamespace

    from ptxbuild import launch as kernel_params
    from ptxbuild.problem import Launch

    calls = []
    ok = SimpleNamespace(name="CUDA_SUCCESS")
    state = {"fits": 15, "regs": 95}

    def occupancy(fn, cfg):
        calls.append((int(fn), cfg.gridDimX))
        return ok, state["fits"]

    def attribute(which, fn):
        return ok, state["regs"] if which == "regs" else 1040

    cu = SimpleNamespace(
        cuOccupancyMaxActiveClusters=occupancy,
        cuFuncGetAttribute=attribute,
        CUresult=SimpleNamespace(CUDA_SUCCESS=ok),
        CUfunction_attribute=SimpleNamespace(
            CU_FUNC_ATTRIBUTE_NUM_REGS="regs", CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES="smem"
        ),
    )
    kernel_params._RESIDENT.clear()
    geom = Launch((128, 1, 1), (512, 1, 1), 0, (8, 1, 1), persistent=True)
    cfg = SimpleNamespace(gridDimX=128)
    assert kernel_params.resident_grid(cu, 7, cfg, geom) == 15 * 8
    assert kernel_params.resident_grid(cu, 7, cfg, geom) == 15 * 8 and len(calls) == 1  # cached
    assert (
        kernel_params.resident_grid(cu, 7, SimpleNamespace(gridDimX=40), geom) == 40
    )  # fewer rows
    assert (
        kernel_params.resident_grid(cu, 7, cfg, Launch((128, 1, 1), (512, 1, 1), 0, (8, 1, 1)))
        == 128
    )
    state.update(fits=16, regs=64)  # the same handle, another module's kernel
    assert kernel_params.resident_grid(cu, 7, cfg, geom) == 16 * 8 and len(calls) == 2
    state["fits"] = 0
    with pytest.raises(kernel_params.NotResident, match="64 regs. can be resident"):
        kernel_params.resident_grid(cu, 9, cfg, geom)
    with pytest.raises(ValueError, match="one-dimensional"):
        kernel_params.resident_grid(
            cu, 7, cfg, Launch((128, 2, 1), (512, 1, 1), 0, (8, 1, 1), persistent=True)
        )
    kernel_params._RESIDENT.clear()
