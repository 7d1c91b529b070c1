"""The CUDA driver side of the runtime (cuda.bindings.driver, imported at the first launch): devices
and their primary contexts, loading a variant's cubin (or JIT of its PTX), architecture and driver
rules, and the general launch used by the cupy path. The per-call fast path is fast.py."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .. import launch as shared
from ..launch import param
from ..records import Variant
from .errors import LoaderError

# PTX ISA -> the CUDA version a driver must support to JIT it (PTX ISA release notes).
PTX_ISA_CUDA = {
    "7.8": "11.8",
    "8.0": "12.0",
    "8.1": "12.1",
    "8.2": "12.2",
    "8.3": "12.3",
    "8.4": "12.4",
    "8.5": "12.5",
    "8.6": "12.7",
    "8.7": "12.8",
    "8.8": "12.9",
    "9.0": "13.0",
    "9.1": "13.1",
}


def _cu():
    try:
        from cuda.bindings import driver as cu
    except ImportError as exc:
        raise LoaderError(
            f"the CUDA driver bindings are not installed ({exc}); run: pip install "
            "'cuda-bindings>=13.0,<14'"
        ) from None
    return cu


def _ok(result, what: str):
    cu = _cu()
    err = result[0] if isinstance(result, tuple) else result
    if err != cu.CUresult.CUDA_SUCCESS:
        raise LoaderError(
            f"{what} failed: {err.name} ({cu.cuGetErrorString(err)[1].decode(errors='replace')})"
        )
    return result[1] if isinstance(result, tuple) and len(result) == 2 else result


def cc_of(arch: str) -> tuple[int, str]:
    """ "sm_90a" -> (90, "a"); "sm_100f" -> (100, "f"); "sm_80" -> (80, "")."""
    digits = "".join(c for c in arch if c.isdigit())
    return int(digits), arch[len(arch.rstrip("af")) :]


def arch_runs_on(arch: str, device_cc: int) -> bool:
    """Whether SASS/PTX for `arch` can run on a device of compute capability `device_cc` (e.g. 90)."""
    cc, suffix = cc_of(arch)
    if suffix == "a":
        return device_cc == cc
    if suffix == "f":
        return device_cc // 10 == cc // 10 and device_cc >= cc
    return device_cc >= cc


def driver_cuda(version: int) -> str:
    return f"{version // 1000}.{version % 1000 // 10}"


def load_choice(ptx_isa: str, driver_version: int) -> str | None:
    """Why the driver cannot JIT PTX of `ptx_isa`, or None if it can (by the ISA's CUDA version)."""
    need = PTX_ISA_CUDA.get(ptx_isa)
    if need is None or driver_version == 0:
        return None
    major, minor = (int(v) for v in need.split("."))
    if driver_version < major * 1000 + minor * 10:
        return (
            f"PTX ISA {ptx_isa} needs a driver for CUDA >= {need}, this driver supports CUDA "
            f"{driver_cuda(driver_version)}"
        )
    return None


@dataclass
class _Device:
    ordinal: int
    name: str
    cc: int
    sm_count: int
    driver_version: int
    context: Any


_devices: dict[int, _Device] = {}
_lock = threading.Lock()


def _device(ordinal: int) -> _Device:
    with _lock:
        if ordinal in _devices:
            return _devices[ordinal]
        cu = _cu()
        _ok(cu.cuInit(0), "cuInit")
        dev = _ok(cu.cuDeviceGet(ordinal), "cuDeviceGet")
        attr = cu.CUdevice_attribute

        def get(which):
            return _ok(cu.cuDeviceGetAttribute(which, dev), "cuDeviceGetAttribute")

        major = get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
        minor = get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
        sms = get(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        name = _ok(cu.cuDeviceGetName(256, dev), "cuDeviceGetName")
        if isinstance(name, bytes):
            name = name.split(b"\0")[0].decode(errors="replace")
        version = _ok(cu.cuDriverGetVersion(), "cuDriverGetVersion")
        ctx = _ok(cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
        _devices[ordinal] = _Device(ordinal, str(name), major * 10 + minor, sms, version, ctx)
        return _devices[ordinal]


class _Current:
    """Make the device's primary context (the one torch and cupy use) current for a block."""

    def __init__(self, dev: _Device):
        self.dev, self.pushed = dev, False

    def __enter__(self):
        cu = _cu()
        if int(_ok(cu.cuCtxGetCurrent(), "cuCtxGetCurrent")) != int(self.dev.context):
            _ok(cu.cuCtxPushCurrent(self.dev.context), "cuCtxPushCurrent")
            self.pushed = True
        return self

    def __exit__(self, *exc):
        if self.pushed:
            _ok(_cu().cuCtxPopCurrent(), "cuCtxPopCurrent")


def load_functions(
    target: str, build_dir: Path, variant: Variant, dev: _Device, entries
) -> dict[str, Any]:
    """entry -> CUfunction of a variant's module loaded on `dev` (every kernel of a multi-kernel op
    lives in the one cubin): the cubin if the driver takes it, else its PTX."""
    if not arch_runs_on(variant.arch, dev.cc):
        raise LoaderError(
            f"{target} was built for {variant.arch}; this GPU ({dev.name}) is sm_{dev.cc}: "
            f"declare a target for it in kernelfile.toml and build it"
        )
    too_new = load_choice(variant.ptx_isa, dev.driver_version)
    images = [(k, (Path(build_dir) / getattr(variant, k)).read_bytes()) for k in ("cubin", "ptx")]
    with _Current(dev):
        module, got = shared.load_module(_cu(), images[: 1 if too_new else 2], entries, _ok)
    if module is not None:
        return got
    why = got + ([f"ptx: {too_new}"] if too_new else [])
    raise LoaderError(
        f"{target}: this driver (CUDA {driver_cuda(dev.driver_version)}) can load neither the "
        f"cubin nor the PTX of {variant.entry} ({'; '.join(why)}); upgrade the NVIDIA driver, "
        f"or rebuild with a compiler no newer than the driver"
    )


def _param(arg) -> np.ndarray:
    try:
        return param(arg)
    except TypeError as exc:
        raise LoaderError(str(exc)) from None


def _launch(fn, geom, args: list, stream: int) -> None:
    """ptxbuild.launch.launch (cuLaunchKernel, or cuLaunchKernelEx with launch attributes)."""
    shared.launch(_cu(), fn, geom, args, stream, _ok)
