"""Load a compiled candidate into the worker's CUDA context and launch it on a stream: the one
launcher (ptxbuild.launch, cuda-bindings) the runtime uses too, with the worker's errors."""

from __future__ import annotations

from .. import launch as shared
from ..problem import Launch
from .errors import CudaError


class Kernel:
    """One entry of a candidate's module, loaded in the worker's context (unloaded with it)."""

    def __init__(self, cu, module, fn):
        self.cu, self.module, self.fn = cu, module, fn

    def __del__(self):
        self.cu.cuModuleUnload(self.module)


def load(entry: str, cubin: bytes, ptx: str = "") -> Kernel:
    """`entry` of the cubin, falling back to the PTX (JIT by the driver): ptxbuild.launch's loader."""
    import cupy
    from cuda.bindings import driver as cu

    cupy.cuda.runtime.free(0)  # the device's context is current on this thread (cudaFree(0))
    images = [(k, d) for k, d in (("cubin", cubin), ("ptx", ptx.encode() if ptx else b"")) if d]
    module, got = shared.load_module(cu, images, [entry], _ok)
    if module is None:
        raise CudaError("could not load the candidate: " + "; ".join(got or ["no cubin or PTX"]))
    return Kernel(cu, module, got[entry])


def _ok(result, what: str) -> None:
    from cuda.bindings import driver as cu

    err = result[0] if isinstance(result, tuple) else result
    if err != cu.CUresult.CUDA_SUCCESS:
        raise CudaError(f"{what}: {err.name}: {cu.cuGetErrorString(err)[1]}")


def launch(kernel, geom: Launch, args: list, stream) -> None:
    """Launch a loaded Kernel (or a cupy RawKernel) on `stream` through the one launcher
    (ptxbuild.launch: cuLaunchKernel, or cuLaunchKernelEx for clusters and programmatic dependent
    launches)."""
    from cuda.bindings import driver as cu

    fn = kernel.fn if isinstance(kernel, Kernel) else cu.CUfunction(kernel.kernel.ptr)  # cupy's
    shared.launch(cu, fn, geom, args, stream.ptr, _ok)
