"""Launching a kernel through the CUDA driver, shared by the GPU worker (gpu/) and the runtime
(runtime/): kernel arguments as host bytes for cuLaunchKernel(Ex) (a device pointer for arrays,
else the value), the function attributes a launch needs, the cuLaunchKernelEx config of a cluster,
programmatic or persistent launch, and one launch on a stream. `cu` is cuda.bindings.driver (the
caller's import: nothing here imports it), `ok(result, what)` the caller's check of a driver result
(it raises the caller's own error). The runtime's per-call path (runtime/fast.py) packs its argument
buffers once and launches through libcuda directly; the worker's calls come here."""

from __future__ import annotations

import numpy as np

SMEM_DEFAULT_BYTES = 48 * 1024  # dynamic shared memory beyond this needs the function attribute set
PORTABLE_CLUSTER = 8  # larger clusters need the non-portable cluster size attribute


class NotResident(RuntimeError):
    """A launch shape of which not one cluster (or block) can be resident on this GPU: the candidate's
    resources (threads, registers, shared memory, cluster size) do not fit, so it is a failed
    candidate (Outcome.RESOURCE), not a failed tool."""


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
    handle may be reused by a later module), and the launch shape; NotResident if no cluster of the shape fits."""
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
        raise NotResident(
            f"no cluster of {size} CTAs x {tuple(geom.block)} threads ({regs} regs) can be resident"
        )
    return min(grid, _RESIDENT[key] * size)


def _attr(cu, which, fn) -> int:
    err, value = cu.cuFuncGetAttribute(which, fn)
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuFuncGetAttribute: {err.name}")
    return int(value)


def load_module(cu, images, entries, ok) -> tuple:
    """(module, entry -> CUfunction) from the first of `images` ((kind, bytes): e.g. the cubin, then
    the PTX for the driver to JIT) that the driver loads into the current context, or (None,
    [why each image was refused]). A module whose entries are not all there is unloaded."""
    why = []
    for kind, data in images:
        buf = np.frombuffer(data + b"\0" if kind == "ptx" else data, dtype=np.uint8)
        err, module = cu.cuModuleLoadData(buf.ctypes.data)
        if err != cu.CUresult.CUDA_SUCCESS:
            why.append(f"{kind}: {err.name}")
            continue
        got = {e: cu.cuModuleGetFunction(module, e.encode()) for e in entries}
        if all(err == cu.CUresult.CUDA_SUCCESS for err, _ in got.values()):
            return module, {e: fn for e, (_, fn) in got.items()}
        why += [
            f"{kind}: {e}: {r[0].name}" for e, r in got.items() if r[0] != cu.CUresult.CUDA_SUCCESS
        ]
        ok(cu.cuModuleUnload(module), "cuModuleUnload")
    return None, why


def set_function_attributes(cu, fn, geom, ok) -> None:
    """What a launch of `geom` needs set on its function first: dynamic shared memory where it and
    the static shared memory together pass the default 48 KB (the static part counts: 48 KB of
    dynamic plus a few mbarriers does not launch, nor fit one cluster, without it), and the
    non-portable cluster size for clusters above 8."""
    attr = cu.CUfunction_attribute
    smem = int(geom.smem_bytes)
    if smem and smem + _attr(cu, attr.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, fn) > SMEM_DEFAULT_BYTES:
        ok(
            cu.cuFuncSetAttribute(fn, attr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem),
            "cuFuncSetAttribute(max dynamic shared memory)",
        )
    if not geom.plain and int(np.prod(geom.cluster)) > PORTABLE_CLUSTER:
        ok(
            cu.cuFuncSetAttribute(fn, attr.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1),
            "cuFuncSetAttribute(non-portable cluster)",
        )


def launch_config(cu, fn, geom, stream: int):
    """The cuLaunchKernelEx config of a non-plain `geom` (cluster, PDL, persistent grid) on `stream`;
    .attrs is kept alive on the config object."""
    cfg = cu.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = (int(v) for v in geom.grid)
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = (int(v) for v in geom.block)
    cfg.sharedMemBytes, cfg.hStream = int(geom.smem_bytes), cu.CUstream(int(stream))
    attrs = launch_attributes(cu, geom)
    cfg.attrs, cfg.numAttrs = attrs, len(attrs)
    cfg.gridDimX = resident_grid(cu, fn, cfg, geom)
    return cfg


def launch(cu, fn, geom, args: list, stream: int, ok) -> None:
    """One launch of `fn` with `args` on `stream` (an int): cuLaunchKernel, or cuLaunchKernelEx with
    the launch attributes (cluster, PDL, persistent grid); nothing for an empty grid (M = 0)."""
    if 0 in tuple(geom.grid):
        return
    set_function_attributes(cu, fn, geom, ok)
    params = [param(a) for a in args]
    ptrs = np.array([p.ctypes.data for p in params], dtype=np.uint64)
    if geom.plain:
        grid, block = (int(v) for v in geom.grid), (int(v) for v in geom.block)
        res = cu.cuLaunchKernel(
            fn, *grid, *block, int(geom.smem_bytes), cu.CUstream(int(stream)), ptrs.ctypes.data, 0
        )
        ok(res, "cuLaunchKernel")
        return
    cfg = launch_config(cu, fn, geom, stream)
    ok(cu.cuLaunchKernelEx(cfg, fn, ptrs.ctypes.data, 0), "cuLaunchKernelEx")
