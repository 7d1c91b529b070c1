"""The GPUs of this machine as lanes: one GpuSession per GPU, its worker pinned to that GPU with
CUDA_VISIBLE_DEVICES (so that a worker sees only its own GPU, as a Ray actor with num_gpus=1 does)."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

from ..errors import ToolError
from ..gpu.session import GpuSession


def visible_gpus() -> list[str]:
    """The GPU ids this process may use: CUDA_VISIBLE_DEVICES where it is set, else every device
    the CUDA runtime counts (none without cupy or a GPU)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip() and d.strip() != "-1"]
    try:
        import cupy

        return [str(i) for i in range(cupy.cuda.runtime.getDeviceCount())]
    except Exception:  # noqa: BLE001 - no cupy, no driver, no device: no GPU
        return []


def local_lanes(n: int, ids: list[str] | None = None, **session) -> list[GpuSession]:
    """`n` GPU sessions, the i-th pinned to the i-th visible GPU, started side by side; `session`:
    GpuSession's keywords (argv: another worker, as the tests' fake one)."""
    ids = visible_gpus() if ids is None else ids
    if not ids:
        raise ToolError(f"--gpus {n}: no GPU here (`ptxbuild doctor` says what is missing)")
    if n > len(ids):
        raise ToolError(
            f"--gpus {n}: this machine shows {len(ids)} GPU(s); ask for at most {len(ids)}"
        )

    def start(gpu_id: str):
        s = GpuSession(device=0, env={"CUDA_VISIBLE_DEVICES": gpu_id}, **session)
        s.where = f"GPU {gpu_id}"
        return s

    with ThreadPoolExecutor(n) as ex:
        futs = [ex.submit(start, i) for i in ids[:n]]
    lanes = [f.result() for f in futs if f.exception() is None]
    errors = [f.exception() for f in futs if f.exception() is not None]
    if errors:
        for s in lanes:
            s.close()
        raise ToolError(f"{errors[0]}; or build without it: ptxbuild build --no-gpu")
    return lanes
