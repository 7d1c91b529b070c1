"""CPU tests of the GPU stages: outcome classification, timing protocol, fingerprints, worker restarts."""

import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ptxbuild import coverage
from ptxbuild.contract import ModuleOp
from ptxbuild.dtypes import from_float, to_float
from ptxbuild.gpu import GpuError, GpuSession, check, errors, stats
from ptxbuild.gpu.fingerprint import (
    Fingerprint,
    cc_of,
    from_props,
    match_gpu,
    model_of,
)
from ptxbuild.gpu.worker import decode_binary, decode_problem, encode_binary, encode_problem
from ptxbuild.outcome import Outcome
from ptxbuild.problem import Binary, Problem

xp = np
TOL = lambda name: (1e-5, 1e-5)  # noqa: E731


def run(out, ref=None, inputs=None, before=None, again=None, dtype="float32", tol=TOL, scale=None):
    inputs = inputs if inputs is not None else {"x": np.arange(4, dtype=np.float32)}
    before = before if before is not None else {k: v.copy() for k, v in inputs.items()}
    ref = ref if ref is not None else {"y": np.full(out["y"].shape, 2.0)}
    return check.judge(dtype, inputs, before, out, ref, tol, xp, again, scale=scale)


NO_L2 = lambda name, kind: (1.0, float("inf"))  # noqa: E731 - the band alone (scale criterion off)


# --- poison and classification -------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_poison_is_nan_in_every_float_dtype(dtype):
    a = np.zeros((3, 5), dtype=dtype)
    check.poison(a, xp)
    assert np.isnan(a).all()
    assert check.unwritten(a, xp) == (15, (0, 0))


def test_poison_is_nan_in_bf16():
    a = np.zeros(7, dtype=np.uint16)
    check.poison(a, xp)
    assert np.isnan(to_float(a, "bfloat16", xp)).all()


def test_unwritten_rows_are_found_with_their_index():
    y = np.full((6, 8), 2.0, dtype=np.float32)
    check.poison(y[3], xp)
    outcome, detail, _, _ = run({"y": y})
    assert outcome is Outcome.UNWRITTEN
    assert "8 of 48" in detail and "(3, 0)" in detail


def test_a_kernel_written_nan_is_wrong_not_unwritten():
    y = np.full((2, 4), 2.0, dtype=np.float32)
    y[1, 2] = np.nan  # a canonical NaN, not the poison
    outcome, detail, _, _ = run({"y": y}, tol=lambda n: (1e30, 1e30))
    assert outcome is Outcome.WRONG_RESULT and "(1, 2)" in detail


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_non_finite_never_passes_whatever_the_tolerance(bad):
    y = np.full(16, 2.0, dtype=np.float32)
    y[5] = bad
    outcome, detail, _, _ = run({"y": y}, tol=lambda n: (np.inf, np.inf))
    assert outcome is Outcome.WRONG_RESULT and "(5,)" in detail and "1 of 16" in detail


def test_tolerance_boundary_and_worst_index():
    ref = {"y": np.array([1.0, 100.0, -4.0, 8.0])}
    atol, rtol = 0.5, 0.01
    y = np.array([1.5, 101.0, -4.0, 8.0], dtype=np.float64)  # exactly on the bound: passes
    assert run({"y": y}, ref, tol=lambda n: (atol, rtol), scale=NO_L2)[0] is Outcome.OK
    # ... the band, not the scale criterion (relative L1 0.0133 here, over the floor 1e-4)
    assert (
        "relative L1 0.0133 of the whole output"
        in run({"y": y}, ref, tol=lambda n: (atol, rtol))[1]
    )
    y = np.array([1.5, 101.0, -4.6, 9.0], dtype=np.float64)
    outcome, detail, max_abs, _ = run({"y": y}, ref, tol=lambda n: (atol, rtol))
    assert outcome is Outcome.WRONG_RESULT
    assert (
        "2 of 4" in detail
        and "worst at (3,)" in detail
        and "got 9" in detail
        and "want 8" in detail
    )
    assert max_abs == pytest.approx(1.0)


def test_bf16_outputs_compare_through_their_bits():
    ref = np.linspace(-3, 3, 64)
    good = from_float(ref.astype(np.float32), "bfloat16", xp)
    assert (
        run({"y": good}, {"y": ref}, dtype="bfloat16", tol=lambda n: (1e-2, 8e-3))[0] is Outcome.OK
    )
    bad = good.copy()
    bad[10] += 8  # 8 ulps off
    outcome, detail, _, _ = run(
        {"y": bad}, {"y": ref}, dtype="bfloat16", tol=lambda n: (1e-2, 8e-3)
    )
    assert outcome is Outcome.WRONG_RESULT and "(10,)" in detail


def test_shape_mismatch_is_wrong():
    outcome, detail, _, _ = run({"y": np.full(3, 2.0)}, {"y": np.full(4, 2.0)})
    assert outcome is Outcome.WRONG_RESULT and "shape" in detail


def test_input_modified_is_caught_bit_for_bit_and_comes_first():
    x = np.array([0.0, 1.0, np.nan], dtype=np.float32)
    before = {"x": x.copy()}
    x[0] = -0.0  # equal as floats, not as bits
    y = np.full(3, 2.0, dtype=np.float32)
    check.poison(y, xp)  # also unwritten: input modification is reported first
    outcome, detail, _, _ = run({"y": y}, inputs={"x": x}, before=before)
    assert outcome is Outcome.INPUT_MODIFIED and "input x: 1 of 3" in detail
    # an unchanged NaN input is not a modification
    x2 = np.array([np.nan, 1.0], dtype=np.float32)
    assert check.differs(x2, x2.copy(), xp) == (0, None)


def test_nondeterminism_is_one_flipped_bit_within_tolerance():
    y = np.full((4, 4), 2.0, dtype=np.float32)
    again = y.copy()
    again.view(np.uint32)[2, 1] ^= 1
    outcome, detail, _, _ = run({"y": y}, again={"y": again})
    assert outcome is Outcome.NONDETERMINISTIC and "(2, 1)" in detail
    assert run({"y": y}, again={"y": y.copy()})[0] is Outcome.OK


