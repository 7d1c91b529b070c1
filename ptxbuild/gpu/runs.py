"""Inside the worker: verify, time and baseline candidates on one GPU with cupy (via check and stats)."""

from __future__ import annotations

import contextlib
import math
import secrets
import sys
from pathlib import Path

from ..dtypes import storage_dtype
from ..oploader import load_op
from ..outcome import Outcome
from . import check, device, stats
from . import fingerprint as fingerprint_mod
from .gate import Gate

ONE_SEED_ABOVE_BYTES = (
    512 << 20
)  # above this many input bytes, one full-size seed (the others run on fewer rows)
FLUSH_MIN_BYTES = 256 << 20
POOL_MAX_SETS = 64
GATE_BATCH = 32  # timed calls (each behind its own gate, gate.py) between gate checks
UNGATED_NOTE = (
    "timed without the gate after it timed out twice in a row (a call that waits on the GPU "
    "from the host, or more launches than the queue holds), so its host time counts: "
)


def add_detail(result: dict, note: str) -> None:
    """Append `note` to a measurement's detail text ("; " between notes)."""
    result["detail"] = "; ".join(filter(None, [result.get("detail", ""), note]))


def nbytes(arrays: dict) -> int:
    return sum(int(a.nbytes) for a in arrays.values())


def _torch_stream(stream):
    """Make torch launch on our stream while a baseline runs (so our events time its work)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return contextlib.nullcontext()
    return torch.cuda.stream(torch.cuda.ExternalStream(stream.ptr))


def _as_cupy(value, cp):
    if type(value).__module__.startswith("torch") and str(value.dtype) == "torch.bfloat16":
        import torch

        return cp.asarray(value.contiguous().view(torch.int16)).view(cp.uint16)
    return cp.asarray(value)


VERIFY_ROWS = 512  # extra seeds run on this many rows (same binary: rows are a runtime size)
# The test suite the worker runs beside the op's own (op.VERSION): bump when it changes, so verdicts
# taken before are taken again (keys.py has the same). 2: a call on dirty buffers (stateful), larger
# and odd sizes (size_classes), relative L2 beside the band (check.py).
SUITE_VERSION = "2"
SIZE_FACTORS = (2, 8)  # the last axis (a row's length) is also verified at these multiples, and odd
SIZE_ROWS = 64  # ... on at most this many rows
SIZE_MAX_BYTES = 256 << 20  # ... where the op moves at most this many bytes (or the problem's own)


REF_KEEP_BYTES = 2 << 30  # references of timing-pool sets kept for the checks of timed calls


def check_positions(n: int, rng=None) -> set:
    """The calls of a window of n timed calls whose outputs are judged: the first, the last and one
    drawn at random (a kernel cannot know which; secrets by default)."""
    pick = rng.randrange(n) if rng is not None else secrets.randbelow(n) if n else 0
    return {0, n - 1, pick} if n else set()


class TimedWrong(Exception):
    """A timed call's outputs failed the check (measure: the outcome `stateful`)."""


def size_classes(op, problem, params: dict, arch: str = "sm_90a") -> list:
    """Larger and odd sizes of the problem's last axis that the candidate's binary serves (a size that
    is a run-time argument): SIZE_FACTORS x N and 2N+1, on at most SIZE_ROWS rows, where the op's check()
    accepts the config and the op moves at most max(SIZE_MAX_BYTES, the problem's bytes); an op may
    name its own with size_classes(problem, params) -> list[Problem] ([] for none)."""
    hook = getattr(op, "size_classes", None)
    if hook is not None:
        shapes = list(hook(problem, params))
    else:
        *lead, n = problem.shape
        lead = [min(lead[0], SIZE_ROWS), *lead[1:]] if lead else []
        sizes = [f * n for f in SIZE_FACTORS] + [2 * n + 1]
        shapes = [problem.with_shape((*lead, m)) for m in sizes]
    cap = max(SIZE_MAX_BYTES, _bytes(op, problem))

    def fits(p) -> bool:
        try:
            return p != problem and op.check(params, p) is None and _bytes(op, p) <= cap
        except Exception:  # noqa: BLE001 - a shape the op cannot judge is not one to run
            return False

    kept = list(dict.fromkeys(p for p in shapes if fits(p)))
    return same_binary(op, params, problem, kept, arch) if kept else []


