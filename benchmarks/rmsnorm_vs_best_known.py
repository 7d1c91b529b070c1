"""Issue #4's bf16 bar, checked from a committed report: each row against the "best known" column.

    python3 benchmarks/rmsnorm_vs_best_known.py [reports/bf16/rmsnorm@h200/report.json] [--out FILE]

BEST_KNOWN is the column of the team's rmsnorm notes (bf16 forward on an H200, microseconds, the
fastest of PyTorch eager, torch.compile, a Triton library kernel and a hand-written CUDA/PTX kernel,
each measured with the L2 flushed). The bar: every row within 1% of it or faster, and the geometric
mean of ours / best known at most 0.97.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

BEST_KNOWN_US = {
    (32768, 256): 13.1,
    (32768, 512): 20.5,
    (32768, 1024): 37.9,
    (32768, 2048): 70.6,
    (32768, 4096): 133.7,
    (32768, 8192): 252.9,
    (32768, 16384): 511.4,
    (32768, 32768): 1021.5,
    (32768, 65536): 2162.1,
    (16384, 131072): 2218.0,
    (8192, 262144): 2502.8,
}
ROW_SLACK, GEOMEAN_BAR = 1.01, 0.97


def compare(report: dict) -> tuple[list[tuple], float | None, bool]:
    """([(M, N, ours us, best known us, ratio, row ok)], geomean ratio, bar met) for the plain bf16 rows."""
    ours = {}
    for d in report["dispatch"]:
        p = d["problem"]
        if p["dtype"] == "bfloat16" and not p.get("options") and d.get("p50_ms"):  # plain rows only
            ours[tuple(p["shape"])] = d["p50_ms"] * 1e3
    rows = []
    for shape, best in BEST_KNOWN_US.items():
        if shape in ours:
            r = ours[shape] / best
            rows.append((*shape, ours[shape], best, r, r <= ROW_SLACK))
    if not rows:
        return rows, None, False
    geo = math.exp(sum(math.log(r[4]) for r in rows) / len(rows))
    return (
        rows,
        geo,
        len(rows) == len(BEST_KNOWN_US) and all(r[5] for r in rows) and geo <= GEOMEAN_BAR,
    )


def render(path: str, report: dict) -> str:
    rows, geo, ok = compare(report)
    s = report.get("summary", {})
    lines = [
        "# bf16 RMSNorm on the H200 against the best known kernels",
        "",
        f"- report: `{path}` (run `{s.get('run', '?')}`)",
        f"- bar: every row <= {ROW_SLACK:.2f}x the best known, geometric mean <= {GEOMEAN_BAR:.2f}x",
        f"- reproduce: `python3 benchmarks/rmsnorm_vs_best_known.py {path}`",
        "",
        "| M x N | ours (us) | best known (us) | ours / best | row |",
        "|---|---:|---:|---:|---|",
    ]
    lines += [
        f"| {m} x {n} | {o:.1f} | {b:.1f} | {r:.3f} | {'ok' if k else 'slower'} |"
        for m, n, o, b, r, k in rows
    ]
    lines += [
        "",
        f"geometric mean of ours / best known: **{geo:.3f}** over {len(rows)} rows: "
        f"bar {'met' if ok else 'not met'}"
        if geo
        else "no bf16 rows in the report",
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report", nargs="?", default="reports/bf16/rmsnorm@h200/report.json")
    ap.add_argument("--out", default="", help="also write the table here (markdown)")
    a = ap.parse_args(argv)
    text = render(a.report, json.loads(Path(a.report).read_text()))
    print(text, end="")
    if a.out:
        Path(a.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
