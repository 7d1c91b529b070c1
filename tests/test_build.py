"""The pipeline with fake compile/GPU stages: incremental rebuilds, outcomes as data, GPU path, explain."""

import json

import pytest
from click.testing import CliRunner

from ptxbuild import cli
from ptxbuild.build import beside
from ptxbuild.build import target as build_mod
from ptxbuild.build.context import Context
from ptxbuild.build.plan import plan
from ptxbuild.build.run import build
from ptxbuild.declare.graph import Target
from ptxbuild.declare.kernelfile import load
from ptxbuild.store.cache import Cache

from .conftest import make_ctx
from .fakes import FakeCompiler, FakeGpu, FakeToolchain, fake_match


def _status(results):
    return {str(r.target): r.status for r in results}


def test_first_build_writes_artifacts_and_second_does_nothing(proj):
    comp = FakeCompiler()
    ctx = make_ctx(proj, comp)
    res = build(ctx)
    assert _status(res) == {"scale@h100": "built", "scale@b200": "built"}
    manifest = json.loads((proj / "build/scale@b200/manifest.json").read_text())
    assert manifest["arch"] == "sm_100a" and manifest["measured_on_hardware"] is False
    assert len(manifest["dispatch"]) == 4  # 2 dtypes x 2 shapes
    assert all(
        d["params"] == {"threads": 128, "vec": 1} and d["source"] == "default"
        for d in manifest["dispatch"]
    )
    for v in manifest["variants"].values():
        assert (proj / "build/scale@b200" / v["cubin"]).is_file() and v["ptx_isa"] == "9.0"
    assert (proj / "reports/scale@b200/report.md").read_text().count(
        "not measured on hardware"
    ) == 1
    first = len(comp.calls)
    assert first == 4  # 2 dtypes x 2 arches; the two shapes share one binary
    comp2 = FakeCompiler()
    res = build(make_ctx(proj, comp2))
    assert _status(res) == {"scale@h100": "up_to_date", "scale@b200": "up_to_date"}
    assert comp2.calls == []


def test_a_deleted_artifact_rebuilds_and_the_report_names_it_from_the_project(proj):
    """Reports travel between machines: the reason a target rebuilt names the artifact relative to the
    kernelfile's folder, not by this machine's absolute path."""
    build(make_ctx(proj))
    (proj / "build/scale@b200/manifest.json").unlink()
    ctx = make_ctx(proj)
    res = build(ctx)
    assert _status(res) == {"scale@h100": "up_to_date", "scale@b200": "built"}
    summary = json.loads(ctx.cache.last_build("scale@b200", ctx.kf.project)["summary"])
    assert summary["why"] == "artifact missing: build/scale@b200/manifest.json"
    assert str(proj) not in (proj / "reports/scale@b200/report.json").read_text()


def test_editing_the_template_rebuilds_only_its_targets(proj):
    (proj / "kernelfile.toml").write_text(
        (proj / "kernelfile.toml").read_text()
        + '\n[ops.other]\ntemplate = "scale"\ndtypes = ["float32"]\nshapes = [[8, 8]]\n'
        'gpus = ["h100"]\n'
    )
    build(make_ctx(proj))
    kf_text = (proj / "kernelfile.toml").read_text()
    (proj / "kernelfile.toml").write_text(
        kf_text.replace("shapes = [[8, 8]]", "shapes = [[8, 16]]")
    )
    res = build(make_ctx(proj))
    assert _status(res) == {
        "scale@h100": "up_to_date",
        "scale@b200": "up_to_date",
        "other@h100": "built",
    }
    src = proj / "ops/scale/scale.cu"
    src.write_text(src.read_text() + "\n// edited\n")
    ctx = make_ctx(proj)
    why = {str(t): w for t, fresh, w in plan(ctx, None)}
    assert why["scale@h100"] == "changed: op file scale.cu"
    assert _status(build(ctx)) == {
        "scale@h100": "built",
        "scale@b200": "built",
        "other@h100": "built",
    }


def test_adding_a_gpu_builds_only_that_gpu(proj):
    build(make_ctx(proj))
    text = (proj / "kernelfile.toml").read_text().replace("[gpus.b200]", "[gpus.b200]\n[gpus.h200]")
    (proj / "kernelfile.toml").write_text(text)
    comp = FakeCompiler()
    res = build(make_ctx(proj, comp))
    assert _status(res) == {
        "scale@h100": "up_to_date",
        "scale@b200": "up_to_date",
        "scale@h200": "built",
    }
    assert comp.calls == []  # h200 is sm_90a like h100: every compile is a cache hit


def test_compile_errors_and_spills_are_outcomes(proj):
    ctx = make_ctx(proj, FakeCompiler(spill_on="#define VEC 2", error_on="#define VEC 1"))
    res = build(ctx, [Target("scale", "h100")])
    assert _status(res) == {"scale@h100": "built"}
    outcomes = {
        (a["outcome"], json.loads(a["params"])["vec"]) for a in ctx.cache.attempts("scale@h100")
    }
    assert ("compile_error", 1) in outcomes and ("spill", 2) in outcomes and ("ok", 4) in outcomes
    manifest = json.loads((proj / "build/scale@h100/manifest.json").read_text())
    assert {d["params"]["vec"] for d in manifest["dispatch"]} == {4}


def test_invalid_everywhere_fails_the_target_not_the_tool(proj):
    ctx = make_ctx(proj, FakeCompiler(error_on=""))
    res = build(ctx, [Target("scale", "b200")])
    assert res[0].status == "failed" and "no valid candidate for 4 problem(s)" in res[0].reason
    assert {a["outcome"] for a in ctx.cache.attempts("scale@b200")} == {"compile_error"}


def test_gpu_present_searches_verifies_measures_and_caches(proj):
    gpu = FakeGpu()
    ctx = make_ctx(proj, gpu=gpu, gpu_match=fake_match)
    res = build(ctx, [Target("scale", "h100")])
    assert res[0].measured and res[0].status == "built"
    manifest = json.loads((proj / "build/scale@h100/manifest.json").read_text())
    for d in manifest["dispatch"]:
        if d["problem"]["shape"][1] % 4 == 0:
            assert d["params"] == {"threads": 256, "vec": 4} and d["p50_ms"] == 0.01
        assert d["baselines"]["eager"]["p50_ms"] == 0.05
    assert gpu.verified == gpu.measured > 0
    lessons = list(ctx.cache.db.query("select * from lessons where kind = 'best'"))
    assert len(lessons) == 4  # one best config per problem (plus failure rules and sensitivities)
    # the same build forced again reuses every verdict and timing of a config it tried before
    first = {(a["problem"], a["params"]) for a in ctx.cache.attempts("scale@h100")}
    gpu2 = FakeGpu()
    ctx2 = make_ctx(proj, gpu=gpu2, gpu_match=fake_match, force=True)
    build(ctx2, [Target("scale", "h100")])
    second = [
        (a["problem"], a["params"])
        for a in ctx2.cache.attempts("scale@h100", ctx2.run)
        if a["outcome"] == "ok"
    ]
    assert len(second) > 0
    assert gpu2.measured == len([k for k in second if k not in first])


def test_hardware_appearing_makes_the_target_stale(proj):
    build(make_ctx(proj))
    ctx = make_ctx(proj, gpu=FakeGpu(), gpu_match=fake_match)
    why = {str(t): (fresh, w) for t, fresh, w in plan(ctx, None)}
    assert why["scale@h100"] == (False, "changed: hardware")
    assert why["scale@b200"] == (True, "up to date")


def test_lessons_from_h100_seed_the_b200_compile_only_build(proj):
    build(make_ctx(proj, gpu=FakeGpu(), gpu_match=fake_match), [Target("scale", "h100")])
    build(make_ctx(proj), [Target("scale", "b200")])
    manifest = json.loads((proj / "build/scale@b200/manifest.json").read_text())
    d = [d for d in manifest["dispatch"] if d["label"] == "float32[64x1024]"][0]
    assert d["params"] == {"threads": 256, "vec": 4} and d["source"] == "lesson"


def _raise_keyboard_interrupt():
    raise KeyboardInterrupt


@pytest.mark.parametrize("stop", ["ctrl-c", "sigterm"])
def test_interrupt_keeps_finished_problems_and_marks_the_build(proj, stop):
    """Ctrl-C, or SIGTERM (plain `timeout`, job schedulers): the build stops, keeps what it finished
    (recorded as interrupted, resumable) and puts the signal handlers back."""
    import os
    import signal

    interrupt = {
        "ctrl-c": _raise_keyboard_interrupt,
        "sigterm": lambda: os.kill(os.getpid(), signal.SIGTERM),
    }[stop]

    class Interrupting(FakeCompiler):
        def __call__(self, kernel, arch):
            if len(self.calls) == 1:
                interrupt()
            return super().__call__(kernel, arch)

    ctx = make_ctx(proj, Interrupting())
    with pytest.raises(KeyboardInterrupt):
        build(ctx, [Target("scale", "b200")])
    last = ctx.cache.last_build("scale@b200", ctx.kf.project)
    assert last["status"] == "interrupted" and json.loads(last["summary"])["problems_done"] == "2/4"
    assert (
        "problems built: 2/4 (**interrupted**: rerun to finish)"
        in (proj / "reports/scale@b200/report.md").read_text()
    )
    manifest = json.loads(
        (proj / "build/scale@b200/manifest.json").read_text()
    )  # a model loading it is told
    assert manifest["incomplete"] == "2/4" and len(manifest["dispatch"]) == 2
    from ptxbuild.runtime import load as load_built

    with pytest.warns(
        UserWarning, match=r"interrupted \(2/4 problems built\); run: ptxbuild build scale@b200 to"
    ):
        load_built(proj / "build/scale@b200", op_folder=proj / "ops/scale")
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    comp = FakeCompiler()
    ctx2 = make_ctx(proj, comp)
    assert [(str(t), w) for t, f, w in plan(ctx2, [Target("scale", "b200")])] == [
        ("scale@b200", "last build interrupted")
    ]
    assert _status(build(ctx2, [Target("scale", "b200")])) == {"scale@b200": "built"}
    assert len(comp.calls) == 1  # the finished float32 compile was not redone
    assert "incomplete" not in json.loads((proj / "build/scale@b200/manifest.json").read_text())