def _bytes(op, problem) -> int:
    try:
        return int(op.bytes_moved(problem))
    except Exception:  # noqa: BLE001 - unknown: no cap beyond SIZE_MAX_BYTES
        return 0


def verified_shapes(plan: list) -> list:
    """The shapes a verdict covers (what the runtime may serve: ptxbuild/coverage.py)."""
    return sorted({tuple(p.shape) for p, _ in plan})


def same_binary(op, params: dict, problem, others: list, arch: str) -> list:
    """The problems of `others` that render to the same source as `problem` with `params`: only those can the
    candidate's binary run. Problem options are often compile-time flags (KDA's initial and final state, rmsnorm's
    residual): a binary built without h0 reads past a one-element placeholder: the harness fails, not the candidate."""

    def source(p) -> str | None:
        try:
            return op.render(params, p, arch).source
        except Exception:  # noqa: BLE001 - a problem the op cannot render is not one this binary runs
            return None

    own = source(problem)
    return [p for p in others if own is not None and source(p) == own]


def fewer_rows(op, problem, params: dict, arch: str = "sm_90a"):
    """The problem with at most VERIFY_ROWS rows if the config accepts it and the binary runs it, else the problem."""
    if len(problem.shape) < 2 or problem.shape[0] <= VERIFY_ROWS:
        return problem
    small = problem.with_shape((VERIFY_ROWS, *problem.shape[1:]))
    return (
        small
        if op.check(params, small) is None and same_binary(op, params, problem, [small], arch)
        else problem
    )


def _hidden_options(problem) -> str:
    """The options a label leaves out (False / None / empty), so a failure names the case exactly."""
    hidden = {k: v for k, v in problem.options if v in (False, None, "")}
    return f" {hidden}" if hidden else ""


def custom_compare(op, problem, xp):
    """The op's optional compare(problem, output, got, want, xp) -> (ok, detail) | None, bound to a problem."""
    fn = getattr(op, "compare", None)
    return None if fn is None else (lambda name, got, want: fn(problem, name, got, want, xp))


def scale_limit(op, problem):
    """The op's optional rel_l2_tolerance(problem, output) -> float | None (None: check.REL_L2 of the
    output's stored type), bound to a problem, as check.judge's `scale`."""
    fn = getattr(op, "rel_l2_tolerance", None)
    return None if fn is None else (lambda name, kind: fn(problem, name))


def judge_run(op, prob, inputs, before, first, ref, xp, again=None):
    """check.judge with the op's tolerance, compare and relative-L2 hooks for `prob`."""
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
        scale_limit(op, prob),
    )


def adversarial(op, problem, params: dict, arch: str = "sm_90a") -> list:
    """The op's adversarial shapes for this config (ops may take the config), minus those it cannot
    run and those that need another binary (same_binary)."""
    import inspect

    takes_params = len(inspect.signature(op.verify_problems).parameters) > 1
    shapes = op.verify_problems(problem, params) if takes_params else op.verify_problems(problem)
    return same_binary(
        op, params, problem, [p for p in shapes if op.check(params, p) is None], arch
    )


