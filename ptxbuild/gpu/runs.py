"""Inside the worker: verify, time and baseline candidates on one GPU with cupy (via check and stats)."""

from __future__ import annotations

import contextlib
import secrets
import sys
from pathlib import Path

from ..coverage import plan_problems, verified_shapes
from ..dtypes import storage_dtype
from ..oploader import load_op
from ..outcome import Outcome
from . import check, device, stats
from . import fingerprint as fingerprint_mod
from .gate import Gate
from .suite import SUITE_VERSION, _hidden_options, custom_compare, judge_run  # noqa: F401
from .timing import GATE_BATCH, TimedWrong, Timing, nbytes  # noqa: F401 - GATE_BATCH re-exported

ONE_SEED_ABOVE_BYTES = (
    512 << 20
)  # above this many input bytes, one full-size seed (the others run on fewer rows)
FLUSH_MIN_BYTES = 256 << 20
UNGATED_NOTE = (
    "timed without the gate after it timed out twice in a row (a call that waits on the GPU "
    "from the host, or more launches than the queue holds), so its host time counts: "
)


def add_detail(result: dict, note: str) -> None:
    """Append `note` to a measurement's detail text ("; " between notes)."""
    result["detail"] = "; ".join(filter(None, [result.get("detail", ""), note]))


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


class Gpu(Timing):
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
        sms = self.fingerprint.sm_count
        calls = op.calls(params, problem, sms, inputs, outputs)
        return [(self.kernel(binary, e), geom, args) for e, geom, args in calls]

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
        scratch = op.SCRATCH
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
        det = op.deterministic(params)
        seeds = list(seeds or [secrets.randbelow(2**31) for _ in range(3)])
        cases, max_abs, max_rel, tols = 0, 0.0, 0.0, {}

        def result(outcome: Outcome, detail: str, **more) -> dict:
            """The verdict with the cases run so far and their largest errors."""
            errors = {"max_abs_err": max_abs, "max_rel_err": max_rel, "cases": cases}
            return {"outcome": outcome.value, "detail": detail, **errors, "seeds": seeds, **more}

        self.drop_pool(above_bytes=ONE_SEED_ABOVE_BYTES)
        arch = binary.get("arch") or "sm_90a"
        main, fewer, *others = plan_problems(op, problem, params, arch)
        plan = [(main, seeds[:1]), (fewer, seeds[1:])]
        plan += [(p, [secrets.randbelow(2**31)]) for p in others]
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
                    if kept is not None and all(
                        k in kept[0] and (kept[0][k].shape, kept[0][k].dtype) == (v.shape, v.dtype)
                        for k, v in inputs.items()
                    ):
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
                        where = f"{prob.label()}{_hidden_options(prob)}, seed {seed}"
                        return result(outcome, f"{detail} [{where}]")
                    if big:
                        big_seen.add(prob)
        shapes = [list(s) for s in verified_shapes(plan)]
        return result(Outcome.OK, "", tolerances=tols, shapes=shapes)

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
        fns = op.baselines(problem)
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
