"""How long `ptxbuild plan`, `check` and a no-op `build` take on a repository (issue 26 item 11).

Each command runs in a fresh interpreter (`python -m ptxbuild.cli ...`, the ptxbuild of --tree on
PYTHONPATH, from --root), once to warm the memo and the bytecode caches, then --runs times; the
table gives the median, min and max wall time of those runs and their median CPU time (user +
system: what a shared, loaded machine inflates least). A no-op build is timed only where
--build names targets already up to date (after `ptxbuild build --locked`, say):

    python benchmarks/plan_speed.py
    python benchmarks/plan_speed.py --tree ../old-checkout --label before
    python benchmarks/plan_speed.py --build rmsnorm@h100 rmsnorm@h200

Not a test: the numbers depend on the machine and its load (lab/plan_speed.md holds measured ones).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def timed(cmd: list[str], root: Path, env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system) of one run of `cmd`."""
    r0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    took, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout}{done.stderr}")
    return took, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", type=Path, default=HERE, help="the ptxbuild checkout to time")
    ap.add_argument("--root", type=Path, default=None, help="the project (default: --tree)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--label", default="")
    ap.add_argument("--build", nargs="*", default=(), help="up-to-date targets for a no-op build")
    args = ap.parse_args()
    root = (args.root or args.tree).resolve()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    # the tree first; what PYTHONPATH held already after it (packages installed to a folder)
    env["PYTHONPATH"] = os.pathsep.join(
        [
            str(args.tree.resolve()),
            *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep)),
        ]
    )
    base = [sys.executable, "-m", "ptxbuild.cli"]
    commands = [["plan"], ["check"]] + ([["build", "--no-gpu", *args.build]] if args.build else [])
    print(
        f"| command {args.label} | wall, median of {args.runs} (s) | min | max | CPU, median (s) |"
    )
    print("|---|---|---|---|---|")
    for argv in [["-c", "pass"]] + commands:
        cmd = [sys.executable, *argv] if argv[0] == "-c" else base + argv
        timed(cmd, root, env)  # warm: bytecode, the memo
        wall, cpu = zip(*(timed(cmd, root, env) for _ in range(args.runs)))
        shown = "python -c pass" if argv[0] == "-c" else "ptxbuild " + " ".join(argv)
        print(
            f"| `{shown}` | {statistics.median(wall):.3f} | {min(wall):.3f} | {max(wall):.3f} "
            f"| {statistics.median(cpu):.3f} |"
        )


if __name__ == "__main__":
    main()
