"""The GPUs of a Ray cluster as lanes: one actor per GPU (num_gpus=1, so Ray pins it with
CUDA_VISIBLE_DEVICES), each holding its own isolated GpuSession worker. A candidate that crashes
the worker is an outcome, as on one GPU (the session restarts it); an actor or node that dies is
not the candidate's: the call runs again on a new actor, and a GPU lost twice leaves the build
(LaneLost), its problem going to another GPU. Every node needs the project at the driver's path."""

from __future__ import annotations

import os
import socket
from contextlib import suppress

from ..errors import ToolError
from ..gpu.session import GpuError, GpuSession, LaneLost

INSTALL = "pip install 'ptxbuild[cluster]'"


class GpuActor:
    """Runs on a GPU of the cluster (made a Ray actor by _actor_class)."""

    def __init__(self, session: dict):
        self.session = GpuSession(**session)

    def hello(self) -> dict:
        return {
            "fingerprint": self.session.fingerprint,
            "copy_tbps": self.session.copy_tbps,
            "where": f"{socket.gethostname()} GPU {os.environ.get('CUDA_VISIBLE_DEVICES', '?')}",
            "pid": os.getpid(),
        }

    def call(self, name: str, args: tuple, kwargs: dict):
        return getattr(self.session, name)(*args, **kwargs)

    def close(self) -> None:
        self.session.close()


_ACTOR = None


def _actor_class():
    global _ACTOR
    if _ACTOR is None:
        import ray

        _ACTOR = ray.remote(num_gpus=1, num_cpus=0, max_restarts=0)(GpuActor)
    return _ACTOR


def connect(address: str):
    """Ray, connected: "auto" joins the running cluster (RAY_ADDRESS, or one `ray start` made
    here) and starts one on this machine where there is none; any other value is an address."""
    try:
        import ray
    except ImportError:
        raise ToolError(f"--cluster needs Ray: {INSTALL}") from None
    if ray.is_initialized():
        return ray
    try:
        if address == "auto":
            try:
                ray.init(address="auto", log_to_driver=False)
            except ConnectionError:
                ray.init(include_dashboard=False, log_to_driver=False)
        else:
            ray.init(address=address, log_to_driver=False)
    except Exception as exc:  # noqa: BLE001 - Ray's own errors: one line, the way out
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ToolError(f"--cluster {address}: Ray could not connect: {first}") from None
    return ray


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


def ray_lanes(
    address: str,
    n: int | None,
    note=lambda m: None,
    startup_timeout_s: float = 300.0,
    **session,
) -> list[RayLane]:
    """`n` GPU actors of the cluster at `address` (all of its GPUs when None); `session`: the
    keywords of each actor's GpuSession (argv: another worker, as the tests' fake one)."""
    ray = connect(address)
    total = int(ray.cluster_resources().get("GPU", 0))
    if total < 1 or (n is not None and n > total):
        raise ToolError(
            f"--cluster {address}: the cluster has {total} GPU(s)"
            + (f"; ask for at most {total} with --gpus" if total else "; start its nodes with GPUs")
        )
    session = {"root": os.getcwd(), **session}
    make = _actor_class()
    actors = [make.remote(session) for _ in range(n or total)]
    lanes = []
    try:
        for a in actors:  # started side by side, greeted in order
            lanes.append(RayLane(lambda: make.remote(session), note, startup_timeout_s, a))
    except BaseException:
        for a in actors:
            with suppress(Exception):
                ray.kill(a, no_restart=True)
        raise
    return lanes


class RayLane:
    """One GPU of the cluster through its actor; GpuSession's methods, each a remote call."""

    def __init__(self, make, note, startup_timeout_s: float, actor=None):
        import ray

        self.ray, self.make, self.note, self.startup_timeout_s = ray, make, note, startup_timeout_s
        self.restarts, self.aborted = 0, False
        self.fingerprint = None
        self._greet(actor or make())

    def _greet(self, actor) -> None:
        """Take `actor` as this lane's; ToolError (first one) or LaneLost (a new one) if it does not
        answer, or answers from a GPU of another fingerprint than the lane's first one."""
        ex = self.ray.exceptions
        try:
            info = self.ray.get(actor.hello.remote(), timeout=self.startup_timeout_s)
        except (ex.GetTimeoutError, ex.RayActorError, ex.RayTaskError) as exc:
            with suppress(Exception):
                self.ray.kill(actor, no_restart=True)
            why = _first_line(exc)
            if self.fingerprint is None:
                raise ToolError(f"a GPU actor of the cluster did not start: {why}") from None
            raise LaneLost(f"{self.where}: no new GPU actor ({why})") from None
        if self.fingerprint is not None and info["fingerprint"] != self.fingerprint:
            self.ray.kill(actor, no_restart=True)
            raise LaneLost(f"{self.where}: the new actor has another GPU ({info['fingerprint']})")
        self.actor, self.fingerprint, self.copy_tbps = actor, info["fingerprint"], info["copy_tbps"]
        self.where, self.pid = info["where"], info["pid"]

    def _call(self, name: str, *args, **kwargs):
        ex = self.ray.exceptions
        for again in (False, True):
            if self.aborted:
                raise GpuError(f"{self.where}: stopped")
            try:
                return self.ray.get(self.actor.call.remote(name, args, kwargs))
            except ex.RayTaskError as exc:  # the session raised: GpuError, as on one GPU
                cause = getattr(exc, "cause", None)
                raise GpuError(f"{self.where}: {cause or _first_line(exc)}") from None
            except ex.RayActorError as exc:
                if self.aborted:
                    raise GpuError(f"{self.where}: stopped") from None
                if again:
                    raise LaneLost(f"{self.where}: lost twice ({_first_line(exc)})") from None
                self.restarts += 1
                self.note(
                    f"{self.where}: its actor died during {name} ({_first_line(exc)}); "
                    "calling again on a new one"
                )
                self._greet(self.make())

    def verify(self, *a, **k):
        return self._call("verify", *a, **k)

    def measure(self, *a, **k):
        return self._call("measure", *a, **k)

    def baselines(self, *a, **k):
        return self._call("baselines", *a, **k)

    def memcheck(self, *a, **k):
        return self._call("memcheck", *a, **k)

    def abort(self) -> None:
        """Stop now, from any thread: the actor is killed and a call in flight raises GpuError."""
        self.aborted = True
        with suppress(Exception):
            self.ray.kill(self.actor, no_restart=True)

    def close(self) -> None:
        if not self.aborted:
            with suppress(Exception):
                self.ray.get(self.actor.close.remote(), timeout=30)
        self.abort()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__
