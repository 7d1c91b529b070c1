"""Op authoring without a GPU (issue 31 item 6): `ptxbuild new NAME` writes an op that
`ptxbuild check --deep` passes; a bug in one non-default config, a missing GPU-side function and a
Python float for a `float` parameter are each caught and named."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from ptxbuild import cli
from ptxbuild.build import deep

OK_LINES = (
    "demo_op: python side ok on float32[8x1024] (numpy, seed 0)\n"
    "demo_op: python side ok on bfloat16[8x1024] (numpy, seed 0)\n"
    "demo_op: float32[4096x1024]: 24 valid config(s) of all 27, compiled all for sm_90a\n"
    "demo_op: float32[1024x4096]: 24 valid config(s) of all 27, compiled all for sm_90a\n"
    "demo_op: bfloat16[4096x1024]: 24 valid config(s) of all 27, compiled all for sm_90a\n"
    "demo_op: bfloat16[1024x4096]: 24 valid config(s) of all 27, compiled all for sm_90a\n"
)


def run(tmp: Path, *args: str):
    return CliRunner().invoke(cli.main, ["-f", str(tmp / "kernelfile.toml"), *args])


def new_op(tmp: Path, name: str = "demo_op") -> Path:
    res = run(tmp, "new", name)
    assert res.exit_code == 0, res.output
    return tmp / "ops" / name


def test_new_writes_the_op_and_a_kernelfile_entry(tmp_path):
    res = run(tmp_path, "new", "demo_op")
    assert res.exit_code == 0
    assert res.output == (
        "wrote ops/demo_op/op.py\nwrote ops/demo_op/demo_op.cu\ncreated kernelfile.toml\n"
        "next: ptxbuild check --deep demo_op\n"
    )
    res = run(tmp_path, "check")
    assert (res.exit_code, res.output) == (
        0,
        "kernelfile.toml: ok, 1 op(s), 1 target(s): demo_op@h200\n",
    )
    # a second op goes into the same kernelfile, for the GPUs it declares
    (tmp_path / "kernelfile.toml").write_text(
        (tmp_path / "kernelfile.toml")
        .read_text()
        .replace("[gpus.h200]", "[gpus.h200]\n[gpus.h100]")
    )
    res = run(tmp_path, "new", "other_op")
    assert res.output.splitlines()[2] == "appended [ops.other_op] to kernelfile.toml"
    assert (
        'gpus = ["h200", "h100"]'
        in (tmp_path / "kernelfile.toml").read_text().split("[ops.other_op]")[1]
    )
    res = run(tmp_path, "check")
    assert (res.exit_code, res.output) == (
        0,
        "kernelfile.toml: ok, 2 op(s), 3 target(s): demo_op@h200 other_op@h200 other_op@h100\n",
    )


def test_new_refuses_a_taken_or_invalid_name_in_one_line(tmp_path):
    new_op(tmp_path)
    before = (tmp_path / "kernelfile.toml").read_text()
    res = run(tmp_path, "new", "demo_op")
    assert (res.exit_code, res.output) == (
        2,
        f"error: {tmp_path / 'ops' / 'demo_op'} already exists: pick another name or remove it\n",
    )
    (tmp_path / "kernelfile.toml").write_text(
        before + '\n[ops.declared]\ntemplate = "rmsnorm"\ndtypes = ["float32"]\nshapes = [[8, 8]]\n'
    )
    res = run(tmp_path, "new", "declared")
    assert (res.exit_code, res.output) == (
        2,
        "error: kernelfile.toml already declares [ops.declared]: pick another name\n",
    )
    for bad in ("Demo", "9op", "a-b", "class", "_x"):
        res = run(tmp_path, "new", bad)
        assert res.exit_code == 2 and res.output.startswith(f"error: invalid op name {bad!r}: ")
        assert res.output.count("\n") == 1
    assert not (tmp_path / "ops" / "declared").exists()


@pytest.mark.compile
def test_new_then_check_deep_passes(tmp_path):
    new_op(tmp_path)
    res = run(tmp_path, "check", "--deep")
    assert res.exit_code == 0, res.output
    assert res.output == OK_LINES + "kernelfile.toml: check --deep ok, 1 op(s), 16 compile(s)\n"


@pytest.mark.compile
def test_a_bug_in_one_non_default_config_is_caught_and_named(tmp_path):
    folder = new_op(tmp_path)
    cu = folder / "demo_op.cu"
    lines = cu.read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if "const long long threads" in line)
    lines[at:at] = ["#if $VEC == 2\n", "  int broken = undefined_name;\n", "#endif\n"]
    cu.write_text("".join(lines))
    res = run(tmp_path, "check", "--deep", "demo_op")
    assert res.exit_code == 1
    configs = "".join(
        f"    threads={t} vec=2 unroll={u}\n" for t in (256, 128, 512) for u in (1, 2, 4)
    )
    assert res.output == OK_LINES + (
        "FAIL demo_op: compile error (sm_90a)\n"
        "  9 config(s), all with vec=2:\n"
        + configs
        + "  on float32[4096x1024], float32[1024x4096], "
        "bfloat16[4096x1024], bfloat16[1024x4096]\n"
        f'  ops/demo_op/demo_op.cu:{at + 2}: error: identifier "undefined_name" is undefined\n'
        f"      {at + 2:>5} | int broken = undefined_name;\n"
        "kernelfile.toml: check --deep 1 failure(s), 1 op(s), 16 compile(s)\n"
    )


def test_a_missing_gpu_side_function_is_named(tmp_path):
    """It used to pass `check` and a compile-only build: nothing called it without a GPU. The
    loader refuses it (the whole contract is checked at load), for every command."""
    folder = new_op(tmp_path)
    op_py = folder / "op.py"
    op_py.write_text(op_py.read_text().replace("def make_inputs(", "def _make_inputs("))
    error = (
        "error: ops/demo_op/op.py does not define make_inputs (the op contract: "
        "ptxbuild/contract.py, ops/README.md)\n"
    )
    for args in (["check"], ["check", "--deep"], ["build", "--no-gpu"]):
        res = run(tmp_path, *args)
        assert (res.exit_code, res.output) == (2, error), args


@pytest.mark.compile
def test_a_python_float_for_a_float_parameter_is_named(tmp_path):
    folder = new_op(tmp_path)
    op_py = folder / "op.py"
    op_py.write_text(
        op_py.read_text().replace("np.float32(self.alpha(problem))", "self.alpha(problem)")
    )
    res = run(tmp_path, "check", "--deep")
    assert res.exit_code == 1
    assert (
        "FAIL demo_op: demo_op_kernel: argument 2 is float64 (8 bytes); the kernel's parameter 2 is "
        ".f32; a Python float is passed as a double: give np.float32(...)\n  24 config(s):\n"
    ) in res.output
    assert res.output.count("FAIL ") == 1  # one mistake, all configs of both dtypes
    assert (
        "  on float32[4096x1024], float32[1024x4096], bfloat16[4096x1024], bfloat16[1024x4096]\n"
        in res.output
    )


def test_compile_errors_name_template_lines_where_render_shifts_them(tmp_path):
    (tmp_path / "k.cu").write_text("int a;\nint b = $X;\nint c = oops;\n")
    op = SimpleNamespace(FOLDER=tmp_path, SOURCES=["k.cu"])
    rendered = "#define P 1\n#define Q 2\nint a;\nint b = 7;\nint c = oops;\n"
    log = (
        'candidate.cu(5): error: identifier "oops" is undefined\n'
        "    int c = oops;\n            ^\n\n"
        "candidate.cu(1): warning: a line no template has\n"
        '1 error detected in the compilation of "candidate.cu".\n'
    )
    assert deep.explain_log(op, rendered, log, tmp_path) == [
        'k.cu:3 (rendered line 5): error: identifier "oops" is undefined',
        "        3 | int c = oops;",
        "rendered line 1 (no template line matches): warning: a line no template has",
        "        1 | #define P 1",
    ]


def test_entry_params_and_argument_widths():
    ptx = (
        ".visible .entry k(\n\t.param .u64 k_param_0,\n\t.param .f32 k_param_1,\n"
        "\t.param .align 8 .b8 k_param_2[16],\n\t.param .u32 k_param_3\n)\n{\n}\n"
    )
    np = pytest.importorskip("numpy")
    types = deep.entry_params(ptx, "k")
    assert types == ["u64", "f32", "b8[16]", "u32"]
    sm100 = ".entry k(\n\t.param .u64 .ptr .align 1 k_param_0,\n\t.param .f32 k_param_1\n)\n"
    assert deep.entry_params(sm100, "k") == ["u64", "f32"]  # sm_100a PTX spells pointers so
    arr = np.zeros(4, np.float32)
    assert deep.args_mismatch([arr, np.float32(1), object(), np.int32(3)], types) is None
    assert deep.args_mismatch([arr, np.float32(1), 0], types) == (
        "kernel_args gives 3 argument(s); the kernel's .entry takes 4"
    )
    assert deep.args_mismatch([arr, np.float32(1), 0, 3], types) == (
        "argument 3 is int64 (8 bytes); the kernel's parameter 3 is .u32"
    )
    assert deep.args_mismatch([arr, np.int32(1), 0, np.int32(3)], types).startswith(
        "argument 1 is int32 (4 bytes); the kernel's parameter 1 is .f32"
    )


def test_a_space_too_large_to_enumerate_is_sampled_and_said_so():
    space = {f"p{i}": list(range(5)) for i in range(7)}  # 78125 configs
    configs, size = deep.space_configs(space)
    assert size == 5**7 and len(configs) == deep.SPACE_SAMPLE
    assert configs == deep.space_configs(space)[0]  # seeded: the same sample every run
    assert len({tuple(c.values()) for c in configs}) == deep.SPACE_SAMPLE
