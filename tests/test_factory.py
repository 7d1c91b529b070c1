"""The factory (issue 31): proposed sources as candidates, the proposer protocol, the scripted and
chat proposers through a build with the fake GPU, compile errors in feedback, lessons and output."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from ptxbuild import cli
from ptxbuild.build.run import build_and_lock
from ptxbuild.declare.graph import Target
from ptxbuild.problem import SOURCE_PARAM, op_params
from ptxbuild.search import proposals
from ptxbuild.store.lessons_io import export_lessons, parse_lessons

from .conftest import make_ctx
from .fake_chat import FakeChat
from .fakes import FakeCompiler, FakeGpu, fake_match

REPO = Path(__file__).resolve().parents[1]
SCRIPTED = REPO / "examples" / "proposers" / "scripted.py"
CHAT = REPO / "examples" / "proposers" / "chat.py"
H100 = [Target("scale", "h100")]


class SourceGpu(FakeGpu):
    """The fake GPU's times, halved for a proposed source; the incumbent timed in the same window."""

    def _t(self, params):
        t = 0.01 * (1 + abs(params["threads"] - 256) / 64 + (4 - params["vec"]))
        return t / 2 if SOURCE_PARAM in params else t

    def measure(self, op_folder, params, problem, binary, incumbent=None):
        r = super().measure(op_folder, op_params(params), problem, binary)
        t = self._t(params)
        inc = self._t(incumbent[0]) if incumbent else None
        return replace(r, p50_ms=t, p20_ms=t, p80_ms=t, incumbent_p50_ms=inc)


def _project(proj: Path, proposer: str, rounds: int) -> Path:
    kf = proj / "kernelfile.toml"
    kf.write_text(
        kf.read_text()
        .replace('dtypes = ["float32", "bfloat16"]', 'dtypes = ["float32"]')
        .replace("shapes = [[64, 1024], [7, 100]]", "shapes = [[64, 1024]]")
        .replace(
            "search = { budget = 6 }",
            f"search = {{ budget = 6, proposers = [{json.dumps(proposer)}], rounds = {rounds} }}",
        )
    )
    return proj


def _ctx(proj, compiler=None, gpu=None):
    return make_ctx(proj, compiler or FakeCompiler(), gpu=gpu or SourceGpu(), gpu_match=fake_match)


SCRIPT = {
    "rounds": [
        [
            {
                "edits": [{"find": "alpha * load_f", "replace": "alpha * /* fast */ load_f"}],
                "edit": "mark the multiply",
                "rationale": "a test edit the fake GPU times at half",
            },
            {"edits": [{"find": "no such text", "replace": "x"}], "edit": "an edit that misses"},
        ],
        [{"source": "PLANTED_ERROR @COLS@", "edit": "a source that does not compile"}],
    ]
}


def _scripted(proj: Path, rounds: int = 2) -> Path:
    (proj / "script.json").write_text(json.dumps(SCRIPT))
    cmd = f"{sys.executable} {SCRIPTED} script.json --log feedback.jsonl"
    return _project(proj, cmd, rounds)


def test_a_scripted_proposer_wins_is_reported_locked_and_rebuilt_from_the_lock(proj):
    _scripted(proj)
    ctx = _ctx(proj, FakeCompiler(error_on="PLANTED_ERROR"))
    done = build_and_lock(ctx, H100)
    assert [r.status for r in done.results] == ["built"], done.results
    manifest = json.loads(done.results[0].manifest.read_text())
    (d,) = manifest["dispatch"]
    digest = d["params"][SOURCE_PARAM]  # the proposed source won: the fake GPU halves its time
    text = (proj / "proposed" / "scale" / f"{digest}.cu").read_text()
    assert "alpha * /* fast */ load_f" in text and proposals.source_digest(text) == digest
    lineage = d["factory"]["lineage"]
    assert lineage["round"] == 0 and lineage["edit"] == "mark the multiply"
    assert lineage["parent"].startswith("template {") and lineage["problem"] == "float32[64x1024]"
    f = d["factory"]
    assert f["winner"] == "proposed" and f["proposers"] == {next(iter(f["proposers"])): {"ok": 1, "compile_error": 1}}  # fmt: skip
    best_template = f["template_best"]["p50_ms"]
    assert f["same_window"]["template_p50_ms"] == pytest.approx(best_template)
    assert f["same_window"]["speedup"] == pytest.approx(2.0)
    report = (proj / "reports" / "scale@h100" / "report.md").read_text()
    assert (
        "## Proposed sources" in report
        and f"proposed `{digest}` (round 0: mark the multiply)" in report
    )
    assert "| 2.00x |" in report
    produced = next(ln for ln in report.splitlines() if ln.startswith("- produced: "))
    assert "3 edit" in produced, produced  # the edit lessons count among the build's lessons

    # build --locked in a fresh context renders the proposed source from proposed/ and matches
    comp = FakeCompiler()
    locked = build_and_lock(_ctx(proj, comp), H100, locked=True)
    assert [r.status for r in locked.results] == ["built"], locked.results
    assert any("alpha * /* fast */ load_f" in s for s in comp.calls)
    (proj / "proposed" / "scale" / f"{digest}.cu").write_text(text + "// edited\n")
    with pytest.raises(Exception, match=digest):  # an edited source is not that source
        build_and_lock(_ctx(proj, FakeCompiler()), H100, locked=True)


