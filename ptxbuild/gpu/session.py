"""GpuSession: the build's handle on one GPU worker; crashes and hangs come back as outcomes."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import GpuError
from ..outcome import Outcome
from ..problem import Binary, Problem
from .fingerprint import Fingerprint
from .process import Child, WorkerDied
from .worker import encode_binary, encode_config, encode_problem


class LaneLost(GpuError):
    """One GPU of several is gone for good (its Ray actor or node died and did not come back): the
    task it ran goes to another GPU; with no GPU left it stops the build like any GpuError."""


@dataclass(frozen=True)
class VerifyResult:
    outcome: Outcome
    detail: str = ""
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    cases: int = 0
    seconds: float = 0.0
    seeds: tuple = ()
    tolerances: dict = field(
        default_factory=dict
    )  # output -> [atol, rtol]: part of the verdict's cache key
    shapes: tuple = ()  # every shape verified (ptxbuild/coverage.py says what they cover)


@dataclass(frozen=True)
class MeasureResult:
    outcome: Outcome
    p50_ms: float = float("nan")
    p20_ms: float = float("nan")
    p80_ms: float = float("nan")
    samples: int = 0
    floor_ms: float = 0.0
    fraction_of_floor: float = 0.0  # floor_ms / p50_ms: 1.0 is copy bandwidth
    incumbent_p50_ms: float | None = None
    round_ratios: tuple = ()  # beside an incumbent: p50 / its p50, round by round
    detail: str = ""
    fingerprint: Fingerprint | None = None


def _result(cls, reply: dict, **given):
    """A `cls` result from the worker's reply: its outcome, the fields the reply has, `given`."""
    fields = {k: reply[k] for k in cls.__dataclass_fields__ if k in reply}
    return cls(**{**fields, "outcome": Outcome(reply["outcome"]), **given})


def _worker_env() -> dict:
    env = dict(os.environ)
    here = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = here + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


# Baselines are third-party code that compiles on first use (torch.compile, Triton autotuning in flash-linear-attention:
# tens of seconds per new shape on a cold machine), so their call may outlast a candidate's; a hang is still cut off.
BASELINES_TIMEOUT_S = 600.0


