"""A measured target's problems spread over several GPUs (ctx.lanes: ptxbuild/cluster's local workers
or Ray actors). Each problem is searched, played off, memchecked and timed beside its baselines on
one GPU, in a driver thread per GPU; only the driver writes the cache (the GPUs return results).

Deterministic: a spread problem is seeded by the lessons as they stood when its target began, never
by another problem of the run, and results are merged in problem order, so the lock is the same for
any number of GPUs and any finishing order. Timings meet only in one window on one GPU, or through
the cache's measurements, keyed by the exact GPU fingerprint (lanes_for: a target uses only the GPUs
of one fingerprint)."""

from __future__ import annotations

import contextlib
import queue
import threading
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import replace

from ..gpu.session import GpuError, LaneLost
from ..outcome import Outcome
from ..store.cache import Cache
from .context import Context

CALLS = {"verify", "measure", "baselines", "memcheck"}
# what a Ctrl-C of the whole process group can cause (a worker or sanitizer killed by it): such a
# result waits a moment for the stop, which the main thread sets as it takes the signal
SUSPECT = {
    o.value
    for o in (Outcome.WORKER_CRASH, Outcome.ILLEGAL_ADDRESS, Outcome.TIMEOUT, Outcome.MEMCHECK)
}


def _suspect(r) -> bool:
    rs = list(r.values()) if isinstance(r, dict) else [r[0] if isinstance(r, tuple) else r]
    return any(getattr(getattr(x, "outcome", x), "value", None) in SUSPECT for x in rs)


def lanes_for(ctx: Context, hw: dict | None) -> list:
    """The GPUs of ctx.lanes whose fingerprint is exactly `hw` (the target's); [] when the target is
    not measured here or the build has no lanes (a plain build: one GPU, the sequential path)."""
    return [g for g in ctx.lanes if hw and g.fingerprint.key() == hw]


class Pool:
    """The build's GPUs: a thread takes one for a problem and gives it back after; a GPU lost for
    good (LaneLost) is out of the run. GpuError when none is left."""

    def __init__(self, lanes: list, stop: threading.Event):
        self.free: queue.Queue = queue.Queue()
        for g in lanes:
            self.free.put(g)
        self.n, self.lost, self.stop, self.lock = len(lanes), [], stop, threading.Lock()

    def take(self):
        while True:
            if self.stop.is_set():
                raise KeyboardInterrupt
            with self.lock:
                if len(self.lost) == self.n:
                    raise GpuError(f"all {self.n} GPU(s) of this build are gone: {self.lost[-1]}")
            with contextlib.suppress(queue.Empty):
                return self.free.get(timeout=0.2)

    def lose(self, exc: LaneLost) -> None:
        with self.lock:
            self.lost.append(exc)


class Guard:
    """A GPU as one problem's thread sees it. Once the run is stopping, every call raises
    KeyboardInterrupt before it starts and after it returns, so that a call cut short by the stop
    (its worker killed) is never recorded as the candidate's outcome. A GPU lost for good under a
    call is replaced by the next free one (of the same fingerprint), and the call made there: the
    problem goes on where it was, its timings compared only within one window or by the cache."""

    def __init__(self, pool: Pool, note):
        self.pool, self.note = pool, note
        self.lane = pool.take()

    def _check(self) -> None:
        if self.pool.stop.is_set():
            raise KeyboardInterrupt

    def __getattr__(self, name):
        attr = getattr(self.lane, name)  # AttributeError where the GPU has none (memcheck)
        if name not in CALLS:
            return attr

        def call(*a, **k):
            while True:
                self._check()
                try:
                    r = getattr(self.lane, name)(*a, **k)
                    if _suspect(r) and self.pool.stop.wait(0.5):
                        raise KeyboardInterrupt
                    return r
                except LaneLost as exc:
                    self.lane = None  # gone: not given back
                    self.pool.lose(exc)
                    self.note(f"{exc}; its problem goes on on another GPU")
                    self.lane = self.pool.take()
                finally:
                    self._check()

        return call


def spread(ctx: Context, lanes: list, probs: list, solve, on_stop=lambda: None):
    """solve(ctx', index, problem) for every problem, each on one of `lanes` (ctx'.gpu; ctx'.cache
    a connection of this thread's to the same file): (the results of the problems that finished, in
    problem order; the stop: KeyboardInterrupt, or a GpuError, e.g. every GPU lost; else None).
    `on_stop` cuts other work short (the compile pool)."""
    ctx.stop.clear()
    pool, lock = Pool(lanes, ctx.stop), threading.Lock()

    def note(message: str) -> None:
        with lock:
            ctx.report("note", message=message)

    def task(i, problem):
        gpu, buf, cache = Guard(pool, note), [], Cache(ctx.cache.path)  # SQLite: per thread

        def report(kind: str, **ev) -> None:  # the problem's events, replayed in one piece after it
            buf.append((kind, ev))  # (its lines stay whole)

        try:
            s = solve(replace(ctx, gpu=gpu, cache=cache, report=report), i, problem)
        finally:
            cache.close()
            if gpu.lane is not None:
                pool.free.put(gpu.lane)
        with lock:
            for kind, ev in buf:
                ctx.report(kind, **ev)
        return s

    ex = ThreadPoolExecutor(len(lanes), thread_name_prefix="ptxbuild-gpu")
    futs = [ex.submit(task, i, p) for i, p in enumerate(probs)]
    stop = None
    try:
        pending = set(futs)
        while pending and stop is None:
            done, pending = wait(pending, timeout=0.5, return_when=FIRST_EXCEPTION)
            stop = next((f.exception() for f in done if f.exception() is not None), None)
    except KeyboardInterrupt as exc:
        stop = exc
    if stop is not None:
        _drain(ctx, futs, lanes, on_stop)
    ex.shutdown(wait=True)
    ok = [f.result() for f in futs if f.done() and not f.cancelled() and f.exception() is None]
    return ok, stop


def _drain(ctx: Context, futs: list, lanes: list, on_stop) -> None:
    """Stop every thread: problems not started never start; calls in flight are cut short by
    killing their workers (again while a thread lives: a call may have started a fresh one)."""
    ctx.stop.set()
    for f in futs:
        f.cancel()
    on_stop()
    while not all(f.done() for f in futs):
        for g in lanes:
            getattr(g, "abort", lambda: None)()
        wait(futs, timeout=0.5)
