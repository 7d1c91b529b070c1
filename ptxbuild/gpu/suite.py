"""What the worker verifies a candidate on: the problems (its own, fewer rows, the op's adversarial
shapes, larger and odd sizes) that its one binary serves, and how each run is judged (the op's hooks
bound to a problem). Pure: no cupy here (xp is numpy or cupy)."""

from __future__ import annotations

from . import check

VERIFY_ROWS = 512  # extra seeds run on this many rows (same binary: rows are a runtime size)
# The test suite the worker runs beside the op's own (op.VERSION): bump when it changes, so verdicts
# taken before are taken again (keys.py has the same). 2: a call on dirty buffers (stateful), larger
# and odd sizes (size_classes), relative L2 beside the band (check.py). 3: the scale criterion judges
# L1 and L2 error against what rounding the reference to the output type costs (check.py).
SUITE_VERSION = "3"
SIZE_FACTORS = (2, 8)  # the last axis (a row's length) is also verified at these multiples, and odd
SIZE_ROWS = 64  # ... on at most this many rows
SIZE_MAX_BYTES = 256 << 20  # ... where the op moves at most this many bytes (or the problem's own)


def size_classes(op, problem, params: dict, arch: str = "sm_90a") -> list:
    """Larger and odd sizes of the problem's last axis that the candidate's binary serves (a size that
    is a run-time argument): SIZE_FACTORS x N and 2N+1, on at most SIZE_ROWS rows, where the op's check()
    accepts the config and the op moves at most max(SIZE_MAX_BYTES, the problem's bytes); an op may
    name its own with size_classes(problem, params) -> list[Problem] ([] for none)."""
    hook = getattr(op, "size_classes", None)
    if hook is not None:
        shapes = list(hook(problem, params))
    else:
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


def _hidden_options(problem) -> str:
    """The options a label leaves out (False / None / empty), so a failure names the case exactly."""
    hidden = {k: v for k, v in problem.options if v in (False, None, "")}
    return f" {hidden}" if hidden else ""


def custom_compare(op, problem, xp):
    """The op's optional compare(problem, output, got, want, xp) -> (ok, detail) | None, bound to a problem."""
    fn = getattr(op, "compare", None)
    return None if fn is None else (lambda name, got, want: fn(problem, name, got, want, xp))


def scale_limit(op, problem):
    """The op's optional error_bound(problem, output) -> (factor, floor) | None (None: the default of
    the output's stored type: check.ROUNDING_FACTOR, check.FLOOR), bound to a problem, as check.judge's `scale`."""
    fn = getattr(op, "error_bound", None)
    return None if fn is None else (lambda name, kind: fn(problem, name))


def judge_run(op, prob, inputs, before, first, ref, xp, again=None):
    """check.judge with the op's tolerance, compare and relative-L2 hooks for `prob`."""
    return check.judge(
        prob.dtype,
        inputs,
        before,
        first,
        ref,
        lambda name: op.tolerance(prob, name),
        xp,
        again,
        custom_compare(op, prob, xp),
        scale_limit(op, prob),
    )


def adversarial(op, problem, params: dict, arch: str = "sm_90a") -> list:
    """The op's adversarial shapes for this config (ops may take the config), minus those it cannot
    run and those that need another binary (same_binary)."""
    import inspect

    takes_params = len(inspect.signature(op.verify_problems).parameters) > 1
    shapes = op.verify_problems(problem, params) if takes_params else op.verify_problems(problem)
    return same_binary(
        op, params, problem, [p for p in shapes if op.check(params, p) is None], arch
    )
