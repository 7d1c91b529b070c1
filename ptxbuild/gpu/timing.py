"""The timing half of the worker's GPU (runs.Gpu inherits it): the pool of input/output sets rotated
through, the timer that takes each call alone (poisoned, flushed, gated), a candidate's runner and the
judging of timed calls' outputs."""

from __future__ import annotations

import math
import secrets

from ..outcome import Outcome
from . import check, device
from .suite import judge_run

POOL_MAX_SETS = 64
GATE_BATCH = 32  # timed calls (each behind its own gate, gate.py) between gate checks
REF_KEEP_BYTES = 2 << 30  # references of timing-pool sets kept for the checks of timed calls


def check_positions(n: int, rng=None) -> set:
    """The calls of a window of n timed calls whose outputs are judged: the first, the last and one
    drawn at random (a kernel cannot know which; secrets by default)."""
    pick = rng.randrange(n) if rng is not None else secrets.randbelow(n) if n else 0
    return {0, n - 1, pick} if n else set()


class TimedWrong(Exception):
    """A timed call's outputs failed the check (measure: the outcome `stateful`)."""


def nbytes(arrays: dict) -> int:
    return sum(int(a.nbytes) for a in arrays.values())


class Timing:
    """Needs of its host: cp, stream, sync(), flush(), release(), gate, rotation, l2_bytes,
    launches(), _pool and _pool_key."""

    def pool(self, op, problem) -> list:
        """Input/output sets to rotate through: more bytes than 2x L2, at most half the free memory."""
        key = (str(op.FOLDER), problem)
        if self._pool_key != key:
            self._pool, self._pool_key, self._pool_ref = [], None, (None, None)
            self.release()
            cp = self.cp

            def make(i: int) -> tuple:
                return op.make_inputs(problem, 1_000_003 + i, cp), op.make_outputs(problem, cp)

            first = make(0)
            size = max(1, nbytes(first[0]) + nbytes(first[1]))
            free, _ = cp.cuda.runtime.memGetInfo()
            n = max(
                1,
                min(POOL_MAX_SETS, math.ceil(2 * self.l2_bytes / size) + 1, int(free // 2 // size)),
            )
            self._pool = [first] + [make(i) for i in range(1, n)]
            # the sets are made on cupy's current stream, which is not ours (a non-blocking stream
            # does not wait for the legacy one): wait for every set before a kernel reads one
            self.sync()
            self._pool_key = key
        return self._pool

    def _timer(self, runners: dict):
        """timer(name, n): n calls of runners[name](pool_index), each timed alone (nvbench's cold measurement,
        verification.md timing rule 1): poison its outputs, flush the L2, wait; gate; events around the
        call; release; wait. A runner is (run, sets) or (run, sets, poison, check): poison(i) fills set i's
        outputs with fresh poison before each call (before the flush, outside the timed window: a kernel
        cannot skip work whose output looks written), and check(0) judges the outputs of the first, the
        last and one random timed call of every timer() call (a window; check_positions), each made on
        set 0, so a kernel that changes what it does after some calls, or on some calls, is caught.
        Each runner is first called once per input set, untimed and ungated. Gates are checked every
        GATE_BATCH calls: a batch with a timeout is timed again; two in a row: timed ungated (timer.ungated)."""
        cp = self.cp
        ungated, primed = set(), set()

        def parts(name):
            r = runners[name]
            return (*r, None, None)[:4]

        def batch(name, n, gated, to_check=()):
            run, sets, poison, verdict = parts(name)
            times = []
            self.sync()
            if gated:
                self.gate.reset()
            for j in range(n):
                judged = verdict is not None and j in to_check
                if judged:
                    i = 0  # a judged call runs on set 0: one reference per pool (kda's cost seconds)
                else:
                    i, self.rotation = self.rotation % sets, self.rotation + 1
                a, b = cp.cuda.Event(), cp.cuda.Event()
                if poison is not None:
                    poison(i)
                self.flush()
                self.sync()
                if gated:
                    self.gate.hold(self.stream)
                try:
                    a.record(self.stream)
                    run(i)
                    b.record(self.stream)
                finally:
                    if gated:
                        self.gate.release()
                self.sync()
                times.append(cp.cuda.get_elapsed_time(a, b))
                if judged:
                    verdict(i)  # after the call's wait, before the next call's poison
            return times

        def timer(name, n):
            run, sets, poison, verdict = parts(name)
            if name not in primed:
                for i in range(sets):
                    if poison is not None:
                        poison(i)
                    run(i)
                self.sync()
                primed.add(name)
                if verdict is not None:
                    verdict(0)  # the untimed first call on set 0: judged in full, its bits kept
            out, checks = [], check_positions(n) if verdict is not None else set()
            while len(out) < n:
                k = min(GATE_BATCH, n - len(out))
                here = {c - len(out) for c in checks if len(out) <= c < len(out) + k}
                times = batch(name, k, name not in ungated, here)
                if name not in ungated and self.gate.timed_out():
                    # once: a host stall (a compiling first call, a GC pause); twice: the call itself waits on the GPU
                    times = batch(name, k, True, here)
                    if self.gate.timed_out():
                        ungated.add(name)
                        times = batch(name, k, False, here)
                out += times
            return out

        timer.ungated = ungated
        return timer

    def _runner(self, op, params, problem, binary, pool):
        """(run, sets, poison, check) of a candidate on the pool (see _timer). The first check(0), after
        the untimed first call of each set, judges set 0's outputs against its reference as verify
        does and keeps their bits; later ones (timed calls) compare the bits with those (one pass,
        cheap beside a judge of a 2^31-element output), or judge again where the op is not
        deterministic. A failure raises TimedWrong."""
        calls = [self.launches(op, params, problem, binary, ins, outs) for ins, outs in pool]
        scratch = op.SCRATCH
        det = op.deterministic(params)
        kept: dict = {}

        def run(i):
            for kern, geom, args in calls[i]:
                device.launch(kern, geom, args, self.stream)

        def poison(i):
            for out in pool[i][1].values():
                check.poison(out, self.cp)

        def verdict(i):
            ins, outs = pool[i]
            got = {k: v for k, v in outs.items() if k not in scratch}
            when = "a timed call" if "first" in kept else "its first call on the timing pool"
            if kept.get("first") is not None:
                for k, v in got.items():
                    at = f"after {when} (set {i}): output {k}"
                    if n := check.unwritten(v, self.cp)[0]:
                        raise TimedWrong(f"unwritten {at}: {n} of {v.size} elements never written")
                    if n := check.differs(v, kept["first"][k], self.cp)[0]:
                        raise TimedWrong(
                            f"differs {at}: {n} of {v.size} elements differ from its first call "
                            "on the same inputs"
                        )
                return
            ref = self.pool_reference(op, pool, problem, i)
            if ref is None:
                return
            outcome, detail, _, _ = judge_run(op, problem, ins, {}, got, ref, self.cp)
            if outcome is not Outcome.OK:
                raise TimedWrong(f"{outcome.value} after {when} (set {i}): {detail}")
            if "first" not in kept:
                kept["first"] = self._snapshot(got) if det else None

        return run, len(pool), poison, verdict

    def _snapshot(self, outputs: dict) -> dict | None:
        """Copies of `outputs` (the judged first call's bits), None if they do not fit in memory."""
        try:
            return {k: v.copy() for k, v in outputs.items()}
        except Exception as exc:  # noqa: BLE001 - only running out of memory is tolerated
            if "OutOfMemory" not in type(exc).__name__:
                raise
            self.release()
            return None

    def pool_reference(self, op, pool: list, problem, i: int):
        """The reference outputs of pool set `i`, kept while they take at most REF_KEEP_BYTES in all
        (else computed for each check); None if one does not fit in memory beside the pool."""
        key, refs = getattr(self, "_pool_ref", (None, None))
        if key != id(pool) or refs is None:
            key, refs = id(pool), {}
            self._pool_ref = (key, refs)
        if i in refs:
            return refs[i]
        try:
            ins = pool[i][0]
            ref = op.reference(problem, {k: v.copy() for k, v in ins.items()}, self.cp)
        except Exception as exc:  # noqa: BLE001 - only running out of memory is tolerated
            if "OutOfMemory" not in type(exc).__name__:
                raise
            self.release()
            self.unchecked = True
            return None
        if sum(nbytes(r) for r in refs.values()) + nbytes(ref) <= REF_KEEP_BYTES:
            refs[i] = ref
        return ref
