"""A stand-in GPU worker for CPU tests: the real request loop (ptxbuild.gpu.worker.serve) over a fake GPU
whose verify() crashes, hangs or raises CUDA errors on demand (params["mode"]).

Times are params["ms"], else a function of the toy op's config (threads=256, vec=4 fastest), so
that a build's winners are known. For the cluster tests (tests/test_cluster.py), from the
environment: PTXBUILD_FAKE_LOG=FILE appends one JSON line per verify and measure (which worker,
pinned to which GPU, on what); PTXBUILD_FAKE_DELAY_S=S sleeps S per verify;
PTXBUILD_FAKE_KILL_PARENT=FILE:N: a worker that has answered two verifies kills its parent (the Ray
actor holding its session, as a lost node would) and itself, N times in all (FILE.0 ... FILE.N-1)."""

import json
import os
import signal
import sys
import time

from ptxbuild.gpu import stats
from ptxbuild.gpu.fingerprint import Fingerprint
from ptxbuild.gpu.worker import serve
from ptxbuild.launch import NotResident


class CUDARuntimeError(RuntimeError):
    """Named like cupy's, so the worker treats it as a CUDA error."""


def _ms(params) -> float:
    if "ms" in params:
        return float(params["ms"])
    threads, vec = params.get("threads", 256), params.get("vec", 4)
    return 2.0 * (1 + abs(threads - 256) / 64 + (4 - vec))


def _log(cmd, problem, params) -> None:
    if path := os.environ.get("PTXBUILD_FAKE_LOG"):
        line = {
            "cmd": cmd,
            "pid": os.getpid(),
            "parent": os.getppid(),
            "gpu": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "problem": [problem.dtype, list(problem.shape)],
            "params": params,
        }
        with open(path, "a") as f:
            f.write(json.dumps(line, sort_keys=True) + "\n")


def _kill_parent_maybe(answered: int) -> None:
    spec = os.environ.get("PTXBUILD_FAKE_KILL_PARENT")
    if not spec or answered < 2:
        return
    path, times = spec.rsplit(":", 1)
    for k in range(int(times)):  # kill k is the one worker's that creates FILE.k (atomically)
        try:
            fd = os.open(f"{path}.{k}", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            continue
        os.write(fd, f"{os.getppid()}\n".encode())
        os.close(fd)
        os.kill(os.getppid(), signal.SIGKILL)
        os._exit(1)


class FakeGpu:
    def __init__(self, device):
        self.answered = 0
        self.fingerprint = Fingerprint(
            "NVIDIA H200",
            "sm_90",
            132,
            150_000_000_000,
            50 << 20,
            1980,
            3201,
            "580.95.05",
            "13.0",
            "13.0",
        )

    def copy_bandwidth(self):
        return 4.25

    def verify(self, op_folder, root, params, problem, binary, seeds=None):
        mode = params.get("mode", "ok")
        if mode == "crash":
            os._exit(1)
        if mode == "crash_illegal":
            sys.stderr.write("CUDA error: an illegal memory access was encountered\n")
            sys.stderr.flush()
            os._exit(134)
        if mode == "hang":
            time.sleep(1000)
        if mode == "illegal":
            raise CUDARuntimeError(
                "cudaErrorIllegalAddress: an illegal memory access was encountered"
            )
        if mode == "resources":
            raise CUDARuntimeError(
                "cudaErrorLaunchOutOfResources: too many resources requested for launch"
            )
        if mode == "not_resident":  # as launch.resident_grid says it of a cluster too large to fit
            raise NotResident(
                "no cluster of 16 CTAs x (512, 1, 1) threads can be resident on this GPU"
            )
        if mode == "bug":
            raise ValueError("the op's reference raised")
        _kill_parent_maybe(self.answered)
        time.sleep(float(os.environ.get("PTXBUILD_FAKE_DELAY_S", "0")))
        _log("verify", problem, params)
        self.answered += 1
        return {
            "outcome": "ok",
            "detail": f"pid {os.getpid()}",
            "cases": 4,
            "max_abs_err": 0.0,
            "max_rel_err": 0.0,
            "seeds": seeds or [1, 2, 3],
            "tolerances": {"y": [1e-6, 1e-6]},
        }

    def measure(
        self, op_folder, root, params, problem, binary, incumbent, copy_tbps, warmup_ms, budget_ms
    ):
        _log("measure", problem, params)
        return stats.summarize([_ms(params)] * 10, stats.floor_ms(4_250_000_000, copy_tbps))

    def baselines(self, op_folder, root, problem, copy_tbps, warmup_ms, budget_ms, winner=None):
        _log("baselines", problem, winner[0] if winner else None)
        eager = stats.summarize([3.0] * 10, stats.floor_ms(4_250_000_000, copy_tbps))
        return {"eager": {**eager, "incumbent_p50_ms": _ms(winner[0]) if winner else None}}


if __name__ == "__main__":
    sys.exit(serve(0, make_gpu=FakeGpu))
