"""Lessons from fake builds: best configs, failure rules with evidence, pruning, contradiction, seed order."""

import json
from types import SimpleNamespace

import pytest

from ptxbuild.build.run import build
from ptxbuild.declare.catalog import CATALOG
from ptxbuild.declare.graph import Target
from ptxbuild.problem import Problem
from ptxbuild.store import learn, lessons
from ptxbuild.store.cache import Cache

from .conftest import make_ctx
from .fakes import FakeCompiler, FakeGpu, fake_match

H100 = Target("scale", "h100")


def _lessons(cache, kind):
    return [
        {
            **r,
            "scope": json.loads(r["scope"]),
            "rule": json.loads(r["rule"]),
            "evidence": json.loads(r["evidence"]),
        }
        for r in cache.db.query("select * from lessons where kind = ? order by id", [kind])
    ]


def test_a_gpu_build_derives_best_configs_and_failure_rules_with_evidence(proj):
    ctx = make_ctx(
        proj, FakeCompiler(error_on="#define VEC 1\n"), gpu=FakeGpu(), gpu_match=fake_match
    )
    build(ctx, [H100])
    best = _lessons(ctx.cache, "best")
    assert {(b["scope"]["dtype"], tuple(b["scope"]["shape"])) for b in best} == {
        ("float32", (64, 1024)),
        ("float32", (7, 100)),
        ("bfloat16", (64, 1024)),
        ("bfloat16", (7, 100)),
    }
    big = [b for b in best if b["scope"]["shape"] == [64, 1024]]
    assert all(
        b["rule"]["params"] == {"threads": 256, "vec": 4} and b["rule"]["p50_ms"] == 0.01
        for b in big
    )
    assert all(
        b["scope"]["gpu"] == "h100"
        and b["scope"]["arch"] == "sm_90a"
        and b["scope"]["bucket"] == "N<=2^10"
        for b in big
    )
    fails = _lessons(ctx.cache, "fails")
    assert {(f["scope"]["dtype"], json.dumps(f["rule"], sort_keys=True)) for f in fails} == {
        (d, '{"outcome": "compile_error", "params": {"vec": 1}}') for d in ("float32", "bfloat16")
    }
    attempts = {a["id"]: a for a in ctx.cache.attempts("scale@h100")}
    for f in fails:
        assert f["scope"]["shape"] is None and f["confidence"] >= lessons.PRUNE_CONFIDENCE
        assert len(f["evidence"]) >= 2
        assert all(
            attempts[i]["outcome"] == "compile_error"
            and json.loads(attempts[i]["params"])["vec"] == 1
            for i in f["evidence"]
        )
    sens = _lessons(ctx.cache, "sensitivity")
    assert sens and all(s["rule"]["order"][0] in ("vec", "threads") for s in sens)


def test_the_next_build_prunes_what_a_failure_rule_covers_without_compiling(proj):
    build(
        make_ctx(
            proj, FakeCompiler(error_on="#define VEC 1\n"), gpu=FakeGpu(), gpu_match=fake_match
        ),
        [H100],
    )
    (proj / "ops/scale/scale.cu").write_text(
        (proj / "ops/scale/scale.cu").read_text() + "\n// v2\n"
    )
    comp = FakeCompiler(error_on="#define VEC 1\n")
    ctx = make_ctx(proj, comp, gpu=FakeGpu(), gpu_match=fake_match)
    build(ctx, [H100])
    run = ctx.cache.attempts("scale@h100", ctx.run)
    pruned = [a for a in run if a["outcome"] == "pruned"]
    assert pruned and all(
        json.loads(a["params"])["vec"] == 1 and a["detail"].startswith("lesson ") for a in pruned
    )
    assert not any(a["outcome"] == "compile_error" for a in run)
    assert not any("#define VEC 1\n" in src for src in comp.calls)  # never compiled
    summary = json.loads(ctx.cache.last_build("scale@h100", ctx.kf.project)["summary"])
    assert any(u.get("kind") == "fails" for u in summary["lessons_used"])
    report = (proj / "reports/scale@h100/report.md").read_text()
    assert "failure rule `" in report and "candidates pruned by failure rules: " in report