def test_baselines_are_cached_per_gpu_and_problem(proj):
    gpu = FakeGpu()
    calls = []
    orig = gpu.baselines
    gpu.baselines = lambda *a, **k: calls.append(a) or orig(*a, **k)
    build(make_ctx(proj, gpu=gpu, gpu_match=fake_match), [Target("scale", "h100")])
    assert len(calls) == 4
    build(make_ctx(proj, gpu=gpu, gpu_match=fake_match, force=True), [Target("scale", "h100")])
    assert len(calls) == 4
    manifest = json.loads((proj / "build/scale@h100/manifest.json").read_text())
    assert all(d["baselines"]["eager"]["p50_ms"] == 0.05 for d in manifest["dispatch"])


def test_metric_and_gates_are_judged_on_measured_builds(proj):
    kf = proj / "kernelfile.toml"
    kf.write_text(
        kf.read_text().replace(
            "search = { budget = 6 }", "search = { budget = 6 }\ngates = { max_time_ms = 0.015 }"
        )
    )
    ctx = make_ctx(proj, gpu=FakeGpu(), gpu_match=fake_match)
    res = build(ctx, [Target("scale", "h100")])
    # the fake GPU times vec=4 at 0.01 ms; 7x100 only allows vec<=4 too, so every winner is 0.01 ms
    assert res[0].status == "built"
    summary = json.loads(ctx.cache.last_build("scale@h100", ctx.kf.project)["summary"])
    assert summary["metric"] == {
        "name": "geomean_time",
        "value_ms": pytest.approx(0.01),
        "problems": 4,
    }
    assert summary["gates"] == {"declared": {"max_time_ms": 0.015}, "failures": []}
    assert (
        "- gates: max_time_ms = 0.015: all met"
        in (proj / "reports/scale@h100/report.md").read_text()
    )
    assert res[0].missed == ()


def test_a_gate_edit_rejudges_the_built_kernels_without_a_new_search(proj, monkeypatch):
    """Gates judge a build and never change it: a stricter gate must not throw away a 30-minute GPU search
    (it did: gates were part of the build key). The target stays up to date, and the build, the report
    and `ptxbuild report` all judge it by the gate as it is now; a miss exits 1 but stays built and locked."""
    from ptxbuild.outputs.lockfile import read_lock

    kf = proj / "kernelfile.toml"
    kf.write_text(
        kf.read_text().replace(
            "search = { budget = 6 }", "search = { budget = 6 }\ngates = { max_time_ms = 0.015 }"
        )
    )
    build(make_ctx(proj, gpu=FakeGpu(), gpu_match=fake_match), [Target("scale", "h100")])
    kf.write_text(kf.read_text().replace("max_time_ms = 0.015", "max_time_ms = 0.005"))
    ctx = make_ctx(proj, gpu=FakeGpu(), gpu_match=fake_match)
    (res,) = build(ctx, [Target("scale", "h100")])
    assert (res.status, len(res.missed)) == ("up_to_date", 4)
    assert res.missed[0] == "float32[7x100]: p50 0.01 ms > max_time_ms 0.005"
    assert plan(ctx, [Target("scale", "h100")]) == [
        (Target("scale", "h100"), True, "up to date; 4 gate(s) of ops.scale.gates missed")
    ]
    assert ctx.cache.last_build("scale@h100", ctx.kf.project)["status"] == "ok"
    report = proj / "reports/scale@h100/report.md"
    assert "- gates: max_time_ms = 0.005: **4 missed**" in report.read_text()
    ctx.force = True  # a forced rebuild judges the same
    assert build(ctx, [Target("scale", "h100")])[0].missed == res.missed
    monkeypatch.setattr(
        cli.shell,
        "_context",
        lambda kf, *a, **k: make_ctx(proj, gpu=FakeGpu(), gpu_match=fake_match),
    )
    monkeypatch.chdir(proj)
    kf.write_text(kf.read_text().replace("max_time_ms = 0.005", "max_time_ms = 0.5"))
    out = CliRunner().invoke(cli.main, ["build", "scale@h100"])
    assert out.exit_code == 0 and "gate(s) missed" not in out.output, out.output
    assert "- gates: max_time_ms = 0.5: all met" in report.read_text()
    kf.write_text(kf.read_text().replace("max_time_ms = 0.5", "max_time_ms = 0.005"))
    out = CliRunner().invoke(cli.main, ["build", "scale@h100"])
    assert out.exit_code == cli.EXIT_BUILD_FAILED, out.output
    assert (
        "scale@h100: 4 gate(s) missed (ops.scale.gates):\n  - float32[7x100]: p50 0.01 ms > max_time_ms 0.005\n"
        in out.output
    )
    assert "scale@h100" in read_lock(load(kf))["targets"]  # built all the same: locked
    out = CliRunner().invoke(
        cli.main, ["build", "--locked", "scale@h100"]
    )  # judged from the lock entry
    assert (
        out.exit_code == cli.EXIT_BUILD_FAILED and "scale@h100: 4 gate(s) missed" in out.output
    ), out.output
    # a compile-only build beside the measured report (another machine's, committed) must not re-judge that
    # report by its own untimed kernels: it showed "all met" over 14 misses (found in review)
    monkeypatch.setattr(cli.shell, "_context", lambda kf, *a, **k: make_ctx(proj))
    assert (
        CliRunner().invoke(cli.main, ["build", "--no-gpu", "--force", "scale@h100"]).exit_code == 0
    )
    assert (
        CliRunner().invoke(cli.main, ["build", "--no-gpu", "scale@h100"]).exit_code == 0
    )  # up to date, untimed
    assert "- gates: max_time_ms = 0.005: **4 missed**" in report.read_text()
    kf.write_text(kf.read_text().replace("max_time_ms = 0.005", "max_time_ms = 0.05"))
    CliRunner().invoke(
        cli.main, ["report", "scale@h100"]
    )  # the cache's build is compile-only: the report
    assert (
        "- gates: max_time_ms = 0.05: all met" in report.read_text()
    )  # there is judged all the same
    kf.write_text(kf.read_text().replace("max_time_ms = 0.05", "max_time_ms = 0.005"))
    ctx.cache.db.execute("delete from builds")  # a committed report, another machine's cache:
    kf.write_text(kf.read_text().replace("max_time_ms = 0.005", "max_time_ms = 0.5"))
    out = CliRunner().invoke(cli.main, ["report", "scale@h100"])
    assert (
        "no build in this cache; its report reports/scale@h100/report.md is rendered again from report.json; "
        "run: ptxbuild build --locked scale@h100"
    ) in out.output, out.output  # locked: rebuild what the lock says
    assert (
        "- gates: max_time_ms = 0.5: all met" in report.read_text()
    )  # judged by the kernelfile as it is now


def test_a_second_sigint_while_the_partial_report_is_written_does_not_lose_it(proj, monkeypatch):
    """`timeout -s INT` signals the build and then its process group: two SIGINTs, the second one
    arriving while the interrupted build writes its artifacts. The report must still be written."""
    import os
    import signal

    class Interrupting(FakeCompiler):
        def __call__(self, kernel, arch):
            if len(self.calls) == 1:
                os.kill(os.getpid(), signal.SIGINT)
            return super().__call__(kernel, arch)

    real = build_mod.write_artifacts

    def second_signal(*a, **k):
        os.kill(os.getpid(), signal.SIGINT)
        return real(*a, **k)

    monkeypatch.setattr(build_mod, "write_artifacts", second_signal)
    ctx = make_ctx(proj, Interrupting())
    with pytest.raises(KeyboardInterrupt):
        build(ctx, [Target("scale", "b200")])
    assert ctx.cache.last_build("scale@b200", ctx.kf.project)["status"] == "interrupted"
    assert "**interrupted**" in (proj / "reports/scale@b200/report.md").read_text()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_kernelfiles_sharing_a_cache_keep_their_own_builds(proj):
    """benchmarks/*.toml share the repository's cache and target names: one kernelfile's build must
    not make another's target up to date, nor show up in its report."""
    text = (proj / "kernelfile.toml").read_text()
    (proj / "other.toml").write_text(text.replace('name = "toy"', 'name = "other"'))
    build(make_ctx(proj), [Target("scale", "b200")])
    kf2 = load(proj / "other.toml")
    ctx2 = Context(
        kf=kf2,
        cache=Cache(kf2.cache_path),
        toolchain=FakeToolchain(),
        compile_fn=FakeCompiler(),
        jobs=1,
    )
    assert ctx2.cache.last_build("scale@b200", "toy")["status"] == "ok"
    assert ctx2.cache.last_build("scale@b200", "other") is None
    assert [(str(t), w) for t, f, w in plan(ctx2, [Target("scale", "b200")])] == [
        ("scale@b200", "never built")
    ]


