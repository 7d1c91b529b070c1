#!/usr/bin/env python3
"""The KDA forward's DRAM bytes per scenario, from ops/kda's own dims and workspace layout: what any
two-kernel version (prepare writes the workspace, the recurrence reads it) must move, against issue
30's bar (FlashKDA's time / 1.6, from the issue: FlashKDA timed on the H200 in session 31).

    python3 lab/kda/wg/bytes.py [--tbps 4.25]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from ptxbuild.oploader import load_op  # noqa: E402
from ptxbuild.problem import Problem  # noqa: E402

kda = load_op(str(ROOT / "ops" / "kda"), ROOT)
MIXED = (1300, 547, 2048, 963, 271, 3063)
# issue 30's targets in ms (FlashKDA / 1.6), in kda.md's scenario order
BAR_MS = {
    (96, (8192,)): 0.876,
    (96, MIXED): 0.870,
    (96, (1024,) * 8): 0.747,
    (64, (8192,)): 0.743,
    (64, MIXED): 0.636,
    (64, (1024,) * 8): 0.507,
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tbps", type=float, default=4.25, help="copy bandwidth (H200 here: 4.25)")
    a = ap.parse_args()
    bw = a.tbps * 1e12
    print(
        "| scenario | fused bytes (MB) | workspace per chunk-head (B) | workspace, written + read (MB) "
        "| two-kernel floor (ms) | bar (ms) | workspace that fits the bar at 100% / 85% of the "
        "copy rate (B per chunk-head) |"
    )
    print("|---|---:|---:|---:|---:|---:|---|")
    for (H, lens), bar in BAR_MS.items():
        pr = Problem.make("kda", "bfloat16", (sum(lens), H), {"lengths": lens})
        d = kda.dims(pr)
        fused = kda.bytes_moved(pr)
        blob = kda.workspace.sizes(d["K"], d["V"])["BLOB"]
        ws = 2 * d["NC"] * d["HV"] * blob
        floor_ms = (fused + ws) / bw * 1e3
        fits = [(bar * 1e-3 * bw * eff - fused) / (2 * d["NC"] * d["HV"]) for eff in (1.0, 0.85)]
        label = f"H{H} {'1 x 8192' if len(lens) == 1 else ('8 x 1024' if len(set(lens)) == 1 else 'mixed 6')}"
        print(
            f"| {label} | {fused / 1e6:.0f} | {blob} | {ws / 1e6:.0f} | {floor_ms:.3f} | {bar} | "
            f"{fits[0]:,.0f} / {fits[1]:,.0f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