class GpuSession:
    """Owns one worker process bound to one GPU. Every call returns a result; a crash or hang is recorded
    (ILLEGAL_ADDRESS / TIMEOUT / WORKER_CRASH), the worker is killed and the next call starts a fresh one."""

    def __init__(
        self,
        device: int = 0,
        timeout_s: float = 60.0,
        *,
        root: str | Path | None = None,
        argv: list[str] | None = None,
        startup_timeout_s: float = 180.0,
        env: dict | None = None,
    ):
        """`env`: variables set for the worker (and memcheck) beyond this process's, e.g.
        CUDA_VISIBLE_DEVICES to pin it to one GPU of several (then `device` 0 is that GPU)."""
        self.device, self.timeout_s, self.startup_timeout_s = device, timeout_s, startup_timeout_s
        self.root = str(Path(root or os.getcwd()).resolve())
        self.env = {**_worker_env(), **(env or {})}
        self.child = Child(
            argv or [sys.executable, "-m", "ptxbuild.gpu.worker", "--device", str(device)],
            env=self.env,
        )
        self.restarts = 0
        try:
            hello = self._call("hello", {}, startup_timeout_s)
            copy = self._call("copy_bandwidth", {}, startup_timeout_s)
            for r in (hello, copy):
                if "cuda_error" in r:
                    raise GpuError(r["cuda_error"]["detail"])
            self.fingerprint, self.copy_tbps = (
                Fingerprint(**hello["fingerprint"]),
                float(copy["tbps"]),
            )
        except (WorkerDied, GpuError) as exc:
            self.child.close()
            raise GpuError(f"the GPU worker did not start ({exc}); run `ptxbuild doctor`") from None

    def _call(self, cmd: str, args: dict, timeout_s: float) -> dict:
        """One request. Raises WorkerDied (crash/timeout) or GpuError; a CUDA error comes back as {"cuda_error"}."""
        if not self.child.alive and self.child.starts:
            self.restarts += 1
            try:  # start the replacement outside the candidate's deadline
                self.child.request({"cmd": "hello", "args": {}}, self.startup_timeout_s)
            except WorkerDied as exc:
                raise GpuError(f"the GPU worker does not restart: {exc}") from None
        reply = self.child.request({"cmd": cmd, "args": args}, timeout_s)
        if reply.get("fatal"):
            self.child.kill()
        if reply.get("ok"):
            return reply["result"]
        if "cuda_error" in reply:
            return {"cuda_error": reply["cuda_error"]}
        raise GpuError(f"{cmd} failed in the GPU worker:\n{reply.get('error', reply)}")

    def _run(self, cmd: str, args: dict, timeout_s: float | None = None) -> tuple[dict, float]:
        """(reply or {"outcome", "detail"} for a crash/hang/CUDA error, seconds)."""
        t0 = time.perf_counter()
        try:
            r = self._call(cmd, args, timeout_s or self.timeout_s)
            r = r.get("cuda_error", r)
        except WorkerDied as exc:
            illegal = "illegal memory access" in exc.detail or "ILLEGAL_ADDRESS" in exc.detail
            crash = Outcome.ILLEGAL_ADDRESS if illegal else Outcome.WORKER_CRASH
            outcome = Outcome.TIMEOUT if exc.kind == "timeout" else crash
            r = {"outcome": outcome.value, "detail": exc.detail}
        return r, time.perf_counter() - t0

    def _job(self, op_folder: str, problem: Problem, **args) -> dict:
        """A request's arguments: the op's folder (resolved where it is one), the root, the problem
        and `args`, a Binary among them encoded."""
        p = Path(op_folder)
        folder = str(p.resolve()) if p.is_dir() else op_folder
        if "binary" in args:
            args["binary"] = encode_binary(args["binary"])
        return {"op_folder": folder, "root": self.root, "problem": encode_problem(problem), **args}

    def verify(
        self,
        op_folder: str,
        params: dict,
        problem: Problem,
        binary: Binary,
        seeds: list | None = None,
    ) -> VerifyResult:
        r, s = self._run(
            "verify", self._job(op_folder, problem, params=params, binary=binary, seeds=seeds)
        )
        return _result(
            VerifyResult,
            r,
            seconds=s,
            seeds=tuple(r.get("seeds", ())),
            shapes=tuple(tuple(x) for x in r.get("shapes", ())),
        )

    def _measure_result(self, r: dict) -> MeasureResult:
        return _result(MeasureResult, r, fingerprint=self.fingerprint)

    def measure(
        self,
        op_folder: str,
        params: dict,
        problem: Problem,
        binary: Binary,
        incumbent: tuple[dict, Binary] | None = None,
        warmup_ms: float = 20.0,
        budget_ms: float = 100.0,
    ) -> MeasureResult:
        args = self._job(
            op_folder,
            problem,
            params=params,
            binary=binary,
            copy_tbps=self.copy_tbps,
            warmup_ms=warmup_ms,
            budget_ms=budget_ms,
            incumbent=encode_config(incumbent),
        )
        return self._measure_result(self._run("measure", args)[0])

    def baselines(
        self,
        op_folder: str,
        problem: Problem,
        winner: tuple[dict, Binary] | None = None,
        warmup_ms: float = 20.0,
        budget_ms: float = 100.0,
    ) -> dict[str, MeasureResult]:
        """Baselines timed; with `winner`, each in one window with the winner (incumbent_p50_ms: the winner's)."""
        args = self._job(
            op_folder,
            problem,
            copy_tbps=self.copy_tbps,
            warmup_ms=warmup_ms,
            budget_ms=budget_ms,
            winner=encode_config(winner),
        )
        r, _ = self._run("baselines", args, max(self.timeout_s, BASELINES_TIMEOUT_S))
        if "outcome" in r and isinstance(r["outcome"], str):  # the whole call crashed or hung
            return {"*": self._measure_result(r)}
        return {name: self._measure_result(v) for name, v in r.items()}

    def memcheck(
        self, op_folder: str, params: dict, problem: Problem, binary: Binary
    ) -> tuple[Outcome | None, str]:
        """The candidate run once under compute-sanitizer memcheck (gpu/memcheck.py), on this GPU:
        (Outcome.OK, ""), (Outcome.MEMCHECK, the report's first line) or (None, why it did not run)."""
        from . import memcheck

        if os.environ.get("PTXBUILD_MEMCHECK") == "0":  # ~10 s a winner: a quick run may skip it
            return None, "memcheck: not run (PTXBUILD_MEMCHECK=0)"
        job = self._job(op_folder, problem, params=params, binary=binary)
        r = memcheck.run([job], device=self.device, env=self.env)[0]
        if r["outcome"] == "not_run":
            return None, r["detail"]
        return Outcome(r["outcome"]), r["detail"]

    def abort(self) -> None:
        """Kill the worker now, from any thread: a call in flight in another thread returns as a
        crash (a stopping build discards it); the next call would start a fresh worker."""
        self.child.kill()

    def close(self) -> None:
        self.child.close()

    def __enter__(self) -> GpuSession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
