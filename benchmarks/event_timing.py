"""Timing one GPU call the way the build does, for the benchmark scripts (cupy on the current stream)."""

from __future__ import annotations

SPIN_SRC = r"""
extern "C" __global__ void spin_ns(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}
"""


def spinner(cp, us: float):
    """A function that enqueues a one-thread kernel keeping the GPU busy for `us` microseconds
    (no memory traffic), or None for us <= 0."""
    if us <= 0:
        return None
    kern = cp.RawKernel(SPIN_SRC, "spin_ns")
    return lambda: kern((1,), (1,), (cp.uint64(int(us * 1000)),))


def event_times_us(
    cp, fn, flush, reps: int, batch: int = 1, settle=None, idle=None, cold: bool = False, gate=None
) -> list[float]:
    """`reps` timings of fn() in microseconds, sorted: two warm-up calls, then each call after
    flush.fill(0) (an L2 flush; or flush() when flush is a function) between two CUDA events.
    batch: calls enqueued before the host waits (1: synchronized after every call; the build
    enqueues 32, ptxbuild/gpu/runs.py). settle / idle: optional functions enqueued after the flush
    (before the start event) / before the flush. cold: the host also waits for each flush before
    the call is enqueued (nvbench's cold measurement, the build's timing protocol 3; batch is 1).
    gate: a ptxbuild.gpu.gate.Gate held before the start event and released after the end event,
    so the host's launch time is not counted (without it a cold call counts it: nothing is queued);
    raises if a gate timed out (a call that waits on the GPU from the host cannot be gated)."""
    do_flush = flush if callable(flush) else (lambda: flush.fill(0))
    if gate:
        gate.reset()
    fn(), fn()
    cp.cuda.get_current_stream().synchronize()
    times = []
    while len(times) < reps:
        evs = []
        for _ in range(1 if cold else min(batch, reps - len(times))):
            if idle:
                idle()
            do_flush()
            if cold:
                cp.cuda.get_current_stream().synchronize()
            if settle:
                settle()
            start, end = cp.cuda.Event(), cp.cuda.Event()
            if gate:
                gate.hold(cp.cuda.get_current_stream())
            start.record()
            fn()
            end.record()
            if gate:
                gate.release()
            evs.append((start, end))
        evs[-1][1].synchronize()
        times += [cp.cuda.get_elapsed_time(s, e) * 1e3 for s, e in evs]
    if gate and gate.timed_out():  # a call waited on the GPU from the host: its host time counted
        raise RuntimeError(
            "a gate timed out: this call waits on the GPU from the host; time it without --gate"
        )
    return sorted(times)


def quantile(times: list[float], f: float) -> float:
    """The f-quantile (0..1) of sorted timings, by index."""
    return times[min(len(times) - 1, int(f * len(times)))]
