"""What a build run knows: the kernelfile, the cache, the compile stage, maybe a GPU."""

from __future__ import annotations

import importlib.util
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..compile.compiler import compile_kernel
from ..declare.memo import book, code_digest, digest
from ..errors import ConfigError, ToolError
from ..outcome import Outcome
from ..problem import Binary, Kernel, Problem


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
    run: str = field(default_factory=lambda: os.urandom(6).hex())  # a run's id (12 hex digits)
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
    op_files: dict = field(default_factory=dict)  # template -> oploader.OpFiles (build/plan.py)
    proposers: tuple = ()  # `ptxbuild try --proposer`: proposer commands instead of the kernelfile's
    rounds: int = 0  # and their rounds a problem (0: the kernelfile's)
    # several GPUs (ptxbuild/cluster: local workers or Ray actors), each with ctx.gpu's methods: a
    # measured target's problems are spread over those of its fingerprint (build/spread.py)
    lanes: list = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)  # set: spread work stops

    def close(self) -> None:
        """Stop the GPU workers, if this context started any."""
        for g in self.lanes or ([self.gpu] if self.gpu is not None else []):
            g.close()


def hardware_for(ctx: Context, gpu) -> dict | None:
    """The fingerprint of the GPU present if it is this target's GPU (or its model), else None; of
    several (ctx.lanes), the first one's that is."""
    if ctx.gpu_match is None:
        return None
    for g in ctx.lanes or ([ctx.gpu] if ctx.gpu is not None else []):
        if ctx.gpu_match(g.fingerprint, gpu) in ("exact", "model"):
            return g.fingerprint.key()
    return None


def remeasuring(ctx: Context, problem: Problem) -> bool:
    """Does this run time `problem` again (--remeasure, or --remeasure-only and its label matches)?"""
    return ctx.remeasure and (
        not ctx.remeasure_only or any(p in problem.label() for p in ctx.remeasure_only)
    )


def must_time(ctx: Context, key: str, row: dict | None, problem: Problem) -> bool:
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


def target_op(ctx: Context, t) -> Any:
    """The op a build of target `t` runs: its template's, serving proposed sources too."""
    from ..oploader import load_op
    from ..search.proposals import with_sources

    return with_sources(load_op(ctx.kf.ops[t.op].template, ctx.kf.root), ctx.kf.root)


class NoCache:
    """The cache of a plan where there is none yet: nothing was ever built."""

    def last_build(self, target: str, project: str = "") -> None:
        return None


def open_context(
    kf, jobs: int | None, use_gpu: bool, report, dry: bool = False, command: str = "", say=print
) -> Context:
    """A Context for `kf`: the toolchain (ToolchainMissing if none), the cache (dry, as for plan: an
    in-memory one where there is none yet), the shared lessons file imported into a new cache, and
    the GPU worker where one is present and `use_gpu`; `say` gets the lines a user should see."""
    from ..compile.compiler import toolchain
    from ..store.cache import Cache

    tc = toolchain()
    cache = NoCache() if dry and not kf.cache_path.exists() else Cache(kf.cache_path)
    ctx = Context(kf=kf, cache=cache, toolchain=tc, report=report, command=command)
    shared = kf.cache_path.parent / "lessons.jsonl"
    counts = None if dry else _import_shared(kf, ctx.cache, shared)
    if counts:
        src = Path(counts["from"])
        where = src.relative_to(kf.root) if src.is_relative_to(kf.root) else counts["from"]
        say(f"lessons: imported {counts['added']} from {where} into a new cache")
    if jobs:
        ctx.jobs = jobs
    if use_gpu and importlib.util.find_spec("cupy") is not None:  # the GPU side needs cupy
        _attach_gpu(ctx, say)
    return ctx


def host_gpus(root: Path = Path("/proc/driver/nvidia")) -> str | None:
    """What identifies this machine's GPUs without starting CUDA: the NVIDIA driver's files (its
    version, each GPU's information), CUDA_VISIBLE_DEVICES, the cupy installed and ptxbuild's code;
    None where the driver shows no GPU. The key of the fingerprint the last worker here read."""
    try:
        infos = sorted((root / "gpus").glob("*/information"))
        parts = [(root / "version").read_text(), *(p.read_text() for p in infos)]
    except OSError:
        return None
    if not infos:
        return None
    spec = importlib.util.find_spec("cupy")
    origin = spec.origin if spec and spec.origin else ""
    cupy = [origin, os.stat(origin).st_mtime_ns if origin else 0]
    return digest(parts, os.environ.get("CUDA_VISIBLE_DEVICES"), cupy, code_digest())


class LazyGpu:
    """The GPU worker, started at its first use (a stale target's verify or measure): until then,
    as for `plan` and a no-op build (~2 s less on an H200), only the fingerprint that the last
    worker on these GPUs read. A worker that reads another one stops the command."""

    def __init__(self, fingerprint, start: Callable[[], Any]) -> None:
        self.fingerprint, self._start, self._real = fingerprint, start, None
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        with self._lock:
            if self._real is None:
                real = self._start()
                if real.fingerprint != self.fingerprint:  # never used: keys hold the other one
                    real.close()
                    raise ToolError(
                        f"this GPU is now {real.fingerprint}, not the {self.fingerprint} "
                        "the command started with: run it again"
                    )
                self._real = real
        return getattr(self._real, name)

    def close(self) -> None:
        if self._real is not None:
            self._real.close()


def _attach_gpu(ctx: Context, say) -> None:
    """ctx.gpu: the worker (LazyGpu where these GPUs' fingerprint is known) and ctx.gpu_match."""
    host, memo = host_gpus(), book("gpus")
    known = memo.get("fingerprint", host) if host else None

    def start():
        from ..gpu import GpuSession
        from ..gpu.session import GpuError

        say("gpu: starting the worker and measuring copy bandwidth ...")
        try:
            gpu = GpuSession()
        except GpuError as exc:
            raise ToolError(f"{exc}; or build without it: ptxbuild build --no-gpu") from exc
        say(f"gpu: {gpu.fingerprint}; copy bandwidth {gpu.copy_tbps:.2f} TB/s")
        if host:
            memo.put("fingerprint", host, gpu.fingerprint.key())
        return gpu

    if known is not None:
        from ..gpu.fingerprint import Fingerprint, match_gpu

        ctx.gpu = LazyGpu(Fingerprint(**known), start)
    else:
        try:
            from ..gpu import gpu_available, match_gpu
        except ImportError:
            return
        if not gpu_available():
            return
        ctx.gpu = start()
    ctx.gpu_match = lambda fp, gpu: match_gpu(
        fp, gpu.name, {**gpu.as_dict(), "models": [gpu.model]}
    )


def _import_shared(kf, cache, shared):
    """The shared lessons file (or those ptxbuild ships, where an op is one of its own) merged into
    a new cache; lessons_io and its pydantic models are imported only here (`plan` reads none)."""
    from ..oploader import from_shipped

    shipped = any(from_shipped(spec.template, kf.root) for spec in kf.ops.values())
    if cache.lesson_count() or not (shared.is_file() or shipped):  # import_shared's own tests,
        return None  # before its pydantic models load
    from ..store.lessons_io import LessonsFileError, import_shared

    try:
        return import_shared(cache, shared, shipped)
    except LessonsFileError as exc:
        raise ConfigError(f"{exc}; fix or remove {shared.name}") from None
