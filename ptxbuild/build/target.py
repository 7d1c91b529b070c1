"""The pipeline of one target: plan, search (compile -> verify -> measure), artifacts, build record."""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import keys
from ..compile.compiler import CompileError, compile_kernel, with_resources
from ..declare.checks import check_declaration, declared_candidates, problems_of
from ..declare.graph import Target, build_order, dependencies
from ..gpu import memcheck
from ..gpu.session import GpuError
from ..oploader import load_op, source_files
from ..outcome import Outcome
from ..outputs import gates
from ..outputs.environment import environment, utc_time
from ..outputs.lockfile import LockError, check_entry, pinned_binaries, read_lock
from ..outputs.manifest import artifact_problem, assemble, target_dir, write_artifacts
from ..outputs.report import rejudge, write_report
from ..problem import Binary, Kernel, Problem, digest
from ..search.strategies import best, neighbours, run_search
from ..store import lessons
from ..store.lessons_io import shipped_among

REGISTERS_PER_SM = 65536


@dataclass
class Context:
    """What a build run needs: the kernelfile, the cache, the compile stage and (maybe) a GPU."""

    kf: Any
    cache: Any
    toolchain: Any  # compiler.Toolchain (or a fake in tests)
    compile_fn: Callable[[Kernel, str], Binary] = compile_kernel
    gpu: Any = None  # gpu.GpuSession or a fake with the same methods
    gpu_match: Callable[[Any, Any], str | None] | None = None
    jobs: int = field(default_factory=lambda: os.cpu_count() or 1)
    report: Callable[..., None] = lambda *a, **k: None
    run: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    force: bool = False
    command: str = ""
    # time every candidate and baseline again (compiles, verdicts cached): a report's numbers from one run
    remeasure: bool = False
    remeasure_only: tuple = ()  # only problems whose label holds one of these; the others keep their timings
    timed: set = field(default_factory=set)  # keys timed in this run
    timed_since: float | None = (
        None  # resuming an interrupted --remeasure build: timings since then are this run's
    )
    resume: bool = True  # False: a --remeasure build starts over even after an interrupted one


@dataclass(frozen=True)
class TargetResult:
    target: Target
    status: str  # built | up_to_date | failed
    reason: str
    measured: bool = False
    manifest: Path | None = None
    missed: tuple = ()  # gates.judge's failures: built (and locked), but the declared bar is not met


def _file_digests(op) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in source_files(op)}


def hardware_for(ctx: Context, gpu) -> dict | None:
    """The fingerprint of the GPU present if it is this target's GPU (or its model), else None."""
    if ctx.gpu is None or ctx.gpu_match is None:
        return None
    return (
        ctx.gpu.fingerprint.key()
        if ctx.gpu_match(ctx.gpu.fingerprint, gpu) in ("exact", "model")
        else None
    )


def target_key(ctx: Context, t: Target, done: dict[Target, str]) -> str:
    spec, gpu = ctx.kf.ops[t.op], ctx.kf.gpus[t.gpu]
    op = load_op(spec.template, ctx.kf.root)
    deps = [done.get(d) or target_key(ctx, d, done) for d in dependencies(ctx.kf, t)]
    return keys.build_key(
        _file_digests(op),
        spec.config(),
        gpu.as_dict(),
        ctx.toolchain.key(),
        deps,
        hardware_for(ctx, gpu),
    )


def explain(ctx: Context, t: Target, key: str) -> tuple[bool, str]:
    """(up to date?, why) for a target whose current build key is `key`: by the cache's last build, else by the lock
    (`build --locked` records no cache build; what it wrote is up to date while the lock entry holds)."""
    fresh, why = _by_cache(ctx, t, key)
    return (
        (True, "up to date (built from the lock)")
        if not fresh and _as_locked(ctx, t)
        else (fresh, why)
    )


def _by_cache(ctx: Context, t: Target, key: str) -> tuple[bool, str]:
    last = ctx.cache.last_build(str(t), ctx.kf.project)
    if last is None:
        return False, "never built"
    if last["status"] not in (
        "ok",
        "gates_failed",
    ):  # gates_failed: recorded before gates stopped being build inputs
        return False, f"last build {last['status']}"
    if last["key"] != key:
        old, new = json.loads(last["summary"]).get("inputs", {}), _inputs(ctx, t)
        changed = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
        return False, "changed: " + (", ".join(changed) if changed else "build inputs")
    # build/<target>/ as this kernelfile names it (a copied project's cache names the original's)
    if why := artifact_problem(ctx.kf, t):
        return False, why
    return True, "up to date"


