"""CLI boundaries: exit codes for a tool that cannot run, kept apart from a failed build."""

import shutil
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from ptxbuild import cli


def test_missing_compiler_is_a_tool_error_not_a_failed_build(proj, monkeypatch):
    from ptxbuild.compile import compiler

    def missing():
        raise compiler.ToolchainMissing(
            "the CUDA compiler is not installed (no module cuda); run: pip install x"
        )

    monkeypatch.setattr(compiler, "toolchain", missing)
    monkeypatch.chdir(proj)
    res = CliRunner().invoke(cli.main, ["build", "--no-gpu"])
    assert res.exit_code == cli.EXIT_TOOL == 3
    assert (
        res.output
        == "Error: the CUDA compiler is not installed (no module cuda); run: pip install x\n"
    )


def test_remeasure_and_remeasure_only_together_is_a_usage_error(proj, monkeypatch):
    monkeypatch.chdir(proj)
    res = CliRunner().invoke(
        cli.main, ["build", "--no-gpu", "--remeasure", "--remeasure-only", "x1024]"]
    )
    assert res.exit_code != 0 and "not both" in res.output
    res = CliRunner().invoke(cli.main, ["build", "--no-gpu", "--no-resume"])
    assert res.exit_code != 0 and "--no-resume only applies with --remeasure" in res.output


def test_cache_show_and_prune_name_the_cache_and_what_went(proj, monkeypatch):
    monkeypatch.chdir(proj)
    res = CliRunner().invoke(cli.main, ["cache", "prune", "--older-than", "0"])  # no cache yet
    assert res.exit_code == 0 and "0 compile(s) dropped" in res.output
    res = CliRunner().invoke(cli.main, ["cache"])
    assert res.exit_code == 0 and ".sqlite: " in res.output and "compiles" in res.output


def _edit(proj, old, new):
    kf = proj / "kernelfile.toml"
    kf.write_text(kf.read_text().replace(old, new))


def test_inputs_that_used_to_succeed_silently_are_errors_that_name_the_input(proj, monkeypatch):
    """Each of these once printed success (or did nothing) and left the user to find out later."""
    from .conftest import make_ctx

    monkeypatch.chdir(proj)
    monkeypatch.setattr(cli.shell, "_context", lambda kf, *a, **k: make_ctx(proj))
    run = lambda *args: CliRunner().invoke(cli.main, list(args))  # noqa: E731
    res = run("plan", "scale@")
    assert (
        res.exit_code == cli.EXIT_CONFIG and "scale@: nothing after '@'; write op@gpu" in res.output
    )
    res = run("build", "--no-gpu", "--remeasure-only", "float32[99x99]")
    assert res.exit_code == cli.EXIT_CONFIG, res.output
    assert (
        "--remeasure-only 'float32[99x99]' matches no problem of these targets (labels look like 'float32["
        in res.output
    )
    assert (
        run("build", "-j", "0").exit_code == 2
        and run("cache", "prune", "--older-than", "-1").exit_code == 2
    )
    res = run("lessons", "show", "nosuchop")
    assert res.exit_code == 0 and "no lessons yet" in res.output  # an empty cache: the generic hint
    from ptxbuild.problem import Problem
    from ptxbuild.store import lessons
    from ptxbuild.store.cache import Cache

    scope = lessons._scope("h100", "sm_90a", Problem.make("scale", "float32", (64, 1024)).key())
    Cache(proj / "cache/ptxbuild.sqlite").db["lessons"].insert(
        lessons._row(
            "scale", "best", scope, {"params": {"threads": 64}, "p50_ms": 0.01}, [1], 1.0, "test"
        )
    )
    res = run("lessons", "show", "sacle")
    assert (
        res.exit_code == 0
        and "no lessons for op 'sacle'; the cache has lessons for scale" in res.output
    )


