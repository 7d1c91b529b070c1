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


def test_remeasure_and_remeasure_only_together_is_a_usage_error(proj, monkeypatch):
    monkeypatch.chdir(proj)
    res = CliRunner().invoke(cli.main, ["build", "--no-gpu", "--remeasure", "--remeasure-only", "x1024]"])
    assert res.exit_code != 0 and "not both" in res.output
    res = CliRunner().invoke(cli.main, ["build", "--no-gpu", "--no-resume"])
    assert res.exit_code != 0 and "--no-resume only applies with --remeasure" in res.output


def test_cache_show_and_prune_name_the_cache_and_what_went(proj, monkeypatch):
    monkeypatch.chdir(proj)
    res = CliRunner().invoke(cli.main, ["cache", "prune", "--older-than", "0"])   # no cache yet
    assert res.exit_code == 0 and "0 compile(s) dropped" in res.output
    res = CliRunner().invoke(cli.main, ["cache"])
    assert res.exit_code == 0 and ".sqlite: " in res.output and "compiles" in res.output
