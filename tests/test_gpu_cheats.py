"""On a GPU: the four cheats issue 27 found passing or winning (tests/planted_softmax) are each rejected
with their outcome through GpuSession, the honest kernel passes, and a build of the planted op picks
the honest kernel (memcheck included where compute-sanitizer is present)."""

import time
from functools import cache
from pathlib import Path

import pytest

from ptxbuild.gpu import GpuSession, gpu_available, memcheck
from ptxbuild.oploader import load_op
from ptxbuild.outcome import Outcome
from ptxbuild.problem import Problem

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not gpu_available(), reason="needs an NVIDIA GPU and cupy (pip install cupy-cuda13x)"
    ),
]

OP = str(Path(__file__).with_name("planted_softmax").resolve())
P = Problem.make("planted_softmax", "bfloat16", (256, 4096))
# M*N*2 bytes not a multiple of 512 (the pool's rounding), so oob's read past x stays in the pool's
# slack outside memcheck (no illegal address), and is out of bounds under it (no pool there)
ODD = Problem.make("planted_softmax", "bfloat16", (257, 4000))


@pytest.fixture(scope="module")
def session():
    with GpuSession(0, timeout_s=120.0) as s:
        yield s


@cache
def build(bad: str, cc: str, threads: int = 128):
    from ptxbuild.compile.compiler import compile_kernel

    op = load_op(OP, Path("."))
    params = {"BAD": bad, "THREADS": threads}
    return params, compile_kernel(op.render(params, P, cc), cc)


@pytest.mark.parametrize(
    "bad,threads,outcome,where",
    [
        ("none", 128, Outcome.OK, ""),
        ("skip", 128, Outcome.STATEFUL, "same buffers"),  # class 1
        ("zeros", 128, Outcome.WRONG_RESULT, "relative L1"),  # class 2: 8% of the mass
        ("bf16acc", 128, Outcome.WRONG_RESULT, "[bfloat16[64x"),  # class 3: at 8N (or 2N)
        # 256 threads: 0.8% off at 8N, inside suite 2's relative-L2 limit (accepted on the H200),
        # ~5x what rounding to bf16 costs (suite 3 bounds it at 2x)
        ("bf16acc", 256, Outcome.WRONG_RESULT, "rounding the reference to bfloat16"),
        ("oob", 128, Outcome.OK, ""),  # class 4: values right (or a fault past a 2 MiB page)
        ("counter", 128, Outcome.OK, ""),  # honest for its first 100 calls; measure below
    ],
)
def test_each_cheat_gets_its_outcome_in_verify(session, bad, threads, outcome, where):
    params, binary = build(bad, session.fingerprint.cc, threads)
    r = session.verify(OP, params, P, binary)
    print(f"{bad}/{threads}: {r.outcome} {r.detail}")
    if bad == "oob" and r.outcome is Outcome.ILLEGAL_ADDRESS:
        return  # x ended on an unmapped page: rejected all the same
    assert r.outcome is outcome, r.detail
    assert where in r.detail, r.detail
    if bad == "none":
        assert r.cases == 1 + 2 + 3 + 3 and r.max_rel_err < 0.01


def test_the_honest_kernel_passes_at_every_size_class(session):
    params, binary = build("none", session.fingerprint.cc, 256)
    for shape in [(64, 32768), (64, 8193), (1, 1 << 20)]:
        r = session.verify(OP, params, P.with_shape(shape), binary)
        assert r.outcome is Outcome.OK, (shape, r.detail)


def test_a_kernel_counting_its_calls_is_stateful_when_timed(session):
    """Verification makes ~20 calls; the timing loop hundreds: the judged timed calls catch it."""
    params, binary = build("counter", session.fingerprint.cc, 256)
    assert session.verify(OP, params, P, binary).outcome is Outcome.OK
    m = session.measure(OP, params, P, binary)
    assert m.outcome is Outcome.STATEFUL, m
    assert "unwritten after a timed call" in m.detail, m.detail


def test_the_skip_kernel_times_as_the_honest_one(session):
    """Fresh poison before every timed call: skipping buys nothing (it won by 6% before). Timed in
    one window with the honest kernel, alternating."""
    big = P.with_shape((4096, 4096))
    params, binary = build("skip", session.fingerprint.cc)
    skip = session.measure(OP, params, big, binary, incumbent=build("none", session.fingerprint.cc))
    print(f"skip beside none: {skip}")
    assert skip.outcome is Outcome.OK, skip
    # the cheat won by 6% (every 16th row skipped); with fresh poison it skips nothing
    assert skip.p50_ms > 0.96 * skip.incumbent_p50_ms, skip