def test_a_compile_error_reaches_the_proposers_feedback_and_the_lessons(proj):
    _scripted(proj)
    ctx = _ctx(proj, FakeCompiler(error_on="PLANTED_ERROR"))
    build_and_lock(ctx, H100)
    msgs = [json.loads(ln) for ln in (proj / "feedback.jsonl").read_text().splitlines()]
    assert [m["type"] for m in msgs] == ["task", "results", "task", "results", "done"]
    task0, res0, task1, res1 = msgs[:4]
    assert task0["protocol"] == proposals.PROTOCOL and task0["op"] == "scale"
    assert task0["gpu"]["measured"] and "def reference" in task0["reference"]
    assert task0["incumbent"]["params"] == {"threads": 256, "vec": 4}  # the template's best
    assert [r["outcome"] for r in res0["results"]] == ["ok", "rejected"]
    assert res0["results"][0]["verdict"] == "helped" and res0["results"][0]["vs_incumbent"] == 0.5
    assert "'find' occurs 0 time(s)" in res0["results"][1]["detail"]
    assert SOURCE_PARAM in task1["incumbent"]["params"]  # round 1 starts from round 0's winner
    assert "/* fast */" in task1["incumbent"]["source"]
    (bad,) = res1["results"]
    assert bad["outcome"] == "compile_error" and "error: planted" in bad["detail"]
    rows = list(ctx.cache.db.query("select rule from lessons where kind = 'edit'"))
    rules = {json.loads(r["rule"])["edit"]: json.loads(r["rule"]) for r in rows}
    assert (
        rules["mark the multiply"]["verdict"] == "helped"
        and rules["mark the multiply"]["ratio"] == 0.5
    )
    broken = rules["a source that does not compile"]
    assert broken["verdict"] == "failed" and broken["result"] == "compile_error"
    assert "error: planted" in broken["why"]
    assert rules["an edit that misses"]["result"] == "rejected"
    # template lessons learn nothing from proposed attempts; edit lessons export and parse back
    assert not list(ctx.cache.db.query("select 1 from lessons where kind != 'edit' and rule like '%source%'"))  # fmt: skip
    lines = export_lessons(ctx.cache)
    back = parse_lessons(("\n".join(lines) + "\n").encode())
    assert sum(r.kind == "edit" for r in back) == 3
    from ptxbuild.store.lessons_io import LessonsFileError

    rec = json.loads(next(ln for ln in lines if '"kind":"edit"' in ln))
    del rec["rule"]["verdict"]  # an edit lesson without its verdict is refused on import
    with pytest.raises(LessonsFileError, match="an 'edit' rule has edit and verdict"):
        parse_lessons((json.dumps(rec) + "\n").encode())
    # the next task carries the lessons
    build_and_lock(replace(_ctx(proj, FakeCompiler(error_on="PLANTED_ERROR")), force=True), H100)
    later = [json.loads(ln) for ln in (proj / "feedback.jsonl").read_text().splitlines()][5]
    assert {ls["edit"] for ls in later["lessons"]} >= {"a source that does not compile"}


