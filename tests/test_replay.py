"""Replay mode: recordings from fake builds, recorded answers, cold vs warm offline, the benchmark script."""

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

from ptxbuild.build.run import build
from ptxbuild.declare.graph import Target

from .conftest import make_ctx
from .fakes import FakeCompiler, FakeGpu, fake_match

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


replay = _load("replay")  # benchmarks/replay.py: the replay engine; the package writes recordings


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    path = tmp_path_factory.mktemp("rec") / "synthetic.jsonl"
    _load("synthetic_recording").generate(path)
    return replay.load_recording(path)


def test_a_recording_answers_with_what_the_build_measured(proj, tmp_path):
    (proj / "kernelfile.toml").write_text(
        (proj / "kernelfile.toml").read_text().replace("budget = 6", "budget = 20")
    )
    ctx = make_ctx(
        proj, FakeCompiler(error_on="#define VEC 1\n"), gpu=FakeGpu(), gpu_match=fake_match
    )
    build(ctx, [Target("scale", "h100")])
    out = tmp_path / "rec.jsonl"
    n = replay.export_recording(
        ctx.cache, out, spaces={"scale": {"threads": [64, 128, 256], "vec": [1, 2, 4]}}
    )
    for rec in (
        replay.load_recording(out),
        replay.load_recording(ctx.kf.cache_path),
    ):  # JSONL or the cache itself
        assert len(rec.rows) == n
        problem = {"op": "scale", "dtype": "float32", "shape": [64, 1024], "options": {}}
        rp = replay.Replayer(rec, "scale", "h100", problem)
        assert rp(
            [{"threads": 256, "vec": 4}, {"threads": 64, "vec": 1}, {"threads": 999, "vec": 4}]
        ) == [0.01, math.inf, math.inf]
        assert (rp.evaluations, rp.unrecorded) == (3, 1)
        assert rp.best_ms() == 0.01


def test_warm_start_from_other_shapes_beats_cold_offline(synthetic):
    g, arch, problem = synthetic.problems("rmsnorm", "h200")[1]
    default = replay.default_of(synthetic, "rmsnorm", problem)
    cold = [
        replay.replay_search(
            synthetic, "rmsnorm", g, problem, strategy="random", seeds=[default], rng_seed=s
        )
        for s in range(4)
    ]
    cache = replay.lessons_cache(
        synthetic, "rmsnorm", lambda r: r["gpu"] == g and r["problem"] != problem
    )
    seeds, used, rules = replay.warm_start(cache, synthetic, "rmsnorm", g, problem)
    assert used[0]["level"] == "same GPU" and {r["rule"]["outcome"] for r in rules} == {
        "spill",
        "resource",
        "compile_error",
    }
    warm = [
        replay.replay_search(
            synthetic,
            "rmsnorm",
            g,
            problem,
            strategy="random",
            seeds=seeds + [default],
            rules=rules,
            rng_seed=s,
        )
        for s in range(4)
    ]
    assert all(w.evaluations is not None and w.evaluations <= 4 for w in warm)
    assert sum(c.evaluations for c in cold) / 4 > 20
    assert set(warm[0].rules_used) == {
        r["lesson"] for r in rules
    }  # pruned configs cost no evaluation


def test_the_benchmark_script_writes_its_report(synthetic, tmp_path):
    rec = tmp_path / "rec.jsonl"
    rec.write_text(
        "\n".join(
            json.dumps(x)
            for x in [
                synthetic.header,
                *[r for r in synthetic.rows if r["problem"]["shape"][1] <= 2048],
            ]
        )
        + "\n"
    )
    summary = _load("warmstart").main([str(rec), "--seeds", "2", "--out", str(tmp_path / "out")])
    md = (tmp_path / "out/warmstart.md").read_text()
    assert (
        md.startswith("# Warm starts vs cold search: rmsnorm@h200")
        and "**SYNTHETIC recording**" in md
    )
    data = json.loads((tmp_path / "out/warmstart.json").read_text())
    assert data["summary"] == json.loads(json.dumps(summary)) and len(data["shapes"]) == 3
    w = summary["warm"]["other shapes, same GPU"]
    assert w["meets_bar"] and w["median_evaluations"] < summary["cold"]["median_evaluations"]
    lo, hi = w["fraction_interval_90"]
    assert lo <= w["fraction_of_cold"] <= hi


def test_the_resampled_interval_shows_how_fragile_a_median_is():
    interval = _load("warmstart").interval
    assert interval([(1.0, 4.0)] * 9) == [0.25, 0.25]  # every shape agrees: no spread
    lo, hi = interval([(1.0, 4.0)] * 5 + [(4.0, 4.0)] * 4)  # a median carried by one shape
    assert lo == 0.25 and hi == 1.0


def test_min_candidates_keeps_only_problems_whose_recording_samples_the_space(synthetic, tmp_path):
    """--min-candidates N: a problem the recording holds fewer configs of (a build's own lesson-picked
    tries) is not a benchmark shape; none left is an error that names the option."""
    import pytest

    ws = _load("warmstart")
    rec = tmp_path / "rec.jsonl"
    keep = [r for r in synthetic.rows if r["problem"]["shape"][1] <= 2048]
    counts = {}
    for r in keep:
        counts[json.dumps(r["problem"], sort_keys=True)] = (
            counts.get(json.dumps(r["problem"], sort_keys=True), 0) + 1
        )
    small = min(counts, key=counts.get)
    trimmed = [r for r in keep if json.dumps(r["problem"], sort_keys=True) != small] + [
        r for r in keep if json.dumps(r["problem"], sort_keys=True) == small
    ][:5]
    rec.write_text("\n".join(json.dumps(x) for x in [synthetic.header, *trimmed]) + "\n")
    ws.main([str(rec), "--seeds", "2", "--min-candidates", "6", "--out", str(tmp_path / "out")])
    data = json.loads((tmp_path / "out/warmstart.json").read_text())
    assert len(data["shapes"]) == len(counts) - 1 and data["meta"]["min_candidates"] == 6
    assert all(s["candidates"] >= 6 for s in data["shapes"])
    assert "at least 6 recorded configs" in (tmp_path / "out/warmstart.md").read_text()
    with pytest.raises(SystemExit, match="--min-candidates"):
        ws.main(
            [
                str(rec),
                "--seeds",
                "2",
                "--min-candidates",
                "100000",
                "--out",
                str(tmp_path / "none"),
            ]
        )


def test_a_tied_outcome_is_the_first_seen_whatever_the_hash_seed():
    """A config whose attempts failed as often one way as another is recorded with the first
    failure seen: the same recording from the same cache in every process (a set's order of strings
    follows PYTHONHASHSEED)."""
    from ptxbuild.search.replay import _row

    def attempt(i, outcome):
        return dict(
            id=i,
            op="scale",
            gpu="h200",
            arch="sm_90a",
            problem='{"shape": [4]}',
            params='{"threads": 128}',
            outcome=outcome,
            p50_ms=None,
            compile_s=0.5,
            verify_s=None,
            measure_s=None,
        )

    for first, second in (("compile_error", "spill"), ("spill", "compile_error")):
        row = _row([attempt(1, first), attempt(2, second)])
        assert row["outcome"] == first and row["attempts"] == [1, 2]
    assert _row([attempt(1, "spill"), attempt(2, "ok")])["outcome"] == "ok"
