"""GPU stages: isolated workers that verify and time candidates, and the hardware fingerprint."""

from __future__ import annotations

import importlib

from .fingerprint import Fingerprint, match_gpu, model_of

# the worker's side is imported at its first use: a plan that knows the GPU's fingerprint (the
# memo of build/context.py) reads gpu.fingerprint alone
_LATER = {
    "GpuError": "session",
    "GpuSession": "session",
    "MeasureResult": "session",
    "VerifyResult": "session",
    "PROTOCOL_VERSION": "stats",
}


def __getattr__(name: str):
    if name in _LATER:
        return getattr(importlib.import_module(f".{_LATER[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