def _attempt(cache, run, params, outcome, p50=None, shape=(64, 1024), gpu="h100"):
    prob = Problem.make("scale", "float32", shape).key()
    return cache.add_attempt(
        run=run,
        target=f"scale@{gpu}",
        op="scale",
        gpu=gpu,
        arch=CATALOG[gpu].arch,
        problem=prob,
        params=params,
        outcome=outcome,
        p50_ms=p50,
    )


OP = SimpleNamespace(
    NAME="scale",
    check=lambda params, problem: None,
    SPACE={"threads": [64, 128, 256, 512], "vec": [1, 2, 4]},
)


def test_a_failure_mid_derive_keeps_none_of_the_runs_lessons(tmp_path, monkeypatch):
    """derive writes a run's lessons in one transaction: a stop while they are written (Ctrl-C after
    the new rules, before the contradicted ones are weakened) leaves the lessons as they were; the
    autocommit connection's `with conn:` kept the first half."""
    cache = Cache(tmp_path / "c.sqlite")
    for t in (64, 128):
        _attempt(cache, "r1", {"threads": t, "vec": 2}, "spill")
    _attempt(cache, "r1", {"threads": 256, "vec": 4}, "ok", 0.01)
    learn.derive(cache, OP, "scale@h100", "r1")
    before = _lessons(cache, "fails") + _lessons(cache, "best")
    assert before  # r1 taught something, so the rows below are r2's alone
    _attempt(cache, "r2", {"threads": 512, "vec": 8}, "spill")
    _attempt(cache, "r2", {"threads": 256, "vec": 2}, "ok", 0.02)

    def stopped(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(learn, "_weaken", stopped)
    with pytest.raises(KeyboardInterrupt):
        learn.derive(cache, OP, "scale@h100", "r2")
    assert _lessons(cache, "fails") + _lessons(cache, "best") == before
    monkeypatch.undo()
    assert learn.derive(cache, OP, "scale@h100", "r2")  # the same run, derived again: it teaches
    assert _lessons(cache, "fails") + _lessons(cache, "best") != before


def test_contradicted_failure_rules_are_weakened_then_retired(tmp_path):
    cache = Cache(tmp_path / "c.sqlite")
    for t in (64, 128):
        _attempt(cache, "r1", {"threads": t, "vec": 2}, "spill")
    _attempt(cache, "r1", {"threads": 256, "vec": 4}, "ok", 0.01)
    learn.derive(cache, OP, "scale@h100", "r1")
    (rule,) = _lessons(cache, "fails")
    assert (
        rule["rule"] == {"params": {"vec": 2}, "outcome": "spill"} and rule["confidence"] == 0.667
    )
    _attempt(cache, "r2", {"threads": 256, "vec": 2}, "ok", 0.02)  # new evidence: vec=2 can pass
    produced = learn.derive(cache, OP, "scale@h100", "r2")
    (rule,) = [r for r in _lessons(cache, "fails") if r["id"] == rule["id"]]
    assert (
        rule["confidence"] == 0.3335
        and rule["retired"] == 0
        and rule["confidence"] < lessons.PRUNE_CONFIDENCE
    )
    assert {"against"} <= set(rule["evidence"][-1]) and any(p.get("weakened") for p in produced)
    _attempt(cache, "r3", {"threads": 512, "vec": 2}, "ok", 0.02)
    learn.derive(cache, OP, "scale@h100", "r3")
    (rule,) = [r for r in _lessons(cache, "fails") if r["id"] == rule["id"]]
    assert rule["retired"] == 1
    prob = Problem.make("scale", "float32", (64, 1024))
    rules = lessons.failure_rules(
        cache, "scale", prob, "sm_90a"
    )  # only the configs that did spill remain
    assert sorted(r["rule"]["params"]["threads"] for r in rules) == [64, 128]
    assert lessons.prune_reason(rules, {"threads": 256, "vec": 2}) is None


def test_an_unfinished_problems_few_attempts_do_not_rederive_its_lessons(tmp_path):
    """An interrupted build's last problem had 4 of 9 attempts: its sensitivity lesson, re-derived from
    them, replaced the 9-attempt one (confidence 0.47 -> 0.29, seen on the H200). Only finished problems
    derive bests and sensitivities; a pass there still weakens a failure rule."""
    cache = Cache(tmp_path / "c.sqlite")
    for t, v, p50 in [(64, 4, 0.02), (128, 4, 0.015), (256, 4, 0.01), (512, 1, 0.05)]:
        _attempt(cache, "r1", {"threads": t, "vec": v}, "ok", p50)
    _attempt(cache, "r1", {"threads": 64, "vec": 2}, "spill")
    _attempt(cache, "r1", {"threads": 128, "vec": 2}, "spill")
    learn.derive(cache, OP, "scale@h100", "r1")
    before = {
        r["id"]: r for kind in ("best", "sensitivity", "fails") for r in _lessons(cache, kind)
    }
    for t, v, p50 in [(64, 4, 0.02), (128, 4, 0.016), (512, 2, 0.04), (256, 1, 0.06)]:
        _attempt(cache, "r2", {"threads": t, "vec": v}, "ok", p50)
    learn.derive(cache, OP, "scale@h100", "r2", done=set())
    after = {r["id"]: r for kind in ("best", "sensitivity", "fails") for r in _lessons(cache, kind)}
    assert {i: r for i, r in after.items() if r["kind"] != "fails"} == {
        i: r for i, r in before.items() if r["kind"] != "fails"
    }
    (rule,) = [
        r for r in after.values() if r["kind"] == "fails" and r["rule"]["params"] == {"vec": 2}
    ]
    assert rule["confidence"] < before[rule["id"]]["confidence"]  # vec=2 passed at 512 threads
    done = {json.dumps(Problem.make("scale", "float32", (64, 1024)).key(), sort_keys=True)}
    learn.derive(cache, OP, "scale@h100", "r2", done=done)  # finished after all: it counts
    (sens,) = _lessons(cache, "sensitivity")
    assert sens["rule"] != before[sens["id"]]["rule"] and "run r2" in sens["source"]


@pytest.mark.parametrize("stored", ["in full", "before vec existed"])
def test_a_best_config_beaten_by_more_than_2_percent_is_retired(tmp_path, stored):
    """A lesson stored before a parameter existed means the parameter's first value (vec = 1)."""
    cache = Cache(tmp_path / "c.sqlite")
    if stored == "in full":
        _attempt(cache, "r1", {"threads": 64, "vec": 4}, "ok", 0.02)
        learn.derive(cache, OP, "scale@h100", "r1")
        (old,) = _lessons(cache, "best")
        again = {"threads": 64, "vec": 4}
    else:
        scope = lessons._scope("h100", "sm_90a", Problem.make("scale", "float32", (64, 1024)).key())
        old = lessons._row(
            "scale", "best", scope, {"params": {"threads": 64}, "p50_ms": 0.02}, [1], 1.0, "test"
        )
        cache.db["lessons"].insert(old)
        again = {"threads": 64, "vec": 1}
    _attempt(cache, "r2", again, "ok", 0.02)
    _attempt(cache, "r2", {"threads": 256, "vec": 4}, "ok", 0.01)
    learn.derive(cache, OP, "scale@h100", "r2")
    rows = {r["id"]: r for r in _lessons(cache, "best")}
    assert rows[old["id"]]["retired"] == 1
    (new,) = [r for r in rows.values() if not r["retired"]]
    assert new["rule"]["params"] == {"threads": 256, "vec": 4}


@pytest.mark.parametrize("measured_again", [True, False])
def test_a_scope_keeps_one_live_best_the_latest_run_that_measured_it_wins(tmp_path, measured_again):
    """A near tie (within 2%) used to leave two live 'best' lessons for one scope, and builds piled them
    up (8 for one H200 row): seeds then took the first four in table order, maybe not the last winner.
    A best this run measured again and did not choose is superseded (its config lives on in the new
    lesson's near list); one it never tried (a probe kernelfile with its own candidates) stays live."""
    cache = Cache(tmp_path / "c.sqlite")
    _attempt(cache, "r1", {"threads": 64, "vec": 4}, "ok", 0.0100)
    learn.derive(cache, OP, "scale@h100", "r1")
    (old,) = _lessons(cache, "best")
    if measured_again:
        _attempt(cache, "r2", {"threads": 64, "vec": 4}, "ok", 0.0100)
    _attempt(cache, "r2", {"threads": 256, "vec": 4}, "ok", 0.0099)
    changed = learn.derive(cache, OP, "scale@h100", "r2")
    live = [r for r in _lessons(cache, "best") if not r["retired"]]
    new = next(r for r in _lessons(cache, "best") if r["id"] != old["id"])
    assert new["rule"]["params"] == {"threads": 256, "vec": 4}
    again = [
        a["id"]
        for a in cache.attempts("scale@h100", "r2")
        if json.loads(a["params"])["threads"] == 64
    ]
    if measured_again:
        assert [r["id"] for r in live] == [new["id"]] and new["rule"]["near"] == [
            {"threads": 64, "vec": 4}
        ]
        assert {
            "lesson": old["id"],
            "kind": "best",
            "retired": True,
            "against": again,  # its re-measurement
            "weakened": True,
        } == {k: v for k, v in changed[-1].items() if k != "confidence"}
    else:
        assert sorted(r["id"] for r in live) == sorted([old["id"], new["id"]]) and again == []
    from ptxbuild.store.lessons_io import (  # the retired one exports and parses back
        export_lessons,
        parse_lessons,
    )

    lines = export_lessons(cache, include_retired=True)
    assert len(parse_lessons("\n".join(lines).encode())) == len(lines) == 2


def test_among_live_bests_of_the_exact_scope_the_newest_seeds_first(tmp_path):
    """Lessons files written before one-best-per-scope hold several live bests of a scope; with a seed
    limit of 4, table order left 2 of the 66 locked H200 rmsnorm winners out of the next build's seeds."""
    cache = Cache(tmp_path / "c.sqlite")
    prob = Problem.make("scale", "float32", (64, 1024))
    scope = lessons._scope("h100", "sm_90a", prob.key())
    for i, threads in enumerate([64, 128, 256, 512, 64]):
        row = lessons._row(
            "scale",
            "best",
            scope,
            {"params": {"threads": threads, "vec": 1 + (i == 4)}, "p50_ms": 0.01},
            [1],
            1.0,
            "test",
        )
        cache.db["lessons"].insert(
            {**row, "created": 1000.0 + (i * 7) % 5}
        )  # created: 1000, 1002, 1004, 1001, 1003
    seeds, used = lessons.seeds(cache, OP, prob, CATALOG["h100"], limit=4)
    assert [(s["threads"], s["vec"]) for s in seeds] == [(256, 1), (64, 2), (128, 1), (512, 1)]
    assert all(u["distance"] == 0 for u in used)


def test_seeds_come_from_the_same_gpu_then_the_same_arch_then_the_family_then_others(tmp_path):
    cache = Cache(tmp_path / "c.sqlite")
    prob = Problem.make("scale", "float32", (64, 1024))
    scopes = [
        ("a100", "sm_80", 1),
        ("b200", "sm_100a", 2),
        ("h100", "sm_90a", 3),
        ("h200", "sm_90a", 4),
    ]
    for gpu, arch, threads in scopes:
        row = lessons._row(
            "scale",
            "best",
            lessons._scope(gpu, arch, prob.key()),
            {"params": {"threads": threads, "vec": 4}, "p50_ms": 0.01},
            [1],
            1.0,
            "test",
        )
        cache.db["lessons"].insert(row)
    hopper_sm90 = {
        "gpu": "x",
        "arch": "sm_90",
        "family": "hopper",
        "dtype": "float32",
        "shape": [64, 1024],
        "options": {},
    }
    cache.db["lessons"].insert(
        lessons._row(
            "scale",
            "best",
            hopper_sm90,
            {"params": {"threads": 5, "vec": 4}, "p50_ms": 0.01},
            [1],
            1.0,
            "test",
        )
    )
    seeds, used = lessons.seeds(cache, OP, prob, CATALOG["h200"], limit=5)
    assert [s["threads"] for s in seeds[:3]] == [4, 3, 5]
    assert [u["level"] for u in used] == [
        "same GPU",
        "same architecture",
        "same family",
        "other family",
        "other family",
    ]


def test_a_lesson_stored_before_a_parameter_existed_seeds_the_config_with_its_first_value(tmp_path):
    cache = Cache(tmp_path / "c.sqlite")
    prob = Problem.make("scale", "float32", (64, 1024))
    old = lessons._scope("h200", "sm_90a", prob.key())
    for params in (
        {"threads": 128},
        {"threads": 128, "vec": 1},
    ):  # the same config, before and after `vec`
        cache.db["lessons"].insert(
            lessons._row("scale", "best", old, {"params": params, "p50_ms": 0.01}, [1], 1.0, "test")
        )
    seeds, used = lessons.seeds(cache, OP, prob, CATALOG["h200"], limit=5)
    assert seeds == [{"threads": 128, "vec": 1}] and len(used) == 1


def test_compile_only_target_picks_its_config_from_a_transferred_lesson_and_says_why(proj):
    build(make_ctx(proj, gpu=FakeGpu(), gpu_match=fake_match), [H100])
    build(make_ctx(proj), [Target("scale", "b200")])
    manifest = json.loads((proj / "build/scale@b200/manifest.json").read_text())
    d = [d for d in manifest["dispatch"] if d["label"] == "float32[64x1024]"][0]
    assert (
        d["source"] == "lesson"
        and d["lesson"]["scope"]["gpu"] == "h100"
        and d["lesson"]["level"] == "other family"
    )
    report = (proj / "reports/scale@b200/report.md").read_text()
    assert "### Config choice without hardware" in report
    assert (
        f"float32[64x1024]: threads=256 vec=4 — lesson `{d['lesson']['lesson']}`: best on h100 (sm_90a)"
        in report
    )


def test_measured_search_tries_an_exact_scope_lesson_then_the_default_then_nearer_scopes():
    from ptxbuild.store.lessons import order_seeds

    exact, near, far, default = {"a": 1}, {"a": 2}, {"a": 3}, {"a": 9}
    used = [{"distance": 0}, {"distance": 0.5}, {"distance": 3.0}]
    assert order_seeds([exact, near, far], used, default) == [exact, default, near, far]
    assert order_seeds([near, far], used[1:], default) == [default, near, far]
    assert order_seeds([near, default], used[1:], default) == [default, near]  # no duplicate
    assert order_seeds([near], used[1:2], None) == [near]


def test_in_run_seeds_are_the_winners_of_earlier_problems_only(proj):
    from ptxbuild.declare.kernelfile import load
    from ptxbuild.oploader import load_op

    ctx = make_ctx(proj)
    prob = {"dtype": "float32", "op": "scale", "options": {}, "shape": [64, 1024]}
    for threads, p50 in ((64, 0.03), (256, 0.01), (128, 0.02)):
        ctx.cache.add_attempt(
            run="r1",
            target="scale@h100",
            op="scale",
            gpu="h100",
            arch="sm_90a",
            problem=prob,
            params={"threads": threads, "vec": 4},
            outcome="ok",
            p50_ms=p50,
        )
    kf = load(proj / "kernelfile.toml")
    op = load_op("scale", kf.root)
    seeds, used = lessons.seeds(
        ctx.cache, op, Problem.make("scale", "float32", (64, 2048)), kf.gpus["h100"], run="r1"
    )
    assert seeds == [{"threads": 256, "vec": 4}]


def test_a_best_lesson_keeps_the_configs_within_2_percent_of_its_winner():
    prob = json.dumps(Problem.make("scale", "float32", (64, 1024)).key())

    def mk(i, t, ms, outcome="ok"):
        return {
            "id": i,
            "gpu": "h200",
            "arch": "sm_90a",
            "problem": prob,  # noqa: E731
            "params": json.dumps({"threads": t, "vec": 4}),
            "outcome": outcome,
            "p50_ms": ms,
        }

    rows = learn.best_rows(
        "scale",
        [
            mk(1, 128, 0.0100),
            mk(2, 256, 0.0101),
            mk(3, 512, 0.0103),
            mk(4, 64, 0.0099, "wrong_result"),
            mk(5, 256, 0.0101),
        ],
        "test",
    )
    (rule,) = [json.loads(r["rule"]) for r in rows]
    assert rule["params"] == {"threads": 128, "vec": 4}  # a wrong result never wins, however fast
    assert rule["near"] == [{"threads": 256, "vec": 4}]  # 1% slower: near; 3% slower: not

    # the build's winner (the playoff's, in one window) is the lesson, at its window's p50, not the
    # search's fastest timing; the search leader becomes one of its near configs
    w = {prob: ({"threads": 256, "vec": 4}, 0.0099)}
    (rule,) = [
        json.loads(r["rule"])
        for r in learn.best_rows("scale", [mk(1, 128, 0.0100), mk(2, 256, 0.0101)], "test", w)
    ]
    assert rule == {
        "params": {"threads": 256, "vec": 4},
        "p50_ms": 0.0099,
        "near": [{"threads": 128, "vec": 4}],
    }
    w = {
        prob: ({"threads": 256, "vec": 4}, 0.0097)
    }  # faster in its window than the leader was in the search:
    (rule,) = [
        json.loads(r["rule"])
        for r in learn.best_rows("scale", [mk(1, 128, 0.0100), mk(2, 256, 0.0101)], "test", w)
    ]
    assert rule["near"] == [
        {"threads": 128, "vec": 4}
    ]  # near is judged against the winner's search timing too


def test_among_equally_near_scopes_a_config_near_best_on_both_neighbours_goes_first(tmp_path):
    """N = 2048 between lessons of N = 1024 and N = 4096 (same distance): the config within 2% on both
    is tried before either neighbour's own winner."""
    cache = Cache(tmp_path / "c.sqlite")
    target = Problem.make("scale", "float32", (64, 2048))
    for n, winner, near in (
        (1024, 1, [{"threads": 3, "vec": 4}]),
        (4096, 2, [{"threads": 3, "vec": 4}]),
    ):
        scope = lessons._scope("h200", "sm_90a", Problem.make("scale", "float32", (64, n)).key())
        cache.db["lessons"].insert(
            lessons._row(
                "scale",
                "best",
                scope,
                {"params": {"threads": winner, "vec": 4}, "p50_ms": 0.01, "near": near},
                [1],
                1.0,
                "t",
            )
        )
    far = lessons._scope("h200", "sm_90a", Problem.make("scale", "float32", (64, 65536)).key())
    cache.db["lessons"].insert(
        lessons._row(
            "scale",
            "best",
            far,
            {
                "params": {"threads": 9, "vec": 4},
                "p50_ms": 0.01,
                "near": [{"threads": 3, "vec": 4}],
            },
            [1],
            1.0,
            "t",
        )
    )
    seeds, used = lessons.seeds(cache, OP, target, CATALOG["h200"], limit=4)
    assert [s["threads"] for s in seeds] == [3, 1, 2, 9]  # distance first, then support
    assert used[0]["support"] > used[1]["support"] == used[2]["support"]
    assert [u["role"] for u in used] == ["near-best", "winner", "winner", "winner"]


def test_a_varlen_lesson_is_in_the_exact_scope_of_its_own_problem():
    """Scopes come back from JSON with lists; problems hold frozen tuples (KDA's segment lengths).
    The H100 compile-only KDA build chose lessons of other scopes because the two never compared equal."""
    gpu = CATALOG["h200"]
    problem = Problem.make(
        "kda", "bfloat16", (8192, 96), {"lengths": [1300, 547, 2048, 963, 271, 3063]}
    )
    scope = json.loads(
        json.dumps(
            {
                "gpu": "h200",
                "arch": gpu.arch,
                "family": gpu.family,
                "dtype": "bfloat16",
                "shape": [8192, 96],
                "options": problem.opts_json,
            }
        )
    )
    assert scope["options"]["lengths"] == [1300, 547, 2048, 963, 271, 3063]
    assert lessons._distance(scope, gpu, problem) == 0.0
    assert lessons._in_scope(scope, problem, gpu.arch)
    other = {**scope, "options": {"lengths": [1024] * 8}}
    assert lessons._distance(other, gpu, problem) == 1.0
