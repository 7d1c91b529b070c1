"""CPU tests of the checks issue 27 asked for, each against the cheat it must catch: the worker's real
verify() and timer over numpy emulations of tests/planted_softmax's kernels (tests/fake_softmax.py),
and the pure pieces (the size classes, the poison and check schedule, shape coverage)."""

import random

import pytest

from ptxbuild import coverage
from ptxbuild.gpu import runs, timing
from ptxbuild.outcome import Outcome
from ptxbuild.problem import Problem
from tests import fake_softmax

P = Problem.make("planted_softmax", "bfloat16", (256, 4096))
SMALL = Problem.make("planted_softmax", "bfloat16", (64, 1024))


def verify(monkeypatch, bad, problem=P, threads=128, state=None):
    g, state = fake_softmax.gpu(monkeypatch, bad, threads, state)
    params = {"BAD": bad, "THREADS": threads}
    return g.verify("x", ".", params, problem, fake_softmax.binary(bad), seeds=[11, 12, 13]), state


def test_the_honest_kernel_passes_every_check_and_says_which_shapes(monkeypatch):
    r, state = verify(monkeypatch, "none")
    assert r["outcome"] == "ok", r
    # main + 2 fewer-row seeds (one in dirty buffers) + 3 adversarial + 3 size classes, 2 calls each
    assert r["cases"] == 1 + 2 + 3 + 3 and state["calls"] == 2 * 9 + 1
    assert [64, 32768] in r["shapes"] and [64, 8193] in r["shapes"] and [256, 4096] in r["shapes"]
    # the same shapes, without a GPU, for a build to record what a verdict covered
    planned = coverage.plan_problems(fake_softmax.op(), P, {"BAD": "none", "THREADS": 128})
    assert sorted({p.shape for p in planned}) == [tuple(s) for s in r["shapes"]]


def test_a_kernel_skipping_rows_whose_output_looks_written_is_stateful(monkeypatch):
    """Class 1: right on fresh poison (every case), wrong on a second call in the same buffers."""
    r, _ = verify(monkeypatch, "skip")
    assert r["outcome"] == Outcome.STATEFUL.value, r
    assert "same buffers" in r["detail"] and "seed 13]" in r["detail"], r["detail"]


def test_zeros_below_atol_pass_the_band_and_fail_the_scale_criterion(monkeypatch):
    """Class 2: on the declared problem, within atol + rtol everywhere; 8% of the mass (relative L1)."""
    r, _ = verify(monkeypatch, "zeros")
    assert r["outcome"] == "wrong_result", r
    assert "relative L1" in r["detail"] and "within the band" in r["detail"]
    assert "[bfloat16[256x4096], seed 11]" in r["detail"], r["detail"]


@pytest.mark.parametrize("threads", [128, 256])
def test_bf16_accumulation_passes_at_the_declared_n_and_fails_at_a_size_class(monkeypatch, threads):
    """Class 3: every declared and adversarial shape passes; a size class (64 rows) fails. At 256
    threads (128 bf16 adds a thread at 8N) the rows are 0.8% off, inside suite 2's relative-L2 limit
    2^-6 (accepted on the H200): 2.3-2.8x the bound (2x what rounding to bf16 costs, + the floor).
    At 128 threads 8N fails (4% off; the band itself may see the worst row); 2N is at 0.6-0.9 of
    the bound (1 seed in 300 over it)."""
    r, _ = verify(monkeypatch, "bf16acc", threads=threads)
    assert r["outcome"] == "wrong_result", r
    assert "[bfloat16[64x" in r["detail"], r["detail"]  # (at 128 the band may see 8N's worst row)
    if threads == 256:  # at most 0.57 of the bound at 2N over 40 seeds: 2N cannot see it
        assert "bfloat16[64x32768]" in r["detail"], r["detail"]
        assert "what rounding the reference to bfloat16 costs" in r["detail"], r["detail"]
        monkeypatch.setattr(coverage, "SIZE_FACTORS", (2,))
        assert verify(monkeypatch, "bf16acc", threads=threads)[0]["outcome"] == "ok"


def test_a_masked_read_past_the_end_passes_every_value_check(monkeypatch):
    """Class 4: only memcheck sees it (test_memcheck_*: the sanitizer's report is the outcome)."""
    r, state = verify(monkeypatch, "oob")
    assert r["outcome"] == "ok" and state["read_past_end"]


