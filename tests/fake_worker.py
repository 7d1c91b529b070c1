"""A stand-in GPU worker for CPU tests: the real request loop (ptxbuild.gpu.worker.serve) over a fake GPU
whose verify() crashes, hangs or raises CUDA errors on demand (params["mode"])."""

import os
import sys
import time

from ptxbuild.gpu import stats
from ptxbuild.gpu.fingerprint import Fingerprint
from ptxbuild.gpu.worker import serve


class CUDARuntimeError(RuntimeError):
    """Named like cupy's, so the worker treats it as a CUDA error."""


class FakeGpu:
    def __init__(self, device):
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
        if mode == "bug":
            raise ValueError("the op's reference raised")
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
        return stats.summarize(
            [float(params.get("ms", 1.0))] * 10, stats.floor_ms(4_250_000_000, copy_tbps)
        )


if __name__ == "__main__":
    sys.exit(serve(0, make_gpu=FakeGpu))
