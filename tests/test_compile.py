"""The real compile stage (NVRTC + nvJitLink wheels): PTX and cubin for sm_90a and sm_100a."""

import json
import os

import pytest
from click.testing import CliRunner

from ptxbuild.cli import main
from ptxbuild.compile.compiler import CompileError, compile_kernel, parse_resources
from ptxbuild.problem import Kernel

pytestmark = pytest.mark.compile

SRC = 'extern "C" __global__ void k(float* y, const float* x) { y[threadIdx.x] = 2.f * x[threadIdx.x]; }'


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_compiles_to_ptx_and_cubin(arch):
    b = compile_kernel(Kernel(SRC, "k"), arch)
    assert f".target {arch}" in b.ptx and ".entry k(" in b.ptx
    assert b.cubin[:4] == b"\x7fELF"
    assert 0 < b.registers <= 16 and b.spill_bytes == 0


# two kernels in one cubin: each one's figures are found by its own symbol; `big` needs a stack frame
TWO = (
    'extern "C" __global__ void small(float* y) { y[threadIdx.x] = 1.f; }\n'
    'extern "C" __global__ void __launch_bounds__(1024, 2) big(float* y, const float* x, int n) {\n'
    "  float a[64];\n"
    "  for (int i = 0; i < 64; ++i) a[i] = x[(threadIdx.x * 64 + i) % n];\n"
    "  float s = 0.f;\n"
    "  for (int i = 0; i < n; ++i) s += a[(i * 7) & 63] * a[i & 63];\n"
    "  y[threadIdx.x] = s; }"
)


@pytest.mark.parametrize("entry", ["small", "big"])
def test_the_cubin_carries_the_registers_and_stack_ptxas_reported(entry):
    from ptxbuild.compile import cubin

    b = compile_kernel(Kernel(TWO, entry), "sm_90a")
    assert cubin.resources(b.cubin, entry) == {"registers": b.registers, "stack": b.local_bytes}
    assert (b.local_bytes > 0) == (entry == "big")


@pytest.mark.parametrize("entry", ["small", "big"])
def test_a_link_log_without_resources_falls_back_to_the_cubin(monkeypatch, entry):
    """Seen on the H200 machine: identical PTX linked a second time gave a log with no resource
    report, so registers and spills read 0. The cubin's figures are used instead; a stack frame
    counts as spilled, so the spill filter still rejects the kernel."""
    from ptxbuild.compile import compiler

    want = compile_kernel(Kernel(TWO, entry), "sm_90a")
    real = compiler.ptx_to_cubin
    monkeypatch.setattr(compiler, "ptx_to_cubin", lambda ptx, arch: (real(ptx, arch)[0], ""))
    got = compile_kernel(Kernel(TWO, entry), "sm_90a")
    assert got.cubin == want.cubin and got.registers == want.registers > 0
    assert got.local_bytes == want.local_bytes and (got.spill_bytes > 0) == (want.local_bytes > 0)
    assert "resources read from the cubin" in got.log


CALLS = (
    "__device__ __noinline__ float helper(const float* x, int n) {\n"
    "  float a[64];\n"
    "  for (int i = 0; i < 64; ++i) a[i] = x[(threadIdx.x * 64 + i) % n];\n"
    "  float s = 0.f;\n"
    "  for (int i = 0; i < n; ++i) s += a[(i * 7) & 63] * a[i & 63];\n"
    "  return s; }\n"
    'extern "C" __global__ void k(float* y, const float* x, int n) { y[threadIdx.x] = helper(x, n); }'
)


def test_a_callees_stack_counts_in_the_cubin_fallback():
    """A __noinline__ helper's locals are not in the kernel's own frame size (EIATTR_FRAME_SIZE = 0)
    but in its minimum stack size: the fallback must see them, or the kernel looks clean."""
    from ptxbuild.compile import cubin

    b = compile_kernel(Kernel(CALLS, "k"), "sm_90a")
    found = cubin.resources(b.cubin, "k")
    assert found["stack"] > 0 and found["registers"] > 0