def test_order_unwritten_before_wrong_before_nondeterministic():
    y = np.full(8, 3.0, dtype=np.float32)  # wrong everywhere
    check.poison(y[7:], xp)  # and one unwritten
    assert run({"y": y})[0] is Outcome.UNWRITTEN
    y = np.full(8, 3.0, dtype=np.float32)
    again = np.full(8, 4.0, dtype=np.float32)
    assert run({"y": y}, again={"y": again})[0] is Outcome.WRONG_RESULT


# --- CUDA errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "msg,outcome,sticky",
    [
        (
            "cudaErrorIllegalAddress: an illegal memory access was encountered",
            Outcome.ILLEGAL_ADDRESS,
            True,
        ),
        (
            "CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered",
            Outcome.ILLEGAL_ADDRESS,
            True,
        ),
        ("cudaErrorMisalignedAddress: misaligned address", Outcome.ILLEGAL_ADDRESS, True),
        ("CUDA_ERROR_LAUNCH_FAILED: unspecified launch failure", Outcome.LAUNCH_ERROR, True),
        (
            "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: too many resources requested for launch",
            Outcome.RESOURCE,
            False,
        ),
        ("CUDA_ERROR_INVALID_VALUE: invalid argument", Outcome.LAUNCH_ERROR, False),
        (
            "CUDA_ERROR_UNSUPPORTED_PTX_VERSION: the provided PTX was compiled with an unsupported toolchain.",
            Outcome.LAUNCH_ERROR,
            False,
        ),
        ("cudaErrorSomethingNew: ???", Outcome.LAUNCH_ERROR, True),
        # cupy's wording, seen on the H200 for a 2^31-element baseline check: not sticky, the call goes on
        (
            "Out of memory allocating 17,179,869,184 bytes (allocated so far: 120,527,519,744 bytes).",
            Outcome.LAUNCH_ERROR,
            False,
        ),
    ],
)
def test_cuda_errors_map_to_outcomes(msg, outcome, sticky):
    assert errors.classify(msg) == (outcome, sticky)


# --- timing protocol -----------------------------------------------------------------------------


def test_quantiles_match_numpy():
    s = list(np.random.RandomState(0).exponential(size=101))
    assert stats.quantiles(s) == pytest.approx(tuple(np.percentile(s, [20, 50, 80])))
    assert stats.quantiles([3.0]) == (3.0, 3.0, 3.0)


def test_floor_and_suspicious():
    floor = stats.floor_ms(4_250_000_000, 4.25)  # 4.25 GB at 4.25 TB/s
    assert floor == pytest.approx(1.0)
    assert stats.judge(0.96, floor) is Outcome.SUSPICIOUS
    assert stats.judge(0.98, floor) is Outcome.OK
    assert stats.judge(0.001, 0.0) is Outcome.OK  # no floor known: never suspicious
    r = stats.summarize([0.5] * 20, floor)
    assert (
        r["outcome"] == "suspicious"
        and r["fraction_of_floor"] == pytest.approx(2.0)
        and "floor" in r["detail"]
    )
    r = stats.summarize([1.25] * 20, floor, [2.0] * 20)
    assert (
        r["outcome"] == "ok"
        and r["fraction_of_floor"] == pytest.approx(0.8)
        and r["incumbent_p50_ms"] == 2.0
    )


def test_sample_count_is_clamped():
    assert stats.sample_count(1.0, 200) == 200
    assert stats.sample_count(0.001, 200) == 1000
    assert stats.sample_count(100.0, 200) == 10


class FakeTimer:
    """Constant kernel times per name; the candidate's time changes to `alone` after `switch` calls."""

    def __init__(self, ms, alone=None, switch=None):
        self.ms, self.alone, self.switch, self.calls = ms, alone, switch, []

    def __call__(self, name, n):
        self.calls.append((name, n))
        k = sum(1 for c in self.calls if c[0] == "candidate")
        late = name == "candidate" and self.switch is not None and k > self.switch
        return [self.alone if late else self.ms[name]] * n


def test_warm_up_by_time_then_budgeted_samples():
    t = FakeTimer({"candidate": 0.5})
    res = stats.run(t, warmup_ms=30, budget_ms=200)
    warm = t.calls[:-1]
    assert [n for _, n in warm] == [1, 1, 2, 4, 8, 16, 32]  # doubling batches up to 30 ms
    assert t.calls[-1] == ("candidate", 400)  # 200 ms budget / 0.5 ms
    assert len(res["candidate"]) == 400 and res["incumbent"] is None and not res["remeasured"]


def test_incumbent_interleaved_in_alternating_order():
    t = FakeTimer({"candidate": 1.0, "incumbent": 1.0})
    res = stats.run(t, incumbent=True, warmup_ms=30, budget_ms=200)
    assert [c[0] for c in t.calls[:12]] == ["candidate"] * 6 + ["incumbent"] * 6  # each warmed up
    timed = [c[0] for c in t.calls[12:]]
    assert timed == ["candidate", "incumbent", "incumbent", "candidate"] * 5
    assert len(res["candidate"]) == len(res["incumbent"]) == 100 and not res["remeasured"]


def test_large_win_is_remeasured_alone_and_the_slower_kept():
    # 6 warm-up + 10 interleaved candidate calls; the 17th is the re-measure alone
    t = FakeTimer({"candidate": 1.0, "incumbent": 2.0}, alone=1.6, switch=16)
    res = stats.run(t, incumbent=True, warmup_ms=30, budget_ms=200)
    assert t.calls[-1] == ("candidate", 100) and len(t.calls) == 6 + 5 + 20 + 1
    assert res["remeasured"] and stats.quantile(res["candidate"], 0.5) == 1.6
    t = FakeTimer({"candidate": 1.0, "incumbent": 2.0}, alone=0.7, switch=16)
    res = stats.run(t, incumbent=True, warmup_ms=30, budget_ms=200)
    assert res["remeasured"] and stats.quantile(res["candidate"], 0.5) == 1.0


