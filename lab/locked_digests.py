#!/usr/bin/env python3
"""Does an op's working copy still compile every locked config to its locked cubin? (no GPU)

`ptxbuild relock` answers this only for edits to kernel sources: it refuses any edit to the op's
Python, since host code decides arguments and launches. Before such an edit is landed with a GPU
rebuild (a new stage, a new parameter), this says whether the locked kernels themselves would stay
byte-identical, i.e. whether the rebuild can only add winners and not lose the old ones:

    python3 lab/locked_digests.py kda kda@h200 kda_heads@h200 kda@h100
    python3 lab/locked_digests.py lab/ops/rmsnorm_long rmsnorm@h200 rmsnorm@h100 rmsnorm@b200

Each locked dispatch entry's params are checked and rendered by the given op and compiled for the
target's architecture; the cubin's sha256 is compared with the entry's binary. Exit 1 if any differs
or is refused.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ptxbuild.compile.compiler import compile_kernel  # noqa: E402
from ptxbuild.oploader import load_op  # noqa: E402
from ptxbuild.problem import Problem  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "op", help="template name (ops/NAME) or an op folder relative to the repository"
    )
    ap.add_argument("targets", nargs="+", help="locked targets, e.g. kda@h200")
    ap.add_argument("--lock", default=str(ROOT / "kernelfile.lock"))
    ap.add_argument("--jobs", type=int, default=4)
    a = ap.parse_args(argv)
    op = load_op(a.op, ROOT)
    lock = json.loads(Path(a.lock).read_text())["targets"]
    jobs = []
    for name in a.targets:
        if name not in lock:
            raise SystemExit(f"{name}: not in {a.lock}")
        t = lock[name]
        jobs += [(name, t["arch"], d) for d in t["dispatch"] if d.get("params") is not None]

    def one(job):
        name, arch, d = job
        problem = Problem.make(**d["problem"])
        if why := op.check(d["params"], problem):
            return name, d["label"], f"refused: {why}"
        got = compile_kernel(op.render(d["params"], problem, arch), arch).digest
        return name, d["label"], "same" if got == d["binary"] else f"differs ({got[:12]})"

    with ThreadPoolExecutor(a.jobs) as ex:
        rows = list(ex.map(one, jobs))
    for name, label, what in rows:
        if what != "same":
            print(f"{name} {label}: {what}")
    bad = sum(what != "same" for *_, what in rows)
    print(
        f"{len(rows)} locked configs of {', '.join(a.targets)}: {len(rows) - bad} same, {bad} not"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