def measure(monkeypatch, bad, state):
    g, state = fake_softmax.gpu(monkeypatch, bad, 128, state)
    return g.measure("x", ".", {"BAD": bad, "THREADS": 128}, SMALL, fake_softmax.binary(bad))


def test_a_kernel_that_counts_its_calls_verifies_then_is_caught_while_timed(monkeypatch):
    """State in device memory: honest for its first 100 calls (verification makes 19), then it
    leaves rows unwritten: a timed call's outputs are judged, and the measurement is `stateful`."""
    r, state = verify(monkeypatch, "counter", SMALL)
    assert r["outcome"] == "ok" and state["calls"] < 100
    m = measure(monkeypatch, "counter", state)
    assert m["outcome"] == Outcome.STATEFUL.value, m
    assert "unwritten after a timed call" in m["detail"], m["detail"]
    assert measure(monkeypatch, "none", {"calls": 0})["outcome"] == "ok"


def test_outputs_are_poisoned_before_every_call_outside_the_timed_window():
    """The schedule: poison, flush, (gate), events around the call, wait, then the check of chosen
    calls; a runner without poison/check (a baseline) is timed as before."""
    from types import SimpleNamespace

    log = []
    g = object.__new__(runs.Gpu)
    g.rotation = 0
    g.gate = SimpleNamespace(
        reset=lambda: None,
        hold=lambda s: log.append("hold"),
        release=lambda: log.append("release"),
        timed_out=lambda: False,
    )
    g.flush = lambda: log.append("flush")
    g.sync = lambda: log.append("sync")
    g.stream = None

    class Event:
        def record(self, stream=None):
            log.append("event")

    g.cp = SimpleNamespace(cuda=SimpleNamespace(Event=Event, get_elapsed_time=lambda a, b: 1.0))
    runner = (
        lambda i: log.append(f"run{i}"),
        2,
        lambda i: log.append(f"poison{i}"),
        lambda i: log.append(f"check{i}"),
    )
    timer = g._timer({"c": runner, "b": (lambda i: log.append(f"base{i}"), 2)})
    timer("c", 5)
    primed = log[: log.index("sync") + 2]
    # each set once, untimed, on fresh poison; set 0's outputs judged in full then (bits kept)
    assert primed == ["poison0", "run0", "poison1", "run1", "sync", "check0"]
    calls = log[len(primed) + 1 :]  # the batch's first sync, then call by call
    one = ["poison0", "flush", "sync", "hold", "event", "run0", "event", "release", "sync"]
    assert calls[: len(one)] == one and calls[len(one)] == "check0"  # the first call is judged
    assert calls.count("poison0") + calls.count("poison1") == 5 and calls.count("flush") == 5
    assert calls[-1].startswith("check")  # ... and the last
    log.clear()
    timer("b", 3)
    assert not any(e.startswith(("poison", "check")) for e in log)


def test_check_positions_are_first_last_and_one_random():
    assert check_positions_all(1) == {0}
    seen = set()
    for seed in range(50):
        pos = timing.check_positions(40, random.Random(seed))
        assert {0, 39} <= pos and len(pos) <= 3
        seen |= pos
    assert len(seen) > 10  # the third one moves
    assert timing.check_positions(0) == set()


def check_positions_all(n):
    return timing.check_positions(n, random.Random(0))


def test_size_classes_of_a_runtime_n_and_not_of_a_compile_time_one():
    from types import SimpleNamespace

    from ptxbuild.contract import ModuleOp

    o = fake_softmax.op()
    params = {"BAD": "none", "THREADS": 128}
    got = [p.shape for p in coverage.size_classes(o, P, params)]
    assert got == [(64, 8192), (64, 32768), (64, 8193)]
    # an N baked into the source (an exact config): another N needs another binary, none is run
    exact = ModuleOp(
        SimpleNamespace(
            render=lambda prm, p, arch: SimpleNamespace(source=f"#define N {p.shape[1]}"),
            check=lambda prm, p: None,
            bytes_moved=o.bytes_moved,
        )
    )
    assert coverage.size_classes(exact, P, params) == []
    # check() refusing a size drops it; the op may name its own classes (or none)
    picky = ModuleOp(
        SimpleNamespace(
            render=o.render,
            check=lambda prm, p: "N > 9000" if p.shape[1] > 9000 else None,
            bytes_moved=o.bytes_moved,
        )
    )
    assert [p.shape for p in coverage.size_classes(picky, P, params)] == [(64, 8192), (64, 8193)]
    own = ModuleOp(
        SimpleNamespace(
            size_classes=lambda p, prm: [],
            render=o.render,
            check=o.check,
            bytes_moved=o.bytes_moved,
        )
    )
    assert coverage.size_classes(own, P, params) == []
    # and a size that moves more than SIZE_MAX_BYTES (and more than the problem) is not run
    big = Problem.make("planted_softmax", "bfloat16", (8, 1 << 20))
    assert [p.shape for p in coverage.size_classes(o, big, params)] == []