def _as_locked(ctx: Context, t: Target) -> bool:
    """build/ holds the kernels kernelfile.lock pins for `t`, its entry holds for today's inputs, and it was measured
    on hardware unless none of the target's GPU is here (a compile-only entry on that GPU is searched there)."""
    try:
        entry = read_lock(ctx.kf)["targets"].get(str(t))
        check_entry(ctx, t, entry, load_op(ctx.kf.ops[t.op].template, ctx.kf.root))
        m = json.loads((target_dir(ctx.kf, t) / "manifest.json").read_text())
    except (LockError, OSError, ValueError, KeyError):
        return False
    return (
        not artifact_problem(ctx.kf, t)
        and (entry["measured_on_hardware"] or not hardware_for(ctx, ctx.kf.gpus[t.gpu]))
        and [d.get("binary") for d in m["dispatch"]] == [d["binary"] for d in entry["dispatch"]]
    )


def _inputs(ctx: Context, t: Target) -> dict[str, str]:
    """Named digests of each input of a target's build key (for --explain)."""
    spec, gpu = ctx.kf.ops[t.op], ctx.kf.gpus[t.gpu]
    op = load_op(spec.template, ctx.kf.root)

    def d(v):
        return hashlib.sha256(json.dumps(v, sort_keys=True, default=str).encode()).hexdigest()[:12]

    out = {f"op file {name}": h[:12] for name, h in _file_digests(op).items()}
    out.update(
        {
            "ops." + t.op: d(spec.config()),
            "gpus." + t.gpu: d(gpu.as_dict()),
            "toolchain": d(ctx.toolchain.key()),
            "hardware": d(hardware_for(ctx, gpu)),
        }
    )
    return out


def plan(ctx: Context, targets: list[Target] | None) -> list[tuple[Target, bool, str]]:
    """(target, up to date?, why) for plan / --explain; up to date also needs build/ to hold what the lock pins."""
    done: dict[Target, str] = {}
    out, pinned = [], pinned_binaries(ctx.kf)
    for t in build_order(ctx.kf, targets):
        done[t] = key = target_key(ctx, t, done)
        fresh, why = explain(ctx, t, key)
        m = json.loads((target_dir(ctx.kf, t) / "manifest.json").read_text()) if fresh else {}
        if (
            fresh
            and str(t) in pinned
            and pinned[str(t)] != [d.get("binary") for d in m["dispatch"]]
        ):
            fresh, why = (
                False,
                "build/ holds other kernels than the lock pins; run: ptxbuild build --locked",
            )
        elif fresh and (
            missed := gates.judge(ctx.kf.ops[t.op], m["dispatch"], m["measured_on_hardware"])[
                "gates"
            ]["failures"]
        ):
            why += f"; {len(missed)} gate(s) of ops.{t.op}.gates missed"
        stale_dep = [
            d for d in dependencies(ctx.kf, t) if not next(f for tt, f, _ in out if tt == d)
        ]
        if fresh and stale_dep:
            fresh, why = False, f"dependency {stale_dep[0]} is stale"
        out.append((t, fresh, why))
    return out


def build(ctx: Context, targets: list[Target] | None = None) -> list[TargetResult]:
    results = []
    failed: set[Target] = set()
    done: dict[Target, str] = {}
    try:
        for t in build_order(ctx.kf, targets):
            done[t] = key = target_key(ctx, t, done)
            bad_deps = [d for d in dependencies(ctx.kf, t) if d in failed]
            if bad_deps:
                failed.add(t)
                results.append(TargetResult(t, "failed", f"dependency {bad_deps[0]} failed"))
                ctx.report("target_skip", target=t, reason=f"dependency {bad_deps[0]} failed")
                continue
            fresh, why = explain(ctx, t, key)
            if fresh and not ctx.force:
                m = json.loads((target_dir(ctx.kf, t) / "manifest.json").read_text())
                results.append(TargetResult(t, "up_to_date", why, missed=rejudge(ctx.kf, t, m)))
                ctx.report("target_fresh", target=t, reason=why)
                continue
            ctx.report("target_start", target=t, reason=why)
            with _Interrupts() as irq:
                res = _build_target_signals_held(ctx, t, key, why, irq)
            if res.status == "failed":
                failed.add(t)
            results.append(res)
    except (
        KeyboardInterrupt,
        GpuError,
    ) as exc:  # the caller still locks the targets finished before it
        exc.finished = results + getattr(exc, "finished", [])
        raise
    return results