def test_a_first_sigint_while_a_finished_build_is_saved_keeps_its_record_and_report(
    proj, monkeypatch
):
    """A SIGINT that arrives after the last problem, while the artifacts, lessons and build record are
    written, must not lose them: the build is recorded and reported, then the interrupt goes on."""
    import os
    import signal

    real = build_mod.write_artifacts

    def signal_while_saving(*a, **k):
        os.kill(os.getpid(), signal.SIGINT)
        return real(*a, **k)

    monkeypatch.setattr(build_mod, "write_artifacts", signal_while_saving)
    ctx = make_ctx(proj)
    with pytest.raises(KeyboardInterrupt):
        build(ctx, [Target("scale", "b200")])
    last = ctx.cache.last_build("scale@b200", ctx.kf.project)
    assert last is not None and json.loads(last["summary"])["problems_done"] == "4/4"
    assert (proj / "reports/scale@b200/report.md").is_file()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_baseline_the_harness_failed_is_measured_again_next_build(proj):
    """An out-of-memory or a crashed baseline call says nothing about the baseline: it must not be
    cached (the H200 run cached one and would never have re-measured those rows)."""
    from ptxbuild.outcome import Outcome

    from .fakes import _M

    class OomOnce(FakeGpu):
        calls = 0

        def baselines(self, op_folder, problem, **kw):
            OomOnce.calls += 1
            if OomOnce.calls <= 4:  # the first build: every problem's baseline call fails
                return {"*": _M(Outcome.LAUNCH_ERROR, float("nan"), float("nan"), float("nan"))}
            return super().baselines(op_folder, problem, **kw)

    build(make_ctx(proj, gpu=OomOnce(), gpu_match=fake_match), [Target("scale", "h100")])
    first = OomOnce.calls
    build(
        make_ctx(proj, gpu=OomOnce(), gpu_match=fake_match, force=True), [Target("scale", "h100")]
    )
    assert OomOnce.calls > first  # measured again, not read from the cache
    again = OomOnce.calls
    build(
        make_ctx(proj, gpu=OomOnce(), gpu_match=fake_match, force=True), [Target("scale", "h100")]
    )
    assert OomOnce.calls == again  # ok baselines are cached


def test_a_failed_baseline_cached_by_an_older_ptxbuild_is_measured_again(proj):
    """Caches written before that fix hold launch_error baselines (the H200 cache's three 2^31-element
    residual rows): a build must not serve them from the cache."""
    ctx = make_ctx(proj, gpu=FakeGpu(), gpu_match=fake_match)
    build(ctx, [Target("scale", "h100")])
    rows = [r for r in ctx.cache.db["measurements"].rows if r["binary"] == "baselines"]
    assert rows
    for r in rows:  # what the old code stored
        ctx.cache.db["measurements"].update(
            r["key"],
            {
                "detail": json.dumps(
                    {
                        "*": {
                            "outcome": "launch_error",
                            "p50_ms": None,
                            "p20_ms": None,
                            "p80_ms": None,
                            "samples": 0,
                            "detail": "cudaErrorMemoryAllocation",
                        }
                    }
                )
            },
        )
    calls = []

    class Counting(FakeGpu):
        def baselines(self, op_folder, problem, **kw):
            calls.append(problem)
            return super().baselines(op_folder, problem, **kw)

    build(
        make_ctx(proj, gpu=Counting(), gpu_match=fake_match, force=True), [Target("scale", "h100")]
    )
    assert len(calls) == len(rows)
    manifest = json.loads((proj / "build/scale@h100/manifest.json").read_text())
    assert all(d["baselines"]["eager"]["p50_ms"] == 0.05 for d in manifest["dispatch"])


def test_remeasure_times_every_candidate_and_baseline_again_once(proj):
    """--remeasure: compiles and verdicts come from the cache, every timing is taken again in this
    run (each measured config once, each problem's baselines once), and the report says so."""
    first = FakeGpu()
    build(make_ctx(proj, gpu=first, gpu_match=fake_match), [Target("scale", "h100")])
    assert first.measured > 0
    again = FakeGpu()
    build(make_ctx(proj, gpu=again, gpu_match=fake_match, force=True), [Target("scale", "h100")])
    assert again.measured == 0 and again.verified == 0  # --force alone reuses every timing
    assert "come from the cache" in (proj / "reports/scale@h100/report.md").read_text()
    calls = []

    class Counting(FakeGpu):
        def baselines(self, op_folder, problem, **kw):
            calls.append(problem)
            return super().baselines(op_folder, problem, **kw)

    fresh = Counting()
    comp = FakeCompiler()
    ctx = make_ctx(proj, comp, gpu=fresh, gpu_match=fake_match, force=True, remeasure=True)
    build(ctx, [Target("scale", "h100")])
    manifest = json.loads((proj / "build/scale@h100/manifest.json").read_text())
    assert fresh.measured == first.measured and fresh.verified == 0 and comp.calls == []
    assert len(calls) == len(manifest["dispatch"]) == len(set(calls))
    assert (
        "every candidate and baseline timed in this run"
        in (proj / "reports/scale@h100/report.md").read_text()
    )


def test_each_row_says_when_its_timings_were_taken_and_a_rebuild_keeps_the_cached_times(proj):
    """The manifest records when each winner's and each baseline's timing was taken; a rebuild that
    takes them from the cache keeps the original times (not the rebuild's), so a report mixing runs
    shows it; only a fresh --remeasure report calls its baselines "same run"."""
    import time

    t0 = time.time()
    build(make_ctx(proj, gpu=FakeGpu(), gpu_match=fake_match), [Target("scale", "h100")])
    t1 = time.time()
    first = json.loads((proj / "build/scale@h100/manifest.json").read_text())["dispatch"]
    stamps = [d["timed_at"] for d in first] + [
        b["timed_at"] for d in first for b in d["baselines"].values()
    ]
    assert stamps and all(t0 <= t <= t1 for t in stamps)
    text = (proj / "reports/scale@h100/report.md").read_text()
    assert "- timed between " in text and "timed (UTC) |" in text
    assert "## Baselines (same GPU, same protocol)" in text  # not claimed as one run
    from ptxbuild import keys

    assert f"- timing protocol: version {keys.PROTOCOL_VERSION} " in text
    assert (
        json.loads((proj / "reports/scale@h100/report.json").read_text())["summary"]["protocol"]
        == keys.PROTOCOL_VERSION
    )
    time.sleep(0.05)
    build(
        make_ctx(proj, gpu=FakeGpu(), gpu_match=fake_match, force=True), [Target("scale", "h100")]
    )
    again = json.loads((proj / "build/scale@h100/manifest.json").read_text())["dispatch"]
    assert [d["timed_at"] for d in again] == [d["timed_at"] for d in first]
    assert [b["timed_at"] for d in again for b in d["baselines"].values()] == [
        b["timed_at"] for d in first for b in d["baselines"].values()
    ]
    build(
        make_ctx(proj, gpu=FakeGpu(), gpu_match=fake_match, force=True, remeasure=True),
        [Target("scale", "h100")],
    )
    fresh = json.loads((proj / "build/scale@h100/manifest.json").read_text())["dispatch"]
    assert all(d["timed_at"] > t1 for d in fresh)
    assert (
        "## Baselines (same GPU, same run, same protocol)"
        in (proj / "reports/scale@h100/report.md").read_text()
    )


def test_remeasure_only_times_again_just_the_matching_problems(proj):
    """--remeasure-only TEXT: the problems whose label contains TEXT get every candidate and their
    baselines timed again; the others keep their cached timings (and times); the report says which."""
    build(make_ctx(proj, gpu=FakeGpu(), gpu_match=fake_match), [Target("scale", "h100")])
    first = {
        d["label"]: d
        for d in json.loads((proj / "build/scale@h100/manifest.json").read_text())["dispatch"]
    }
    pick = "float32[64x1024]"
    assert pick in first and len(first) > 1
    calls = []

    class Counting(FakeGpu):
        def baselines(self, op_folder, problem, **kw):
            calls.append(problem.label())
            return super().baselines(op_folder, problem, **kw)

    fresh = Counting()
    build(
        make_ctx(
            proj,
            gpu=fresh,
            gpu_match=fake_match,
            force=True,
            remeasure=True,
            remeasure_only=(pick,),
        ),
        [Target("scale", "h100")],
    )
    again = {
        d["label"]: d
        for d in json.loads((proj / "build/scale@h100/manifest.json").read_text())["dispatch"]
    }
    assert calls == [pick] and fresh.measured > 0
    assert again[pick]["timed_at"] > first[pick]["timed_at"]
    assert all(again[k]["timed_at"] == first[k]["timed_at"] for k in first if k != pick)
    text = (proj / "reports/scale@h100/report.md").read_text()
    assert f"problems matching `{pick}` timed again in this run (`--remeasure-only`)" in text
    assert "## Baselines (same GPU, same protocol)" in text
    notes = []
    ctx = make_ctx(
        proj,
        gpu=FakeGpu(),
        gpu_match=fake_match,
        force=True,
        remeasure=True,
        remeasure_only=("x4096]",),
    )
    ctx.report = lambda kind, **kw: notes.append(kw.get("message", "")) if kind == "note" else None
    build(ctx, [Target("scale", "h100")])
    assert any("matches none of its problems" in n and "scale@h100" in n for n in notes)


def test_the_report_lists_each_problems_timed_candidates_fastest_first(proj):
    """The losers are evidence: each problem's fastest timed configs of the run, with their ratio to
    the fastest (FakeGpu: threads=256, vec=4 wins at 0.01 ms)."""
    build(make_ctx(proj, gpu=FakeGpu(), gpu_match=fake_match), [Target("scale", "h100")])
    md = (proj / "reports/scale@h100/report.md").read_text()
    section = md.split("## Timed candidates (this run, fastest first)")[1].split("\n## ")[0]
    rows = [r.split(" | ") for r in section.strip().splitlines()[2:] if "..." not in r]
    assert rows and all(len(r) == 4 for r in rows)
    firsts = {}
    for problem, p50, ratio, cfg in rows:
        firsts.setdefault(problem, (float(p50), ratio, cfg))
        assert float(ratio[:-1]) >= 1.0
    assert any(
        cfg.startswith("threads=256 vec=4") and p50 == 10.0 and ratio == "1.00x"
        for p50, ratio, cfg in firsts.values()
    )