@pytest.mark.skipif(memcheck.find() is None, reason=memcheck.NOT_FOUND)
def test_memcheck_reports_the_masked_read_past_the_end(session):
    params, binary = build("oob", session.fingerprint.cc)
    verdict = session.verify(OP, params, ODD, binary)
    print(f"oob verify: {verdict}")
    assert verdict.outcome in (Outcome.OK, Outcome.ILLEGAL_ADDRESS), verdict  # values are right
    t0 = time.perf_counter()
    outcome, detail = session.memcheck(OP, params, ODD, binary)
    print(f"oob memcheck ({time.perf_counter() - t0:.1f} s): {outcome} {detail}")
    assert outcome is Outcome.MEMCHECK, detail
    assert "Invalid __global__ read" in detail, detail
    # the honest kernel's clean run: the build test below (its winner, "memcheck: 1 of 1 ... clean")


def test_a_build_of_the_planted_op_rejects_every_cheat_and_picks_the_honest_kernel(
    tmp_path, monkeypatch
):
    """`ptxbuild build` over all 12 configs (6 kernels x 2 thread counts) on this GPU: every cheat is
    an attempt with its outcome, the winner is honest, and the report says what memcheck did."""
    import json
    import shutil

    from click.testing import CliRunner

    from ptxbuild import cli
    from ptxbuild.declare.kernelfile import load
    from ptxbuild.gpu import fingerprint
    from ptxbuild.store.cache import Cache

    if "H200" not in fingerprint.read(0).name:
        pytest.skip("the kernelfile declares an h200")
    shutil.copytree(OP, tmp_path / "ops" / "planted_softmax")
    (tmp_path / "kernelfile.toml").write_text(
        '[project]\nname = "planted"\n\n[gpus.h200]\n\n[ops.planted_softmax]\n'
        'template = "planted_softmax"\ndtypes = ["bfloat16"]\nshapes = [[256, 4096]]\n'
        'gpus = ["h200"]\nsearch = { strategy = "exhaustive", budget = 12, seconds = 900 }\n'
    )
    monkeypatch.chdir(tmp_path)
    t0 = time.perf_counter()
    res = CliRunner().invoke(cli.main, ["build", "planted_softmax@h200"])
    print(f"build ({time.perf_counter() - t0:.1f} s), exit {res.exit_code}:\n{res.output}")
    assert res.exit_code == 0, (res.output, res.exception)
    kf = load(tmp_path / "kernelfile.toml")
    outcomes = {}
    for a in Cache(kf.cache_path).attempts():
        params = json.loads(a["params"]) if isinstance(a["params"], str) else a["params"]
        outcomes.setdefault(params["BAD"], set()).add(a["outcome"])
        print(f"attempt {params} {a['outcome']}: {(a['detail'] or '')[:300]}")
    assert outcomes["none"] == {"ok"}, outcomes
    assert outcomes["skip"] == {"stateful"} and outcomes["zeros"] == {"wrong_result"}, outcomes
    assert outcomes["bf16acc"] == {"wrong_result"}, outcomes
    # counter: verified, then caught while timed (unless the other thread count's verification
    # already pushed the module's count past 100: then verification catches it as stateful)
    assert outcomes["counter"] <= {"stateful", "unwritten"} and outcomes["counter"], outcomes
    lock = json.loads((tmp_path / "kernelfile.lock").read_text())
    (entry,) = lock["targets"]["planted_softmax@h200"]["dispatch"]
    print(f"winner: {entry['params']}")
    assert entry["params"]["BAD"] == "none", entry
    report = (tmp_path / "reports/planted_softmax@h200/report.md").read_text()
    print("report memcheck line:", [x for x in report.splitlines() if "memcheck" in x])
    if memcheck.find() is None:
        assert memcheck.NOT_FOUND in report
    else:
        assert "memcheck: 1 of 1 winners clean" in report or "memcheck: clean" in report, report
    # oob verifies (ok) or faults; if it won the playoff, memcheck rejected it and none won
    assert outcomes["oob"] <= {"ok", "memcheck", "illegal_address"}, outcomes