def test_an_op_with_no_gpus_and_an_unknown_gpu_in_another_kernelfile_name_the_file_and_key(
    proj, monkeypatch
):
    monkeypatch.chdir(proj)
    _edit(proj, "search = { budget = 6 }", "search = { budget = 6 }\ngpus = []")
    res = CliRunner().invoke(cli.main, ["check"])
    assert (
        res.exit_code == cli.EXIT_CONFIG
        and "kernelfile.toml: ops.scale.gpus: empty, so nothing would be built" in res.output
    )
    (proj / "k.toml").write_text(
        (proj / "kernelfile.toml")
        .read_text()
        .replace("gpus = []", "")
        .replace("[gpus.b200]", "[gpus.h300]")
    )
    res = CliRunner().invoke(cli.main, ["-f", "k.toml", "check"])
    assert (
        res.exit_code == cli.EXIT_CONFIG
        and "k.toml: gpus.h300: unknown GPU (did you mean 'h200'?)" in res.output
    )


def test_version_names_the_installed_package():
    from importlib.metadata import version

    res = CliRunner().invoke(cli.main, ["--version"])
    assert res.exit_code == 0 and res.output == f"ptxbuild, version {version('ptxbuild')}\n"


@pytest.mark.compile  # the real compiler: the CLI builds without the fakes
def test_plan_is_a_dry_run_that_creates_no_cache(proj, monkeypatch):
    """`ptxbuild plan` only says what a build would do: it used to create the cache (and import the shared
    lessons file into it), so a plan on a fresh clone left a new file behind."""
    monkeypatch.chdir(proj)
    assert CliRunner().invoke(cli.main, ["build", "--no-gpu", "-q", "scale@h100"]).exit_code == 0
    assert CliRunner().invoke(cli.main, ["lessons", "export", "cache/lessons.jsonl"]).exit_code == 0
    for f in (proj / "cache").glob(
        "ptxbuild.sqlite*"
    ):  # a fresh clone: the shared lessons file, no cache
        f.unlink()  # and no build/ (up to date by the lock otherwise)
    shutil.rmtree(proj / "build")
    res = CliRunner().invoke(cli.main, ["plan", "--no-gpu", "scale@h100"])
    assert res.exit_code == 0 and "build      scale@h100  (never built)" in res.output, res.output
    assert not list((proj / "cache").glob("ptxbuild.sqlite*")) and "lessons:" not in res.output
    res = CliRunner().invoke(
        cli.main, ["build", "--no-gpu", "scale@h100"]
    )  # a build does import them
    assert "lessons: imported" in res.output, res.output
    res = CliRunner().invoke(cli.main, ["plan", "--no-gpu", "scale@h100"])  # a cache there is read
    assert "up-to-date scale@h100  (up to date)" in res.output, res.output


@pytest.mark.compile  # the real compiler: the CLI builds without the fakes
def test_explain_says_up_to_date_once(proj, monkeypatch):
    """`build --explain` printed 'scale@h100: up to date (up to date)': the reason repeated the status."""
    monkeypatch.chdir(proj)
    res = CliRunner().invoke(cli.main, ["build", "--no-gpu", "-q", "--explain", "scale@h100"])
    assert res.exit_code == 0 and res.stdout.startswith("scale@h100: stale (never built)\n"), (
        res.output
    )
    res = CliRunner().invoke(cli.main, ["build", "--no-gpu", "-q", "--explain", "scale@h100"])
    assert res.exit_code == 0 and "(up to date)" not in res.output, res.output
    assert res.stdout == "scale@h100: up to date\n" * 2, (
        res.output
    )  # the explain line, then the result line


@pytest.mark.compile  # the real compiler: the CLI builds without the fakes
def test_the_lock_line_is_printed_only_when_the_lock_changed(proj, monkeypatch):
    """After a build the CLI printed 'lock: .../kernelfile.lock' even when the build left the lock as it was."""
    monkeypatch.chdir(proj)

    def said(res):
        return [line for line in res.stderr.splitlines() if line.startswith("lock: ")]

    res = CliRunner().invoke(cli.main, ["build", "--no-gpu", "scale@h100"])
    assert (
        res.exit_code == 0 and len(said(res)) == 1 and said(res)[0].endswith("kernelfile.lock")
    ), res.output
    text = (proj / "kernelfile.lock").read_text()
    res = CliRunner().invoke(
        cli.main, ["build", "--no-gpu", "scale@h100"]
    )  # up to date: the same lock
    assert (
        res.exit_code == 0 and not said(res) and (proj / "kernelfile.lock").read_text() == text
    ), res.output
    res = CliRunner().invoke(
        cli.main, ["build", "--no-gpu", "scale@b200"]
    )  # a new entry: said again
    assert (
        res.exit_code == 0
        and len(said(res)) == 1
        and (proj / "kernelfile.lock").read_text() != text
    ), res.output


