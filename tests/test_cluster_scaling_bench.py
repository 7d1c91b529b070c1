"""benchmarks/cluster_scaling.py on the CPU: the project copy it builds in, the winners' comparison
and its Markdown (the builds themselves need GPUs: the lead's H200 runs)."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location(
    "cluster_scaling", ROOT / "benchmarks/cluster_scaling.py"
)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_the_copy_keeps_the_kernelfiles_relative_paths(tmp_path):
    kf = bench.project_copy(ROOT / "benchmarks/rmsnorm_bf16.toml", tmp_path)
    assert kf == tmp_path / "benchmarks/rmsnorm_bf16.toml"
    assert (tmp_path / "ops/rmsnorm/op.py").read_bytes() == (
        ROOT / "ops/rmsnorm/op.py"
    ).read_bytes()
    assert (tmp_path / "cache/lessons.jsonl").is_file()
    assert not (tmp_path / "cache/ptxbuild.sqlite").exists()  # an empty cache: both builds alike


def test_winners_are_the_same_a_tie_or_different():
    one = {
        "a": {"label": "a", "params": {"t": 1}, "p50_ms": 1.0},
        "b": {"label": "b", "params": {"t": 1}, "p50_ms": 1.0},
        "c": {"label": "c", "params": {"t": 1}, "p50_ms": 1.0},
    }
    many = {
        "a": {"label": "a", "params": {"t": 1}, "p50_ms": 1.01},
        "b": {"label": "b", "params": {"t": 2}, "p50_ms": 0.985},
        "c": {"label": "c", "params": {"t": 2}, "p50_ms": 0.9},
    }
    rows = {r["label"]: r for r in bench.compare(one, many)}
    assert rows["a"]["same_winner"] and not rows["a"]["tie"]
    assert not rows["b"]["same_winner"] and rows["b"]["tie"]  # within the playoff's 2%
    assert not rows["c"]["same_winner"] and not rows["c"]["tie"]
    data = {
        "target": "rmsnorm@h200",
        "gpus": 2,
        "kernelfile": "kernelfile.toml",
        "command": "python benchmarks/cluster_scaling.py rmsnorm@h200 --gpus 2",
        "seconds": {"1": 100.0, "n": 55.0},
        "summary": {
            "speedup": 100 / 55,
            "bar": 1.7,
            "problems": 3,
            "same": 1,
            "ties": 1,
            "different": 1,
            "ratio_median": 0.985,
            "ratio_min": 0.9,
            "ratio_max": 1.01,
            "passed": False,
        },
        "problems": list(rows.values()),
    }
    md = bench.markdown(data)
    assert "**1.82x** (bar 1.70x)" in md and "1 the same, 1 ties within 2%, 1 different" in md
    assert "| c | t=1 | 1000.0 | t=2 | 900.0 | 0.9000 |" in md and "pass: **no**" in md