def test_a_baseline_beside_the_winner_is_not_guarded_against_a_large_win():
    """The re-measure rule protects the incumbent from a fluke candidate; with the baseline as the
    candidate and the winner as incumbent it would keep the baseline's slower timing: off."""
    t = FakeTimer({"candidate": 1.0, "incumbent": 2.0}, alone=1.6, switch=16)
    res = stats.run(t, incumbent=True, warmup_ms=30, budget_ms=200, guard=False)
    assert (
        not res["remeasured"]
        and stats.quantile(res["candidate"], 0.5) == 1.0
        and len(t.calls) == 6 + 5 + 20
    )


def test_round_ratios_pair_each_rounds_samples_and_need_equal_rounds():
    assert stats.round_ratios([1, 1, 3, 3], [1, 1, 1, 1], 2) == [1.0, 3.0]
    assert stats.round_ratios([2, 2, 2, 2], [1, 1], 2) == [2.0, 2.0]
    assert stats.round_ratios([1, 1, 3], [1, 1, 1, 1], 2) == []  # not `rounds` equal chunks
    assert stats.round_ratios([1, 1], None, 2) == [] and stats.round_ratios([1, 1], [1, 1], 0) == []
    assert stats.summarize([1.0] * 4, 0.0, [2.0] * 4, rounds=2)["round_ratios"] == [0.5, 0.5]
    assert (
        stats.summarize([1.0] * 4, 0.0, [2.0] * 4)["round_ratios"] == []
    )  # a search timing: not asked


def test_small_win_is_not_remeasured():
    t = FakeTimer({"candidate": 1.0, "incumbent": 1.05}, alone=5.0, switch=16)
    res = stats.run(t, incumbent=True, warmup_ms=30, budget_ms=200)
    assert (
        not res["remeasured"]
        and stats.quantile(res["candidate"], 0.5) == 1.0
        and len(t.calls) == 6 + 6 + 20
    )


# --- fingerprint ---------------------------------------------------------------------------------

PROPS = {
    "name": b"NVIDIA H200",
    "major": 9,
    "minor": 0,
    "multiProcessorCount": 132,
    "totalGlobalMem": 150_109_863_936,
    "l2CacheSize": 52_428_800,
}


def fp(name, cc="sm_90", sms=132, mem=150_109_863_936, clocks=(1980, 3201), driver="580.95.05"):
    return Fingerprint(name, cc, sms, mem, 50 << 20, clocks[0], clocks[1], driver, "13.0", "13.0")


def test_fingerprint_from_runtime_and_nvidia_smi():
    f = from_props(PROPS, 13000, 13000, "NVIDIA H200, 1980 MHz, 3201 MHz, 580.95.05")
    assert (f.name, f.cc, f.sm_count, f.l2_bytes) == ("NVIDIA H200", "sm_90", 132, 52_428_800)
    assert (f.sm_clock_mhz, f.mem_clock_mhz, f.driver, f.cuda_driver, f.cuda_runtime) == (
        1980,
        3201,
        "580.95.05",
        "13.0",
        "13.0",
    )
    g = from_props(
        {**PROPS, "clockRate": 1_755_000}, 12080, 12060, None
    )  # no nvidia-smi, CUDA 12 runtime
    assert (g.sm_clock_mhz, g.mem_clock_mhz, g.driver, g.cuda_runtime) == (1755, 0, "12.8", "12.6")