class _Evaluator:
    """Turns configs into scores for one problem, recording every outcome as an attempt row."""

    def __init__(self, ctx: Context, t: Target, op, problem: Problem, hardware: dict | None, pool):
        self.ctx, self.t, self.op, self.problem, self.hw, self.pool = (
            ctx,
            t,
            op,
            problem,
            hardware,
            pool,
        )
        self.gpu = ctx.kf.gpus[t.gpu]
        self.binaries: dict[
            tuple, Binary
        ] = {}  # per config: configs may share a cubin, not their PTX
        self.results: dict[tuple, dict] = {}
        self.timed_at: dict[tuple, float] = {}  # when each config's timing was taken (cached: then)
        self.incumbent: tuple[dict, Binary, float] | None = None
        self.rules = lessons.failure_rules(
            ctx.cache, op.NAME, problem, self.gpu.arch
        )  # failure lessons
        self.pruned: set[tuple] = set()

    def __call__(self, group: list[dict]) -> list[float]:
        rendered, compiled = {}, {}
        for cfg in group:
            reason = self.op.check(cfg, self.problem)
            if not reason and (reason := lessons.prune_reason(self.rules, cfg)):
                self.pruned.add(tuple(sorted(cfg.items())))
            if reason:
                rendered[id(cfg)] = (None, reason)
                continue
            kernel = self.op.render(cfg, self.problem, self.gpu.arch)
            rendered[id(cfg)] = (
                kernel,
                keys.compile_key(kernel, self.gpu.arch, self.ctx.toolchain.key()),
            )
        # each compile row is read (and decompressed) once per group; a damaged row reads as absent
        rows = {
            k: self.ctx.cache.get_compile(k) for kern, k in rendered.values() if kern is not None
        }
        todo = {k: kern for kern, k in rendered.values() if kern is not None and rows[k] is None}
        futures = {k: self._submit(kern) for k, kern in todo.items()}
        for k, fut in futures.items():
            binary, error, secs = fut() if callable(fut) else fut.result()
            self.ctx.cache.put_compile(
                k, self.gpu.arch, todo[k].entry, binary, error, str(self.ctx.toolchain), secs
            )
            compiled[k] = secs
            rows[k] = self.ctx.cache.get_compile(k)
        return [self._finish(cfg, *rendered[id(cfg)], compiled, rows) for cfg in group]

    def _submit(self, kernel: Kernel):
        if self.pool is None:
            res = _compile_one(self.ctx.compile_fn, kernel, self.gpu.arch)
            return lambda: res
        return self.pool.submit(_compile_one, self.ctx.compile_fn, kernel, self.gpu.arch)

    def _record(self, cfg: dict, outcome: Outcome, detail: str = "", **extra) -> float:
        row = {
            "run": self.ctx.run,
            "target": str(self.t),
            "op": self.t.op,
            "gpu": self.t.gpu,
            "arch": self.gpu.arch,
            "problem": self.problem.key(),
            "params": cfg,
            "outcome": outcome.value,
            "detail": detail[:2000],
            **extra,
        }
        self.ctx.cache.add_attempt(**row)
        score = extra.get("p50_ms") if outcome is Outcome.OK else math.inf
        if outcome is Outcome.OK and score is None:
            score = 0.0  # compile-only: every config that passes scores the same; seeds come first
        self.results[tuple(sorted(cfg.items()))] = {**row, "score": score}
        self.ctx.report(
            "attempt", target=self.t, problem=self.problem, params=cfg, outcome=outcome, score=score
        )
        return score

    def _finish(self, cfg, kernel, key_or_reason, compiled, rows) -> float:
        if kernel is None:
            pruned = tuple(sorted(cfg.items())) in self.pruned
            return self._record(cfg, Outcome.PRUNED if pruned else Outcome.INVALID, key_or_reason)
        row = rows[key_or_reason]
        compile_s = compiled.get(key_or_reason, 0.0)
        if row["outcome"] != "ok":
            return self._record(cfg, Outcome.COMPILE_ERROR, row["error"] or "", compile_s=compile_s)
        binary = Binary(
            arch=row["arch"],
            entry=row["entry"],
            ptx=row["ptx"],
            cubin=row["cubin"],
            registers=row["registers"],
            spill_bytes=row["spill_bytes"],
            smem_static_bytes=row["smem_static_bytes"],
            local_bytes=row["local_bytes"],
            log=row["log"],
            compiler=row["toolchain"],
        )
        try:
            binary = with_resources(
                binary
            )  # rows cached before the cubin fallback may lack the figures
        except CompileError as exc:
            return self._record(cfg, Outcome.COMPILE_ERROR, str(exc), compile_s=compile_s)
        self.binaries[tuple(sorted(cfg.items()))] = binary
        res = dict(
            binary=binary.digest,
            registers=binary.registers,
            spill_bytes=binary.spill_bytes,
            compile_s=compile_s,
        )
        if binary.spill_bytes > self.op.SPILL_BUDGET_BYTES:
            return self._record(
                cfg,
                Outcome.SPILL,
                f"{binary.spill_bytes} bytes spilled (budget {self.op.SPILL_BUDGET_BYTES})",
                **res,
            )
        launch = self.op.launch(cfg, self.problem, self.gpu.sm_count)
        threads = launch.block[0] * launch.block[1] * launch.block[2]
        smem = launch.smem_bytes + binary.smem_static_bytes
        if (
            threads > 1024
            or binary.registers * threads > REGISTERS_PER_SM
            or smem > self.gpu.smem_per_block_bytes
        ):
            return self._record(
                cfg,
                Outcome.RESOURCE,
                f"{threads} threads x {binary.registers} registers, "
                f"{smem} bytes shared memory exceed {self.gpu.name}'s limits",
                **res,
            )
        if self.hw is None:
            return self._record(cfg, Outcome.OK, "compiled; not measured on hardware", **res)
        return self._on_gpu(cfg, binary, res)

    def _on_gpu(self, cfg, binary, res) -> float:
        cache, op, problem, gpu = self.ctx.cache, self.op, self.problem, self.ctx.gpu
        vkey = keys.verify_key(binary.digest, op.VERSION, problem, cfg)
        verdict = cache.get("verdicts", vkey)
        if (
            verdict is None or verdict["outcome"] == Outcome.TIMEOUT.value
        ):  # a deadline may be the harness's
            v = gpu.verify(str(op.FOLDER), cfg, problem, binary)
            verdict = {
                "key": vkey,
                "binary": binary.digest,
                "suite": op.VERSION,
                "problem": json.dumps(problem.key()),
                "outcome": v.outcome.value,
                "detail": v.detail,
                "max_abs_err": v.max_abs_err,
                "max_rel_err": v.max_rel_err,
                "cases": v.cases,
                "seconds": v.seconds,
            }
            cache.put("verdicts", verdict)
        res["verify_s"] = verdict["seconds"]
        if verdict["outcome"] != "ok":
            return self._record(cfg, Outcome(verdict["outcome"]), verdict["detail"], **res)
        mkey = keys.measure_key(binary.digest, self.hw, problem, cfg)
        m = cache.get("measurements", mkey)
        if _must_time(self.ctx, mkey, m, problem):
            self.ctx.timed.add(mkey)
            inc = (self.incumbent[0], self.incumbent[1]) if self.incumbent else None
            t0 = time.perf_counter()
            r = gpu.measure(str(op.FOLDER), cfg, problem, binary, incumbent=inc)
            measure_s = time.perf_counter() - t0
            m = {
                "key": mkey,
                "binary": binary.digest,
                "fingerprint": json.dumps(self.hw, sort_keys=True),
                "problem": json.dumps(problem.key()),
                "outcome": r.outcome.value,
                "p50_ms": r.p50_ms,
                "p20_ms": r.p20_ms,
                "p80_ms": r.p80_ms,
                "samples": r.samples,
                "floor_ms": r.floor_ms,
                "copy_tbps": gpu.copy_tbps,
                "detail": r.detail,
                "seconds": round(measure_s, 4),
            }
            m["created"] = cache.put("measurements", m)
        self.timed_at[tuple(sorted(cfg.items()))] = m["created"]
        res.update(measure_s=m["seconds"], p50_ms=m["p50_ms"], measured_on=self.hw.get("name", ""))
        if m["outcome"] != "ok":
            return self._record(cfg, Outcome(m["outcome"]), m["detail"], **res)
        score = self._record(cfg, Outcome.OK, "", **res)
        if self.incumbent is None or score < self.incumbent[2]:
            self.incumbent = (cfg, binary, score)
        return score

    def playoff(self, hist: list, size: int = 4, within: float = 0.02):
        """The search's fastest config against the next ones (up to `size` in all) within `within` of
        it, each challenger timed in one window with the leader, alternating (verification.md timing
        rule 4): timed apart, near-ties are ordered by noise, and the fastest of many noisy timings is
        biased low. A challenger lower in the window leads, its p50 there its score. Bouts: self.bouts."""
        ranked, self.bouts = (
            sorted((h for h in hist if math.isfinite(h[1])), key=lambda h: h[1]),
            [],
        )

        def binary(c):
            return self.binaries[tuple(sorted(c.items()))]

        def geoms(c):
            return (self.op.launches if hasattr(self.op, "KERNELS") else self.op.launch)(
                c, self.problem, self.gpu.sm_count
            )

        def kernel(c):
            return (
                binary(c).digest,
                repr(geoms(c)),
            )  # what a bout runs: every launch of the op

        if not ranked:
            return None
        lead, met = ranked[0], {kernel(ranked[0][0])}
        for cfg, score in ranked[1:]:
            if len(self.bouts) >= size - 1 or score > ranked[0][1] * (1 + within):
                break
            if kernel(cfg) in met:
                continue  # the same kernel and launch as one already met: nothing to learn
            met.add(kernel(cfg))
            b, lb = binary(cfg), binary(lead[0])
            key = digest(
                "playoff",
                b.digest,
                lb.digest,
                self.hw,
                self.problem.key(),
                cfg,
                lead[0],
                keys.PROTOCOL_VERSION,
            )
            row = self.ctx.cache.get("measurements", key)
            if _must_time(self.ctx, key, row, self.problem) or row["outcome"] in RETRY_BASELINE:
                self.ctx.timed.add(key)
                r = self.ctx.gpu.measure(
                    str(self.op.FOLDER), cfg, self.problem, b, incumbent=(lead[0], lb)
                )
                row = {
                    "key": key,
                    "binary": "playoff",
                    "fingerprint": json.dumps(self.hw, sort_keys=True),
                    "problem": json.dumps(self.problem.key()),
                    "outcome": r.outcome.value,
                    "p50_ms": r.p50_ms if r.outcome is Outcome.OK else None,
                    "detail": json.dumps({"leader_p50_ms": r.incumbent_p50_ms}),
                }
                if (
                    row["outcome"] not in RETRY_BASELINE
                ):  # the harness failed: timed again next build
                    self.ctx.cache.put("measurements", row)
            lead_p50 = json.loads(row["detail"])["leader_p50_ms"]
            won = row["outcome"] == "ok" and lead_p50 is not None and row["p50_ms"] < lead_p50
            self.bouts.append(
                {"params": cfg, "p50_ms": row["p50_ms"], "leader_p50_ms": lead_p50, "won": won}
            )
            lead = (cfg, row["p50_ms"]) if won else lead
        return lead