def test_the_chat_proposer_talks_to_an_openai_style_server(proj, monkeypatch):
    good = '```cuda\n// chat kernel\nextern "C" __global__ void scale() {}\n```\nFewer branches.'
    chat = FakeChat([good, "no code block this time"])
    try:
        monkeypatch.setenv("PTXBUILD_CHAT_URL", chat.url)
        monkeypatch.setenv("PTXBUILD_CHAT_MODEL", "fake-model")
        monkeypatch.setenv("OPENAI_API_KEY", "k-test")
        _project(proj, f"{sys.executable} {CHAT}", 2)
        ctx = _ctx(proj)
        done = build_and_lock(ctx, H100)
    finally:
        chat.close()
    assert [r.status for r in done.results] == ["built"]
    assert len(chat.requests) == 2 and chat.requests[0]["path"] == "/v1/chat/completions"
    first = chat.requests[0]["body"]
    assert first["model"] == "fake-model" and chat.requests[0]["auth"] == "Bearer k-test"
    assert "Op scale" in first["messages"][-1]["content"] and "extern \"C\" __global__ void scale" in first["messages"][-1]["content"]  # fmt: skip
    second = chat.requests[1]["body"]["messages"]
    assert any(m["content"].startswith("Results: ") and '"outcome": "ok"' in m["content"] for m in second)  # fmt: skip
    tried = [json.loads(a["params"]) for a in ctx.cache.db.query("select params from attempts")]
    (src,) = [p[SOURCE_PARAM] for p in tried if SOURCE_PARAM in p]
    assert "// chat kernel" in (proj / "proposed" / "scale" / f"{src}.cu").read_text()
    meta = json.loads((proj / "proposed" / "scale" / f"{src}.json").read_text())
    assert meta["edit"] == "Fewer branches." and meta["proposer"].endswith("chat.py")


def test_no_valid_candidate_prints_the_rejected_candidates_evidence(proj, monkeypatch):
    monkeypatch.chdir(proj)
    fake = lambda kf, jobs, gpu, progress, *a, **k: make_ctx(proj, FakeCompiler(error_on="scale"), report=progress)  # noqa: E731 # fmt: skip
    monkeypatch.setattr(cli.shell, "_context", fake)
    res = CliRunner().invoke(cli.main, ["build", "scale@b200"])
    assert res.exit_code == cli.EXIT_BUILD_FAILED, res.output
    assert "NO VALID CANDIDATE" in res.output
    lines = res.output.splitlines()
    at = lines.index(next(ln for ln in lines if "NO VALID CANDIDATE" in ln))
    assert "compile_error" in lines[at + 1] and "error: planted" in lines[at + 2], lines[
        at : at + 4
    ]


def test_try_runs_a_proposer_on_one_target_and_prints_json(proj, monkeypatch):
    monkeypatch.chdir(proj)
    _scripted(proj, rounds=1)
    kf = proj / "kernelfile.toml"  # the kernelfile names no proposer: `try` brings its own
    kf.write_text(
        kf.read_text().replace("search = { budget = 6, proposers", "search = { budget = 6 }\n# ")
    )
    monkeypatch.setattr(
        cli.shell, "_context", lambda kf, *a, **k: _ctx(proj)
    )  # its progress unseen
    cmd = f"{sys.executable} {SCRIPTED} script.json"
    res = CliRunner().invoke(cli.main, ["try", "scale@h100", "--proposer", cmd])
    assert res.exit_code == 0, res.output
    (row,) = [json.loads(ln) for ln in res.output.splitlines() if ln.startswith("{")]
    assert row["winner"] == "proposed" and row["same_window"]["speedup"] == pytest.approx(2.0)


def test_the_rewriter_and_the_reply_checks():
    assert proposals.apply_edits("a b a", [{"find": "a", "replace": "c", "count": 0}]) == "c b c"
    assert proposals.apply_edits("a b a", [{"find": "a", "replace": "c"}]) == "c b a"
    for edits, msg in (
        ([{"find": "z", "replace": "y"}], "occurs 0 time"),
        ([{"find": "a", "replace": "y", "count": 3}], "occurs 2 time"),
        ([{"find": "", "replace": "y"}], "non-empty"),
        ([{"find": "a", "replace": "y", "count": -1}], "integer >= 0"),
    ):
        with pytest.raises(proposals.EditError, match=msg):
            proposals.apply_edits("a b a", edits)
    assert proposals.candidate_errors({"source": "x"}) is None
    assert "exactly one" in proposals.candidate_errors({"source": "x", "edits": []})
    assert "exactly one" in proposals.candidate_errors({})
    assert "'params'" in proposals.candidate_errors({"source": "x", "params": [1]})
    assert "object" in proposals.candidate_errors("x")
    schema = json.loads(proposals.SCHEMA.read_text())
    assert schema["$id"] == proposals.PROTOCOL
    assert set(schema["$defs"]["candidate"]["properties"]) == {"params", "source", "edits", "base", "edit", "rationale", "parent"}  # fmt: skip


