"""Bad kernelfile input (issue 27, item 6, and the names and op files of item 5): each case is refused at
`check` with exit 2 and error lines that name the key and say what to write, never a traceback and never
silent success. Every case here once passed check (or crashed) on main."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from ptxbuild.cli import main

from .fakes import toy_project

TOY_KF = """[project]
name = "toy"
{project}
[gpus.h100]
[gpus.b200]

[ops.scale]
dtypes = {dtypes}
shapes = {shapes}
search = {search}
{extra}
"""


def kernelfile(proj, project="", dtypes='["float32", "bfloat16"]', shapes="[[64, 1024], [7, 100]]",
               search="{ budget = 6 }", extra="", text=None):  # fmt: skip
    path = proj / "kernelfile.toml"
    body = text if text is not None else TOY_KF.format(
        project=project, dtypes=dtypes, shapes=shapes, search=search, extra=extra
    )  # fmt: skip
    path.write_bytes(body if isinstance(body, bytes) else body.encode())
    return path


def cli(proj, *args):
    return CliRunner().invoke(main, ["-f", str(proj / "kernelfile.toml"), *args])


def refused(res, code=2):
    """The error lines of a refused command: exit `code`, no exception escaped (CliRunner would
    keep it: the user's traceback), every line of output an error line."""
    assert res.exit_code == code, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert lines and all(ln.lower().startswith("error: ") for ln in lines), res.output
    return lines


@pytest.fixture
def proj(tmp_path):
    return toy_project(tmp_path)


# -- strict types: no bool, string or float where an integer goes --------------------------------------------
TYPE_CASES = {
    "shape_bool": (dict(shapes="[[true, 1024]]"), "ops.scale.shapes[0][0]"),
    "shape_string": (dict(shapes='[["64", 1024]]'), "ops.scale.shapes[0][0]"),
    "shape_float": (dict(shapes="[[64, 1024.0]]"), "ops.scale.shapes[0][1]"),
    "budget_string": (dict(search='{ budget = "8" }'), "ops.scale.search.budget"),
    "budget_bool": (dict(search="{ budget = true }"), "ops.scale.search.budget"),
    "budget_float": (dict(search="{ budget = 8.0 }"), "ops.scale.search.budget"),
    "seconds_string": (dict(search='{ seconds = "600" }'), "ops.scale.search.seconds"),
    "seconds_bool": (dict(search="{ seconds = true }"), "ops.scale.search.seconds"),
    "seed_bool": (dict(search="{ seed = false }"), "ops.scale.search.seed"),
    "sm_count_string": (
        dict(
            text=TOY_KF.format(
                project="",
                dtypes='["float32"]',
                shapes="[[64, 1024]]",
                search="{ budget = 6 }",
                extra="",
            ).replace("[gpus.h100]", '[gpus.h100]\nsm_count = "132"')
        ),
        "gpus.h100.sm_count",
    ),  # fmt: skip
    "dram_bool": (
        dict(
            text=TOY_KF.format(
                project="",
                dtypes='["float32"]',
                shapes="[[64, 1024]]",
                search="{ budget = 6 }",
                extra="",
            ).replace("[gpus.h100]", "[gpus.h100]\ndram_tbps = true")
        ),
        "gpus.h100.dram_tbps",
    ),  # fmt: skip
}


@pytest.mark.parametrize("case", sorted(TYPE_CASES))
def test_a_number_given_as_a_bool_string_or_float_is_refused_naming_its_key(proj, case):
    kw, key = TYPE_CASES[case]
    kernelfile(proj, **kw)
    lines = refused(cli(proj, "check"))
    assert len(lines) == 1 and f"kernelfile.toml: {key}: " in lines[0], lines
    assert "integer" in lines[0] or "number" in lines[0], lines


# -- shapes within the op's and CUDA's limits -----------------------------------------------------------------
LIMIT_CASES = {
    # 2^62 x 4 elements: past 2^63, no tensor can be indexed with a signed 64-bit offset
    "past_2_63": ("[[4611686018427387904, 4]]", "ops.scale.shapes[0]", "2^63"),
    # 2^40 x 1024 elements: fits 2^63, but the op's default config launches 2^43 blocks in x
    "grid_x": ("[[1099511627776, 1024]]", "ops.scale.shapes[0] = [1099511627776, 1024]", "grid"),
    "zero_dim": ("[[0, 1024]]", "ops.scale.shapes[0]", "positive"),
    "empty_shape": ("[[]]", "ops.scale.shapes[0]", "non-empty"),
}


@pytest.mark.parametrize("case", sorted(LIMIT_CASES))
def test_a_shape_past_the_limits_is_refused_at_check(proj, case):
    shapes, key, why = LIMIT_CASES[case]
    kernelfile(proj, shapes=shapes)
    lines = refused(cli(proj, "check"))
    assert len(lines) == 1 and key in lines[0] and why in lines[0], lines


def test_a_shape_the_default_config_rejects_is_refused_at_check(proj):
    """Each declared shape goes through the op's own check() with its default config (the toy op
    defaults to vec=1, so a copy of it defaulting to vec=4 is used: N=101 is no multiple of 4)."""
    op = proj / "ops/scale/op.py"
    op.write_text(
        op.read_text().replace(
            'return {"threads": 128, "vec": 1}', 'return {"threads": 128, "vec": 4}'
        )
    )
    kernelfile(proj, shapes="[[64, 1024], [7, 101]]")
    lines = refused(cli(proj, "check"))
    assert len(lines) == 1 and "ops.scale.shapes[1] = [7, 101]" in lines[0], lines
    assert "N=101 is not a multiple of vec=4" in lines[0], lines


# -- dtypes against the op ------------------------------------------------------------------------------------
def test_a_dtype_the_op_does_not_support_is_refused_at_check(proj):
    kernelfile(proj, dtypes='["float32", "float16"]')
    lines = refused(cli(proj, "check"))
    assert len(lines) == 1, lines
    assert "ops.scale.dtypes[1]" in lines[0] and "float16" in lines[0], lines
    assert "float32, bfloat16" in lines[0], lines  # what the op supports


# -- every error at once, and did-you-mean for keys and tables -------------------------------------------------
def test_every_error_of_a_kernelfile_is_reported_at_once(proj):
    kernelfile(proj, dtypes='["float33"]', shapes="[[64, -1]]", search='{ budget = "8" }',
               extra='metric = "fastest"')  # fmt: skip
    lines = refused(cli(proj, "check"))
    assert len(lines) == 4, lines
    for key in (
        "ops.scale.dtypes[0]",
        "ops.scale.shapes[0]",
        "ops.scale.search.budget",
        "ops.scale.metric",
    ):
        assert sum(key in ln for ln in lines) == 1, (key, lines)


def test_errors_found_after_parsing_are_reported_together_too(proj):
    """A dtype the op lacks and a shape its default config rejects: both, not the first."""
    kernelfile(proj, dtypes='["float32", "float16"]', shapes="[[64, 1024], [1099511627776, 1024]]")
    lines = refused(cli(proj, "check"))
    assert (
        len(lines) == 2 and "ops.scale.dtypes[1]" in lines[0] and "ops.scale.shapes[1]" in lines[1]
    ), lines


TYPO_CASES = {
    "dtype": ("dtypes", "ops.scale.dtype"),
    "shape": ("shapes", "ops.scale.shape"),
    "serch": ("search", "ops.scale.serch"),
    "budgt": ("budget", "ops.scale.search.budgt"),
}


@pytest.mark.parametrize("typo", sorted(TYPO_CASES))
def test_a_misspelled_key_is_reported_as_the_typo_not_as_a_missing_key(proj, typo):
    right, where = TYPO_CASES[typo]
    text = TOY_KF.format(
        project="", dtypes='["float32"]', shapes="[[64, 1024]]", search="{ budget = 6 }", extra=""
    )
    if typo == "budgt":
        text = text.replace("{ budget = 6 }", "{ budgt = 6 }")
    else:
        text = text.replace(f"\n{right} =", f"\n{typo} =")
    kernelfile(proj, text=text)
    lines = refused(cli(proj, "check"))
    assert len(lines) == 1, lines  # the missing key it was meant to be is not a second error
    assert f"{where}: unknown key" in lines[0] and f"did you mean '{right}'?" in lines[0], lines
    assert "missing" not in lines[0], lines


TABLE_CASES = {
    "op": ("[ops.scale]", "[op.scale]", "op", "ops"),
    "projet": ("[project]", "[projet]", "projet", "project"),
    "gpu": ("[gpus.h100]\n[gpus.b200]", "[gpu.h100]\n[gpu.b200]", "gpu", "gpus"),
}


@pytest.mark.parametrize("case", sorted(TABLE_CASES))
def test_a_misspelled_table_gets_a_did_you_mean(proj, case):
    old, new, where, right = TABLE_CASES[case]
    text = TOY_KF.format(
        project="", dtypes='["float32"]', shapes="[[64, 1024]]", search="{ budget = 6 }", extra=""
    )
    kernelfile(proj, text=text.replace(old, new))
    lines = refused(cli(proj, "check"))
    assert len(lines) == 1, lines
    assert f"kernelfile.toml: {where}: unknown key" in lines[0], lines
    assert f"did you mean '{right}'?" in lines[0] and "missing" not in lines[0], lines


# -- targets --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cmd", ["build", "plan"])
@pytest.mark.parametrize("target", ["", " ", "@"])
def test_an_empty_target_is_an_error(proj, cmd, target):
    kernelfile(proj)
    lines = refused(cli(proj, cmd, "--no-gpu", target))
    assert len(lines) == 1 and "empty target" in lines[0] and "op@gpu" in lines[0], lines
    assert not (proj / "build").exists() and not (proj / "kernelfile.lock").exists()


# -- names used as paths --------------------------------------------------------------------------------------
NAME_CASES = {
    "op_dotdot": ('[ops."../../x"]\ntemplate = "scale"', 'ops."../../x"'),
    "op_slash": ('[ops."a/b"]\ntemplate = "scale"', 'ops."a/b"'),
    "op_dot": ('[ops."."]\ntemplate = "scale"', 'ops."."'),
    "op_long": (f'[ops.{"k" * 300}]\ntemplate = "scale"', f"ops.{'k' * 300}"),
    "op_at": ('[ops."a@b"]\ntemplate = "scale"', 'ops."a@b"'),
    "gpu_dotdot": ('[gpus."../g"]\narch = "sm_90a"', 'gpus."../g"'),
}


@pytest.mark.parametrize("case", sorted(NAME_CASES))
def test_an_op_or_gpu_name_that_is_no_safe_folder_name_is_refused_at_check(proj, case):
    table, key = NAME_CASES[case]
    body = 'dtypes = ["float32"]\nshapes = [[64, 1024]]\n'
    text = f'[project]\nname = "toy"\n\n[gpus.h100]\n\n{table}\n{body}'
    if case.startswith("gpu"):
        text = f'[project]\nname = "toy"\n\n{table}\n\n[ops.scale]\n{body}'
    kernelfile(proj, text=text)
    lines = refused(cli(proj, "check"))
    assert len(lines) == 1 and f"kernelfile.toml: {key}: " in lines[0], lines
    assert "name" in lines[0] and "letters, digits" in lines[0], lines
    res = cli(proj, "build", "--no-gpu")
    refused(res)
    assert sorted(p.name for p in proj.parent.iterdir()) == ["proj"]  # nothing written outside
    assert not (proj / "build").exists()


# -- files that cannot be read or imported --------------------------------------------------------------------
def test_a_kernelfile_that_is_not_utf8_is_refused_naming_the_byte(proj):
    kernelfile(proj, text=TOY_KF.format(project="# caf\xe9", dtypes='["float32"]', shapes="[[64, 1024]]",
                                        search="{ budget = 6 }", extra="").encode("latin-1"))  # fmt: skip
    lines = refused(cli(proj, "check"))
    assert len(lines) == 1 and "kernelfile.toml: not UTF-8" in lines[0] and "0xe9" in lines[0], (
        lines
    )


OP_IMPORT_CASES = {
    "syntax_error": ("def default_params(problem:\n", "SyntaxError"),
    "exits_0": ("import sys\nsys.exit(0)\n", "sys.exit(0)"),
    "exits_3": ("raise SystemExit(3)\n", "sys.exit(3)"),
    "raises": ("raise RuntimeError('no CUDA here')\n", "RuntimeError: no CUDA here"),
    "imports_missing": ("import no_such_module_xyz\n", "No module named 'no_such_module_xyz'"),
}


@pytest.mark.parametrize("cmd", ["check", "build"])
@pytest.mark.parametrize("case", sorted(OP_IMPORT_CASES))
def test_an_op_that_fails_or_exits_at_import_is_an_error_naming_its_file(proj, case, cmd):
    code, what = OP_IMPORT_CASES[case]
    op = proj / "ops/scale/op.py"
    op.write_text(code + op.read_text())
    kernelfile(proj)
    args = ["build", "--no-gpu"] if cmd == "build" else ["check"]
    lines = refused(cli(proj, *args))
    assert len(lines) == 1 and "ops/scale/op.py" in lines[0] and what in lines[0], lines
    assert not (proj / "build").exists()


# -- project paths --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("key", ["build_dir", "reports_dir"])
def test_a_project_folder_that_names_a_file_is_refused_at_check(proj, key):
    (proj / "out.txt").write_text("keep me\n")
    kernelfile(proj, project=f'{key} = "out.txt"')
    for args in (["check"], ["build", "--no-gpu"]):
        lines = refused(cli(proj, *args))
        assert len(lines) == 1 and f"project.{key}: out.txt is a file" in lines[0], lines
    assert (proj / "out.txt").read_text() == "keep me\n"