def search_batch(jobs: int, budget: int) -> int:
    """Configs compiled together per search step: enough to use the cores, few enough that an
    evolutionary search gets several generations out of its budget (a third of it, at least 4)."""
    return max(1, min(jobs, max(4, budget // 3)))


def _compile_worker(parent: int) -> None:
    """A compile process leaves Ctrl-C to the build, which stops it (no traceback per process); takes
    SIGTERM (fork copied the build's handler, which made it a KeyboardInterrupt the pool caught); and
    dies with its build, even one killed with SIGKILL (Linux: PR_SET_PDEATHSIG)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        import ctypes

        with suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the build died before prctl took effect
        os._exit(1)


def _stop_pool(pool: ProcessPoolExecutor, interrupted: bool) -> None:
    """Stopped: compiles in flight are killed, not waited for (one can take minutes)."""
    if interrupted:
        for proc in list((getattr(pool, "_processes", None) or {}).values()):
            with suppress(OSError):
                proc.terminate()
    pool.shutdown(wait=not interrupted, cancel_futures=True)


class _Interrupts:
    """SIGINT (or SIGTERM) while a target builds: the first one stops the search (KeyboardInterrupt); the next
    one, which `timeout -s INT` (the child, then its process group) or a second Ctrl-C sends while
    the partial results are written, is ignored; a third stops at once. A first one that arrives
    while a finished build is saved (`saving`) is held like a second until the build is recorded."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)  # SIGTERM: plain `timeout`, job schedulers

    def __init__(self):
        self.count, self.prev, self.saving = 0, {}, False

    def _handle(self, signum, frame):
        self.count += 1
        if self.count != 2 and not (self.saving and self.count == 1):
            raise KeyboardInterrupt

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self.prev = {sig: signal.signal(sig, self._handle) for sig in self.SIGNALS}
        return self

    def __exit__(self, *exc):
        for sig, handler in self.prev.items():
            signal.signal(sig, handler)


def _compile_one(compile_fn, kernel: Kernel, arch: str):
    t0 = time.perf_counter()
    try:
        return compile_fn(kernel, arch), "", time.perf_counter() - t0
    except CompileError as exc:
        return None, str(exc)[:4000], time.perf_counter() - t0


def _build_target_signals_held(
    ctx: Context, t: Target, key: str, why: str, irq: _Interrupts
) -> TargetResult:
    spec, gpu = ctx.kf.ops[t.op], ctx.kf.gpus[t.gpu]
    op = load_op(spec.template, ctx.kf.root)
    hw = hardware_for(ctx, gpu)
    search = spec.search
    chosen: list[dict] = []
    memchecks: list[str] = []  # per problem built on a GPU: what memcheck said of its winner
    used_lessons: list[dict] = []
    probs = problems_of(spec)
    started = time.time()
    check_declaration(spec, op, gpu.sm_count)
    ctx.timed_since = resume_point(ctx, t) if hw and ctx.remeasure and ctx.resume else None
    if ctx.timed_since:
        ctx.report(
            "note",
            message=f"{t}: resuming an interrupted --remeasure build: timings made since "
            f"{utc_time(ctx.timed_since)} are kept",
        )
    if ctx.remeasure_only and hw and not any(remeasuring(ctx, p) for p in probs):
        ctx.report(
            "note",
            message=f"{t}: --remeasure-only {' / '.join(ctx.remeasure_only)} matches none of its "
            f"problems (labels look like {probs[0].label()}): every timing comes from the cache",
        )
    pool = (
        ProcessPoolExecutor(ctx.jobs, initializer=_compile_worker, initargs=(os.getpid(),))
        if ctx.jobs > 1 and ctx.compile_fn is compile_kernel
        else None
    )
    interrupted, gpu_failure = False, None
    try:
        for i, problem in enumerate(probs):
            ctx.report("problem_start", target=t, problem=problem, index=i, total=len(probs))
            seeds, used = lessons.seeds(ctx.cache, op, problem, gpu, run=ctx.run)
            used_lessons += used
            default = op.default_params(problem)
            # compile-only: transferred lessons before the default; measured: see lessons.order_seeds
            seeds = seeds + [default] if hw is None else lessons.order_seeds(seeds, used, default)
            mine = declared_candidates(
                spec, op, problem, default, note=lambda m: ctx.report("note", message=m)
            )
            seeds = mine + seeds
            ev = _Evaluator(ctx, t, op, problem, hw, pool)

            # configs a failure lesson covers leave the search space; seeds they cover are recorded as pruned
            def valid(c, p=problem, e=ev):
                return op.check(c, p) or lessons.prune_reason(e.rules, c)

            used_lessons += [
                {k: r[k] for k in ("lesson", "kind", "scope", "rule", "confidence")}
                for r in ev.rules
            ]
            if hw is None:
                # compile-only: the first config that compiles within the limits, lessons and default first
                hist = []
                for cfg in _dedupe(seeds):
                    hist.append((cfg, ev([cfg])[0]))
                    if math.isfinite(hist[-1][1]):
                        break
                if not any(math.isfinite(s) for _, s in hist):
                    hist += run_search(
                        op.SPACE,
                        ev,
                        strategy="exhaustive",
                        budget=min(search["budget"], 16),
                        seconds=search["seconds"],
                        valid=valid,
                        seeds=(),
                        rng_seed=search["seed"],
                        batch=ctx.jobs,
                    )
            else:
                ev(
                    [
                        s
                        for s in _dedupe(seeds)
                        if op.check(s, problem) is None and lessons.prune_reason(ev.rules, s)
                    ]
                )
                hist = run_search(
                    op.SPACE,
                    ev,
                    strategy=search["strategy"],
                    budget=search["budget"],
                    seconds=search["seconds"],
                    valid=valid,
                    seeds=seeds,
                    rng_seed=search["seed"],
                    batch=search_batch(ctx.jobs, search["budget"]),
                )
                top = best(hist)
                extra = (
                    neighbours(
                        top[0], op.SPACE, search.get("polish", ()), valid, [c for c, _ in hist]
                    )
                    if top
                    else []
                )
                hist += list(zip(extra, ev(extra))) if extra else []
            winner = (
                ev.playoff(hist) if hw else best(hist)
            )  # else: the first with the lowest finite score
            if hw and winner is not None:
                winner, checked = _memchecked(ctx, ev, op, problem, hist, winner)
                memchecks.append(checked)
            if winner is None:
                ctx.report("problem_fail", target=t, problem=problem)
                chosen.append({"problem": problem.key(), "label": problem.label(), "params": None})
                continue
            cfg, ck = (
                winner[0],
                tuple(sorted(winner[0].items())),
            )  # ck: the config's key in ev's tables
            row, binary = ev.results[ck], ev.binaries[ck]
            entry = {
                "problem": problem.key(),
                "label": problem.label(),
                "params": cfg,
                "binary": binary.digest,
                "launch": op.launch(cfg, problem, gpu.sm_count).__dict__,
                "registers": binary.registers,
                "spill_bytes": binary.spill_bytes,
                "p50_ms": winner[1] if hw else row.get("p50_ms"),
                "floor_ms": op.bytes_moved(problem)
                / ((ctx.gpu.copy_tbps if hw else gpu.dram_tbps) * 1e9),
                "source": "measured"
                if hw
                else (
                    "declared"
                    if cfg in mine
                    else "lesson"
                    if cfg in [u["params"] for u in used]
                    else "default"
                ),
                "lesson": None if hw else next((u for u in used if u["params"] == cfg), None),
                "_binary": binary,
            }
            t_base = time.perf_counter()
            if hw:
                entry["timed_at"] = ev.timed_at.get(ck)
                entry["baselines"] = _baselines(ctx, op, problem, hw, (cfg, binary))
                entry["playoff"] = ev.bouts
            chosen.append(entry)
            ctx.report(
                "problem_done",
                target=t,
                problem=problem,
                entry=entry,
                baseline_s=time.perf_counter() - t_base if hw else None,
            )
    except KeyboardInterrupt:
        interrupted = True  # keep what finished: partial artifacts and report, marked interrupted
    except (
        GpuError
    ) as exc:  # the worker is gone for good: keep what finished the same way, then say so
        interrupted, gpu_failure = True, exc
    finally:
        irq.saving = True
        if pool:
            _stop_pool(pool, interrupted)
    ok = all(c["params"] is not None for c in chosen) and not interrupted
    summary = {
        "target": str(t),
        "arch": gpu.arch,
        "why": why,
        "measured": bool(hw),
        "hardware": hw,
        "kernelfile": ctx.kf.digest,
        "toolchain": ctx.toolchain.key(),
        "run": ctx.run,
        "inputs": _inputs(ctx, t),
        "command": ctx.command or f"ptxbuild build {t}",
        "incomplete": f"{len(chosen)}/{len(probs)}"
        if interrupted
        else None,  # the manifest says so too
        "copy_tbps": ctx.gpu.copy_tbps if hw else None,
        "lessons_used": used_lessons,
        "lessons_shipped": shipped_among(ctx.cache, [u["lesson"] for u in used_lessons]),
        "remeasured": bool(hw) and ctx.remeasure,
        "problems_done": f"{len(chosen)}/{len(probs)}",
        "remeasured_only": list(ctx.remeasure_only) if hw and ctx.remeasure else [],
        # timed_since is only set by a resumed --remeasure build (hardware present)
        "timed_since": ctx.timed_since or (started if hw and ctx.remeasure else None),
        "remeasure_resumed": ctx.timed_since is not None,
        "protocol": keys.PROTOCOL_VERSION
        if hw
        else None,  # the timing protocol every timing here used
        "memcheck": memcheck_summary(memchecks) if hw else None,
        "environment": environment(ctx.kf.root),
    }  # where it ran: a report may be rewritten elsewhere
    # a stop keeps a complete old set: build/<target>/ is the old complete set or the new one
    manifest = write_artifacts(ctx.kf, t, gpu, op, chosen, summary, keep_complete=interrupted)
    m = assemble(ctx.kf, t, gpu, op, chosen, summary)[0]
    summary["report_manifest"] = {  # what the report needs travels with the cache (report.collect)
        "dispatch": m.get("dispatch", []),
        "variants": m.get("variants", {}),
    }
    summary["lessons_produced"] = lessons.derive(
        ctx.cache,
        op,
        t,
        ctx.run,
        {
            json.dumps(c["problem"], sort_keys=True): (c["params"], c["p50_ms"])
            for c in chosen
            if hw and c["params"] is not None
        },
        done={json.dumps(c["problem"], sort_keys=True) for c in chosen},
    )
    summary.update(gates.judge(spec, chosen, bool(hw)))
    status = "interrupted" if interrupted else ("failed" if not ok else "ok")
    ctx.cache.add_build(
        str(t),
        key,
        ctx.kf.digest,
        status,
        bool(hw),
        os.path.relpath(
            manifest, ctx.kf.root
        ),  # from the kernelfile's folder: a copy reads its own
        summary,
        ctx.kf.project,
    )
    write_report(ctx.kf, ctx.cache, t)
    if gpu_failure is not None or interrupted:
        raise gpu_failure or KeyboardInterrupt()
    reason = (
        f"no valid candidate for {sum(c['params'] is None for c in chosen)} problem(s)"
        if not ok
        else None
    )
    res = TargetResult(
        t,
        "failed" if reason else "built",
        reason or why,
        bool(hw),
        manifest,
        tuple(summary["gates"]["failures"]),
    )
    if irq.count:  # a stop held while this finished target was saved: the caller still locks it
        (stop := KeyboardInterrupt()).finished = [res]
        raise stop
    return res


MEMCHECK_TRIES = 3  # configs of one problem checked under memcheck before it has no valid candidate


def _memchecked(ctx: Context, ev, op, problem: Problem, hist: list, winner: tuple):
    """(the winner, or the next-fastest config in `hist` when memcheck reports an error in it, each
    failure recorded as the outcome `memcheck`; None when MEMCHECK_TRIES failed; and a note of what
    memcheck said). One call on at most memcheck.ROWS rows; cached in the verdicts table by binary,
    that problem, config and memcheck.VERSION; a run that could not happen is a note, never cached."""
    run, failed = getattr(ctx.gpu, "memcheck", None), set()
    for _ in range(MEMCHECK_TRIES):
        cfg = winner[0]
        ck = tuple(sorted(cfg.items()))
        binary = ev.binaries[ck]
        small = memcheck.small_problem(op, problem, cfg, binary.arch)
        key = digest("memcheck", binary.digest, small.key(), cfg, memcheck.VERSION)
        row = ctx.cache.get("verdicts", key)
        if row is None:
            if run is None:
                return winner, "memcheck: not run (this GPU session cannot)"
            outcome, detail = run(str(op.FOLDER), cfg, small, binary)
            if outcome is None:
                return winner, detail
            row = {
                "key": key,
                "binary": binary.digest,
                "suite": f"memcheck-{memcheck.VERSION}",
                "problem": json.dumps(small.key()),
                "outcome": outcome.value,
                "detail": detail,
                "cases": 1,
            }
            ctx.cache.put("verdicts", row)
        if row["outcome"] == Outcome.OK.value:
            return winner, f"memcheck: clean ({small.label()})"
        ev._record(cfg, Outcome(row["outcome"]), row["detail"], binary=binary.digest)
        failed.add(ck)
        winner = best([h for h in hist if tuple(sorted(h[0].items())) not in failed])
        if winner is None:
            break
    return None, f"memcheck: {len(failed)} config(s) rejected, no other candidate"


def memcheck_summary(notes: list[str]) -> str | None:
    """One line for the report: how many winners memcheck found clean, or why it did not run."""
    if not notes:
        return None
    clean = sum(n.startswith("memcheck: clean") for n in notes)
    others = sorted({n for n in notes if not n.startswith("memcheck: clean")})
    if not clean and len(others) == 1:
        return others[0]
    return "; ".join([f"memcheck: {clean} of {len(notes)} winners clean"] + others)


def remeasuring(ctx: Context, problem: Problem) -> bool:
    """Does this run time `problem` again (--remeasure, or --remeasure-only and its label matches)?"""
    return ctx.remeasure and (
        not ctx.remeasure_only or any(p in problem.label() for p in ctx.remeasure_only)
    )


def _must_time(ctx: Context, key: str, row: dict | None, problem: Problem) -> bool:
    """Time `key` now: never timed, timed out (the deadline may be the harness's: run 24a), or --remeasure and not
    timed in this run; a resumed --remeasure keeps its successful timings, not failed ones (maybe the SIGINT's)."""
    if row is None or row.get("outcome") == Outcome.TIMEOUT.value:
        return True
    if not remeasuring(ctx, problem) or key in ctx.timed:
        return False
    return not (
        ctx.timed_since is not None
        and (row.get("created") or 0) >= ctx.timed_since
        and row.get("outcome", "ok") == "ok"
    )


def resume_point(ctx: Context, t: Target) -> float | None:
    """When the last build of `t` was an interrupted --remeasure build, the time its timings began:
    a rerun with --remeasure keeps what that run timed and times only the rest."""
    last = ctx.cache.last_build(str(t), ctx.kf.project)
    if not last or last["status"] != "interrupted":
        return None
    summary = json.loads(last["summary"] or "{}")
    return summary.get("timed_since") if summary.get("remeasured") else None


def _baselines(ctx: Context, op, problem: Problem, hw: dict, winner: tuple[dict, Binary]) -> dict:
    """Reference implementations timed on this GPU, each in one window with the winner (its p50 there:
    winner_p50_ms); cached like a measurement (same GPU, problem, protocol, winner)."""
    key = digest(
        "baselines",
        hw,
        problem.key(),
        op.VERSION,
        getattr(op, "BASELINES_VERSION", ""),
        keys.PROTOCOL_VERSION,
        "beside",
        "rounds",
        winner[0],
        winner[1].digest,
    )
    row = ctx.cache.get("measurements", key)
    cached = None if _must_time(ctx, key, row, problem) else json.loads(row["detail"])
    ctx.timed.add(key)
    # caches written before the harness's failures stopped being cached hold them: measure again
    if cached is not None and not any(v["outcome"] in RETRY_BASELINE for v in cached.values()):
        return {n: {**v, "timed_at": row.get("created")} for n, v in cached.items()}
    ctx.report(
        "baselines_start", problem=problem
    )  # third-party code may compile or autotune for minutes
    out = {}
    for name, r in ctx.gpu.baselines(
        str(op.FOLDER), problem, winner=winner, budget_ms=200.0
    ).items():
        out[name] = {
            "outcome": r.outcome.value,
            "p50_ms": r.p50_ms,
            "p20_ms": r.p20_ms,
            "p80_ms": r.p80_ms,
            "samples": r.samples,
            "detail": r.detail,
            "winner_p50_ms": r.incumbent_p50_ms,
            "round_ratios": list(r.round_ratios),
        }
    if any(v["outcome"] in RETRY_BASELINE for v in out.values()):
        return out  # the harness failed (out of memory, a crash, a hang): measure again next build
    created = ctx.cache.put(
        "measurements",
        {
            "key": key,
            "binary": "baselines",
            "fingerprint": json.dumps(hw, sort_keys=True),
            "problem": json.dumps(problem.key()),
            "outcome": "ok",
            "detail": json.dumps(out),
        },
    )
    return {n: {**v, "timed_at": created} for n, v in out.items()}


# baseline outcomes that say the run failed, not the baseline: not cached
RETRY_BASELINE = {
    o.value
    for o in (
        Outcome.LAUNCH_ERROR,
        Outcome.TIMEOUT,
        Outcome.WORKER_CRASH,
        Outcome.ILLEGAL_ADDRESS,
        Outcome.RESOURCE,
    )
}


def _dedupe(cfgs: list[dict]) -> list[dict]:
    first: dict[str, dict] = {}
    for c in cfgs:
        first.setdefault(json.dumps(c, sort_keys=True), c)
    return list(first.values())