def test_untimed_baselines_are_announced_before_they_run_and_not_when_cached(proj):
    """Baselines are third-party code that may compile or autotune for minutes (FLA: ~100 s per new
    problem on the H200): the build says so before the silence, and only when it really times them."""
    events = []
    ctx = make_ctx(
        proj, gpu=FakeGpu(), gpu_match=fake_match, report=lambda kind, **kw: events.append(kind)
    )
    build(ctx, [Target("scale", "h100")])
    done = events.count("problem_done")
    assert done > 0 and events.count("baselines_start") == done
    assert events.index("baselines_start") < events.index("problem_done")
    events.clear()
    build(
        make_ctx(
            proj,
            gpu=FakeGpu(),
            gpu_match=fake_match,
            force=True,
            report=lambda kind, **kw: events.append(kind),
        ),
        [Target("scale", "h100")],
    )
    assert events.count("problem_done") == done and "baselines_start" not in events


def test_a_compile_only_rebuild_of_the_same_kernels_leaves_the_committed_report(proj, monkeypatch):
    """The README's first command, on a fresh clone (no cache), rewrote the committed compile-only reports
    with its own environment and times around the same kernels: a dirty checkout. The report now stands."""
    build(make_ctx(proj), [Target("scale", "h100")])
    path = proj / "reports/scale@h100/report.json"
    first = path.read_text()
    for f in (proj / "cache").glob("ptxbuild.sqlite*"):
        f.unlink()
    ctx = make_ctx(proj)
    assert build(ctx, [Target("scale", "h100")])[0].status == "built"
    assert path.read_text() == first and json.loads(first)["summary"]["run"] != ctx.run
    monkeypatch.chdir(proj)  # nor does `ptxbuild report` from that cache
    assert (
        CliRunner().invoke(cli.main, ["report", "scale@h100"]).exit_code == 0
        and path.read_text() == first
    )
    kf = proj / "kernelfile.toml"  # a gate declared later: said, but not judged
    kf.write_text(
        kf.read_text().replace(
            "search = { budget = 6 }", "search = { budget = 6 }\ngates = { max_time_ms = 0.005 }"
        )
    )
    assert build(make_ctx(proj), [Target("scale", "h100")])[0].status == "up_to_date"
    assert (
        "- gates: max_time_ms = 0.005: not judged (not measured on hardware)\n"
        in path.with_suffix(".md").read_text()
    )


def test_a_report_can_be_rewritten_from_the_cache_where_the_artifacts_are_not(proj):
    """A GPU machine builds, its cache comes back, its build/ folder does not: `ptxbuild report`
    still has the results table (the dispatch travels in the build's summary)."""
    import shutil

    from ptxbuild.outputs.report import write_report

    ctx = make_ctx(proj, gpu=FakeGpu(), gpu_match=fake_match)
    build(ctx, [Target("scale", "h100")])
    before = (proj / "reports/scale@h100/report.md").read_text()
    shutil.rmtree(proj / "build")
    (proj / "reports/scale@h100/report.md").unlink()
    write_report(ctx.kf, ctx.cache, Target("scale", "h100"))
    after = (proj / "reports/scale@h100/report.md").read_text()
    assert after == before and "threads=256 vec=4" in after.split("## Results")[1].split("##")[0]


def test_a_stale_manifest_on_this_machine_does_not_replace_the_builds_own_results(proj):
    """The GPU machine's build comes back in the cache; build/ here holds an older local build's
    manifest with other winners. The rewritten report shows the GPU build's results."""
    from ptxbuild.outputs.report import write_report

    ctx = make_ctx(proj, gpu=FakeGpu(), gpu_match=fake_match)
    build(ctx, [Target("scale", "h100")])
    before = (proj / "reports/scale@h100/report.md").read_text()
    path = proj / "build/scale@h100/manifest.json"
    stale = json.loads(path.read_text())
    for d in stale["dispatch"]:
        d["params"], d["p50_ms"] = {"threads": 64, "vec": 1}, 9.99
    path.write_text(json.dumps(stale))
    write_report(ctx.kf, ctx.cache, Target("scale", "h100"))
    after = (proj / "reports/scale@h100/report.md").read_text()
    assert after == before and "9990" not in after and "threads=64 vec=1 |" not in after


def _declare_candidates(proj, entries: str):
    kf = proj / "kernelfile.toml"
    kf.write_text(
        kf.read_text().replace(
            "search = { budget = 6 }", f"search = {{ budget = 6, candidates = {entries} }}"
        )
    )


def test_declared_candidates_are_tried_first_merged_over_the_default(proj):
    # vec = 4 does not divide N = 102: that entry is skipped for the 7x102 problems, kept for 64x1024
    _declare_candidates(proj, "[{ vec = 4 }, { threads = 64, vec = 2 }]")
    kf = proj / "kernelfile.toml"
    kf.write_text(kf.read_text().replace("[7, 100]", "[7, 102]"))

    class Recording(FakeGpu):
        order: list = []

        def measure(self, op_folder, params, problem, binary, *a, **k):
            self.order.append((problem.shape[1], dict(params)))
            return super().measure(op_folder, params, problem, binary, *a, **k)

    gpu = Recording()
    build(make_ctx(proj, gpu=gpu, gpu_match=fake_match), [Target("scale", "h100")])
    wide = [p for n, p in gpu.order if n == 1024]
    narrow = [p for n, p in gpu.order if n == 102]
    assert wide[:2] == [{"threads": 128, "vec": 4}, {"threads": 64, "vec": 2}]
    assert narrow[0] == {"threads": 64, "vec": 2} and {"threads": 128, "vec": 4} not in narrow


def test_a_declared_candidate_with_an_unknown_parameter_names_the_key(proj, monkeypatch):
    _declare_candidates(proj, "[{ vec = 2 }, { warps = 4 }]")
    monkeypatch.chdir(proj)
    res = CliRunner().invoke(cli.main, ["build", "--no-gpu"])
    assert res.exit_code == cli.EXIT_CONFIG
    assert (
        "ops.scale.search.candidates[1]: unknown parameter(s) warps; the op's parameters are threads, vec"
        in res.output
    )


@pytest.mark.parametrize(
    "entry, shown", [("vec = 3", "3"), ("vec = 2.0", "2.0"), ("vec = true", "True")]
)
def test_a_declared_candidate_value_outside_the_space_is_an_error(proj, entry, shown):
    """Values are compared with their type: 2.0 == 2 and True == 1 in Python, but they would render
    and key differently from the op's own values."""
    from ptxbuild.declare.checks import check_declaration
    from ptxbuild.declare.kernelfile import KernelfileError
    from ptxbuild.oploader import load_op

    _declare_candidates(proj, f"[{{ {entry} }}]")
    kf = load(proj / "kernelfile.toml")
    with pytest.raises(
        KernelfileError, match=rf"candidates\[0\]: vec = {shown} is not one of \[1, 2, 4\]"
    ):
        check_declaration(kf.ops["scale"], load_op(kf.ops["scale"].template, kf.root))


def test_ptxbuild_check_rejects_bad_candidates_before_any_build(proj, monkeypatch):
    _declare_candidates(proj, "[{ vec = 2.0 }]")
    monkeypatch.chdir(proj)
    res = CliRunner().invoke(cli.main, ["check"])
    assert (
        res.exit_code == cli.EXIT_CONFIG
        and "candidates[0]: vec = 2.0 is not one of [1, 2, 4]" in res.output
    )


def _notes_of_a_compile_only_build(proj) -> list[str]:
    notes = []
    ctx = make_ctx(
        proj, report=lambda kind, **kw: notes.append(kw.get("message")) if kind == "note" else None
    )
    build(ctx, [Target("scale", "b200")])
    return notes


def test_declared_candidates_change_the_declaration_and_are_labelled_in_compile_only_builds(proj):
    before = load(proj / "kernelfile.toml").ops["scale"].config()
    _declare_candidates(proj, "[{ threads = 64, vec = 2 }]")
    after = load(proj / "kernelfile.toml").ops["scale"].config()
    assert after != before and after["search"]["candidates"] == [{"threads": 64, "vec": 2}]
    notes = _notes_of_a_compile_only_build(proj)
    manifest = json.loads((proj / "build/scale@b200/manifest.json").read_text())
    assert {d["source"] for d in manifest["dispatch"]} == {"declared"}
    assert all(d["params"] == {"threads": 64, "vec": 2} for d in manifest["dispatch"])
    assert notes == []


def test_a_compile_only_build_prefers_a_transferred_lesson_to_a_declared_candidate(proj):
    """Declared candidates are timed first where a GPU measures them; without one, a lesson (another
    GPU's measured winner) is evidence and a declaration is a guess: the lesson decides, and the
    declared candidate serves only the problems no lesson covers."""
    _declare_candidates(proj, "[{ threads = 64, vec = 2 }]")
    build(make_ctx(proj, gpu=FakeGpu(), gpu_match=fake_match), [Target("scale", "h100")])
    measured = json.loads((proj / "build/scale@h100/manifest.json").read_text())["dispatch"]
    build(make_ctx(proj), [Target("scale", "b200")])
    guessed = json.loads((proj / "build/scale@b200/manifest.json").read_text())["dispatch"]
    h100 = {d["label"]: d["params"] for d in measured}
    assert any(
        p != {"threads": 64, "vec": 2} for p in h100.values()
    )  # the candidate lost somewhere
    for d in guessed:
        assert d["source"] == "lesson" and d["params"] == h100[d["label"]], d


def test_a_declared_candidate_the_op_rejects_is_skipped_with_its_reason(proj):
    _declare_candidates(proj, "[{ vec = 4 }]")
    kf = proj / "kernelfile.toml"
    kf.write_text(kf.read_text().replace("[7, 100]", "[7, 102]"))
    notes = _notes_of_a_compile_only_build(proj)
    assert notes == [
        f"{d}[7x102]: ops.scale.search.candidates[0] skipped: N=102 is not a multiple of vec=4"
        for d in ("float32", "bfloat16")
    ]


