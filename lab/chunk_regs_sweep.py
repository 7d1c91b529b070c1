"""How well the rmsnorm op's register estimate for stage="chunk" predicts what ptxas does (no GPU).

    python3 lab/chunk_regs_sweep.py [--arch sm_90a] [--jobs 2] [--out lab/compile/chunk-regs.md]

check() refuses a chunked config when `_chunk_regs` (the estimate) exceeds the register cap that
threads x min_blocks leave (`_reg_cap`). This compiles every exact block-regime chunk config over
dtypes, N in {8192, 32768}, with and without a residual, threads 128-1024, unroll 1-8 and min_blocks
1-4, whatever the estimate says, and counts: refused but compiles without spills (a config the
search never tries), accepted but spills (the compile step rejects it, at a compile's cost).
"""

from __future__ import annotations

import argparse
import itertools
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ptxbuild.oploader import load_op  # noqa: E402
from ptxbuild.problem import Problem  # noqa: E402

DTYPES = ["bfloat16", "float16", "float32"]
NS = [8192, 32768]
THREADS = [128, 256, 512, 1024]
UNROLLS = [1, 2, 4, 8]
MIN_BLOCKS = [1, 2, 3, 4]


def configs(op):
    """(problem, params, estimate, cap) of every chunk config whose only refusal, if any, is registers."""
    for dtype, n, res, t, u, mb in itertools.product(
        DTYPES, NS, (False, True), THREADS, UNROLLS, MIN_BLOCKS
    ):
        if t * mb > 2048:
            continue
        problem = Problem.make("rmsnorm", dtype, (1, n), {"residual": True} if res else {})
        params = op._full(
            {
                "regime": "block",
                "threads": t,
                "stage": "chunk",
                "unroll": u,
                "min_blocks": mb,
                "load_hint": "l2",
            }
        )
        why = op.check(params, problem)
        if why is not None and "registers" not in why:
            continue
        yield problem, params, op._chunk_regs(params, problem), op._reg_cap(params)


def compile_one(job):
    problem, params, arch = job
    from ptxbuild.compile.compiler import compile_kernel

    op = load_op("rmsnorm", ROOT)
    b = compile_kernel(op.render(params, problem, arch), arch)
    return b.registers, b.spill_bytes


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    op = load_op("rmsnorm", ROOT)
    rows = list(configs(op))
    with ProcessPoolExecutor(a.jobs) as pool:
        built = list(pool.map(compile_one, [(p, q, a.arch) for p, q, _, _ in rows], chunksize=4))
    false_refusals, false_accepts, right = [], [], 0
    for (problem, params, est, cap), (regs, spill) in zip(rows, built):
        refused, clean = est > cap, spill == 0
        label = (
            f"{problem.dtype} N={problem.shape[1]}{' +res' if problem.opts else ''} "
            f"t={params['threads']} u={params['unroll']} mb={params['min_blocks']}: "
            f"estimate {est}, cap {cap}, ptxas {regs} regs, {spill} B spilled"
        )
        if refused and clean:
            false_refusals.append(label)
        elif not refused and not clean:
            false_accepts.append(label)
        else:
            right += 1
    lines = [
        f"# stage=chunk: the register estimate against ptxas ({a.arch})",
        "",
        f"- reproduce: `python3 lab/chunk_regs_sweep.py --arch {a.arch}`",
        f"- {len(rows)} configs compiled; the estimate decided {right} right",
        f"- refused, but compile without spills: **{len(false_refusals)}** (the search never tries them)",
        f"- accepted, but spill: **{len(false_accepts)}** (the compile step rejects them)",
        "",
    ]
    for title, items in (
        ("Refused but clean", false_refusals),
        ("Accepted but spilling", false_accepts),
    ):
        lines += [f"## {title}", ""] + [f"- {x}" for x in items] + [""]
    text = "\n".join(lines)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
