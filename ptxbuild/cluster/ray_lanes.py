"""The GPUs of a Ray cluster as lanes: one actor per GPU (num_gpus=1, so Ray pins it with
CUDA_VISIBLE_DEVICES), each holding its own isolated GpuSession worker. A candidate that crashes
the worker is an outcome, as on one GPU (the session restarts it); an actor or node that dies is
not the candidate's: Ray starts a new actor and makes the call again there, once; a GPU lost again
(or whose new actor has another GPU) leaves the build (LaneLost) and its problem goes on on another.
Every node needs the project at the driver's path (a shared file system, or one checkout path)."""

from __future__ import annotations

import os
import re
import socket
from contextlib import suppress
from functools import partialmethod

from ..errors import ToolError
from ..gpu.session import GpuError, GpuSession, LaneLost


class GpuActor:
    """Runs on one GPU of the cluster (a Ray actor: see ray_lanes)."""

    def __init__(self, session: dict):
        self.session = GpuSession(**session)

    def call(self, name: str, args: tuple, kwargs: dict, expect=None):
        """(this actor's pid, the session's answer); a restarted actor on another GPU refuses."""
        s = self.session
        if expect is not None and s.fingerprint != expect:
            raise LaneLost(f"the new actor has another GPU ({s.fingerprint})")
        if name == "hello":
            where = f"{socket.gethostname()} GPU {os.environ.get('CUDA_VISIBLE_DEVICES', '?')}"
            return os.getpid(), (s.fingerprint, s.copy_tbps, where)
        return os.getpid(), getattr(s, name)(*args, **kwargs)


def connected() -> bool:
    """Is this process connected to a Ray cluster (False without Ray)?"""
    try:
        import ray
    except ImportError:
        return False
    return ray.is_initialized()


def shutdown() -> None:
    """Leave the cluster (a Ray instance this process started stops with it)."""
    if connected():
        import ray

        ray.shutdown()


def connect(address: str):
    """Ray, connected to the cluster at `address` ("auto": the running one, else a new one on this
    machine); ToolError without Ray or when it cannot connect."""
    try:
        import ray
    except ImportError:
        raise ToolError("--cluster needs Ray: pip install 'ptxbuild[cluster]'") from None
    try:
        if not ray.is_initialized():
            try:
                ray.init(address=address, log_to_driver=False)
            except ConnectionError:
                if address != "auto":
                    raise
                ray.init(include_dashboard=False, log_to_driver=False)
        ray.cluster_resources()
    except Exception as exc:  # noqa: BLE001 - Ray's own errors: one line
        raise ToolError(f"--cluster {address}: Ray could not connect: {_line(exc)}") from None
    return ray


def gpus_of(address: str) -> list[tuple[str, int]]:
    """(node, GPUs) of each live node of the cluster, as `ptxbuild doctor --cluster` lists them."""
    ray = connect(address)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    return [(n["NodeManagerAddress"], int(n["Resources"].get("GPU", 0))) for n in nodes]


def ray_lanes(address: str, n: int | None, note=print, startup_s: float = 300.0, **session):
    """`n` GPU actors of the Ray cluster at `address` (all of its GPUs when None; "auto": the
    running cluster, else a new one on this machine); `session`: each actor's GpuSession keywords."""
    ray = connect(address)
    total = int(ray.cluster_resources().get("GPU", 0))
    if total < 1 or (n or 0) > total:
        raise ToolError(f"--cluster {address}: the cluster has {total} GPU(s)")
    actor = ray.remote(num_gpus=1, num_cpus=0, max_restarts=1, max_task_retries=1)(GpuActor)
    actors = [actor.remote({"root": os.getcwd(), **session}) for _ in range(n or total)]
    try:
        return [RayLane(ray, a, note, startup_s) for a in actors]
    except Exception as exc:  # noqa: BLE001 - one that did not start: none are kept
        for a in actors:
            with suppress(Exception):
                ray.kill(a, no_restart=True)
        raise ToolError(f"a GPU actor of the cluster did not start: {_line(exc)}") from None


class RayLane:
    """One GPU of the cluster through its actor: GpuSession's methods, each a remote call."""

    def __init__(self, ray, actor, note, startup_s: float):
        self.ray, self.actor, self.note, self.restarts, self.aborted = ray, actor, note, 0, False
        self.pid, hello = ray.get(actor.call.remote("hello", (), {}), timeout=startup_s)
        self.fingerprint, self.copy_tbps, self.where = hello

    def _call(self, name: str, *args, **kwargs):
        ex = self.ray.exceptions
        try:
            pid, r = self.ray.get(self.actor.call.remote(name, args, kwargs, self.fingerprint))
        except ex.RayTaskError as exc:  # the session raised: a GpuError, as on one GPU
            cause = getattr(exc, "cause", None)
            raise cause if isinstance(cause, GpuError) else GpuError(_line(exc)) from None
        except ex.RayActorError as exc:
            lost = GpuError if self.aborted else LaneLost
            raise lost(f"{self.where}: lost ({_line(exc)})") from None
        if pid != self.pid:
            self.pid, self.restarts = pid, self.restarts + 1
            self.note(
                f"{self.where}: its actor died during {name}; Ray made the call again on a new one"
            )
        return r

    verify = partialmethod(_call, "verify")
    measure = partialmethod(_call, "measure")
    baselines = partialmethod(_call, "baselines")
    memcheck = partialmethod(_call, "memcheck")

    def abort(self) -> None:
        """Stop now, from any thread: the actor is killed and a call in flight raises GpuError."""
        self.aborted = True
        with suppress(Exception):
            self.ray.kill(self.actor, no_restart=True)

    def close(self) -> None:
        if not self.aborted:
            with suppress(Exception):
                self.ray.get(self.actor.call.remote("close", (), {}), timeout=30)
        self.abort()


def _line(exc: BaseException) -> str:
    """One line for a Ray error: the GpuError in it where there is one, and the root cause (the
    last `...Error: ` line of a remote traceback)."""
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    head = next((x.split("GpuError: ", 1)[1] for x in lines if "GpuError: " in x), lines[0])
    root = next(
        (x.strip() for x in reversed(lines) if re.match(r"\s*[\w.]+(Error|Exception): ", x)), ""
    )
    return (head if not root or root in head else f"{head} ... {root}")[:400]