def test_a_cached_binary_without_a_resource_report_is_repaired_from_its_cubin():
    """Rows cached before the fallback existed hold 0 registers and 0 spills when the log had no
    report; reading them back fills the figures in from the cubin."""
    from dataclasses import replace

    from ptxbuild.compile.compiler import with_resources

    good = compile_kernel(Kernel(TWO, "big"), "sm_90a")
    stale = replace(good, registers=0, spill_bytes=0, local_bytes=0, log="")
    fixed = with_resources(stale)
    assert (
        fixed.registers == good.registers
        and fixed.local_bytes == good.local_bytes > 0
        and fixed.spill_bytes > 0
    )
    assert with_resources(good) is good  # a log with the report is trusted
    fake = replace(good, cubin=b"not an elf", log="fake")
    assert with_resources(fake) is fake  # test doubles pass through untouched


def test_a_cubin_that_is_not_elf_is_refused():
    from ptxbuild.compile import cubin

    with pytest.raises(cubin.CubinError, match="not a 64-bit"):
        cubin.resources(b"MZ\x90\x00" * 16, "k")
    assert cubin.resources(compile_kernel(Kernel(SRC, "k"), "sm_90a").cubin, "absent") is None


def test_compile_error_carries_the_log():
    with pytest.raises(CompileError, match='identifier "oops" is undefined'):
        compile_kernel(Kernel('extern "C" __global__ void k() { oops; }', "k"), "sm_90a")


def test_missing_entry_point_is_a_compile_error():
    with pytest.raises(CompileError, match="entry point 'nope' not found"):
        compile_kernel(Kernel(SRC, "nope"), "sm_90a")


def test_parse_resources():
    log = (
        "ptxas info    : Function properties for k\nptxas         .     24 bytes stack frame, 8 bytes spill stores, "
        "12 bytes spill loads\nptxas info    : Used 40 registers, used 1 barriers, 2048 bytes smem"
    )
    assert parse_resources(log) == {
        "registers": 40,
        "spill_store": 8,
        "spill_load": 12,
        "stack": 24,
        "smem": 2048,
    }


def test_cli_build_twice_second_compiles_nothing(proj):
    cwd = os.getcwd()
    os.chdir(proj)
    try:
        first = CliRunner().invoke(main, ["build", "scale@b200", "scale@h100", "-j", "2"])
        second = CliRunner().invoke(main, ["build", "scale@b200", "scale@h100"])
    finally:
        os.chdir(cwd)
    assert first.exit_code == 0, first.output
    assert "scale@b200: built (not measured on hardware) -> build/scale@b200\n" in first.output
    assert second.exit_code == 0
    assert second.stdout == "scale@b200: up to date\nscale@h100: up to date\n"
    assert "up to date" not in second.stderr  # said once, by the result line
    for t, arch in (("scale@b200", "sm_100a"), ("scale@h100", "sm_90a")):
        m = json.loads((proj / "build" / t / "manifest.json").read_text())
        assert m["arch"] == arch
        for v in m["variants"].values():
            ptx = (proj / "build" / t / v["ptx"]).read_text()
            assert f".target {arch}" in ptx
            assert (proj / "build" / t / v["cubin"]).read_bytes()[:4] == b"\x7fELF"


def test_parse_resources_reads_the_entrys_own_section():
    """A source with several kernels: ptxas lists each; the entry's figures are the ones that count
    (KDA's fused kernel has 161 registers, the prepare kernel beside it 43968 bytes of static smem)."""
    log = (
        "ptxas info    : Compiling entry function 'fused' for 'sm_90a'\n"
        "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
        "ptxas info    : Used 161 registers, used 2 barriers\n"
        "ptxas info    : Compiling entry function 'prep' for 'sm_90a'\n"
        "ptxas         .     8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n"
        "ptxas info    : Used 80 registers, used 1 barriers, 43968 bytes smem\n"
    )
    assert parse_resources(log, "fused") == {
        "registers": 161,
        "spill_store": 0,
        "spill_load": 0,
        "stack": 0,
        "smem": 0,
    }
    assert parse_resources(log, "prep") == {
        "registers": 80,
        "spill_store": 4,
        "spill_load": 4,
        "stack": 8,
        "smem": 43968,
    }
    assert (
        parse_resources(log)["registers"] == 161
        and parse_resources(log, "absent")["registers"] == 161
    )