def test_an_empty_candidates_list_leaves_the_declaration_digest_alone(proj):
    before = load(proj / "kernelfile.toml").ops["scale"].config()
    _declare_candidates(proj, "[]")
    assert load(proj / "kernelfile.toml").ops["scale"].config() == before
    assert "candidates" not in before["search"]


def test_polish_times_the_winners_neighbours_along_the_declared_parameters(proj):
    """budget = 1 times only the default (threads=128, vec=1); polish = ["vec"] then times vec = 2 and
    4 beside it (where N allows), and the fastest of all is the winner. threads is not polished."""
    kf = proj / "kernelfile.toml"
    kf.write_text(
        kf.read_text().replace(
            "search = { budget = 6 }", 'search = { budget = 1, polish = ["vec"] }'
        )
    )

    class Recording(FakeGpu):
        seen: list = []

        def measure(self, op_folder, params, problem, binary, *a, **k):
            self.seen.append((problem.dtype, problem.shape[1], dict(params)))
            return super().measure(op_folder, params, problem, binary, *a, **k)

    gpu = Recording()
    build(make_ctx(proj, gpu=gpu, gpu_match=fake_match), [Target("scale", "h100")])
    assert [p for d, n, p in gpu.seen if (d, n) == ("float32", 1024)] == [
        {"threads": 128, "vec": v} for v in (1, 2, 4)
    ]
    assert [p for d, n, p in gpu.seen if (d, n) == ("float32", 100)] == [
        {"threads": 128, "vec": v} for v in (1, 2, 4)
    ]
    manifest = json.loads((proj / "build/scale@h100/manifest.json").read_text())
    assert {json.dumps(d["params"]) for d in manifest["dispatch"]} == {
        json.dumps({"threads": 128, "vec": 4})
    }


def test_a_polish_parameter_the_op_lacks_names_the_key(proj, monkeypatch):
    kf = proj / "kernelfile.toml"
    kf.write_text(
        kf.read_text().replace(
            "search = { budget = 6 }", 'search = { budget = 6, polish = ["vecs"] }'
        )
    )
    monkeypatch.chdir(proj)
    res = CliRunner().invoke(cli.main, ["check"])
    assert res.exit_code == cli.EXIT_CONFIG
    assert (
        "ops.scale.search.polish[0]: unknown parameter 'vecs' (did you mean 'vec'?)" in res.output
    )


def test_an_undeclared_polish_leaves_the_declaration_digest_alone(proj):
    before = load(proj / "kernelfile.toml").ops["scale"].config()
    kf = proj / "kernelfile.toml"
    kf.write_text(
        kf.read_text().replace("search = { budget = 6 }", "search = { budget = 6, polish = [] }")
    )
    assert (
        load(proj / "kernelfile.toml").ops["scale"].config() == before
        and "polish" not in before["search"]
    )
    kf.write_text(kf.read_text().replace("polish = []", 'polish = ["vec"]'))
    assert load(proj / "kernelfile.toml").ops["scale"].config()["search"]["polish"] == ["vec"]


def _remeasure(proj, gpu, interrupted=False):
    ctx = make_ctx(proj, gpu=gpu, gpu_match=fake_match, force=True, remeasure=True)
    if interrupted:
        with pytest.raises(KeyboardInterrupt):
            build(ctx, [Target("scale", "h100")])
    else:
        build(ctx, [Target("scale", "h100")])
    return ctx


def test_rerunning_an_interrupted_remeasure_build_keeps_what_it_timed(proj):
    """--remeasure, Ctrl-C after some problems, --remeasure again: the rerun times only what the
    interrupted run had not (its timings are as fresh as this run's), and a third --remeasure after a
    finished build times everything again."""
    build(make_ctx(proj, gpu=FakeGpu(), gpu_match=fake_match), [Target("scale", "h100")])

    class StopAfter(FakeGpu):
        def measure(self, *a, **k):
            if self.measured == 3:
                raise KeyboardInterrupt
            return super().measure(*a, **k)

    first = StopAfter()
    _remeasure(proj, first, interrupted=True)
    full = FakeGpu()
    _remeasure(proj, full)
    resumed = FakeGpu()
    ctx = make_ctx(proj, gpu=resumed, gpu_match=fake_match, force=True, remeasure=True)
    # after a finished --remeasure build nothing is resumed: every timing is taken again
    build(ctx, [Target("scale", "h100")])
    total = resumed.measured
    assert first.measured == 3 and full.measured == total - 3  # the first resume already kept 3

    # interrupted again, then resumed: the two runs together time each config once
    stop = StopAfter()
    _remeasure(proj, stop, interrupted=True)
    rest = FakeGpu()
    ctx = make_ctx(proj, gpu=rest, gpu_match=fake_match, force=True, remeasure=True)
    build(ctx, [Target("scale", "h100")])
    assert stop.measured == 3 and rest.measured == total - 3
    summary = json.loads(ctx.cache.last_build("scale@h100", ctx.kf.project)["summary"])
    assert (
        summary["remeasured"]
        and summary["timed_since"] is not None
        and summary["remeasure_resumed"]
    )
    assert "timed since " in (proj / "reports/scale@h100/report.md").read_text()


def test_a_gpu_worker_lost_for_good_keeps_the_finished_problems_and_a_remeasure_resumes(proj):
    """GpuError (the worker cannot be restarted) is recorded like an interrupt: the problems that
    finished are in the build record and the report, and --remeasure again keeps their timings."""
    from ptxbuild.gpu.session import GpuError

    build(make_ctx(proj, gpu=FakeGpu(), gpu_match=fake_match), [Target("scale", "h100")])

    class Dies(FakeGpu):
        def measure(self, *a, **k):
            if self.measured == 8:
                raise GpuError("the GPU worker exited and could not be restarted")
            return super().measure(*a, **k)

    ctx = make_ctx(proj, gpu=Dies(), gpu_match=fake_match, force=True, remeasure=True)
    with pytest.raises(GpuError, match="could not be restarted"):
        build(ctx, [Target("scale", "h100")])
    last = ctx.cache.last_build("scale@h100", ctx.kf.project)
    assert last["status"] == "interrupted" and json.loads(last["summary"])["problems_done"] == "1/4"
    rest, every = FakeGpu(), FakeGpu()
    _remeasure(proj, rest)
    _remeasure(proj, every)
    assert rest.measured == every.measured - 8
    # --no-resume: the same interruption, then every timing taken again
    with pytest.raises(GpuError):
        build(
            make_ctx(proj, gpu=Dies(), gpu_match=fake_match, force=True, remeasure=True),
            [Target("scale", "h100")],
        )
    again = FakeGpu()
    build(
        make_ctx(proj, gpu=again, gpu_match=fake_match, force=True, remeasure=True, resume=False),
        [Target("scale", "h100")],
    )
    assert again.measured == every.measured


def test_a_resumed_remeasure_times_again_what_failed_and_the_baselines_it_had_not_timed(
    proj, monkeypatch
):
    """Timings the interrupted run made are kept only when they succeeded (a failure may be the
    interrupt's own doing: the worker gets the same SIGINT); each problem's baselines are kept or
    timed again the same way."""
    from ptxbuild.outcome import Outcome

    from .fakes import _M

    build(make_ctx(proj, gpu=FakeGpu(), gpu_match=fake_match), [Target("scale", "h100")])

    class Counting(FakeGpu):
        base_calls = 0

        def baselines(self, op_folder, problem, **kw):
            self.base_calls += 1
            return super().baselines(op_folder, problem, **kw)

    class FailOnceThenStop(Counting):
        def measure(self, *a, **k):
            self.measured += 1
            if self.measured == 1:
                return _M(Outcome.TIMEOUT, None, None, None)
            if self.measured == 9:  # in the second problem: the first one's baselines are timed
                raise KeyboardInterrupt
            t = 0.01 * self.measured
            return _M(Outcome.OK, t, t, t)

    bouts, playoff = [], beside.playoff  # a playoff's bouts are timed in every run

    def counted(ev, hist):
        lead = playoff(ev, hist)
        bouts.append(len(ev.bouts))
        return lead

    monkeypatch.setattr(beside, "playoff", counted)
    first = FailOnceThenStop()
    _remeasure(proj, first, interrupted=True)
    rest, n_rest = Counting(), len(bouts)
    _remeasure(proj, rest)
    every, n_rest = Counting(), sum(bouts[n_rest:])
    n_every = len(bouts)
    _remeasure(proj, every)
    n_every = sum(bouts[n_every:])
    # the first run kept 7 successful timings (the timeout and the interrupted one are timed again)
    assert rest.measured - n_rest == every.measured - n_every - 7
    # baselines are timed beside the winner: the first problem's kept ones would do, but its winner
    # changed (the timed-out config, timed again, wins), so they are timed again beside the new one
    assert first.winners[0][1].digest != rest.winners[0][1].digest
    assert first.base_calls == 1 and rest.base_calls == 4 and every.base_calls == 4


