"""On a GPU: the gate that holds the timing stream until the host has enqueued a batch (gpu/gate.py),
and the worker's timer built on it (gpu/runs.py)."""

import time

import pytest

from ptxbuild.gpu import gpu_available

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not gpu_available(), reason="needs an NVIDIA GPU and cupy (pip install cupy-cuda13x)"
    ),
]


def _timed_pair(cp, stream, gate, host_delay_s):
    """Events around one tiny kernel whose launch the host delays by host_delay_s; ms between them."""
    a, b = cp.cuda.Event(), cp.cuda.Event()
    x = cp.zeros(1024, dtype=cp.float32)
    if gate:
        gate.reset()
        gate.hold(stream)
    a.record(stream)
    time.sleep(host_delay_s)
    with stream:
        x += 1
    b.record(stream)
    if gate:
        gate.release()
    stream.synchronize()
    return cp.cuda.get_elapsed_time(a, b)


def test_gate_hides_the_hosts_delay_between_a_calls_events():
    import cupy as cp

    from ptxbuild.gpu.gate import Gate

    stream = cp.cuda.Stream(non_blocking=True)
    gate = Gate(cp)
    _timed_pair(cp, stream, None, 0.0)  # compile the elementwise kernel first
    assert (
        _timed_pair(cp, stream, None, 0.03) > 25.0
    )  # without a gate: the 30 ms sleep is "kernel time"
    assert _timed_pair(cp, stream, gate, 0.03) < 2.0  # behind a gate: only the GPU's work
    assert not gate.timed_out()


def test_gate_gives_up_instead_of_deadlocking():
    import cupy as cp

    from ptxbuild.gpu.gate import Gate

    stream = cp.cuda.Stream(non_blocking=True)
    gate = Gate(cp, max_wait_s=0.05)
    gate.reset()
    gate.hold(stream)
    t0 = time.perf_counter()
    stream.synchronize()  # never released: the gate must time out
    assert time.perf_counter() - t0 < 5.0
    assert gate.timed_out()


def test_timer_falls_back_to_ungated_for_a_call_that_waits_on_the_gpu():
    """A runner that synchronizes inside its call would wait for the gate that waits for the host:
    the gate times out, the runner is timed without gates and named in timer.ungated."""
    import cupy as cp

    from ptxbuild.gpu.runs import GATE_BATCH, Gpu

    gpu = Gpu()
    x = cp.zeros(1 << 20, dtype=cp.float32)
    x.fill(0)  # cupy compiles its fill kernel now, not behind a gate
    calls = {"n": 0}

    def polite(_i):
        calls["n"] += 1
        if calls["n"] == 3:  # inside the first gated batch (call 1 primes the one input set):
            time.sleep(0.4)  # one host stall longer than the gate waits (a GC pause, a compile)
        with gpu.stream:
            x.fill(1)

    def blocking(_i):
        with gpu.stream:
            x.fill(2)
        gpu.stream.synchronize()

    timer = gpu._timer({"polite": (polite, 1), "blocking": (blocking, 1)})
    samples = timer("polite", GATE_BATCH + 3)
    assert (
        len(samples) == GATE_BATCH + 3 and max(samples) < 100.0
    )  # the stalled batch was timed again
    assert calls["n"] == 1 + GATE_BATCH + GATE_BATCH + 3  # priming, the stalled batch, the rest
    assert timer.ungated == set()  # one stall does not drop the gate
    samples = timer("blocking", 5)
    assert len(samples) == 5 and all(
        s < 100.0 for s in samples
    )  # the retry's samples, not the 250 ms stall
    assert timer.ungated == {"blocking"}
    assert len(timer("polite", 4)) == 4 and "polite" not in timer.ungated
