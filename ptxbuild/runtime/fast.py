"""The per-call launch path of torch tensors: a call shape resolved once becomes a Prepared launch
(function handles, grids, blocks, shared memory, cluster / PDL configs, the packed argument buffer
with its scalars written in), so that a call only allocates the outputs, writes the tensors' device
pointers into the buffer and makes one driver call per kernel on the caller's current stream.

Two launchers: "ctypes" (default: cuLaunchKernel of libcuda through ctypes, ~1 us of Python) and
"bindings" (cuda.bindings.driver); PTXBUILD_LAUNCHER=bindings picks the latter, and
benchmarks/host_overhead.py times both. Launches with attributes (clusters, programmatic dependent
launch) go through cuLaunchKernelEx of cuda.bindings with a config prepared per stream. A launch
whose driver call fails (no or another context current on this thread) is retried once with the
device's primary context pushed; a second failure is a LoaderError naming the driver's error.
Nothing here is checked per call: the checks ran when the call shape was first resolved."""

from __future__ import annotations

import ctypes
import os
import sys
import threading

from .. import launch as shared
from .arrays import Ptr
from .driver import _cu, _Current, _ok, _param
from .errors import LoaderError

LAUNCHERS = ("ctypes", "bindings")
_cuda_lib: list = []


def launcher() -> str:
    name = os.environ.get("PTXBUILD_LAUNCHER", "ctypes")
    if name not in LAUNCHERS:
        raise LoaderError(f"PTXBUILD_LAUNCHER={name!r}: use one of {', '.join(LAUNCHERS)}")
    return name


def _ctypes_launch():
    """libcuda's cuLaunchKernel as a ctypes function (the driver library the process already has).
    No argtypes: callers pass ctypes objects made once (c_void_p handle, seven c_uint, c_void_p
    stream and parameter array), which ctypes passes without converting (1.3 us against 2.2 us
    with argtypes, measured on this project's CPU host)."""
    if not _cuda_lib:
        lib = ctypes.CDLL("nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1")
        fn = lib.cuLaunchKernel
        fn.restype = ctypes.c_int
        _cuda_lib.append(fn)
    return _cuda_lib[0]


def raw_stream(torch):
    """index -> the current stream of that CUDA device as an int (torch's own getter, as inductor's
    generated code uses; torch.cuda.current_stream(index).cuda_stream where it is absent)."""
    get = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return get or (lambda index: torch.cuda.current_stream(index).cuda_stream)


class _Args:
    """One kernel's argument buffer: 8 bytes per argument (scalars written once, pointers patched
    per call) and the void* array of their addresses that cuLaunchKernel takes."""

    def __init__(self, args: list, sources: dict):
        n = len(args)
        self.store = (ctypes.c_uint64 * max(n, 1))()
        base = ctypes.addressof(self.store)
        self.extra, addrs, self.patch = [], [], []  # extra: scalars wider than 8 bytes
        for j, a in enumerate(args):
            if isinstance(a, Ptr):
                src, ptr = sources[a.origin]
                off = a.data.ptr - ptr
                if src is None:  # a tensor held by the prepared launch: its pointer is constant
                    self.store[j] = ptr + off
                else:
                    self.patch.append((j, src, off))
                addrs.append(base + 8 * j)
                continue
            raw = _param(a).tobytes()
            if len(raw) > 8:
                buf = ctypes.create_string_buffer(raw, len(raw))
                self.extra.append(buf)
                addrs.append(ctypes.addressof(buf))
            else:
                ctypes.memmove(base + 8 * j, raw, len(raw))
                addrs.append(base + 8 * j)
        self.params = (ctypes.c_void_p * max(n, 1))(*addrs)
        self.address = ctypes.addressof(self.params)