def test_min_speedup_gate_compares_each_winner_with_its_closest_baseline():
    from ptxbuild.outputs import gates
    from ptxbuild.records import DispatchEntry

    def entry(row: dict) -> DispatchEntry:
        return DispatchEntry.from_json({"problem": {}, "params": {}, **row})

    def failures(declared: dict, rows: list[dict]) -> list[str]:
        return gates.failures(declared, [entry(r) for r in rows])

    row = {
        "label": "bfloat16[32768x512]",
        "p50_ms": 0.0209,
        "floor_ms": 0.0158,
        "baselines": {
            "torch_eager": {"outcome": "ok", "p50_ms": 0.0321},
            "torch_compile": {"outcome": "ok", "p50_ms": 0.0205},
            "broken": {"outcome": "launch_error", "p50_ms": None},
        },
    }
    assert failures({"min_speedup": 1.0}, [row]) == [
        "bfloat16[32768x512]: 0.981x torch_compile (20.5 against 20.9 us) < min_speedup 1"
    ]
    assert failures({"min_speedup": 0.98}, [row]) == []
    assert (
        failures({"min_speedup": 1.0}, [{**row, "baselines": {}}]) == []
    )  # nothing to compare with
    assert failures({"min_speedup": 1.0}, [{**row, "p50_ms": None}]) == []  # not timed: not judged
    # timed in one window with the winner: the winner's p50 of that window is the one compared
    same = {
        **row,
        "baselines": {
            "torch_compile": {"outcome": "ok", "p50_ms": 0.0205, "winner_p50_ms": 0.0203}
        },
    }
    assert gates.closest_baseline(entry(same)) == (0.0205 / 0.0203, "torch_compile", 0.0205, 0.0203)
    assert failures({"min_speedup": 1.0}, [same]) == []
    # speedup_evidence = "every_round": a loss that some round of the window contradicts is a tie
    tc = {"outcome": "ok", "p50_ms": 0.0205, "winner_p50_ms": 0.0209, "round_ratios": [0.97, 1.01]}
    tie, loss = (
        {**row, "baselines": {"torch_compile": {**tc, "round_ratios": rr}}}
        for rr in ([0.97, 1.01], [0.97, 0.99])
    )
    assert failures({"min_speedup": 1.0}, [tie]) == [
        "bfloat16[32768x512]: 0.981x torch_compile (20.5 against 20.9 us) < min_speedup 1; rounds 0.970-1.010x"
    ]
    assert failures({"min_speedup": 1.0, "speedup_evidence": "every_round"}, [tie]) == []
    assert failures({"min_speedup": 1.0, "speedup_evidence": "every_round"}, [loss]) == [
        "bfloat16[32768x512]: 0.981x torch_compile (20.5 against 20.9 us) < min_speedup 1; rounds 0.970-0.990x"
    ]
    # every baseline is judged: the closest one a round contradicts, another one no round does
    both = {
        **row,
        "baselines": {
            "torch_compile": tie["baselines"]["torch_compile"],
            "torch_eager": {**tc, "p50_ms": 0.0207, "round_ratios": [0.98, 0.995]},
        },
    }
    assert failures({"min_speedup": 1.0, "speedup_evidence": "every_round"}, [both]) == [
        "bfloat16[32768x512]: 0.990x torch_eager (20.7 against 20.9 us) < min_speedup 1; rounds 0.980-0.995x"
    ]
    assert (
        len(failures({"min_speedup": 1.0}, [both])) == 1
    )  # one line per row: its closest baseline
    # a loss that rounds to the threshold is shown with the digit that makes it one
    assert failures({"min_speedup": 1.0}, [{**row, "p50_ms": 0.02051}])[0].startswith(
        "bfloat16[32768x512]: 0.9995x torch_compile (20.5 against 20.5 us)"
    )


def test_baselines_are_timed_beside_the_winner_and_the_report_compares_that_window(proj):
    """The build hands each problem's winner (config and binary) to the baselines' timing; the
    report's speed-up and losses use the winner's p50 of the baselines' window, shown beside them."""
    from ptxbuild.gpu.session import MeasureResult
    from ptxbuild.outcome import Outcome

    from .fakes import _M

    class SameWindow(FakeGpu):
        def baselines(self, op_folder, problem, winner=None, budget_ms=100.0):
            super().baselines(op_folder, problem, winner, budget_ms)
            fast = MeasureResult(
                Outcome.OK, 0.00998, 0.0099, 0.0101, samples=10, incumbent_p50_ms=0.00990
            )
            return {"eager": _M(Outcome.OK, 0.05, 0.049, 0.051), "compiled": fast}

    gpu = SameWindow()
    build(make_ctx(proj, gpu=gpu, gpu_match=fake_match), [Target("scale", "h100")])
    manifest = json.loads((proj / "build/scale@h100/manifest.json").read_text())
    assert [w[1].digest for w in gpu.winners] == [d["binary"] for d in manifest["dispatch"]]
    assert [w[0] for w in gpu.winners] == [d["params"] for d in manifest["dispatch"]]
    assert all(d["baselines"]["compiled"]["winner_p50_ms"] == 0.0099 for d in manifest["dispatch"])
    md = (proj / "reports/scale@h100/report.md").read_text()
    assert "## Rows where it loses" not in md  # the winner's own p50 (0.01) would lose to 0.00998
    assert "| bfloat16[7x100] | compiled | ok | 10.0 | 9.9 | 9.9-10.1 | 10 |" in md


def test_a_baseline_not_run_here_says_why_in_the_report_and_is_cached(proj):
    """A baseline the op did not run (FlashKDA not built on this machine) is a row saying why, no
    timings, no speed-up; the entry is cached like a timing (the op's BASELINES_VERSION says which
    baselines it saw), so the next build times nothing again."""
    from ptxbuild.gpu.session import MeasureResult
    from ptxbuild.outcome import Outcome

    from .fakes import _M

    why = "FlashKDA: not built on this machine (see benchmarks/flashkda_prepare.py | x)"

    class Absent(FakeGpu):
        calls = 0

        def baselines(self, op_folder, problem, **kw):
            Absent.calls += 1
            return {
                "eager": _M(Outcome.OK, 0.05, 0.049, 0.051),
                "flashkda": MeasureResult(Outcome.INVALID, detail=why),
            }

    build(make_ctx(proj, gpu=Absent(), gpu_match=fake_match), [Target("scale", "h100")])
    md = (proj / "reports/scale@h100/report.md").read_text()
    row = "| bfloat16[7x100] | flashkda | invalid: FlashKDA: not built on this machine "
    assert row + "(see benchmarks/flashkda_prepare.py / x) | - | - | --- | 0 |" in md
    assert "x flashkda" not in md  # no speed-up against it
    first = Absent.calls
    build(make_ctx(proj, gpu=Absent(), gpu_match=fake_match, force=True), [Target("scale", "h100")])
    assert Absent.calls == first


def test_the_report_lists_a_loss_that_its_rounded_speed_up_hides(proj):
    """A baseline 0.2% faster than the winner shows as 1.00x in the table; the losses section is
    judged on the timings and names it with its exact ratio."""
    from ptxbuild.outcome import Outcome

    from .fakes import _M

    class CloseBaseline(FakeGpu):
        def baselines(self, op_folder, problem, **kw):
            return {
                "eager": _M(Outcome.OK, 0.05, 0.049, 0.051),
                "compiled": _M(Outcome.OK, 0.00998, 0.0099, 0.0101),
            }

    build(make_ctx(proj, gpu=CloseBaseline(), gpu_match=fake_match), [Target("scale", "h100")])
    md = (proj / "reports/scale@h100/report.md").read_text()
    assert "| 1.00x |" in md
    section = md.split("## Rows where it loses to a baseline (4 of 4)\n\n")[1].split("\n\n")[0]
    assert sorted(section.splitlines()) == sorted(
        f"- {d}[{s}]: 0.998x compiled (10.0 against 10.0 us)"
        for d in ("float32", "bfloat16")
        for s in ("64x1024", "7x100")
    )


def test_a_playoff_times_near_ties_in_one_window_and_keeps_the_faster_there(proj):
    """The search's fastest config meets the next ones within 2% in one window each; a challenger
    faster there wins the problem (timed apart, it was 1% slower). The bouts are recorded beside the
    winner and cached: a rebuild does not time them again."""
    from ptxbuild.gpu.session import MeasureResult
    from ptxbuild.outcome import Outcome

    best, near = {"threads": 256, "vec": 4}, {"threads": 256, "vec": 2}

    seen = []

    class Close(FakeGpu):
        def measure(self, op_folder, params, problem, binary, incumbent=None):
            self.measured += 1
            seen.append((params, problem.label()))
            if (
                params == near and seen.count((near, problem.label())) == 2
            ):  # the second time: the bout
                assert incumbent[0] == best
                return MeasureResult(
                    Outcome.OK, 0.0099, 0.0098, 0.0100, samples=10, incumbent_p50_ms=0.0100
                )
            t = {json.dumps(best): 0.0100, json.dumps(near): 0.0101}.get(
                json.dumps(params, sort_keys=True), 0.05
            )
            return MeasureResult(Outcome.OK, t, t, t, samples=10)

    gpu = Close()
    build(make_ctx(proj, gpu=gpu, gpu_match=fake_match), [Target("scale", "h100")])
    manifest = json.loads((proj / "build/scale@h100/manifest.json").read_text())
    assert [d["params"] for d in manifest["dispatch"]] == [near] * len(manifest["dispatch"])
    assert all(
        d["playoff"] == [{"params": near, "p50_ms": 0.0099, "leader_p50_ms": 0.0100, "won": True}]
        for d in manifest["dispatch"]
    )
    assert all(
        d["p50_ms"] == 0.0099 for d in manifest["dispatch"]
    )  # the p50 of the window that chose it
    from ptxbuild.store import lessons

    best_lessons = [r for r in lessons.listing(make_ctx(proj).cache) if r["kind"] == "best"]
    assert len(best_lessons) == len(
        manifest["dispatch"]
    )  # and the lesson is the playoff's winner, at its p50
    assert all(r["rule"] == "threads=256 vec=2 -> 9.9 us" for r in best_lessons)
    md = (proj / "reports/scale@h100/report.md").read_text()
    assert (
        f"Playoff: in {len(manifest['dispatch'])} problems the fastest config met the next ones within 2% of it, "
        f"each in one window, alternating ({len(manifest['dispatch'])} bouts, largest difference there 1.0%); "
        f"a challenger won in {len(manifest['dispatch'])}"
    ) in md
    n0 = len(seen)
    build(make_ctx(proj, gpu=Close(), gpu_match=fake_match, force=True), [Target("scale", "h100")])
    assert not [
        p for p, _ in seen[n0:] if p in (best, near)
    ]  # neither the search's timings nor the bouts
    assert [
        d["params"]
        for d in json.loads((proj / "build/scale@h100/manifest.json").read_text())["dispatch"]
    ] == [near] * len(manifest["dispatch"])


