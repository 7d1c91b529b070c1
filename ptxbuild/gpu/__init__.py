"""GPU stages: isolated workers that verify and time candidates, and the hardware fingerprint."""

from __future__ import annotations

from .fingerprint import Fingerprint, match_gpu, model_of
from .session import GpuError, GpuSession, MeasureResult, VerifyResult
from .stats import PROTOCOL_VERSION


def gpu_available() -> bool:
    """cupy importable and at least one CUDA device present; never raises."""
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - any failure means no usable GPU
        return False


__all__ = [
    "Fingerprint",
    "GpuError",
    "GpuSession",
    "MeasureResult",
    "PROTOCOL_VERSION",
    "VerifyResult",
    "gpu_available",
    "match_gpu",
    "model_of",
]