@pytest.mark.parametrize(
    "name,model",
    [
        ("NVIDIA H200", "h200"),
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H100 PCIe", "h100"),
        ("NVIDIA GH200 480GB", "gh200"),
        ("NVIDIA B200", "b200"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA GeForce RTX 4090", "rtx4090"),
        ("h100-sxm", "h100"),
    ],
)
def test_model_of(name, model):
    assert model_of(name) == model


def test_match_gpu_levels():
    assert match_gpu(fp("NVIDIA H200"), "h200", {"arch": "sm_90a"}) == "model"
    assert match_gpu(fp("NVIDIA H100 80GB HBM3"), "h100", {"arch": "sm_90a"}) == "model"
    assert match_gpu(fp("NVIDIA H100 PCIe", sms=114), "h100", {"arch": "sm_90a"}) == "model"
    assert match_gpu(fp("NVIDIA GH200 480GB"), "h200", {"arch": "sm_90a"}) == "arch"
    assert match_gpu(fp("NVIDIA GH200 480GB"), "gh200", {"arch": "sm_90a"}) == "model"
    assert match_gpu(fp("NVIDIA H200"), "h100", {"arch": "sm_90a"}) == "arch"
    b200 = fp("NVIDIA B200", cc="sm_100", sms=148)
    assert match_gpu(b200, "b200", {"arch": "sm_100a"}) == "model"
    assert match_gpu(b200, "h200", {"arch": "sm_90a"}) is None
    assert match_gpu(fp("NVIDIA H200"), "b200", {"arch": "sm_100a"}) is None
    assert (
        match_gpu(fp("NVIDIA H200"), "hopper-box", {"arch": "sm_90a", "models": ["H200"]})
        == "model"
    )
    assert (
        match_gpu(fp("NVIDIA H200"), "h200", {"arch": "sm_90a", "sm_count": 132, "memory_gb": 140})
        == "exact"
    )
    assert match_gpu(fp("NVIDIA H200"), "h200", {"arch": "sm_90a", "sm_count": 114}) == "model"
    assert (
        cc_of("sm_100a") == "sm_100"
        and cc_of("sm_90") == "sm_90"
        and cc_of("compute_120f") == "sm_120"
    )


# --- wire format and the worker process ----------------------------------------------------------

BIN = Binary("sm_90a", "planted", ".entry planted(", b"\x7fELF\x00\xff" * 10, 12, 0, 0, 0)
P = Problem.make("planted_op", "float32", (512, 1024), {"residual": True})


def test_wire_round_trip():
    import json

    assert decode_problem(json.loads(json.dumps(encode_problem(P)))) == P
    d = decode_binary(json.loads(json.dumps(encode_binary(BIN))))
    assert d["cubin"] == BIN.cubin and d["digest"] == BIN.digest and d["entry"] == "planted"


FAKE = [sys.executable, str(Path(__file__).with_name("fake_worker.py"))]


@pytest.fixture
def session():
    s = GpuSession(argv=FAKE, timeout_s=3.0, startup_timeout_s=60.0)
    yield s
    s.close()


def verify(s, mode):
    return s.verify("tests/planted_op", {"mode": mode}, P, BIN)


def test_session_reads_fingerprint_and_bandwidth(session):
    assert session.fingerprint.model == "h200" and session.copy_tbps == 4.25
    r = verify(session, "ok")
    assert (
        r.outcome is Outcome.OK
        and r.cases == 4
        and r.tolerances == {"y": [1e-6, 1e-6]}
        and r.seconds > 0
    )
    m = session.measure("tests/planted_op", {"ms": 0.5}, P, BIN)
    assert (
        m.outcome is Outcome.SUSPICIOUS
        and m.floor_ms == pytest.approx(1.0)
        and m.fingerprint == session.fingerprint
    )
    assert session.measure(
        "tests/planted_op", {"ms": 1.25}, P, BIN
    ).fraction_of_floor == pytest.approx(0.8)


def test_crashes_and_hangs_become_outcomes_and_the_session_goes_on(session):
    pid = verify(session, "ok").detail
    assert verify(session, "crash").outcome is Outcome.WORKER_CRASH
    again = verify(session, "ok")
    assert again.outcome is Outcome.OK and again.detail != pid and session.restarts == 1
    t0 = time.monotonic()
    hang = verify(session, "hang")
    assert hang.outcome is Outcome.TIMEOUT and "3 s" in hang.detail and time.monotonic() - t0 < 30
    assert verify(session, "ok").outcome is Outcome.OK and session.restarts == 2
    illegal = verify(session, "illegal")
    assert illegal.outcome is Outcome.ILLEGAL_ADDRESS and "illegal memory access" in illegal.detail
    assert verify(session, "ok").outcome is Outcome.OK and session.restarts == 3
    assert verify(session, "crash_illegal").outcome is Outcome.ILLEGAL_ADDRESS
    pid = verify(session, "ok").detail
    assert verify(session, "resources").outcome is Outcome.RESOURCE  # not sticky: same worker
    assert verify(session, "ok").detail == pid and session.restarts == 4
    # a launch shape that cannot be resident (a cluster of 16 too large for any GPC) is the
    # candidate's failure, stored as data; it once stopped a whole build ("verify failed in the GPU worker")
    too_big = verify(session, "not_resident")
    assert too_big.outcome is Outcome.RESOURCE and "can be resident" in too_big.detail
    assert verify(session, "ok").detail == pid and session.restarts == 4
    with pytest.raises(GpuError, match="reference raised"):
        verify(session, "bug")  # the tool failing is an exception
    assert verify(session, "ok").detail == pid


def test_a_worker_that_cannot_start_is_a_tool_error():
    with pytest.raises(GpuError, match="did not start"):
        GpuSession(
            argv=[sys.executable, "-c", "import sys; sys.exit(7)"],
            timeout_s=3.0,
            startup_timeout_s=10.0,
        )


def test_closing_a_worker_still_busy_with_a_stopped_call_does_not_wait_for_it():
    """Ctrl-C during a baseline's minute of autotune: the build saved its work, then waited 10 s for
    the busy worker to read "exit", and `timeout -s INT -k 10` killed it first (run 31b, rc 137)."""
    from ptxbuild.gpu.process import Child

    child = Child([sys.executable, "-c", "import time; time.sleep(60)"])  # never reads its stdin
    child.start()
    t0 = time.monotonic()
    child.close()
    assert time.monotonic() - t0 < 5 and child.proc is None


def test_planted_op_honours_the_contract_on_cpu():
    from ptxbuild.oploader import load_op

    op = load_op(str(Path(__file__).with_name("planted_op")), Path("."))
    p = Problem.make("planted_op", "float32", (4, 4095))
    ins = op.make_inputs(p, 1, np)
    ref = op.reference(p, ins, np)
    outs = op.make_outputs(p, np)
    outs["y"][...] = ref["y"]
    assert run(outs, ref, inputs=ins, tol=lambda n: op.tolerance(p, n))[0] is Outcome.OK
    assert op.bytes_moved(p) == 2 * 4 * 4095 * 4 and op.launch(
        op.default_params(p), p, 132
    ).grid == (4, 1, 1)
    assert any(q.shape[1] % 8 for q in op.verify_problems(p))


@pytest.mark.compile
def test_planted_kernels_compile():
    pytest.importorskip("cuda.bindings.nvjitlink")
    from ptxbuild.compile.compiler import compile_kernel
    from ptxbuild.oploader import load_op

    op = load_op(str(Path(__file__).with_name("planted_op")), Path("."))
    for bad in op.BADS:
        b = compile_kernel(op.render({"BAD": bad, "THREADS": 256}, P, "sm_90a"), "sm_90a")
        assert b.cubin and b.spill_bytes == 0


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_chunked_compare_matches_whole_array_compare(monkeypatch, dtype):
    """Outputs past CHUNK elements are compared slice by slice; counts, maxima and the worst element
    (as an index of the full shape) must be those of one whole-array compare."""
    rng = np.random.default_rng(7)
    want = rng.standard_normal((37, 53))
    got = want.astype(np.float32).copy()
    got[3, 5] += 0.5
    got[30, 50] += 2.0  # the worst element, in a late chunk
    got[11, 0] = np.nan  # NaN where the reference is finite: always bad, reported worst
    out = from_float(got, "bfloat16", np) if dtype == "bfloat16" else got
    whole = check.compare(out, want, dtype, 1e-2, 1e-2, np)
    monkeypatch.setattr(check, "CHUNK", 64)
    parts = check.compare(out, want, dtype, 1e-2, 1e-2, np)
    assert parts["bad"] == whole["bad"] >= 3
    assert parts["worst"] == whole["worst"] == (11, 0)
    assert parts["max_rel"] == pytest.approx(whole["max_rel"])
    assert parts["max_abs"] == whole["max_abs"] == float("inf")
    got[11, 0] = want[11, 0]
    out = from_float(got, "bfloat16", np) if dtype == "bfloat16" else got
    monkeypatch.setattr(check, "CHUNK", 1 << 26)
    whole = check.compare(out, want, dtype, 1e-2, 1e-2, np)
    monkeypatch.setattr(check, "CHUNK", 64)
    parts = check.compare(out, want, dtype, 1e-2, 1e-2, np)
    assert parts["worst"] == whole["worst"] == (30, 50)
    assert (parts["got"], parts["want"]) == (whole["got"], whole["want"])
    assert parts["max_abs"] == pytest.approx(whole["max_abs"]) and parts["max_abs"] > 1.9


def _bare_gpu():
    """A runs.Gpu with no device: numpy arrays, no stream, no synchronisation."""
    from ptxbuild.gpu import runs

    g = object.__new__(runs.Gpu)
    g.cp, g._pool, g._pool_key = np, [], None
    g.stream = __import__("contextlib").nullcontext()
    g.sync = g.release = lambda: None
    return g


def _run_baselines(monkeypatch, g, fns: dict, winner=None, run=None, summarize=None) -> dict:
    """g.baselines() of a fake op whose baselines are `fns`, timing and summaries stubbed out."""
    from types import SimpleNamespace

    from ptxbuild.gpu import runs

    op = ModuleOp(
        SimpleNamespace(
            baselines=lambda p: fns,
            make_inputs=lambda p, seed, xp: {"x": np.ones(4, dtype=np.float32)},
            reference=lambda p, ins, xp: {"y": np.full(4, 2.0)},
            tolerance=lambda p, name: (1e-3, 1e-3),
            bytes_moved=lambda p: 16,
        )
    )
    monkeypatch.setattr(runs, "load_op", lambda folder, root: op)
    monkeypatch.setattr(
        runs.stats, "run", run or (lambda timer, **k: {"candidate": [1.0] * 5, "incumbent": None})
    )
    monkeypatch.setattr(
        runs.stats,
        "summarize",
        summarize or (lambda samples, floor, incumbent=None, rounds=0: {"outcome": "ok"}),
    )
    return g.baselines("ops/x", ".", SimpleNamespace(dtype="float32"), winner=winner)


def test_a_baseline_the_op_cannot_run_here_is_reported_with_its_reason(monkeypatch):
    """op.baselines may name a baseline with the reason it is not run (FlashKDA not built): recorded
    as invalid with that detail, nothing called; the others are checked and timed as before."""
    called, g = [], _bare_gpu()
    g.pool = lambda op, problem: [({"x": np.ones(4, dtype=np.float32)}, {})]
    res = _run_baselines(
        monkeypatch,
        g,
        {
            "absent": "FlashKDA: not built on this machine",
            "eager": lambda ins: called.append(1) or {"y": np.full(4, 2.0)},
        },
    )
    assert res == {
        "absent": {"outcome": "invalid", "detail": "FlashKDA: not built on this machine"},
        "eager": {"outcome": "ok"},
    }
    assert called == [1]


def test_a_baseline_with_its_own_compare_is_judged_by_it_not_by_the_ops_tolerance(monkeypatch):
    """FlashKDA misses the KDA op's accuracy gate by design (a bf16 state); it brings its own verdict,
    which decides alone: 2.5 against 2.0 passes it, and a verdict that fails is a wrong result."""
    seen = []

    def loose(ins):
        return {"y": np.full(4, 2.5)}

    loose.compare = lambda name, got, want: seen.append(name) or (True, "close enough")

    def strict(ins):
        return {"y": np.full(4, 2.0)}

    strict.compare = lambda name, got, want: (False, "relative RMS 1 (gate 0.02)")
    g = _bare_gpu()
    g.pool = lambda op, problem: [({"x": np.ones(4, dtype=np.float32)}, {})]
    res = _run_baselines(
        monkeypatch, g, {"loose": loose, "strict": strict, "plain": lambda ins: loose(ins)}
    )
    assert res["loose"] == {"outcome": "ok"} and seen == ["y"]
    assert res["strict"]["outcome"] == "wrong_result"
    assert res["strict"]["detail"] == "output y: relative RMS 1 (gate 0.02)"
    assert res["plain"]["outcome"] == "wrong_result"  # no compare of its own: the op's tolerance


def test_each_baseline_is_timed_in_one_window_with_the_winner(monkeypatch):
    """With the build's winner, a baseline's timer runs both (the winner on the same input sets),
    alternating, without the re-measure guard; the winner's p50 there comes back beside it."""
    g, seen, calls, summarize = _bare_gpu(), {}, [], stats.summarize
    g.pool = lambda op, problem: [({"x": np.ones(4, dtype=np.float32)}, {})] * 3
    g._runner = lambda op, params, problem, binary, pool: (
        ("winner", params, binary, len(pool)),
        len(pool),
    )
    g._timer = lambda runners: seen.setdefault("runners", runners)
    res = _run_baselines(
        monkeypatch, g, {"eager": lambda ins: {"y": np.full(4, 2.0)}}, winner=({"t": 1}, "bin")
    )
    assert seen["runners"]["incumbent"] == (("winner", {"t": 1}, "bin", 3), 3) and res == {
        "eager": {"outcome": "ok"}
    }
    res = _run_baselines(
        monkeypatch,
        g,
        {"eager": lambda ins: {"y": np.full(4, 2.0)}},
        winner=({"t": 1}, "bin"),
        run=lambda timer, **k: (
            calls.append(k) or {"candidate": [2.0] * 20, "incumbent": [1.0] * 10 + [2.0] * 10}
        ),
        summarize=summarize,
    )
    assert calls and calls[0]["incumbent"] is True and calls[0]["guard"] is False
    assert res["eager"]["p50_ms"] == 2.0 and res["eager"]["incumbent_p50_ms"] == 1.5
    assert res["eager"]["round_ratios"] == [2.0] * 5 + [1.0] * 5  # ten rounds of two samples each


def test_every_baseline_check_runs_without_a_big_timing_pool(monkeypatch):
    """A 2^31-element problem's timing pool and a baseline check's float64 reference do not fit
    together (cupy 'Out of memory' on the H200): the pool is dropped before each baseline's check,
    not only the first one's (the first baseline's timing rebuilds it)."""
    from types import SimpleNamespace

    g = _bare_gpu()
    held_during_check = []

    def pool(op, problem):
        if not g._pool:
            g._pool, g._pool_key = [({"x": SimpleNamespace(nbytes=8 << 30)}, {})], "key"
        return g._pool

    g.pool = pool

    def baseline(inputs):
        held_during_check.append(bool(g._pool))
        return {"y": np.full(4, 2.0)}

    res = _run_baselines(monkeypatch, g, {"eager": baseline, "compiled": baseline})
    assert res == {"eager": {"outcome": "ok"}, "compiled": {"outcome": "ok"}}
    assert held_during_check == [False, False]


def test_a_timed_baselines_pool_and_cached_inputs_are_freed_before_the_next_check(monkeypatch):
    """Dropping the pool frees nothing while the loop still holds it (its `pool` variable, the timer)
    or a timed baseline's closure keeps its inputs (rmsnorm's caches torch views of every set it ran
    on): at 2^31 elements that pinned ~40 GB through torch_compile's check."""
    import weakref

    class Big:
        nbytes = 8 << 30

    g = _bare_gpu()
    made, alive_at_check = [], []

    def pool(op, problem):
        if not g._pool:
            g._pool, g._pool_key = [({"x": Big()}, {"y": Big()}) for _ in range(2)], "key"
            made.extend(weakref.ref(a) for s in g._pool for d in s for a in d.values())
        return g._pool

    g.pool = pool
    g._timer = lambda runners: [runners["candidate"][0](i) for i in range(runners["candidate"][1])]

    def make():
        views = {}

        def run(inputs):
            if isinstance(inputs["x"], np.ndarray):  # the check
                alive_at_check.append(sum(r() is not None for r in made))
            views[id(inputs["x"])] = inputs["x"]
            return {"y": np.full(4, 2.0)}

        return run

    res = _run_baselines(monkeypatch, g, {"eager": make(), "compiled": make()})
    assert res == {"eager": {"outcome": "ok"}, "compiled": {"outcome": "ok"}}
    assert alive_at_check == [0, 0]


def test_cupys_pool_is_released_between_a_baselines_reference_and_its_call(monkeypatch):
    """torch cannot allocate from cupy's pool: the reference's freed temporaries must go back to the
    device before the baseline runs (the H200's fp32 2^31-element residual rows: OutOfMemoryError,
    '0 bytes allocated by PyTorch', 136.87 GiB in use)."""
    g = _bare_gpu()
    events = []
    g.release = lambda: events.append("release")
    g.pool = lambda op, problem: [({"x": np.ones(4, dtype=np.float32)}, {})]

    def baseline(inputs):
        events.append("call")
        return {"y": np.full(4, 2.0)}

    _run_baselines(monkeypatch, g, {"eager": baseline})
    first_check = events.index("call")
    assert first_check > 0 and events[first_check - 1] == "release"


def _two_kernel_op(scratch=()):
    """A fake op of two entries: 'stage1' writes the scratch output ws, 'main' writes y from it."""
    from types import SimpleNamespace

    from ptxbuild.problem import Launch

    geoms = {
        "stage1": Launch((3, 1, 1), (64, 1, 1), 0),
        "main": Launch((5, 1, 1), (128, 1, 1), 1024),
    }
    return ModuleOp(
        SimpleNamespace(
            KERNELS=("stage1", "main"),
            SCRATCH=set(scratch),
            launches=lambda params, p, sms: geoms,
            launch=lambda params, p, sms: geoms["main"],
            stage_args=lambda e, params, p, ins, outs: (
                [e, ins["x"], outs["ws"]] + ([outs["y"]] if e == "main" else [])
            ),
            kernel_args=lambda params, p, ins, outs: pytest.fail(
                "a multi-kernel op's calls go through stage_args"
            ),
            make_inputs=lambda p, seed, xp: {"x": np.ones(4, dtype=np.float32)},
            make_outputs=lambda p, xp: {
                "y": np.zeros(4, np.float32),
                "ws": np.zeros(4, np.float32),
            },
            reference=lambda p, ins, xp: {"y": np.full(4, 2.0)},
            tolerance=lambda p, name: (1e-3, 1e-3),
            verify_problems=lambda p: [],
            check=lambda params, p: None,
            bytes_moved=lambda p: 16,
        )
    )


def _launch_recorder(monkeypatch, write_ws=True):
    """device.load / device.launch replaced: loads and launches are recorded; 'main' writes y = 2."""
    from ptxbuild.gpu import runs

    loaded, launched = [], []
    monkeypatch.setattr(
        runs.device, "load", lambda entry, cubin, ptx="": loaded.append((entry, cubin)) or entry
    )

    def launch(kern, geom, args, stream):
        launched.append((kern, tuple(geom.grid), tuple(geom.block), args[0]))
        if kern == "stage1" and write_ws:
            args[2][:] = 1.0
        if kern == "main":
            args[3][:] = 2.0

    monkeypatch.setattr(runs.device, "launch", launch)
    return loaded, launched


def _gpu_with_sms():
    from types import SimpleNamespace

    g = _bare_gpu()
    g.fingerprint, g.kernels = SimpleNamespace(sm_count=132), {}
    return g


def test_a_multi_kernel_op_launches_every_entry_in_order_in_verify(monkeypatch):
    from ptxbuild.gpu import runs

    op = _two_kernel_op(scratch={"ws"})
    monkeypatch.setattr(runs, "load_op", lambda folder, root: op)
    loaded, launched = _launch_recorder(monkeypatch)
    g = _gpu_with_sms()
    binary = {"entry": "main", "digest": "d1", "cubin": b"CUBIN"}
    P = Problem.make("fake", "float32", (4,))
    res = g.verify("ops/x", ".", {}, P, binary, seeds=[1])
    assert res["outcome"] == "ok", res
    # each entry loaded once from the one cubin; each call launches stage1 then main, own geometry and args
    assert sorted(loaded) == [("main", b"CUBIN"), ("stage1", b"CUBIN")]
    assert launched[:2] == [
        ("stage1", (3, 1, 1), (64, 1, 1), "stage1"),
        ("main", (5, 1, 1), (128, 1, 1), "main"),
    ]
    assert [k for k, *_ in launched] == ["stage1", "main"] * 2  # the determinism run too


def test_a_multi_kernel_op_launches_every_entry_in_order_in_measure(monkeypatch):
    op = _two_kernel_op()
    loaded, launched = _launch_recorder(monkeypatch)
    g = _gpu_with_sms()
    pool = [(op.make_inputs(None, i, np), op.make_outputs(None, np)) for i in range(2)]
    run, n, _, _ = g._runner(op, {}, None, {"entry": "main", "digest": "d1", "cubin": b"C"}, pool)
    assert n == 2
    run(1)
    assert [(k, grid) for k, grid, *_ in launched] == [("stage1", (3, 1, 1)), ("main", (5, 1, 1))]
    assert launched[0][3] == "stage1" and pool[1][1]["y"][0] == 2.0  # set 1's buffers, not set 0's


def test_scratch_outputs_are_poisoned_but_never_checked(monkeypatch):
    """A workspace that the first kernel writes only in part is not 'unwritten': the op says it is
    scratch. Without SCRATCH the same run is reported unwritten."""
    from ptxbuild.gpu import runs

    binary = {"entry": "main", "digest": "d2", "cubin": b"C"}
    P = Problem.make("fake", "float32", (4,))
    _launch_recorder(monkeypatch, write_ws=False)
    for scratch, outcome in (({"ws"}, "ok"), ((), "unwritten")):
        op = _two_kernel_op(scratch=scratch)
        monkeypatch.setattr(runs, "load_op", lambda folder, root, op=op: op)
        assert _gpu_with_sms().verify("ops/x", ".", {}, P, binary, seeds=[1])["outcome"] == outcome


def test_a_single_kernel_op_launches_its_one_kernel(monkeypatch):
    from types import SimpleNamespace

    from ptxbuild.problem import Launch

    loaded, launched = _launch_recorder(monkeypatch)
    op = ModuleOp(
        SimpleNamespace(
            launch=lambda params, p, sms: Launch((7, 1, 1), (32, 1, 1), 0),
            kernel_args=lambda params, p, ins, outs: ["k", outs["y"]],
        )
    )
    calls = _gpu_with_sms().launches(
        op, {}, None, {"entry": "k", "digest": "d3", "cubin": b"C"}, {}, {"y": 1}
    )
    assert [(k, tuple(g.grid), a) for k, g, a in calls] == [("k", (7, 1, 1), ["k", 1])]


def test_a_big_problem_that_cannot_shrink_is_verified_on_one_seed(monkeypatch):
    """Above ONE_SEED_ABOVE_BYTES one full-size seed, the other seeds on fewer rows; a problem
    fewer_rows() cannot shrink (here 1-D; KDA's varlen problems) gets no second full-size seed (at
    T=8192, H=96 each costs ~10 s of the worker's 60 s call)."""
    from ptxbuild.gpu import runs

    op = _two_kernel_op(scratch={"ws"})
    monkeypatch.setattr(runs, "load_op", lambda folder, root: op)
    _launch_recorder(monkeypatch)
    P = Problem.make("fake", "float32", (4,))
    binary = {"entry": "main", "digest": "d4", "cubin": b"C"}
    assert _gpu_with_sms().verify("ops/x", ".", {}, P, binary, seeds=[1, 2, 3])["cases"] == 3
    monkeypatch.setattr(runs, "ONE_SEED_ABOVE_BYTES", 0)
    assert _gpu_with_sms().verify("ops/x", ".", {}, P, binary, seeds=[1, 2, 3])["cases"] == 1


def test_problem_options_from_a_kernelfile_list_hash_and_keep_their_key():
    """A kernelfile mode `lengths = [...]` arrives as a list: the verifier keeps problems in a set
    (it crashed with "unhashable type: 'list'" on the H200); key() still encodes a list."""
    from ptxbuild.problem import Problem

    p = Problem.make("kda", "bfloat16", (24, 2), {"lengths": [4, 8, 12]})
    assert p in {p} and p == Problem.make("kda", "bfloat16", (24, 2), {"lengths": (4, 8, 12)})
    assert p.key()["options"] == {"lengths": (4, 8, 12)}
    import json

    assert json.loads(json.dumps(p.key()))["options"]["lengths"] == [4, 8, 12]


def test_the_verifier_runs_only_problems_the_candidate_binary_was_built_for():
    """KDA's initial / final state are compile-time flags: the adversarial cases without them need
    another binary. Run with the main problem's binary they read past a one-element h0 placeholder
    (every candidate "failed" on the H200). They are left to builds of problems with those options."""
    from pathlib import Path

    from ptxbuild.oploader import load_op
    from ptxbuild.problem import Problem

    kda = load_op("ops/kda", Path("."))
    p = Problem.make("kda", "bfloat16", (8192, 4), {})
    params = kda.default_params(p)
    every = kda.verify_problems(p)
    kept = coverage.adversarial(kda, p, params)
    dropped = [q for q in every if q not in kept]
    assert dropped and all(
        not (q.opts.get("initial_state", True) and q.opts.get("final_state", True)) for q in dropped
    )
    assert all(
        kda.render(params, q, "sm_90a").source == kda.render(params, p, "sm_90a").source
        for q in kept
    )
    assert {q.shape[0] for q in kept} >= {16, 17, 37, 97}
    off = Problem.make("kda", "bfloat16", (8192, 4), {"initial_state": False})
    assert any(
        q.shape == (64, 4) and q.opts["initial_state"] is False
        for q in coverage.adversarial(kda, off, params)
    )
    assert coverage.fewer_rows(kda, p, params).shape == (coverage.VERIFY_ROWS, 4)


def test_a_problem_sent_to_the_worker_comes_back_hashable_and_equal():
    """The worker decodes problems from JSON (lists): a varlen KDA problem must hash there too."""
    import json

    from ptxbuild.gpu.session import encode_problem
    from ptxbuild.gpu.worker import decode_problem
    from ptxbuild.problem import Problem

    p = Problem.make("kda", "bfloat16", (24, 2), {"lengths": [4, 8, 12], "initial_state": False})
    q = decode_problem(json.loads(json.dumps(encode_problem(p))))
    assert q == p and hash(q) == hash(p) and q in {p}


def test_protocol_version_is_one_number():
    """The measure key (keys.py) and the protocol (gpu/stats.py) name the same protocol version; the
    verify key (keys.py) and the worker (gpu/runs.py) the same suite version, and the key holds it."""
    from ptxbuild import keys
    from ptxbuild.gpu import runs
    from ptxbuild.gpu import stats as gpu_stats

    assert keys.PROTOCOL_VERSION == gpu_stats.PROTOCOL_VERSION == "4"
    assert keys.SUITE_VERSION == runs.SUITE_VERSION == "3"
    P = Problem.make("x", "float32", (4, 8))
    k = keys.verify_key("b", "1", P, {})
    runs.SUITE_VERSION = keys.SUITE_VERSION = "1"
    try:
        assert keys.verify_key("b", "1", P, {}) != k
    finally:
        runs.SUITE_VERSION = keys.SUITE_VERSION = "3"


class _FakeGate:
    """A gate whose calls time out as scripted: `plan` holds one bool per gate held. Like the real
    gate's device flag, a timeout stays set until reset()."""

    def __init__(self, plan):
        self.plan, self.held, self.released, self._out = list(plan), 0, 0, False

    def reset(self):
        self._out = False

    def hold(self, stream):
        self.held += 1
        self._out = (self.plan.pop(0) if self.plan else False) or self._out

    def release(self):
        self.released += 1

    def timed_out(self):
        return self._out


def _gated_gpu(plan):
    """A bare runs.Gpu whose events report 1 ms (2 ms for a call made without a gate, 3 ms for a
    call started before the host waited for the flush before it)."""
    from types import SimpleNamespace

    g = _bare_gpu()
    g.gate, g.rotation = _FakeGate(plan), 0
    state = {"gated": False, "flushing": False}
    g.flush = lambda: state.update(flushing=True)
    real_hold = g.gate.hold

    def hold(stream):
        state["gated"] = True
        real_hold(stream)

    g.gate.hold = hold

    class Event:
        def record(self, stream=None):
            self.gated, self.flushing = state["gated"], state["flushing"]

    def elapsed(a, b):
        return 3.0 if a.flushing else 1.0 if a.gated else 2.0

    g.cp = SimpleNamespace(cuda=SimpleNamespace(Event=Event, get_elapsed_time=elapsed))
    real_sync = g.sync

    def sync():
        state.update(gated=False, flushing=False)  # ungated until hold(); the flush is done
        real_sync()

    g.sync = sync
    return g


def test_timer_batches_calls_behind_gates_after_one_ungated_call_per_input_set():
    from ptxbuild.gpu.runs import GATE_BATCH

    g = _gated_gpu([])
    calls = []  # (input set, gates held so far)
    timer = g._timer({"c": (lambda i: calls.append((i, g.gate.held)), 3)})
    samples = timer("c", 2 * GATE_BATCH + 5)
    # first: each input set once, before any gate (a first call on a set may wait on the GPU)
    assert calls[:3] == [(0, 0), (1, 0), (2, 0)]
    # {1.0}: every call behind a gate, after the host waited for its flush
    assert len(samples) == len(calls) - 3 == 2 * GATE_BATCH + 5 and set(samples) == {1.0}
    assert [held for _, held in calls[3:]] == list(
        range(1, 2 * GATE_BATCH + 6)
    )  # each call behind its own gate
    assert g.gate.held == g.gate.released == 2 * GATE_BATCH + 5
    assert [i for i, _ in calls[3:7]] == [0, 1, 2, 0]  # the pool still rotates
    assert timer.ungated == set()
    timer("c", 2)
    assert len(calls) == 3 + 2 * GATE_BATCH + 5 + 2  # primed once per runner, not per call


def test_timer_retries_a_timed_out_batch_once_behind_a_new_gate():
    g = _gated_gpu([True])  # one stall (a first call that compiles)
    timer = g._timer({"c": (lambda i: None, 1)})
    samples = timer("c", 5)
    assert samples == [1.0] * 5  # the retry's samples only
    assert g.gate.held == 10 and timer.ungated == set()


def test_timer_drops_the_gate_after_two_timeouts_in_a_row_and_says_so():
    g = _gated_gpu([True] + [False] * 3 + [True])  # the call waits on the GPU from the host:
    # a gate of each 4-call batch times out
    timer = g._timer({"c": (lambda i: None, 1), "d": (lambda i: None, 1)})
    assert timer("c", 4) == [2.0] * 4  # timed again without a gate
    assert timer.ungated == {"c"}
    assert timer("c", 3) == [2.0] * 3 and g.gate.held == 8  # no more gates for "c"
    assert timer("d", 3) == [1.0] * 3 and timer.ungated == {"c"}  # other runners keep theirs
