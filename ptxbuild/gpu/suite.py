"""How the worker judges each run of a candidate (the op's hooks bound to a problem), and the suite's
version. What it verifies a candidate on (the problems its one binary serves: its own, fewer rows,
the op's adversarial shapes, larger and odd sizes) is ptxbuild/coverage.py's plan_problems. Pure:
no cupy here (xp is numpy or cupy)."""

from __future__ import annotations

from . import check

# The test suite the worker runs beside the op's own (op.VERSION): bump when it changes, so verdicts
# taken before are taken again (keys.py has the same). 2: a call on dirty buffers (stateful), larger
# and odd sizes (size_classes), relative L2 beside the band (check.py). 3: the scale criterion judges
# L1 and L2 error against what rounding the reference to the output type costs (check.py).
SUITE_VERSION = "3"


def _hidden_options(problem) -> str:
    """The options a label leaves out (False / None / empty), so a failure names the case exactly."""
    hidden = {k: v for k, v in problem.options if v in (False, None, "")}
    return f" {hidden}" if hidden else ""


def custom_compare(op, problem, xp):
    """The op's compare(problem, output, got, want, xp) -> (ok, detail) | None, bound to a problem
    (Op's default: None, the band judges)."""
    return lambda name, got, want: op.compare(problem, name, got, want, xp)


def judge_run(op, prob, inputs, before, first, ref, xp, again=None):
    """check.judge with the op's tolerance, compare and relative-L2 hooks for `prob`: its scale
    bound is the op's optional error_bound(problem, output) -> (factor, floor) | None (None: the
    default of the output's stored type: check.ROUNDING_FACTOR, check.FLOOR)."""
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
        lambda name, kind: op.error_bound(prob, name),
    )
