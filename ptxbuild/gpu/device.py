"""Load a compiled candidate into the worker's CUDA context and launch it on a stream (cupy, cuda-bindings)."""

from __future__ import annotations

import os
import tempfile

import numpy as np

from ..launch import (
    PORTABLE_CLUSTER,
    SMEM_DEFAULT_BYTES,
    launch_attributes,
    param,
    resident_grid,
)
from ..problem import Launch
from .errors import CudaError


def load(entry: str, cubin: bytes, ptx: str = ""):
    """A cupy RawKernel for `entry` from the cubin, falling back to the PTX (JIT by the driver)."""
    import cupy

    errors = []
    for data, suffix in ((cubin, ".cubin"), (ptx.encode() if ptx else b"", ".ptx")):
        if not data:
            continue
        fd, path = tempfile.mkstemp(suffix=suffix, prefix="ptxbuild-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            kernel = cupy.RawModule(path=path).get_function(entry)
            kernel.kernel  # noqa: B018 - load the module now, while the file exists
            return kernel
        except Exception as exc:  # noqa: BLE001 - a candidate that does not load is an outcome
            errors.append(f"{suffix[1:]}: {exc}")
        finally:
            os.unlink(path)
    raise CudaError("could not load the candidate: " + "; ".join(errors or ["no cubin or PTX"]))


def _check(result) -> None:
    from cuda.bindings import driver as cu

    err = result[0] if isinstance(result, tuple) else result
    if err != cu.CUresult.CUDA_SUCCESS:
        raise CudaError(f"{err.name}: {cu.cuGetErrorString(err)[1]}")


def launch(kernel, geom: Launch, args: list, stream) -> None:
    """Launch on `stream`; clusters and programmatic dependent launches go through cuLaunchKernelEx."""
    smem = int(geom.smem_bytes)
    if smem > SMEM_DEFAULT_BYTES:
        kernel.max_dynamic_shared_size_bytes = smem
    if geom.plain:
        with stream:
            kernel(tuple(geom.grid), tuple(geom.block), tuple(args), shared_mem=smem)
        return
    from cuda.bindings import driver as cu

    fn = cu.CUfunction(kernel.kernel.ptr)
    if int(np.prod(geom.cluster)) > PORTABLE_CLUSTER:
        _check(
            cu.cuFuncSetAttribute(
                fn, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1
            )
        )
    cfg = cu.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = (int(v) for v in geom.grid)
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = (int(v) for v in geom.block)
    cfg.sharedMemBytes, cfg.hStream = smem, cu.CUstream(stream.ptr)
    attrs = launch_attributes(cu, geom)
    cfg.attrs, cfg.numAttrs = attrs, len(attrs)
    cfg.gridDimX = resident_grid(cu, fn, cfg, geom)
    params = [param(a) for a in args]
    ptrs = np.array([p.ctypes.data for p in params], dtype=np.uint64)
    _check(cu.cuLaunchKernelEx(cfg, fn, ptrs.ctypes.data, 0))
