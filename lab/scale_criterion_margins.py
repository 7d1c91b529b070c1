"""How far honest kernels and planted cheats are from the scale criterion's bound (issue 27), on the
CPU: err_p / (2 ||round(want) - want||_p + floor ||want||_p), the worst over p = 1, 2, the whole output
and every row (1 is the bound; ptxbuild/gpu/check.py). The kernels are tests/test_scale_criterion.py's
numpy emulations (fp32 arithmetic, rounded once), fed each op's own make_inputs / reference.

    python3 lab/scale_criterion_margins.py > lab/scale-criterion/margins.md
"""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ptxbuild.gpu import check  # noqa: E402
from ptxbuild.problem import Problem  # noqa: E402
from tests import test_scale_criterion as T  # noqa: E402


def score(got, want, dtype):
    """(worst err / bound, worst err / rounding cost) over p, the whole output and every row."""
    kind = check.stored_type(got, dtype)
    k, floor = check.ROUNDING_FACTOR, check.FLOOR[kind]
    worst = ratio = 0.0
    for _, s in check.error_norms(got, want, dtype, np):
        for p in (1, 2):
            e, r, m = (s[f"{x}{p}"] ** (1 / p) for x in ("err", "rnd", "mass"))
            ok = m > 0
            if ok.any():
                worst = max(worst, float((e[ok] / (k * r[ok] + floor * m[ok])).max()))
                if kind != "float32":
                    ratio = max(ratio, float((e[ok] / np.maximum(r[ok], 1e-300)).max()))
    return worst, ratio


def ops_table():
    cases = [
        (
            "rmsnorm",
            T.rmsnorm_kernel,
            T.RMSNORM_MODES,
            [(64, 4096), (199, 13), (3, 4095), (16, 65536)],
        ),
        (
            "rmsnorm_bwd",
            T.rmsnorm_bwd_kernel,
            T.BWD_MODES,
            [(512, 256), (199, 13), (3, 4095), (2048, 1024)],
        ),
        ("softmax", T.softmax_kernel, [{}], [(64, 4096), (7, 50257), (199, 13)]),
    ]
    print("| op | dtype | output | worst err / bound | worst err / rounding | cases |")
    print("|---|---|---|---|---|---|")
    for name, kernel, modes, shapes in cases:
        op = T.OPS[name]
        for dt in op.DTYPES:
            rows = {}
            for opts in modes:
                for shape in shapes:
                    for seed in (0, 1, 2):
                        prob = Problem.make(name, dt, shape, opts)
                        inputs = op.make_inputs(prob, seed, np)
                        ref = op.reference(prob, dict(inputs), np)
                        for out, got in kernel(prob, inputs).items():
                            w, r = score(got, ref[out], dt)
                            a = rows.get(out, (0.0, 0.0, 0))
                            rows[out] = (max(a[0], w), max(a[1], r), a[2] + 1)
            for out, (w, r, n) in sorted(rows.items()):
                print(f"| {name} | {dt} | {out} | {w:.3f} | {r:.3f} | {n} |")


def cheats_table():
    print("\n| planted_softmax kernel | N | threads | err / bound, min-max over 10 seeds |")
    print("|---|---|---|---|")
    for kind, acc, below in (
        ("honest", "float32", 0),
        ("bf16acc", "bfloat16", 0),
        ("zeros<1e-4", "float32", 1e-4),
    ):
        for n in (4096, 8192, 32768, 8193):
            for th in (128, 256):
                got = []
                for seed in range(10):
                    x = T.logits(64, n, 1.0, seed=seed + 100 * n)
                    got.append(score(T.softmax(x, th, acc, below), T.exact(x), "bfloat16")[0])
                print(f"| {kind} | {n} | {th} | {min(got):.2f}-{max(got):.2f} |")


if __name__ == "__main__":
    print("# The scale criterion's margins (`python3 lab/scale_criterion_margins.py`)\n")
    print("1.0 is the bound (2x what rounding the float reference to the output type costs, plus")
    print(
        "a floor: 2^-11 bf16, 2^-14 fp16, 1e-4 fp32); fp32 outputs: rounding ~0, the floor decides.\n"
    )
    ops_table()
    cheats_table()
