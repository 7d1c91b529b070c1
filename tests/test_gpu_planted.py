"""On a GPU: each planted bad kernel gets its own outcome through GpuSession, and the session goes on."""

from functools import cache
from pathlib import Path

import pytest

from ptxbuild.gpu import GpuSession, gpu_available, match_gpu
from ptxbuild.oploader import load_op
from ptxbuild.outcome import Outcome
from ptxbuild.problem import Problem

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not gpu_available(), reason="needs an NVIDIA GPU and cupy (pip install cupy-cuda13x)"
    ),
]

OP = str(Path(__file__).with_name("planted_op").resolve())
SMALL = Problem.make(
    "planted_op", "float32", (512, 1024)
)  # N % 8 == 0: (b) fails only on an adversarial shape
BIG = Problem.make(
    "planted_op", "float32", (8192, 8192)
)  # 512 MiB moved: the floor is ~0.1 ms on an H200


@pytest.fixture(scope="module")
def session():
    with GpuSession(0, timeout_s=30.0) as s:
        yield s


@cache
def build(bad: str, cc: str):
    from ptxbuild.compile.compiler import compile_kernel

    op = load_op(OP, Path("."))
    params = {**op.default_params(SMALL), "BAD": bad}
    return params, compile_kernel(op.render(params, SMALL, cc), cc)


def good_still_verifies(session):
    params, binary = build("none", session.fingerprint.cc)
    r = session.verify(OP, params, SMALL, binary)
    assert r.outcome is Outcome.OK, r.detail


@pytest.mark.parametrize(
    "bad,outcome",
    [
        ("none", Outcome.OK),
        ("unwritten", Outcome.UNWRITTEN),  # (a)
        ("tail", Outcome.WRONG_RESULT),  # (b)
        ("input", Outcome.INPUT_MODIFIED),  # (c)
        ("nondet", Outcome.NONDETERMINISTIC),  # (d)
        ("hang", Outcome.TIMEOUT),  # (e)
        ("illegal", Outcome.ILLEGAL_ADDRESS),  # (f)
        ("skip", Outcome.STATEFUL),  # (g) right on poison, wrong on a second call (issue 27)
    ],
)
def test_planted_kernel_gets_its_own_outcome(session, bad, outcome):
    params, binary = build(bad, session.fingerprint.cc)
    r = session.verify(OP, params, SMALL, binary)
    assert r.outcome is outcome, r.detail
    if bad == "none":
        # main, 2 seeds on fewer rows, 3 adversarial shapes, 3 size classes (2N, 8N, 2N+1)
        assert r.cases == 3 + 3 + 3 and r.max_abs_err == 0.0 and r.tolerances == {"y": [1e-6, 1e-6]}
    if bad == "tail":
        assert "x4095" in r.detail, r.detail  # found on the adversarial shape, not the main one
    good_still_verifies(session)  # the session survives every planted kernel


def test_the_session_restarted_after_the_crashes(session):
    params, binary = build("illegal", session.fingerprint.cc)
    before = session.restarts
    assert session.verify(OP, params, SMALL, binary).outcome is Outcome.ILLEGAL_ADDRESS
    good_still_verifies(session)
    assert session.restarts == before + 1


def test_skip_kernel_gains_nothing_from_reused_outputs(session):  # (g)
    """Outputs are poisoned again before every timed call (issue 27): the kernel that does nothing
    when y holds a value does all its work, at the honest kernel's speed (it was 'impossibly fast')."""
    params, binary = build("skip", session.fingerprint.cc)
    m = session.measure(OP, params, BIG, binary)
    assert m.outcome is Outcome.OK, m
    assert 0.2 < m.fraction_of_floor <= 1.03, m


def test_good_kernel_timing(session):
    params, binary = build("none", session.fingerprint.cc)
    m = session.measure(OP, params, BIG, binary)
    assert m.outcome is Outcome.OK, m
    assert 10 <= m.samples <= 1000 and m.p20_ms <= m.p50_ms <= m.p80_ms
    assert 0.2 < m.fraction_of_floor <= 1.03 and m.fingerprint == session.fingerprint
    inc = session.measure(OP, params, BIG, binary, incumbent=(params, binary))
    assert inc.outcome is Outcome.OK and inc.incumbent_p50_ms is not None
    assert (
        abs(inc.p50_ms - inc.incumbent_p50_ms) < 0.2 * inc.incumbent_p50_ms
    )  # the same kernel, the same window


def test_baselines_are_checked_then_timed(session):
    res = session.baselines(OP, BIG)
    assert res["xp_2x"].outcome is Outcome.OK and res["xp_2x"].samples >= 10, res
    assert res["wrong_copy"].outcome is Outcome.WRONG_RESULT, res


def test_fingerprint_and_copy_bandwidth(session):
    fp = session.fingerprint
    assert fp.sm_count > 0 and fp.memory_bytes > 0 and fp.cc.startswith("sm_") and fp.cuda_runtime
    assert 0.1 < session.copy_tbps < 20
    if "H200" in fp.name and "GH200" not in fp.name:
        assert match_gpu(fp, "h200", {"arch": "sm_90a"}) == "model"
