"""Which shapes a verified kernel may serve: the class of shapes its verification covered (pure, L0).

The GPU worker verifies a candidate on its problem, fewer rows, the op's adversarial shapes and larger
and odd sizes of the last axis (size_classes below) and returns every shape it ran
(VerifyResult.shapes). A shape is in the verified class when it has as many axes, every axis is at
most the largest verified size of that axis, and its last axis has the alignment class (odd, 2 mod 4,
4 mod 8, a multiple of 8) of some verified shape's last axis: a precision or tail bug that shows only
at larger sizes or another alignment is then one verification has seen.

A build records, per dispatch entry, the shapes the worker verifies that entry's config on (the plan
below, the same the worker runs) in manifest.json's "coverage" (not in the lock: nothing it pins
changes); the runtime never dispatches an entry to a shape outside its class (served())."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .keys import SUITE_VERSION
from .problem import Problem
from .records import DispatchEntry, Manifest

VERIFY_ROWS = 512  # extra seeds run on this many rows (same binary: rows are a runtime size)
SIZE_FACTORS = (2, 8)  # the last axis (a row's length) is also verified at these multiples, and odd
SIZE_ROWS = 64  # ... on at most this many rows
SIZE_MAX_BYTES = 256 << 20  # ... where the op moves at most this many bytes (or the problem's own)


def alignment(n: int) -> int:
    """0 for odd n, 1 for 2 mod 4, 2 for 4 mod 8, 3 for a multiple of 8."""
    k = 0
    while k < 3 and n % (2 << k) == 0:
        k += 1
    return k


def covers(verified: Iterable[Sequence[int]], shape: Sequence[int]) -> bool:
    """Is `shape` in the class of shapes `verified` covers (see the module's docstring)?"""
    shape = tuple(int(s) for s in shape)
    same = [tuple(int(s) for s in v) for v in verified if len(v) == len(shape)]
    if not same or not shape or min(shape) < 1:
        return False
    if any(s > max(v[d] for v in same) for d, s in enumerate(shape)):
        return False
    return any(alignment(v[-1]) == alignment(shape[-1]) for v in same)


# --- what the worker verifies a candidate on (gpu/runs.py verify; pure: a build records it) -----


def size_classes(op, problem, params: dict, arch: str = "sm_90a") -> list:
    """Larger and odd sizes of the problem's last axis that the candidate's binary serves (a size that
    is a run-time argument): SIZE_FACTORS x N and 2N+1, on at most SIZE_ROWS rows, where the op's check()
    accepts the config and the op moves at most max(SIZE_MAX_BYTES, the problem's bytes); an op may
    name its own with size_classes(problem, params) -> list[Problem] ([] for none)."""
    shapes = op.size_classes(problem, params)
    if shapes is None:
        *lead, n = problem.shape
        lead = [min(lead[0], SIZE_ROWS), *lead[1:]] if lead else []
        sizes = [f * n for f in SIZE_FACTORS] + [2 * n + 1]
        shapes = [problem.with_shape((*lead, m)) for m in sizes]
    cap = max(SIZE_MAX_BYTES, _bytes(op, problem))

    def fits(p) -> bool:
        try:
            return p != problem and op.check(params, p) is None and _bytes(op, p) <= cap
        except Exception:  # noqa: BLE001 - a shape the op cannot judge is not one to run
            return False

    kept = list(dict.fromkeys(p for p in shapes if fits(p)))
    return same_binary(op, params, problem, kept, arch) if kept else []


def _bytes(op, problem) -> int:
    try:
        return int(op.bytes_moved(problem))
    except Exception:  # noqa: BLE001 - unknown: no cap beyond SIZE_MAX_BYTES
        return 0


def verified_shapes(plan: list) -> list:
    """The shapes a verdict covers (what the runtime may serve: ptxbuild/coverage.py)."""
    return sorted({tuple(p.shape) for p, _ in plan})


def plan_problems(op, problem, params: dict, arch: str = "sm_90a") -> list:
    """Every problem the worker verifies a candidate on, in order: the problem, the problem on fewer
    rows (the extra seeds), the op's adversarial shapes, then the size classes not among them. Pure:
    a build can say what a verdict covered without a GPU (ptxbuild/coverage.py covers())."""
    first = [
        problem,
        fewer_rows(op, problem, params, arch),
        *adversarial(op, problem, params, arch),
    ]
    seen = set(first)
    return first + [p for p in size_classes(op, problem, params, arch) if p not in seen]


def same_binary(op, params: dict, problem, others: list, arch: str) -> list:
    """The problems of `others` that render to the same source as `problem` with `params`: only those can the
    candidate's binary run. Problem options are often compile-time flags (KDA's initial and final state, rmsnorm's
    residual): a binary built without h0 reads past a one-element placeholder: the harness fails, not the candidate."""

    def source(p) -> str | None:
        try:
            return op.render(params, p, arch).source
        except Exception:  # noqa: BLE001 - a problem the op cannot render is not one this binary runs
            return None

    own = source(problem)
    return [p for p in others if own is not None and source(p) == own]


def fewer_rows(op, problem, params: dict, arch: str = "sm_90a"):
    """The problem with at most VERIFY_ROWS rows if the config accepts it and the binary runs it, else the problem."""
    if len(problem.shape) < 2 or problem.shape[0] <= VERIFY_ROWS:
        return problem
    small = problem.with_shape((VERIFY_ROWS, *problem.shape[1:]))
    return (
        small
        if op.check(params, small) is None and same_binary(op, params, problem, [small], arch)
        else problem
    )


def adversarial(op, problem, params: dict, arch: str = "sm_90a") -> list:
    """The op's adversarial shapes for this config (ops may take the config), minus those it cannot
    run and those that need another binary (same_binary)."""
    shapes = op.verify_problems(problem, params)
    return same_binary(
        op, params, problem, [p for p in shapes if op.check(params, p) is None], arch
    )


# --- the record a build writes, what the runtime reads -------------------------------------------


def record(op, dispatch: list[dict], arch: str) -> dict:
    """manifest.json's "coverage": for each dispatch entry, in order, the shapes the worker verifies
    its config on (plan_problems; None for an entry without a kernel), and the suite's version."""

    def shapes(d: dict) -> list | None:
        plan = d.get("params") and plan_problems(
            op, Problem.make(**d["problem"]), d["params"], arch
        )
        return plan and [list(s) for s in sorted({p.shape for p in plan})]

    return {"suite": SUITE_VERSION, "shapes": [shapes(d) for d in dispatch]}


def served(manifest: Manifest, entry: DispatchEntry, shape: Sequence[int]) -> bool:
    """May the runtime dispatch `entry` (one of manifest.dispatch) to `shape`: is it in the class
    of the shapes its "coverage" record names (a manifest written before the record: the class of the
    entry's own built shape, the narrowest)?"""
    shapes = (manifest.coverage or {}).get("shapes") or []
    i = next((i for i, d in enumerate(manifest.dispatch) if d is entry), len(shapes))
    return covers((shapes[i] if i < len(shapes) else None) or [entry.problem["shape"]], shape)
