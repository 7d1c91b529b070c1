"""Kernelfile mistakes: one line naming the key path, exit code 2, and no file changed."""

import os

import pytest
from click.testing import CliRunner

from ptxbuild.cli import EXIT_CONFIG, main
from ptxbuild.oploader import shipped_ops

# the ops ptxbuild ships (in a checkout: this repository's ops/), listed by an unknown-template error
SHIPPED = ", ".join(sorted(p.parent.name for p in shipped_ops().glob("[!_]*/op.py")))

GOOD = """
[project]
name = "t"
[gpus.h100]
[gpus.b200]
[ops.scale]
dtypes = ["float32"]
shapes = [[64, 1024]]
"""

CASES = [
    (
        "unknown key",
        GOOD.replace('dtypes = ["float32"]', 'dtypes = ["float32"]\nshape = [[1, 2]]'),
        "error: kernelfile.toml: ops.scale.shape: unknown key (did you mean 'shapes'?); allowed here: template, dtypes, "
        "shapes, options, modes, gpus, metric, gates, search, depends",
    ),
    (
        "wrong type",
        GOOD.replace("[[64, 1024]]", '"64x1024"'),
        "error: kernelfile.toml: ops.scale.shapes: Input should be a valid list (got '64x1024')",
    ),
    (
        "unknown gpu",
        GOOD.replace("shapes = [[64, 1024]]", 'shapes = [[64, 1024]]\ngpus = ["h10"]'),
        "error: kernelfile.toml: ops.scale.gpus[0]: unknown GPU 'h10' (did you mean 'h100'?); declare [gpus.h10] or use "
        "one of h100, b200",
    ),
    (
        "unknown catalog gpu",
        GOOD.replace("[gpus.b200]", "[gpus.b2000]"),
        "error: kernelfile.toml: gpus.b2000: unknown GPU (did you mean 'b200'?); use a catalog name (a100, l40s, h100, "
        'h200, gh200, b200) or give arch = "sm_90a"',
    ),
    (
        "unknown op template",
        GOOD.replace("[ops.scale]", "[ops.scael]"),
        "error: kernelfile.toml: ops.scael.template: no op.py in ops/scael (did you mean 'scale'?); ops/ holds: scale; "
        f"ptxbuild ships: {SHIPPED}",
    ),
    (
        "empty shapes",
        GOOD.replace("[[64, 1024]]", "[]"),
        "error: kernelfile.toml: ops.scale.shapes: List should have at least 1 item after validation, not 0",
    ),
    (
        "bad dtype",
        GOOD.replace('"float32"]', '"bfloat61"]'),
        "error: kernelfile.toml: ops.scale.dtypes[0]: unknown dtype 'bfloat61' (did you mean 'bfloat16'?); one of "
        "bfloat16, float16, float32",
    ),
    (
        "cycle",
        GOOD + '\ndepends = ["scale2"]\n[ops.scale2]\ntemplate = "scale"\ndtypes = ["float32"]\n'
        'shapes = [[1, 1]]\ndepends = ["scale"]\n',
        "error: kernelfile.toml: ops.scale.depends: dependency cycle scale -> scale2 -> scale; remove one of these "
        "dependencies",
    ),
    (
        "unknown dependency",
        GOOD + 'depends = ["norm"]\n',
        "error: kernelfile.toml: ops.scale.depends[0]: unknown op 'norm'; declare [ops.norm]",
    ),
    (
        "gate as a string",
        GOOD + 'gates = { min_speedup = "1" }\n',  # lax pydantic read it as 1.0
        "error: kernelfile.toml: ops.scale.gates.min_speedup: Input should be a valid number (got '1')",
    ),
    (
        "missing project",
        GOOD.replace('[project]\nname = "t"', ""),
        "error: kernelfile.toml: project: required key is missing; add it",
    ),
    ("bad toml", GOOD + "[[[", None),
]


def _snapshot(root):
    return {p: p.stat().st_mtime_ns for p in root.rglob("*")}


@pytest.mark.parametrize("name,text,message", CASES, ids=[c[0] for c in CASES])
def test_kernelfile_mistake(proj, name, text, message):
    (proj / "kernelfile.toml").write_text(text)
    before = _snapshot(proj)
    cwd = os.getcwd()
    os.chdir(proj)
    try:
        res = CliRunner().invoke(main, ["build"])
    finally:
        os.chdir(cwd)
    assert res.exit_code == EXIT_CONFIG
    lines = res.output.strip().splitlines()
    assert len(lines) == 1, res.output
    if message:
        assert lines[0] == message
    else:
        assert lines[0].startswith("error: kernelfile.toml: not valid TOML")
    assert _snapshot(proj) == before


def test_unknown_target_did_you_mean(proj):
    cwd = os.getcwd()
    os.chdir(proj)
    try:
        res = CliRunner().invoke(main, ["build", "scale@h10"])
    finally:
        os.chdir(cwd)
    assert res.exit_code == EXIT_CONFIG
    assert (
        res.output == "error: scale@h10: no GPU 'h10' (did you mean 'h100'?); known: h100, b200\n"
    )


def test_gates_and_the_metric_leave_the_op_config_as_locks_recorded_it(proj):
    """Gates and the metric judge a build, they do not change it: declaring or editing them keeps the config
    (and so every lock's declaration digest, written with the defaults) as it was."""
    from ptxbuild.declare.kernelfile import KernelfileError, load

    (proj / "kernelfile.toml").write_text(GOOD)
    before = load(proj / "kernelfile.toml").ops["scale"].config()
    assert before["gates"] == {"min_bandwidth_fraction": None, "max_time_ms": None}
    (proj / "kernelfile.toml").write_text(
        GOOD + 'metric = "max_time"\ngates = { min_speedup = 1.0, max_time_ms = 2 }\n'
    )
    spec = load(proj / "kernelfile.toml").ops["scale"]
    assert spec.config() == before
    assert (spec.metric, spec.gates) == (
        "max_time",
        {"min_bandwidth_fraction": None, "max_time_ms": 2, "min_speedup": 1.0},
    )
    (proj / "kernelfile.toml").write_text(
        GOOD + 'gates = { min_speedup = 1.0, speedup_evidence = "every_round" }\n'
    )
    assert load(proj / "kernelfile.toml").ops["scale"].gates["speedup_evidence"] == "every_round"
    (proj / "kernelfile.toml").write_text(
        GOOD + 'gates = { min_speedup = 1.0, speedup_evidence = "mean" }\n'
    )
    with pytest.raises(KernelfileError, match="speedup_evidence"):
        load(proj / "kernelfile.toml")
    (proj / "kernelfile.toml").write_text(GOOD + 'gates = { speedup_evidence = "every_round" }\n')
    with pytest.raises(
        KernelfileError, match="gates.speedup_evidence: judges min_speedup, which is not declared"
    ):
        load(proj / "kernelfile.toml")
    (proj / "kernelfile.toml").write_text(
        GOOD + 'gates = { min_speedup = 1.0, speedup_evidence = "median" }\n'
    )
    assert load(proj / "kernelfile.toml").ops["scale"].gates == {  # the default, written out
        "min_bandwidth_fraction": None,
        "max_time_ms": None,
        "min_speedup": 1.0,
    }


def test_the_shipped_ops_include_those_a_model_repository_uses():
    assert {"rmsnorm", "kda", "kda_prepare", "kda_recurrence"} <= set(SHIPPED.split(", "))
