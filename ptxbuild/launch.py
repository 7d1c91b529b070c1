"""Kernel arguments as host bytes for cuLaunchKernel(Ex): a device pointer for arrays, else the value."""

from __future__ import annotations

import numpy as np

SMEM_DEFAULT_BYTES = 48 * 1024  # dynamic shared memory beyond this needs the function attribute set
PORTABLE_CLUSTER = 8  # larger clusters need the non-portable cluster size attribute


def param(arg) -> np.ndarray:
    """One parameter (cupy's rules: Python int -> int64, float -> float64, numpy scalars as they are)."""
    if hasattr(arg, "data") and hasattr(arg.data, "ptr"):
        return np.array([arg.data.ptr], dtype=np.uint64)
    for kind, dtype in (
        (bool, np.bool_),
        (int, np.int64),
        (float, np.float64),
        (np.generic, None),
    ):  # bool is an int
        if isinstance(arg, kind):
            return np.array([arg], dtype=dtype)
    raise TypeError(
        f"kernel argument of type {type(arg).__name__} is neither an array nor a numpy scalar"
    )


def launch_attributes(cu, geom) -> list:
    """The cuLaunchKernelEx attributes of a Launch (cu: cuda.bindings.driver): its cluster shape, and
    programmatic stream serialization for a programmatic dependent launch (geom.pdl)."""
    attrs = []
    if tuple(geom.cluster) != (1, 1, 1):
        attr = cu.CUlaunchAttribute()
        attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = (
            int(v) for v in geom.cluster
        )
        attrs.append(attr)
    if getattr(geom, "pdl", False):
        attr = cu.CUlaunchAttribute()
        attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        attrs.append(attr)
    return attrs


_RESIDENT: dict = {}
_RESIDENT_MAX = 256  # entries; a long build loads many kernels (handles are reused after unloads)


def resident_grid(cu, fn, cfg, geom) -> int:
    """cfg.gridDimX for `geom`: as given, or for a persistent cluster launch (geom.persistent) at most the clusters that
    can be resident at once (cuOccupancyMaxActiveClusters on cfg, which already carries the block, shared memory and
    cluster attribute), times the cluster size. Cached per function handle, its registers and static shared memory (a
    handle may be reused by a later module), and the launch shape; RuntimeError if no cluster of the shape fits."""
    grid = int(cfg.gridDimX)
    if not getattr(geom, "persistent", False):
        return grid
    if tuple(geom.cluster)[1:] != (1, 1) or tuple(geom.grid)[1:] != (1, 1):
        raise ValueError(
            f"a persistent launch is one-dimensional: grid {tuple(geom.grid)}, cluster {tuple(geom.cluster)}"
        )
    size = int(geom.cluster[0])
    attr = cu.CUfunction_attribute
    regs = _attr(cu, attr.CU_FUNC_ATTRIBUTE_NUM_REGS, fn)
    static_smem = _attr(cu, attr.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, fn)
    key = (
        int(fn),
        regs,
        static_smem,
        tuple(int(v) for v in geom.block),
        int(geom.smem_bytes),
        size,
    )
    if key not in _RESIDENT:
        err, n = cu.cuOccupancyMaxActiveClusters(fn, cfg)
        if err != cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuOccupancyMaxActiveClusters: {err.name}")
        if len(_RESIDENT) >= _RESIDENT_MAX:
            _RESIDENT.clear()
        _RESIDENT[key] = int(n)
    if _RESIDENT[key] < 1:
        raise RuntimeError(
            f"no cluster of {size} CTAs x {tuple(geom.block)} threads can be resident on this GPU"
        )
    return min(grid, _RESIDENT[key] * size)


def _attr(cu, which, fn) -> int:
    err, value = cu.cuFuncGetAttribute(which, fn)
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuFuncGetAttribute: {err.name}")
    return int(value)