class Gpu:
    """The worker's GPU: its own stream, an L2 flush buffer, loaded kernels and a rotating input pool."""

    def __init__(self, index: int = 0):
        import cupy as cp

        self.cp, self.index = cp, index
        cp.cuda.Device(index).use()
        self.fingerprint = fingerprint_mod.read(index)
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.l2_bytes = self.fingerprint.l2_bytes or (50 << 20)
        self.flush_buf = cp.empty(max(FLUSH_MIN_BYTES, 4 * self.l2_bytes), dtype=cp.uint8)
        self.kernels: dict = {}
        self.flushes, self.rotation = 0, 0
        self._pool, self._pool_key = [], None
        self.gate = Gate(cp)
        self._warm_cupy()
        self.gate.hold(self.stream)  # compile the gate kernel now, not inside the first measurement
        self.gate.release()
        self.sync()

    def _warm_cupy(self) -> None:
        """Compile cupy's kernels for the checks now, not inside the first candidate's deadline."""
        cp = self.cp
        cp.random.RandomState(0).standard_normal((2, 3)).astype(cp.float32)
        for name in ("float32", "float16", "bfloat16"):
            a = cp.zeros((2, 3), dtype=storage_dtype(name, cp))
            for ref in (cp.zeros((2, 3), cp.float32), cp.zeros((2, 3), cp.float64)):
                check.judge(
                    name,
                    {"x": a},
                    {"x": a.copy()},
                    {"y": a},
                    {"y": ref},
                    lambda _: (1e-3, 1e-3),
                    cp,
                    {"y": a.copy()},
                )
            check.poison(a, cp)
            check.unwritten(a, cp)
        self.sync()

    # plumbing
    def sync(self) -> None:
        self.stream.synchronize()
        self.cp.cuda.Device(self.index).synchronize()

    def flush(self) -> None:
        self.flushes += 1
        self.cp.cuda.runtime.memsetAsync(
            self.flush_buf.data.ptr, self.flushes & 0xFF, self.flush_buf.nbytes, self.stream.ptr
        )

    def kernel(self, binary: dict, entry: str | None = None):
        """The function `entry` (default: the binary's own entry) of the binary's cubin."""
        entry = entry or binary["entry"]
        key = (entry, binary["digest"])
        if key not in self.kernels:
            if len(self.kernels) >= 32:
                self.kernels.pop(next(iter(self.kernels)))
            self.kernels[key] = device.load(entry, binary["cubin"], binary.get("ptx", ""))
        return self.kernels[key]

    def launches(
        self, op, params: dict, problem, binary: dict, inputs: dict, outputs: dict
    ) -> list:
        """[(function, geometry, args)] of one call of the op, launched in this order on our stream:
        one kernel, or every entry of a multi-kernel op (KERNELS, launches(), stage_args(); all
        entries live in the one cubin, whose own entry is the op's main kernel)."""
        if not hasattr(op, "KERNELS"):
            return [
                (
                    self.kernel(binary),
                    op.launch(params, problem, self.fingerprint.sm_count),
                    op.kernel_args(params, problem, inputs, outputs),
                )
            ]
        geoms = op.launches(
            params, problem, self.fingerprint.sm_count
        )  # this config's entries, in order
        return [
            (self.kernel(binary, e), geoms[e], op.stage_args(e, params, problem, inputs, outputs))
            for e in geoms
        ]

    def release(self) -> None:
        self.cp.get_default_memory_pool().free_all_blocks()
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            torch.cuda.empty_cache()  # baselines allocate through torch's own caching allocator

    def drop_pool(self, above_bytes: int = 0) -> None:
        """Free the timing pool if its sets exceed `above_bytes` (a 2^31-element problem's pool plus a
        float64 reference do not fit together; the pool is rebuilt when next needed)."""
        if self._pool and sum(nbytes(i) + nbytes(o) for i, o in self._pool) > above_bytes:
            self._pool, self._pool_key, self._pool_ref = [], None, (None, None)
            self.release()

    # stages
    def copy_bandwidth(self, max_bytes: int = 1 << 30, reps: int = 20) -> float:
        """Device-to-device copy bandwidth in TB/s, read + write bytes counted, median of `reps` copies."""
        cp = self.cp
        size = int(min(max_bytes, cp.cuda.runtime.memGetInfo()[0] // 4)) // 256 * 256
        src, dst = cp.ones(size, dtype=cp.uint8), cp.empty(size, dtype=cp.uint8)

        def timer(_name, n):
            evs = [(cp.cuda.Event(), cp.cuda.Event()) for _ in range(n)]
            self.sync()
            for a, b in evs:
                a.record(self.stream)
                cp.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, size, 3, self.stream.ptr)
                b.record(self.stream)
            self.sync()
            return [cp.cuda.get_elapsed_time(a, b) for a, b in evs]

        stats.warm_up(timer, "copy", 20.0)
        ms = stats.quantile(timer("copy", reps), 0.5)
        del src, dst
        self.release()
        return 2 * size / (ms * 1e-3) / 1e12

    def run_once(
        self, op, binary: dict, params: dict, problem, inputs: dict, outputs: dict | None = None
    ) -> dict:
        """Fresh poisoned outputs (or `outputs` as they are: the dirty-buffer call), one call (every
        kernel of the op) on our stream, synchronize (errors surface here). Returns the outputs to check:
        scratch outputs (op.SCRATCH) are poisoned too, so a kernel reading what another never wrote shows
        in the checked ones, but not returned. All of them (scratch too) stay in self.last_outputs."""
        if outputs is None:
            outputs = op.make_outputs(problem, self.cp)
            for out in outputs.values():
                check.poison(out, self.cp)
        self.last_outputs = outputs
        calls = self.launches(op, params, problem, binary, inputs, outputs)
        self.sync()
        for kern, geom, args in calls:
            device.launch(kern, geom, args, self.stream)
        self.sync()
        scratch = set(getattr(op, "SCRATCH", ()))
        return {k: v for k, v in outputs.items() if k not in scratch}

    def verify(
        self,
        op_folder: str,
        root: str,
        params: dict,
        problem,
        binary: dict,
        seeds: list | None = None,
    ) -> dict:
        cp, op = self.cp, load_op(op_folder, Path(root))
        det = getattr(op, "DETERMINISTIC", True)
        det = det(params) if callable(det) else bool(det)
        seeds = list(seeds or [secrets.randbelow(2**31) for _ in range(3)])
        cases, max_abs, max_rel, tols = 0, 0.0, 0.0, {}
        self.drop_pool(above_bytes=ONE_SEED_ABOVE_BYTES)
        arch = binary.get("arch") or "sm_90a"
        plan = [(problem, seeds[:1]), (fewer_rows(op, problem, params, arch), seeds[1:])]
        plan += [(p, [secrets.randbelow(2**31)]) for p in adversarial(op, problem, params, arch)]
        seen = {p for p, _ in plan}
        plan += [
            (p, [secrets.randbelow(2**31)])
            for p in size_classes(op, problem, params, arch)
            if p not in seen
        ]
        big_seen = (
            set()
        )  # one seed per problem above ONE_SEED_ABOVE_BYTES, also when fewer_rows cannot shrink it
        with self.stream:
            for prob, prob_seeds in plan:
                kept = None  # (input buffers, all outputs) of this problem's last seed, if small
                for seed in prob_seeds:
                    if prob in big_seen:
                        break
                    inputs = op.make_inputs(prob, seed, cp)
                    before = {k: v.copy() for k, v in inputs.items()}
                    ref = op.reference(prob, {k: v.copy() for k, v in inputs.items()}, cp)
                    dirty = None
                    if kept is not None:
                        # this seed's inputs in the last seed's buffers (the same pointers), its
                        # outputs not poisoned again (they hold the last seed's results): a kernel that
                        # skips work whose output looks written, or caches by pointer, is wrong here
                        for k, v in inputs.items():
                            kept[0][k][...] = v
                        inputs = kept[0]
                        dirty = self.run_once(op, binary, params, prob, inputs, kept[1])
                    first = self.run_once(op, binary, params, prob, inputs)
                    all_outputs = self.last_outputs
                    again = self.run_once(op, binary, params, prob, inputs) if det else None
                    outcome, detail, a, r = judge_run(
                        op, prob, inputs, before, first, ref, cp, again
                    )
                    if outcome is Outcome.OK and dirty is not None:
                        o2, d2, _, _ = judge_run(op, prob, inputs, before, dirty, ref, cp)
                        if o2 is not Outcome.OK:
                            outcome = Outcome.STATEFUL
                            detail = (
                                f"{o2.value} on a second call in the same buffers, outputs not "
                                f"poisoned again (right on fresh poison): {d2}"
                            )
                    cases, max_abs, max_rel = cases + 1, max(max_abs, a), max(max_rel, r)
                    tols = tols or {name: list(op.tolerance(problem, name)) for name in ref}
                    big = nbytes(inputs) > ONE_SEED_ABOVE_BYTES
                    kept = None if big else (inputs, all_outputs)
                    del inputs, before, ref, first, again, dirty, all_outputs
                    self.last_outputs = None
                    self.release()
                    if outcome is not Outcome.OK:
                        return {
                            "outcome": outcome.value,
                            "detail": f"{detail} [{prob.label()}{_hidden_options(prob)}, seed {seed}]",
                            "max_abs_err": max_abs,
                            "max_rel_err": max_rel,
                            "cases": cases,
                            "seeds": seeds,
                        }
                    if big:
                        big_seen.add(prob)
                kept = None
        return {
            "outcome": Outcome.OK.value,
            "detail": "",
            "max_abs_err": max_abs,
            "max_rel_err": max_rel,
            "cases": cases,
            "seeds": seeds,
            "tolerances": tols,
            "shapes": [list(s) for s in verified_shapes(plan)],
        }

    def pool(self, op, problem) -> list:
        """Input/output sets to rotate through: more bytes than 2x L2, at most half the free memory."""
        key = (str(op.FOLDER), problem)
        if self._pool_key != key:
            self._pool, self._pool_key, self._pool_ref = [], None, (None, None)
            self.release()
            cp = self.cp
            first = (op.make_inputs(problem, 1_000_003, cp), op.make_outputs(problem, cp))
            size = max(1, nbytes(first[0]) + nbytes(first[1]))
            free, _ = cp.cuda.runtime.memGetInfo()
            n = max(
                1,
                min(POOL_MAX_SETS, math.ceil(2 * self.l2_bytes / size) + 1, int(free // 2 // size)),
            )
            self._pool = [first] + [
                (op.make_inputs(problem, 1_000_003 + i, cp), op.make_outputs(problem, cp))
                for i in range(1, n)
            ]
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
        """(run, sets, poison, check) of a candidate on the pool (see _timer): check(0) judges set 0's
        outputs against its reference as verify does; a failure raises TimedWrong."""
        calls = [self.launches(op, params, problem, binary, ins, outs) for ins, outs in pool]
        scratch = set(getattr(op, "SCRATCH", ()))

        def run(i):
            for kern, geom, args in calls[i]:
                device.launch(kern, geom, args, self.stream)

        def poison(i):
            for out in pool[i][1].values():
                check.poison(out, self.cp)

        def verdict(i):
            ref = self.pool_reference(op, pool, problem, i)
            if ref is None:
                return
            ins, outs = pool[i]
            got = {k: v for k, v in outs.items() if k not in scratch}
            outcome, detail, _, _ = judge_run(op, problem, ins, {}, got, ref, self.cp)
            if outcome is not Outcome.OK:
                raise TimedWrong(f"{outcome.value} after a timed call (set {i}): {detail}")

        return run, len(pool), poison, verdict

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

    def measure(
        self,
        op_folder: str,
        root: str,
        params: dict,
        problem,
        binary: dict,
        incumbent=None,
        copy_tbps: float = 0.0,
        warmup_ms: float = 30.0,
        budget_ms: float = 200.0,
    ) -> dict:
        op = load_op(op_folder, Path(root))
        pool = self.pool(op, problem)
        self.unchecked = False
        runners = {"candidate": self._runner(op, params, problem, binary, pool)}
        if incumbent:
            # poisoned as the candidate is (a fair window), not judged: its own measure judged it
            runners["incumbent"] = self._runner(op, incumbent[0], problem, incumbent[1], pool)[:3]
        timer = self._timer(runners)
        with self.stream:
            try:
                res = stats.run(
                    timer, incumbent=bool(incumbent), warmup_ms=warmup_ms, budget_ms=budget_ms
                )
            except TimedWrong as exc:
                return {"outcome": Outcome.STATEFUL.value, "detail": str(exc), "samples": 0}
        out = stats.summarize(
            res["candidate"], stats.floor_ms(op.bytes_moved(problem), copy_tbps), res["incumbent"]
        )
        if res["remeasured"]:
            add_detail(out, "beat the incumbent by >10%: re-timed alone, slower kept")
        if ungated := getattr(timer, "ungated", ()):
            add_detail(out, UNGATED_NOTE + ", ".join(sorted(ungated)))
        if self.unchecked:
            add_detail(out, "timed outputs not checked: the reference did not fit beside the pool")
        return out

    def baselines(
        self,
        op_folder: str,
        root: str,
        problem,
        copy_tbps: float = 0.0,
        warmup_ms: float = 30.0,
        budget_ms: float = 200.0,
        winner=None,
    ) -> dict:
        """Each baseline checked against the reference, then timed; with `winner` (params, binary), in the winner's
        window, alternating (verification.md timing rule 4): the winner's p50 there comes back as incumbent_p50_ms.
        op.baselines(problem) maps a name to a callable (its `compare(name, got, want)`, if any, judges it
        instead of the op's) or to a str: why it is not run here (outcome invalid, that detail)."""
        cp, op = self.cp, load_op(op_folder, Path(root))
        fns = op.baselines(problem) if hasattr(op, "baselines") else {}
        results = {}
        for name in list(fns):
            fn = fns.pop(
                name
            )  # a timed baseline's closure goes, and the torch views of inputs it cached
            if isinstance(fn, str):  # the op says why it is not run here (not built, not its case)
                results[name] = {"outcome": Outcome.INVALID.value, "detail": fn}
                continue
            inputs = before = ref = got = pool = runners = timer = (
                None  # nothing of the last baseline stays
            )
            self.drop_pool(
                above_bytes=ONE_SEED_ABOVE_BYTES
            )  # the previous baseline's timing rebuilt it
            try:
                with self.stream, _torch_stream(self.stream):
                    inputs = op.make_inputs(problem, secrets.randbelow(2**31), cp)
                    before = {k: v.copy() for k, v in inputs.items()}
                    ref = op.reference(problem, {k: v.copy() for k, v in inputs.items()}, cp)
                    # the reference's temporaries sit in cupy's pool; torch allocates beside it, not
                    # from it (fp32 2^31-element residual: torch's first 8 GiB failed with 134 GiB pooled)
                    self.release()
                    got = {k: _as_cupy(v, cp) for k, v in fn(inputs).items()}
                    self.sync()
                    missing = [k for k in ref if k not in got]
                    outcome, detail, _, _ = (
                        (Outcome.WRONG_RESULT, f"baseline returned no {missing}", 0, 0)
                        if missing
                        else check.judge(
                            problem.dtype,
                            inputs,
                            before,
                            got,
                            ref,
                            lambda o: op.tolerance(problem, o),
                            cp,
                            # a baseline may bring its own verdict (one less accurate than
                            # the op's gate is still timed as what it is)
                            custom=getattr(fn, "compare", None) or custom_compare(op, problem, cp),
                        )
                    )
                    del inputs, before, ref, got
                    if outcome is not Outcome.OK:
                        results[name] = {"outcome": outcome.value, "detail": detail}
                        continue
                pool = self.pool(op, problem)
                runners = {"candidate": ((lambda i, f=fn: f(pool[i][0])), len(pool))}
                if winner:
                    runners["incumbent"] = self._runner(op, winner[0], problem, winner[1], pool)[:3]
                timer = self._timer(runners)
                with (
                    self.stream,
                    _torch_stream(self.stream),
                ):  # torch may have been imported by the check
                    res = stats.run(
                        timer,
                        incumbent=bool(winner),
                        warmup_ms=warmup_ms,
                        budget_ms=budget_ms,
                        guard=False,
                    )
                results[name] = stats.summarize(
                    res["candidate"],
                    stats.floor_ms(op.bytes_moved(problem), copy_tbps),
                    res["incumbent"],
                    rounds=stats.ROUNDS if winner else 0,
                )
                if getattr(timer, "ungated", ()):
                    add_detail(results[name], UNGATED_NOTE + name)
            except Exception as exc:  # noqa: BLE001 - a baseline that cannot run is reported, not raised
                from .errors import classify, is_cuda_error

                if is_cuda_error(exc) and classify(str(exc))[1]:
                    raise
                results[name] = {
                    "outcome": Outcome.LAUNCH_ERROR.value,
                    "detail": f"{type(exc).__name__}: {exc}",
                }
        self.release()
        return results