@pytest.mark.parametrize(
    "body, why",
    [
        ("import time; time.sleep(30)", "no reply within 1 s"),
        ("print('not json', flush=True); input()", "not JSON"),
        ('print(\'{"type": "candidates"}\', flush=True); input()', "a reply is {"),
        ("import sys; sys.stderr.write('boom\\n'); sys.exit(3)", "exit 3: boom"),
        ("print('x' * (2 << 20), flush=True)", "over 1048576 bytes"),
    ],
)
def test_a_proposer_that_breaks_the_protocol_is_one_line(tmp_path, body, why):
    (tmp_path / "p.py").write_text(body)
    p = proposals.Proposer(f"python {tmp_path / 'p.py'}", tmp_path, seconds=1)
    try:
        with pytest.raises(proposals.ProposalError, match=why.replace("{", r"\{")):
            p.ask({"round": 0})
    finally:
        p.close()


def test_a_proposed_source_stands_in_only_where_the_template_renders_the_text_it_replaced(proj):
    _scripted(proj, rounds=1)
    ctx = _ctx(proj, FakeCompiler(error_on="PLANTED_ERROR"))
    build_and_lock(ctx, H100)
    from ptxbuild.oploader import load_op
    from ptxbuild.problem import Problem

    op = proposals.with_sources(load_op("scale", proj), proj)
    (digest,) = [p.stem for p in (proj / "proposed" / "scale").glob("*.cu")]
    cfg = {"threads": 256, "vec": 4, SOURCE_PARAM: digest}
    assert op.check(cfg, Problem.make("scale", "float32", (64, 1024))) is None
    assert (
        op.check(cfg, Problem.make("scale", "float32", (3, 1024))) is None
    )  # same text: fewer rows
    why = op.check(cfg, Problem.make("scale", "bfloat16", (64, 1024)))
    assert why == f"proposed source {digest} was written for float32[64x1024], where the template renders other code"  # fmt: skip
    assert "vec=2" in op.check({**cfg, "vec": 2}, Problem.make("scale", "float32", (64, 1023)))
    assert op.check({**cfg, SOURCE_PARAM: "0" * 16}, Problem.make("scale", "float32", (64, 1024))).startswith("proposed source 0000")  # fmt: skip


@pytest.mark.compile
def test_the_committed_factory_lock_rebuilds_its_proposed_winners(tmp_path):
    """benchmarks/factory.lock (H200 run 26b) names proposed sources: a copy of the repository's
    files rebuilds both winners byte for byte from benchmarks/proposed/ with the real compiler."""
    import shutil

    from ptxbuild.build.context import Context
    from ptxbuild.compile.compiler import toolchain
    from ptxbuild.declare.kernelfile import load
    from ptxbuild.store.cache import Cache

    for rel in ("benchmarks/factory.toml", "benchmarks/factory.lock"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, tmp_path / rel)
    for rel in ("benchmarks/proposed/softmax", "ops/softmax"):
        shutil.copytree(REPO / rel, tmp_path / rel)
    kf = load(tmp_path / "benchmarks" / "factory.toml")
    ctx = Context(kf=kf, cache=Cache(kf.cache_path), toolchain=toolchain(), jobs=1)
    lock = json.loads((tmp_path / "benchmarks" / "factory.lock").read_text())
    params = [d["params"] for d in lock["targets"]["softmax@h200"]["dispatch"]]
    assert params and all(SOURCE_PARAM in p for p in params)  # the locked winners are proposed
    done = build_and_lock(ctx, [Target("softmax", "h200")], locked=True)
    assert [r.status for r in done.results] == ["built"], done.results