def test_coverage_is_sizes_up_to_the_largest_verified_and_alignments_seen():
    from ptxbuild.coverage import alignment, covers

    assert [alignment(n) for n in (1, 2, 4, 8, 6, 12, 4096, 4095)] == [0, 1, 2, 3, 1, 2, 3, 0]
    verified = [(256, 4096), (1, 4095), (199, 760), (64, 32768), (64, 8193)]
    assert covers(verified, (256, 4096)) and covers(verified, (100, 30000))
    assert covers(verified, (3, 5001))  # odd: 4095 and 8193 were
    assert not covers(verified, (300, 4096))  # more rows than verified
    assert not covers(verified, (8, 65536))  # past 8N: the bf16 accumulator's failure is there
    assert not covers(verified, (8, 4098))  # 2 mod 4: no verified shape had it
    assert not covers(verified, (4096,)) and not covers([], (1, 8))
    # what the worker reports for the honest planted kernel covers its declared shape
    assert covers(
        [(256, 4096), (64, 32768), (64, 8193), (1, 4095), (199, 760), (3, 1000)], (4, 1000)
    )


# --- memcheck: the sanitizer's report is the outcome ---------------------------------------------

SANITIZED = """========= COMPUTE-SANITIZER
@@ptxbuild-memcheck start 0
@@ptxbuild-memcheck done 0
@@ptxbuild-memcheck start 1
@@ptxbuild-memcheck launch 1
========= Invalid __global__ read of size 2 bytes
=========     at planted_softmax+0x2d0
=========     by thread (31,0,0) in block (63,0,0)
=========     Address 0x7f1c2e680000 is out of bounds
=========     and is 1 bytes after the nearest allocation at 0x7f1c2e600000 of size 524,288 bytes
=========
========= Program hit cudaErrorLaunchFailure (error 719) due to "unspecified launch failure"
@@ptxbuild-memcheck fail 1 CUDARuntimeError: cudaErrorLaunchFailure: unspecified launch failure
========= ERROR SUMMARY: 2 errors"""


def test_memcheck_output_names_the_job_and_its_first_report_line():
    from ptxbuild.gpu import memcheck

    got, nxt = memcheck.parse(SANITIZED.splitlines(), 3, 99)
    assert got[0] == {"outcome": "ok", "detail": ""}
    assert got[1]["outcome"] == "memcheck" and nxt == 2
    assert got[1]["detail"].startswith("Invalid __global__ read of size 2 bytes; Address 0x7f1c")
    clean = "========= COMPUTE-SANITIZER\n@@ptxbuild-memcheck start 0\n@@ptxbuild-memcheck done 0\n"
    assert memcheck.parse((clean + "========= ERROR SUMMARY: 0 errors").splitlines(), 1, 0) == (
        {0: {"outcome": "ok", "detail": ""}},
        None,
    )
    # a report before the candidate's launch (while making inputs) is the harness's: not run
    early = "@@ptxbuild-memcheck start 0\n========= Invalid __global__ write of size 4 bytes"
    got, _ = memcheck.parse(early.splitlines(), 1, 99)
    assert got[0]["outcome"] == "not_run" and "Invalid __global__ write" in got[0]["detail"]
    # a worker that dies inside a job without a report: not run (the harness), never a rejection
    died, _ = memcheck.parse(["@@ptxbuild-memcheck start 0"], 1, -9)
    assert died[0]["outcome"] == "not_run" and "exited -9" in died[0]["detail"]