@pytest.mark.compile  # the real compiler: the CLI builds without the fakes
def test_a_compile_only_build_prints_one_progress_line_per_target(proj, monkeypatch):
    """The README's first command printed 132 lines of 'tried 1, failed 0, best compiled' (one per problem
    of two compile-only targets); a timed build still prints one line per problem."""
    monkeypatch.chdir(proj)
    res = CliRunner().invoke(cli.main, ["build", "--no-gpu", "scale@h100", "scale@b200"])
    assert res.exit_code == 0, res.output
    lines = [line for line in res.output.splitlines() if line.startswith("  ")]
    assert len(lines) == 2 and all(
        line.startswith("  4/4 problems compiled and resource-checked, not timed (")
        for line in lines
    ), res.output
    progress, seen = cli.Progress(), []
    monkeypatch.setattr(cli.click, "echo", lambda msg="", **k: seen.append(msg))
    from ptxbuild.problem import Problem

    p = Problem.make("scale", "float32", (7, 100))
    for i in range(2):  # timed: a line per problem, with its time
        progress("problem_start", index=i, total=2, problem=p)
        progress("attempt", outcome=SimpleNamespace(failed=False), score=0.0123)
        progress("problem_done", entry={})
    assert [m.split(" (")[0] for m in seen] == [
        f"  [{i}/2] float32[7x100]: tried 1, failed 0, best 12.3 us" for i in (1, 2)
    ]


def test_plan_stops_the_gpu_worker_it_started(proj, monkeypatch):
    """With a GPU present, plan starts the worker to read its fingerprint (part of every key); it was
    never stopped."""
    from .conftest import make_ctx

    closed = []
    monkeypatch.setattr(
        cli.shell,
        "_context",
        lambda kf, *a, **k: make_ctx(proj, gpu=SimpleNamespace(close=lambda: closed.append(1))),
    )
    monkeypatch.chdir(proj)
    res = CliRunner().invoke(cli.main, ["plan", "scale@h100"])
    assert res.exit_code == 0 and "scale@h100  (never built)" in res.output and closed == [1], (
        res.output
    )


def test_a_stopped_build_still_prints_the_gate_misses_of_the_targets_it_finished(proj, monkeypatch):
    """Ctrl-C after a target finished: it is locked, and the gate misses it was judged with are printed
    as after a whole build (they were not: the user saw only "interrupted")."""
    from ptxbuild.build import run as run_mod
    from ptxbuild.declare.graph import Target
    from ptxbuild.records import TargetResult

    from .conftest import make_ctx

    monkeypatch.chdir(proj)
    monkeypatch.setattr(cli.shell, "_context", lambda kf, *a, **k: make_ctx(proj))

    def stopped(ctx, targets):
        finished = TargetResult(
            Target("scale", "h100"),
            "built",
            "",
            missed=("float32[7x100]: p50 0.01 ms > max_time_ms 0.005",),
        )
        return run_mod.Run([finished], KeyboardInterrupt())

    monkeypatch.setattr(run_mod, "run", stopped)
    res = CliRunner().invoke(cli.main, ["build", "--no-gpu", "scale@h100"])
    assert res.exit_code == 130, res.output
    assert (
        "scale@h100: 1 gate(s) missed (ops.scale.gates):\n  - float32[7x100]: p50 0.01 ms > max_time_ms 0.005\n"
        in res.output
    ), res.output


def test_doctor_runs_without_a_gpu_and_names_the_code_digest():
    """`ptxbuild doctor` never raises: here (no GPU needed) it prints every check, the code first."""
    from ptxbuild.outputs.environment import code_digest

    res = CliRunner().invoke(cli.main, ["doctor"])
    assert res.exit_code == 0, res.output
    names = [line.split()[0] for line in res.output.splitlines()]
    assert names[:3] == ["ptxbuild", "python", "numpy"], res.output
    assert {"cupy", "torch", "nvidia-smi", "gpu", "compiler"} <= set(names), res.output
    assert f"code {code_digest()}" in res.output.splitlines()[0]
