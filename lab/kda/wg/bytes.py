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


def designs(K: int, V: int) -> dict[str, int]:
    """Bytes per chunk-head of the workspace: today's, and two smaller ones (workspace.sizes' parts)."""
    sz = kda.workspace.sizes(K, V)
    u32 = sz["BLOB"] - sz["U"]  # U^T in fp32
    return {
        "today (U^T fp32)": sz["BLOB"],
        "U^T in f16": sz["BLOB"] - u32 // 2,
        # the recurrence forms U^T = V^T (T_inv diag(beta))^T itself: v moves from the prepare's
        # reads to the recurrence's (no change in the fused bytes), the blob keeps T_inv diag(beta)
        "U^T from v in the recurrence": sz["U"] + kda.CH * kda.CH * 2,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tbps", type=float, default=4.25, help="copy bandwidth (H200 here: 4.25)")
    a = ap.parse_args()
    bw = a.tbps * 1e12
    rows = []
    for (H, lens), bar in BAR_MS.items():
        pr = Problem.make("kda", "bfloat16", (sum(lens), H), {"lengths": lens})
        d = kda.dims(pr)
        fused, heads = kda.bytes_moved(pr), d["NC"] * d["HV"]
        label = f"H{H} " + (
            "1 x 8192" if len(lens) == 1 else ("8 x 1024" if len(set(lens)) == 1 else "mixed 6")
        )
        fits = [(bar * 1e-3 * bw * eff - fused) / (2 * heads) for eff in (1.0, 0.85)]
        floors = {n: (fused + 2 * heads * b) / bw * 1e3 for n, b in designs(d["K"], d["V"]).items()}
        rows.append((label, fused, floors, bar, fits))
    sizes = designs(128, 128)
    names = list(sizes)
    print(
        f"Two-kernel traffic floor (ms) at {a.tbps} TB/s: (fused bytes + 2 x blob x chunk-heads) / bandwidth"
    )
    print()
    print(
        "| scenario | fused bytes (MB) | "
        + " | ".join(f"{n}: {sizes[n]:,} B" for n in names)
        + " | bar (ms) | blob that fits the bar at 100% / 85% (B) |"
    )
    print("|---|---:|" + "---:|" * len(names) + "---:|---|")
    for label, fused, floors, bar, fits in rows:
        cells = " | ".join(
            f"**{floors[n]:.3f}**" if floors[n] > bar else f"{floors[n]:.3f}" for n in names
        )
        print(
            f"| {label} | {fused / 1e6:.0f} | {cells} | {bar} | {fits[0]:,.0f} / {fits[1]:,.0f} |"
        )
    print()
    print("Bold: a floor above the bar, which no two-kernel forward with that workspace can meet.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