@pytest.mark.parametrize("eager_loses_every_round", [False, True])
def test_the_report_says_which_losses_hold_in_every_round_of_their_window(
    proj, eager_loses_every_round
):
    """Beside each loss the range of the round-by-round ratios of its window; a count of the losses
    that no round contradicts, judged as the every_round gate judges them: over every baseline, not
    only the closest (a row whose closest baseline won a round can still lose every round to another)."""
    from ptxbuild.gpu.session import MeasureResult
    from ptxbuild.outcome import Outcome

    from .fakes import _M

    class Rounds(FakeGpu):
        def baselines(self, op_folder, problem, winner=None, budget_ms=100.0):
            mixed = problem.dtype == "float32"
            rr = (0.985, 1.004) if mixed else (0.98, 0.99)
            fast = MeasureResult(
                Outcome.OK,
                0.0099,
                0.0098,
                0.0100,
                samples=10,
                incumbent_p50_ms=0.0100,
                round_ratios=rr,
            )
            eager = (
                MeasureResult(
                    Outcome.OK,
                    0.00995,
                    0.0099,
                    0.0100,
                    samples=10,
                    incumbent_p50_ms=0.0100,
                    round_ratios=(0.99, 0.996),
                )
                if eager_loses_every_round and mixed
                else _M(Outcome.OK, 0.05, 0.049, 0.051)
            )
            if (
                problem.shape == (7, 100) and mixed and not eager_loses_every_round
            ):  # timed apart: no rounds
                eager = _M(Outcome.OK, 0.0099, 0.0098, 0.0100)
            return {"eager": eager, "compiled": fast}

    build(make_ctx(proj, gpu=Rounds(), gpu_match=fake_match), [Target("scale", "h100")])
    md = (proj / "reports/scale@h100/report.md").read_text()
    section = md.split("## Rows where it loses to a baseline (4 of 4)\n\n")[1].split("\n\n## ")[0]
    every = (
        4 if eager_loses_every_round else 3
    )  # 3: bfloat16's two, and float32[7x100] timed apart from eager
    assert section.startswith(
        f"{every} of them lose in every round of a baseline's window, or were timed apart"
    )
    assert (
        "- bfloat16[7x100]: 0.990x compiled (9.9 against 10.0 us); rounds 0.980-0.990x" in section
    )
    assert "- float32[7x100]: 0.990x compiled (9.9 against 10.0 us); rounds 0.985-1.004x" in section


def test_a_bout_the_harness_failed_is_timed_again_by_the_next_build(proj):
    """A bout that came back as a crash / timeout is not cached (as a failed baseline is not): the
    challenger would otherwise lose it in every build until --remeasure."""
    from ptxbuild.gpu.session import MeasureResult
    from ptxbuild.outcome import Outcome

    best, near, seen = {"threads": 256, "vec": 4}, {"threads": 256, "vec": 2}, []

    class Crashing(FakeGpu):
        def measure(self, op_folder, params, problem, binary, incumbent=None):
            seen.append(
                (json.dumps(params, sort_keys=True), problem.label(), incumbent is not None)
            )
            bout = params == near and sum(s[:2] == seen[-1][:2] for s in seen) > 1
            if bout:
                return MeasureResult(Outcome.WORKER_CRASH, float("nan"))
            t = {json.dumps(best): 0.0100, json.dumps(near): 0.0101}.get(
                json.dumps(params, sort_keys=True), 0.05
            )
            return MeasureResult(Outcome.OK, t, t, t, samples=10)

    build(make_ctx(proj, gpu=Crashing(), gpu_match=fake_match), [Target("scale", "h100")])
    manifest = json.loads((proj / "build/scale@h100/manifest.json").read_text())
    assert all(
        d["params"] == best
        and d["playoff"] == [{"params": near, "p50_ms": None, "leader_p50_ms": None, "won": False}]
        for d in manifest["dispatch"]
    )
    n0 = len(seen)
    build(
        make_ctx(proj, gpu=Crashing(), gpu_match=fake_match, force=True), [Target("scale", "h100")]
    )
    assert sum(p == json.dumps(near) for p, _, _ in seen[n0:]) == len(
        manifest["dispatch"]
    )  # each bout again


def test_the_playoff_tells_configs_apart_by_every_launch_of_a_multi_kernel_op():
    """Two configs with one binary and one main launch but a different second launch are different
    kernels: the playoff holds their bout (it once compared the main launch only and skipped it)."""
    from pathlib import Path
    from types import SimpleNamespace as NS

    from ptxbuild.build.beside import playoff
    from ptxbuild.build.evaluate import Evaluator
    from ptxbuild.contract import ModuleOp
    from ptxbuild.gpu.session import MeasureResult
    from ptxbuild.outcome import Outcome
    from ptxbuild.problem import Launch, Problem

    main, timed = Launch((1, 1, 1), (32, 1, 1)), []
    op = ModuleOp(
        NS(
            KERNELS=("a", "b"),
            launch=lambda c, p, n: main,
            launches=lambda c, p, n: {"a": main, "b": Launch((c["g"], 1, 1), (32, 1, 1))},
        )
    ).bind(Path("x"))

    def measure(folder, cfg, problem, b, incumbent=None):
        timed.append(cfg)
        return MeasureResult(
            Outcome.OK, 0.0099, 0.0098, 0.0100, samples=10, incumbent_p50_ms=0.0100
        )

    ev, one = Evaluator.__new__(Evaluator), NS(digest="d")
    ev.op, ev.problem, ev.gpu, ev.hw = (
        op,
        Problem.make("scale", "float32", (7, 100)),
        NS(sm_count=132),
        {"name": "h100"},
    )
    ev.binaries = {(("g", 1),): one, (("g", 2),): one}
    ev.ctx = NS(
        cache=NS(get=lambda *a: None, put=lambda *a: None), timed=set(), gpu=NS(measure=measure)
    )
    assert playoff(ev, [({"g": 1}, 0.0100), ({"g": 2}, 0.0101)]) == ({"g": 2}, 0.0099)
    assert timed == [{"g": 2}]


def test_the_report_names_ptxbuilds_code_by_content(proj, tmp_path):
    """A report's header names the code that built it by content (git metadata may be stale, or be the
    user's repository's when ptxbuild is an installed package); one changed byte changes the name."""
    import shutil
    from pathlib import Path

    from ptxbuild.outputs import environment as report

    build(make_ctx(proj, gpu=FakeGpu(), gpu_match=fake_match), [Target("scale", "h100")])
    md = (proj / "reports/scale@h100/report.md").read_text()
    assert f"; ptxbuild code `{report.code_digest()}`" in md and len(report.code_digest()) == 12
    pkg = tmp_path / "pkg"
    shutil.copytree(
        Path(report.__file__).parents[1], pkg, ignore=shutil.ignore_patterns("__pycache__")
    )
    assert report.code_digest(pkg) == report.code_digest()
    (pkg / "outputs/gates.py").write_text((pkg / "outputs/gates.py").read_text() + "\n")
    assert report.code_digest(pkg) != report.code_digest()
    assert (
        report.code_digest(tmp_path / "empty") == ""
    )  # no files to read (a zip import): no name at all


def test_a_rerender_keeps_a_report_from_a_later_build_that_this_cache_lacks(proj, monkeypatch):
    """A GPU machine's later build came back as its report only, not its cache: `ptxbuild report` here
    would replace it with the older build this cache holds. It leaves it and says why."""
    from click.testing import CliRunner

    from ptxbuild import cli

    build(make_ctx(proj, gpu=FakeGpu(), gpu_match=fake_match), [Target("scale", "h100")])
    path = proj / "reports/scale@h100/report.json"
    later = json.loads(path.read_text())
    later["built_at"], later["summary"]["run"] = later["built_at"] + 3600, "later"
    path.write_text(json.dumps(later))
    monkeypatch.chdir(proj)
    res = CliRunner().invoke(cli.main, ["report", "scale@h100"])
    assert (
        res.exit_code == 0
        and "scale@h100: left as it is: its report comes from a later build" in res.output
    )
    assert json.loads(path.read_text())["summary"]["run"] == "later"
    path.write_text(
        json.dumps({**later, "built_at": later["built_at"] - 7200})
    )  # an older one is re-rendered
    assert CliRunner().invoke(cli.main, ["report", "scale@h100"]).exit_code == 0
    assert json.loads(path.read_text())["summary"]["run"] != "later"


@pytest.mark.parametrize("stop", ["ctrl-c", "gpu"])
def test_a_stop_in_a_later_target_still_locks_the_targets_finished_before_it(
    proj, monkeypatch, stop
):
    """`ptxbuild build` writes the lock when every target is done: Ctrl-C (or a lost GPU) in the second
    target must not cost the first one, finished and reported, its lock entry (a dependency built
    for twenty minutes, then the dependent interrupted, was left unlocked)."""
    from ptxbuild.build import target as target_mod
    from ptxbuild.gpu.session import GpuError
    from ptxbuild.outputs.lockfile import read_lock

    real, seen = target_mod.build_target, []

    def stop_second(ctx, t, *a):
        seen.append(str(t))
        if len(seen) == 2:
            raise KeyboardInterrupt if stop == "ctrl-c" else GpuError("the GPU worker exited")
        return real(ctx, t, *a)

    monkeypatch.setattr(target_mod, "build_target", stop_second)
    monkeypatch.setattr(cli.shell, "_context", lambda kf, *a, **k: make_ctx(proj))
    monkeypatch.chdir(proj)
    res = CliRunner().invoke(cli.main, ["build", "--no-gpu"])
    assert res.exit_code == (130 if stop == "ctrl-c" else cli.EXIT_TOOL), res.output
    assert "(the targets finished before the stop)" in res.output
    assert sorted(read_lock(load(proj / "kernelfile.toml"))["targets"]) == [seen[0]]


