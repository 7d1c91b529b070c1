"""benchmarks/rmsnorm_vs_best_known.py: issue #4's bf16 bar computed from a report's dispatch table."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import rmsnorm_vs_best_known as vs  # noqa: E402


def _report(scale: dict, residual_fast: bool = False) -> dict:
    rows = [
        {
            "problem": {"dtype": "bfloat16", "shape": list(s), "options": {}},
            "p50_ms": b * scale.get(s, 0.96) / 1e3,
        }
        for s, b in vs.BEST_KNOWN_US.items()
    ]
    rows += [
        {"problem": {"dtype": "float16", "shape": [32768, 256], "options": {}}, "p50_ms": 1e-6}
    ]
    if (
        residual_fast
    ):  # a residual or rstd row of the same shape must not stand in for the plain one
        rows.insert(
            0,
            {
                "problem": {
                    "dtype": "bfloat16",
                    "shape": [32768, 512],
                    "options": {"residual": True},
                },
                "p50_ms": 1e-6,
            },
        )
        rows.append(
            {
                "problem": {"dtype": "bfloat16", "shape": [32768, 1024], "options": {"rstd": True}},
                "p50_ms": 1e-6,
            }
        )
    return {"dispatch": rows, "summary": {"run": "r"}}


def test_every_row_4_percent_faster_meets_the_bar():
    rows, geo, ok = vs.compare(_report({}, residual_fast=True))
    assert len(rows) == 11 and abs(geo - 0.96) < 1e-9 and ok
    assert all(abs(r[4] - 0.96) < 1e-9 for r in rows)


def test_one_row_2_percent_slower_fails_the_bar_even_with_a_good_geomean():
    rows, geo, ok = vs.compare(_report({(32768, 512): 1.02}))
    assert geo < 0.97 and not ok
    assert [r[:2] for r in rows if not r[5]] == [(32768, 512)]


def test_a_missing_row_fails_and_the_markdown_says_so():
    rep = _report({})
    rep["dispatch"] = rep["dispatch"][1:]
    rows, geo, ok = vs.compare(rep)
    assert len(rows) == 10 and not ok
    assert "bar not met" in vs.render("r.json", rep)
