"""CLI boundaries: exit codes for a tool that cannot run, kept apart from a failed build."""

from click.testing import CliRunner

from ptxbuild import cli


def test_missing_compiler_is_a_tool_error_not_a_failed_build(proj, monkeypatch):
    from ptxbuild import compiler

    def missing():
        raise compiler.ToolchainMissing("the CUDA compiler is not installed (no module cuda); run: pip install x")
    monkeypatch.setattr(compiler, "toolchain", missing)
    monkeypatch.chdir(proj)
    res = CliRunner().invoke(cli.main, ["build", "--no-gpu"])
    assert res.exit_code == cli.EXIT_TOOL == 3
    assert res.output == "Error: the CUDA compiler is not installed (no module cuda); run: pip install x\n"