FAKE_SANITIZER = r"""#!/usr/bin/env python3
import json, sys
jobs = json.load(open(sys.argv[-1]))
print("========= COMPUTE-SANITIZER")
for i, job in enumerate(jobs):
    print(f"@@ptxbuild-memcheck start {i}")
    print(f"@@ptxbuild-memcheck launch {i}")
    if job["params"]["BAD"] == "oob":
        print("========= Invalid __global__ read of size 2 bytes")
        print("=========     Address 0x10 is out of bounds")
        print(f"@@ptxbuild-memcheck fail {i} CUDARuntimeError: unspecified launch failure")
        sys.exit(99)
    print(f"@@ptxbuild-memcheck done {i}")
"""


def test_memcheck_goes_on_in_a_fresh_process_after_a_job_broke_its_context(tmp_path):
    from ptxbuild.gpu import memcheck

    fake = tmp_path / "compute-sanitizer"
    fake.write_text(FAKE_SANITIZER)
    fake.chmod(0o755)
    jobs = [{"params": {"BAD": b}} for b in ("none", "oob", "none", "oob")]
    got = memcheck.run(jobs, sanitizer=str(fake), env={})
    assert [r["outcome"] for r in got] == ["ok", "memcheck", "ok", "memcheck"]
    assert (
        got[1]["detail"] == "Invalid __global__ read of size 2 bytes; Address 0x10 is out of bounds"
    )


def test_memcheck_without_the_sanitizer_says_so(monkeypatch):
    from ptxbuild.gpu import memcheck

    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(memcheck.Path, "is_file", lambda self: False)
    assert memcheck.find() is None
    assert memcheck.run([{}]) == [{"outcome": "not_run", "detail": memcheck.NOT_FOUND}]
    assert memcheck.NOT_FOUND == "memcheck: not run (compute-sanitizer not found)"


def test_the_memcheck_problem_is_small_where_the_binary_serves_it():
    from ptxbuild.gpu import memcheck

    o = fake_softmax.op()
    params = {"BAD": "oob", "THREADS": 128}
    assert memcheck.small_problem(o, P, params).shape == (64, 4096)
    assert memcheck.small_problem(o, P.with_shape((7, 4096)), params).shape == (7, 4096)


def test_a_quick_run_may_skip_memcheck_and_the_note_says_so(monkeypatch):
    from ptxbuild.gpu.session import GpuSession

    s = object.__new__(GpuSession)  # no worker: the switch is read before anything starts
    monkeypatch.setenv("PTXBUILD_MEMCHECK", "0")
    assert s.memcheck("x", {}, P, None) == (None, "memcheck: not run (PTXBUILD_MEMCHECK=0)")


def test_the_timing_pool_is_complete_before_any_kernel_reads_it():
    """H200 run 25c: the pool's inputs were generated on cupy's current (legacy) stream while the
    kernels ran on the worker's non-blocking stream, so on 128 MB+ problems an honest kernel read
    half-generated inputs and its first judged call was called `stateful`. pool() waits now."""
    from types import SimpleNamespace

    log = []
    g = object.__new__(runs.Gpu)
    g._pool_key, g._pool, g._pool_ref = None, [], (None, None)
    g.l2_bytes = 100
    g.release = lambda: log.append("release")
    g.sync = lambda: log.append("sync")
    g.cp = SimpleNamespace(
        cuda=SimpleNamespace(runtime=SimpleNamespace(memGetInfo=lambda: (10_000, 10_000)))
    )

    class Arr:
        nbytes = 40

    op = SimpleNamespace(
        FOLDER="op",
        make_inputs=lambda problem, seed, xp: (
            log.append(f"inputs{seed - 1_000_003}") or {"x": Arr()}
        ),
        make_outputs=lambda problem, xp: log.append("outputs") or {"y": Arr()},
    )
    pool = g.pool(op, "problem")
    assert len(pool) == 4  # ceil(2 * 100 / 80) + 1 sets
    made = [e for e in log if e.startswith(("inputs", "outputs"))]
    assert made == [
        "inputs0",
        "outputs",
        "inputs1",
        "outputs",
        "inputs2",
        "outputs",
        "inputs3",
        "outputs",
    ]
    assert log[-1] == "sync" and log.index("sync") > log.index("inputs3")
    log.clear()
    assert g.pool(op, "problem") is pool and log == []  # the same problem reuses the pool
