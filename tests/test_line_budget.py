"""A line budget for the tool itself: small modules with one job each stay small."""
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "ptxbuild"
TOTAL_LINES = 6000
MODULE_LINES = 650


def test_the_package_stays_within_its_line_budget():
    sizes = {p.relative_to(PKG).as_posix(): len(p.read_text().splitlines()) for p in PKG.rglob("*.py")}
    assert sum(sizes.values()) <= TOTAL_LINES, f"ptxbuild/ has {sum(sizes.values())} lines (budget {TOTAL_LINES})"
    big = {k: v for k, v in sizes.items() if v > MODULE_LINES}
    assert not big, f"modules over {MODULE_LINES} lines: {big}; split them by job"