class Prepared:
    """A resolved call shape. `names`: the per-call input tensors, in call order; `held`: tensors the
    launch keeps (chunk layouts, zero states) whose pointers are written once; `sample`: this first
    call's tensors by name (inputs and held), `outputs`: its freshly allocated outputs by name."""

    def __init__(self, target, op, params, problem, dev, functions, names, sample, outputs, torch):
        self.target, self.dev, self.names = target, dev, tuple(names)
        self.out_names = tuple(outputs)
        like = next(iter(outputs.values()))
        self.device, self._empty, self._empty_like = like.device, torch.empty, torch.empty_like
        # an output shaped and typed like a per-call input is allocated with empty_like (faster)
        meta = [(tuple(sample[n].shape), sample[n].dtype, sample[n].is_contiguous()) for n in names]
        specs = [(tuple(t.shape), t.dtype, True) for t in outputs.values()]
        self.out_specs = [(*s[:2], meta.index(s) if s in meta else None) for s in specs]
        self.index = like.device.index
        self._stream = raw_stream(torch)
        self.lock = threading.Lock()
        # tensors written into the buffers once (chunk layouts, zero states): kept alive here
        self.held = {n: t for n, t in sample.items() if n not in self.names}
        # tensor origin -> (its index in a call's pointers, or None where held; its sample address)
        sources = {
            ("in", n): (self.names.index(n) if n in self.names else None, int(t.data_ptr()))
            for n, t in sample.items()
        }
        for i, (n, t) in enumerate(outputs.items(), len(self.names)):
            sources[("out", n)] = (i, int(t.data_ptr()))
        ins = {n: Ptr(t, ("in", n)) for n, t in sample.items()}
        outs = {n: Ptr(t, ("out", n)) for n, t in outputs.items()}
        self.buffers, self.fires = [], []
        with _Current(dev):
            for entry, geom, args in op.calls(params, problem, dev.sm_count, ins, outs):
                if 0 in tuple(geom.grid):
                    continue  # nothing to launch (e.g. M = 0)
                buf = _Args(args, sources)
                # the op's one kernel (entry None): the only function loaded
                fn = functions[entry] if entry else next(iter(functions.values()))
                shared.set_function_attributes(_cu(), fn, geom, _ok)
                self.buffers.append(buf)
                self.fires.append(self._fire(fn, geom, buf))
        self.patches = [(b.store, b.patch) for b in self.buffers if b.patch]

    def _fire(self, fn, geom, buf: _Args):
        """stream -> 0, or the driver's error code: one launch of `fn` with `buf`'s arguments."""
        cu, addr = _cu(), buf.address
        ok = cu.CUresult.CUDA_SUCCESS
        if not geom.plain:
            configs: dict = {}

            def fire_ex(stream: int) -> int:
                cfg = configs.get(stream)
                if cfg is None:
                    cfg = configs[stream] = shared.launch_config(cu, fn, geom, stream)
                err = cu.cuLaunchKernelEx(cfg, fn, addr, 0)[0]
                return 0 if err == ok else int(err)

            return fire_ex
        grid, block = tuple(int(v) for v in geom.grid), tuple(int(v) for v in geom.block)
        smem = int(geom.smem_bytes)
        if launcher() == "ctypes":
            launch, u = _ctypes_launch(), ctypes.c_uint
            const = (ctypes.c_void_p(int(fn)), *map(u, grid), *map(u, block), u(smem))
            params, handles = ctypes.c_void_p(addr), {}

            def fire_ctypes(stream: int) -> int:
                h = handles.get(stream)
                if h is None:
                    h = handles[stream] = ctypes.c_void_p(stream)
                return launch(*const, h, params, None)

            return fire_ctypes
        streams: dict = {}

        def fire(stream: int) -> int:
            h = streams.get(stream)
            if h is None:
                h = streams[stream] = cu.CUstream(stream)
            err = cu.cuLaunchKernel(fn, *grid, *block, smem, h, addr, 0)[0]
            return 0 if err == ok else int(err)

        return fire

    def __call__(self, tensors) -> list:
        """Launch on the current stream with `tensors` (inputs in `names` order); the outputs."""
        empty, empty_like, device = self._empty, self._empty_like, self.device
        outs = [
            empty(shape, dtype=dt, device=device) if like is None else empty_like(tensors[like])
            for shape, dt, like in self.out_specs
        ]
        ptrs = [t.data_ptr() for t in tensors]
        ptrs += [o.data_ptr() for o in outs]
        stream = self._stream(self.index)
        with self.lock:  # the buffers are shared: patch and launch as one step
            for store, patch in self.patches:
                for j, src, off in patch:
                    store[j] = ptrs[src] + off
            for fire in self.fires:
                if fire(stream):
                    self._retry(fire, stream)
        return outs

    def _retry(self, fire, stream: int) -> None:
        with _Current(self.dev):
            err = fire(stream)
        if err:
            try:
                name = _cu().CUresult(err).name
            except ValueError:
                name = f"error {err}"
            raise LoaderError(f"{self.target}: the kernel launch failed: {name}")
