"""Timing one GPU call the way the build does, for the benchmark scripts (cupy on the current stream)."""
from __future__ import annotations


def event_times_us(cp, fn, flush, reps: int) -> list[float]:
    """`reps` timings of fn() in microseconds, sorted: two warm-up calls, then each call after
    flush.fill(0) (an L2 flush; or flush() when flush is a function) between two CUDA events."""
    do_flush = flush if callable(flush) else (lambda: flush.fill(0))
    fn(), fn()
    times = []
    for _ in range(reps):
        do_flush()
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end) * 1e3)
    return sorted(times)


def quantile(times: list[float], f: float) -> float:
    """The f-quantile (0..1) of sorted timings, by index."""
    return times[min(len(times) - 1, int(f * len(times)))]