def test_a_stop_held_while_a_finished_target_is_saved_still_locks_it(proj, monkeypatch):
    """Ctrl-C while a target's report is written is held until the build is recorded (ok), then stops
    the command: the target finished, so it is locked like any other finished before the stop."""
    import os
    import signal

    from ptxbuild.outputs.lockfile import read_lock

    real, calls = build_mod.write_report, []

    def report_then_ctrl_c(*a, **k):
        calls.append(1)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGINT)  # held: the first target is being saved
        return real(*a, **k)

    monkeypatch.setattr(build_mod, "write_report", report_then_ctrl_c)
    monkeypatch.setattr(cli.shell, "_context", lambda kf, *a, **k: make_ctx(proj))
    monkeypatch.chdir(proj)
    res = CliRunner().invoke(cli.main, ["build", "--no-gpu"])
    assert res.exit_code == 130 and len(calls) == 1, res.output
    kf = load(proj / "kernelfile.toml")
    (first,) = read_lock(kf)["targets"]
    assert Cache(kf.cache_path).last_build(first, kf.project)["status"] == "ok"


@pytest.mark.parametrize(
    "decl, said",
    [
        ("modes = [{}, { alfa = 1.0 }]", "ops.scale.modes[1]: unknown option 'alfa'"),
        (
            'options = { alpha = "x" }',
            "ops.scale.options: alpha = 'x' is not a float (the op's default is 2.0)",
        ),
        ("options = { alpha = 3 }", None),  # an int where the default is a float
    ],
)
def test_options_and_modes_are_checked_against_the_ops_options_by_name_and_type(
    proj, monkeypatch, decl, said
):
    """A misspelled mode key used to build the op's plain kernel under a label that named the option."""
    kf = proj / "kernelfile.toml"
    kf.write_text(
        kf.read_text().replace("search = { budget = 6 }", f"search = {{ budget = 6 }}\n{decl}")
    )
    monkeypatch.chdir(proj)
    res = CliRunner().invoke(cli.main, ["check"])
    if said is None:
        assert res.exit_code == 0, res.output
    else:
        assert res.exit_code == cli.EXIT_CONFIG and said in res.output, res.output
        assert "did you mean 'alpha'" in res.output or "options" in said


@pytest.mark.parametrize(
    "shape, said",
    [
        (
            "[64, 2048, 3]",
            "ops.rmsnorm.shapes[1] = [64, 2048, 3]: the op cannot build bfloat16[64x2048x3] "
            "(no default config for bfloat16[64x2048x3])",
        ),
        (
            "[4096]",
            "ops.rmsnorm.shapes[1] = [4096]: the op cannot build bfloat16[4096] (",
        ),  # an IndexError in the op
    ],
)
def test_a_shape_the_op_cannot_build_names_its_key_before_any_build(
    tmp_path, monkeypatch, shape, said
):
    from pathlib import Path

    ops = Path(__file__).resolve().parents[1] / "ops" / "rmsnorm"
    (tmp_path / "kernelfile.toml").write_text(
        f'[project]\nname = "t"\n[gpus.h100]\n[ops.rmsnorm]\ntemplate = "{ops.as_posix()}"\ndtypes = ["bfloat16"]\n'
        f"shapes = [[64, 2048], {shape}]\n"
    )
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(cli.main, ["build", "--no-gpu"])
    assert res.exit_code == cli.EXIT_CONFIG, res.output
    assert said in res.output and "Traceback" not in res.output


def test_report_on_a_cache_without_the_build_points_at_the_committed_report(proj, monkeypatch):
    """A fresh clone has the GPU machine's committed report but not its cache: say where the report is."""
    (proj / "reports/scale@h100").mkdir(parents=True)
    (proj / "reports/scale@h100/report.md").write_text("# scale@h100\n")
    monkeypatch.chdir(proj)
    res = CliRunner().invoke(cli.main, ["report"])
    assert res.exit_code == 0, res.output
    assert (
        "scale@h100: no build in this cache; its report is reports/scale@h100/report.md; run: ptxbuild build "
        "scale@h100"
    ) in res.output
    assert "scale@b200: no build in this cache; run: ptxbuild build scale@b200" in res.output
    assert (proj / "reports/scale@h100/report.md").read_text() == "# scale@h100\n"


@pytest.mark.parametrize("slow", ["verify", "measure"])
def test_a_verify_or_measure_timeout_is_asked_again_next_build(proj, slow):
    """A deadline missed says as much about the harness (a slow reference or input generation: run 24a
    built kda_recurrence's inputs for ~60 s per seed) as about the kernel: a cached timeout verdict or
    timing is not served to the next build, which verifies or times that candidate again."""
    from ptxbuild.outcome import Outcome

    from .fakes import _M, _V

    class SlowOnce(FakeGpu):
        def __init__(self, slow):
            super().__init__()
            self.slow = slow

        def verify(self, op_folder, params, problem, binary):
            self.verified += 1
            return _V(Outcome.TIMEOUT) if self.slow == "verify" else _V(Outcome.OK)

        def measure(self, op_folder, params, problem, binary, incumbent=None):
            if self.slow == "measure":
                self.measured += 1
                return _M(Outcome.TIMEOUT, float("nan"), float("nan"), float("nan"))
            return super().measure(op_folder, params, problem, binary, incumbent)

    def count(g):
        return g.verified if slow == "verify" else g.measured

    first = SlowOnce(slow)
    assert (
        build(make_ctx(proj, gpu=first, gpu_match=fake_match), [Target("scale", "h100")])[0].status
        == "failed"
    )
    assert count(first) > 0
    again = SlowOnce(None)
    assert (
        build(make_ctx(proj, gpu=again, gpu_match=fake_match), [Target("scale", "h100")])[0].status
        == "built"
    )
    assert count(again) == count(
        first
    )  # each timed-out candidate asked again, not served from the cache
    manifest = json.loads((proj / "build/scale@h100/manifest.json").read_text())
    assert all(d["p50_ms"] > 0 for d in manifest["dispatch"])


class _MemcheckGpu(FakeGpu):
    """memcheck reports an error in every config with vec=4 (the fastest ones)."""

    def memcheck(self, op_folder, params, problem, binary):
        from ptxbuild.outcome import Outcome

        self.memchecked = getattr(self, "memchecked", []) + [(params, problem.shape)]
        if params["vec"] == 4:
            return Outcome.MEMCHECK, "Invalid __global__ read of size 16 bytes"
        return Outcome.OK, ""


def test_a_winner_memcheck_rejects_is_replaced_by_the_next_fastest(proj):
    """Issue 27: every winner of a GPU build runs under memcheck; an error there is the outcome
    `memcheck` (the report line its evidence) and the next-fastest config that passes wins."""
    gpu = _MemcheckGpu()
    ctx = make_ctx(proj, gpu=gpu, gpu_match=fake_match)
    res = build(ctx, [Target("scale", "h100")])
    assert res[0].status == "built"
    manifest = json.loads((proj / "build/scale@h100/manifest.json").read_text())
    assert all(d["params"]["vec"] != 4 for d in manifest["dispatch"])
    rejected = [a for a in ctx.cache.attempts("scale@h100") if a["outcome"] == "memcheck"]
    assert rejected and all("Invalid __global__ read" in a["detail"] for a in rejected)
    report = (proj / "reports/scale@h100/report.md").read_text()
    assert "memcheck: 4 of 4 winners clean" in report
    # the verdicts are cached: a forced rebuild asks memcheck nothing again
    gpu2 = _MemcheckGpu()
    build(make_ctx(proj, gpu=gpu2, gpu_match=fake_match, force=True), [Target("scale", "h100")])
    assert getattr(gpu2, "memchecked", []) == []


def test_a_gpu_build_without_memcheck_says_so_in_the_report(proj):
    ctx = make_ctx(proj, gpu=FakeGpu(), gpu_match=fake_match)
    build(ctx, [Target("scale", "h100")])
    report = (proj / "reports/scale@h100/report.md").read_text()
    assert "- memcheck: not run (this GPU session cannot)" in report


def test_the_two_rerender_paths_write_the_builds_own_report_byte_for_byte(proj, monkeypatch):
    """`ptxbuild report` renders a report from the cache's build where the cache has it, else from
    the committed report.json (CI's case: a fresh clone has no cache). Both give the bytes the build
    itself wrote, report.md and report.json alike."""
    ctx = make_ctx(proj, gpu=FakeGpu(), gpu_match=fake_match)
    build(ctx, [Target("scale", "h100")])
    folder = proj / "reports/scale@h100"
    wrote = {f: (folder / f).read_bytes() for f in ("report.md", "report.json")}
    monkeypatch.chdir(proj)
    for cache_here in (True, False):
        if not cache_here:  # the cache and its -wal / -shm files moved aside
            for f in ctx.kf.cache_path.parent.glob(ctx.kf.cache_path.name + "*"):
                f.rename(proj / f.name)
        (folder / "report.md").write_text("stale\n")
        res = CliRunner().invoke(cli.main, ["report", "scale@h100"])
        assert res.exit_code == 0, res.output
        assert ("no build in this cache" in res.output) is not cache_here, res.output
        assert {f: (folder / f).read_bytes() for f in wrote} == wrote, cache_here
