"""One candidate config of one problem: render, compile, resources, verify, time, each through its key."""

from __future__ import annotations

import json
import math
import time

from .. import keys
from ..compile.compiler import CompileError, with_resources
from ..declare.graph import Target
from ..outcome import Outcome
from ..problem import Binary, Kernel, Problem
from ..store import lessons
from .context import Context, must_time

REGISTERS_PER_SM = 65536
# what the cache's verdicts and measurements keep of a VerifyResult / MeasureResult, by name
VERDICT_FIELDS = ("detail", "max_abs_err", "max_rel_err", "cases", "seconds")
MEASUREMENT_FIELDS = ("p50_ms", "p20_ms", "p80_ms", "samples", "floor_ms")


class Evaluator:
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
            res = compile_one(self.ctx.compile_fn, kernel, self.gpu.arch)
            return lambda: res
        return self.pool.submit(compile_one, self.ctx.compile_fn, kernel, self.gpu.arch)

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
        row["id"] = self.ctx.cache.add_attempt(**row)  # the evidence a lesson names
        # compile-only (no p50_ms): every config that passes scores the same; seeds come first
        score = (extra.get("p50_ms") or 0.0) if outcome is Outcome.OK else math.inf
        self.results[tuple(sorted(cfg.items()))] = {**row, "score": score}
        self.ctx.report(
            "attempt", target=self.t, problem=self.problem, params=cfg, outcome=outcome, score=score
        )
        return score

    def _finish(self, cfg, kernel, key_or_reason, compiled, rows) -> float:
        if kernel is None:
            pruned = tuple(sorted(cfg.items())) in self.pruned
            return self._record(cfg, Outcome.PRUNED if pruned else Outcome.INVALID, key_or_reason)
        binary, error = rows[key_or_reason]
        compile_s = compiled.get(key_or_reason, 0.0)
        if binary is None:
            return self._record(cfg, Outcome.COMPILE_ERROR, error, compile_s=compile_s)
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
                **{k: getattr(v, k) for k in VERDICT_FIELDS},
            }
            cache.put("verdicts", verdict)
        res["verify_s"] = verdict["seconds"]
        if verdict["outcome"] != "ok":
            return self._record(cfg, Outcome(verdict["outcome"]), verdict["detail"], **res)
        mkey = keys.measure_key(binary.digest, self.hw, problem, cfg)
        m = cache.get("measurements", mkey)
        if must_time(self.ctx, mkey, m, problem):
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
                **{k: getattr(r, k) for k in MEASUREMENT_FIELDS},
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


def compile_one(compile_fn, kernel: Kernel, arch: str):
    t0 = time.perf_counter()
    try:
        return compile_fn(kernel, arch), "", time.perf_counter() - t0
    except CompileError as exc:
        return None, str(exc)[:4000], time.perf_counter() - t0
