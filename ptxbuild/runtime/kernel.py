"""A built target as a callable: load-time checks of its artifacts and op files, then per call a
dictionary lookup of the call's shape (shapes, dtypes, strides, devices of its tensors, its
options) to a Prepared launch (fast.py). A shape seen for the first time is bound to a built mode,
checked (dtype, input shapes, contiguity, device), dispatched to a variant and prepared; cupy
arrays, the reference fallback and every refusal take the general path (run)."""

from __future__ import annotations

import hashlib
import json
import warnings
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from ..oploader import OpError, changed_files, load_op, source_files
from ..problem import Problem
from ..records import DispatchEntry, Manifest
from .arrays import TorchXp, contiguous, dtype_of, from_numpy, kind, strides, to_numpy
from .dispatch import Dispatch, _Mode
from .driver import _Current, _device, _launch, load_functions
from .errors import LoaderError
from .fast import Prepared


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _meta(v):
    """What a call's key holds for an argument: a tensor's shape, dtype, strides, device and whether
    its address is 16-byte aligned; any other value as it is (an array without .stride(), cupy's or
    numpy's, is unhashable: the general path takes it)."""
    try:
        return (v.shape, v.dtype, v.stride(), v.device, v.data_ptr() & 15)
    except (AttributeError, TypeError):
        return v


class BuiltKernel(Dispatch):
    """A built target as a callable; see ptxbuild.runtime.load()."""

    def __init__(self, build: Path, manifest: Manifest, folder: Path, allow_fallback: bool = False):
        self.build_dir, self.manifest, self.allow_fallback = Path(build), manifest, allow_fallback
        self.target, self.arch = manifest.target, manifest.arch
        try:
            self.op = load_op(str(Path(folder).resolve()), Path("/"))
        except OpError as exc:
            raise LoaderError(
                f"{self.target}: cannot load its op {manifest.template!r} ({exc}); "
                "install the ptxbuild that built it, or pass op_folder= to ptxbuild.load"
            ) from None
        self._check_artifacts()
        self._check_op_files()
        self.entries = [e for e in manifest.dispatch if e.params is not None]
        self.dtypes = sorted({e.problem["dtype"] for e in self.entries})
        self._modes: list[_Mode] | None = None
        self._choice: dict[tuple, DispatchEntry | None] = {}
        self._specs: dict[tuple, dict] = {}
        self._functions: dict[tuple, dict] = {}
        self._prepared: dict[tuple, tuple] = {}
        self._warned: set = set()
        self.calls = 0  # calls that launched the built kernels (not fallbacks)

    @cached_property
    def torch_op(self):
        """What a torch module calls: the custom op under torch.compile and autograd, the per-call
        path itself in eager (torch_ops.module_callable; imports torch)."""
        from .torch_ops import module_callable

        return module_callable(self)

    def __repr__(self) -> str:
        return f"<ptxbuild kernel {self.target} ({self.arch}), {len(self.entries)} problem(s)>"

    # ---------------------------------------------------------- checks at load time
    def _check_artifacts(self) -> None:
        for digest, v in sorted(self.manifest.variants.items()):
            for what, want in (("cubin", digest), ("ptx", v.ptx_sha256 or None)):
                path = self.build_dir / getattr(v, what)
                if not path.is_file():
                    raise LoaderError(f"{path} is missing; rebuild: ptxbuild build {self.target}")
                if want is not None and (got := _sha256(path)) != want:
                    raise LoaderError(
                        f"{path} does not match its digest in manifest.json (sha256 {got[:16]}..., "
                        f"manifest {want[:16]}...): the artifact was modified; refusing it; "
                        f"rebuild: ptxbuild build --locked {self.target}"
                    )

    def _check_op_files(self) -> None:
        built = self.manifest.op_files
        if not built:
            return
        now = {p.name: _sha256(p) for p in source_files(self.op) if p.is_file()}
        changed = changed_files(built, now)
        if changed:
            raise LoaderError(
                f"{self.op.FOLDER}/{changed[0]} changed since {self.target} was built: its kernels "
                f"may no longer match the op's arguments; rebuild: ptxbuild build {self.target}"
            )

    # ---------------------------------------------------------- the call
    def __call__(self, *args, **kwargs):
        try:  # _meta of every positional tensor, inlined (this line is most of a call's key)
            key = tuple([(a.shape, a.dtype, a.stride(), a.device, a.data_ptr() & 15) for a in args])
        except (AttributeError, TypeError):
            key = tuple(map(_meta, args))
        if kwargs:
            key = (key, tuple((k, _meta(v)) for k, v in kwargs.items()))
        try:
            hit = self._prepared.get(key)
        except TypeError:  # an unhashable argument: cupy / numpy arrays, a list option
            return self._values(self.run(*args, **kwargs))
        if hit is None and (hit := self._resolve(key, args, kwargs)) is None:
            return self._values(self.run(*args, **kwargs))
        prep, order, keep = hit
        tensors = (
            args if order is None else [args[i] if type(i) is int else kwargs[i] for i in order]
        )
        outs = prep(tensors)
        self.calls += 1
        return outs[0] if keep == 1 else tuple(outs[:keep])

    def _values(self, outputs: dict):
        scratch = self.op.SCRATCH
        vals = [v for n, v in outputs.items() if n not in scratch]
        return vals[0] if len(vals) == 1 else tuple(vals)

    def _resolve(self, key, args: tuple, kwargs: dict):
        """The Prepared launch for a call shape seen for the first time, with the order its tensors
        are taken from the call, or None where the general path must answer (errors, fallback,
        cupy). Every check of a call runs here, once per call shape."""
        mode, arrays = self.bind(args, kwargs)
        if {kind(a) for a in arrays.values()} != {"torch"}:
            return None
        problem = self.problem_of(mode, arrays)
        entry = self.select(problem)
        ordinal = self._device_of(arrays, mode) if entry is not None else None
        if entry is None or ordinal is None:
            return None
        prep = self.prepare(entry, problem, _device(ordinal), mode.names, arrays)
        pos = {n: i for i, n in enumerate(mode.names[: len(args)])}
        order = None if len(args) == len(mode.names) else [pos.get(n, n) for n in mode.names]
        scratch = self.op.SCRATCH
        keep = [n for n in prep.out_names if n not in scratch]
        if prep.out_names[: len(keep)] != tuple(keep):
            raise LoaderError(f"{self.target}: scratch outputs must come after the others")
        self._prepared[key] = (prep, order, len(keep))
        return self._prepared[key]

    def prepare(self, entry: DispatchEntry, problem: Problem, dev, names, sample: dict) -> Prepared:
        """A Prepared launch of `entry` for `problem` on `dev`: per call it takes the tensors
        `names` (in that order); the other tensors of `sample` are held by it."""
        import torch

        like = next(iter(sample.values()))
        outputs = self.op.make_outputs(problem, TorchXp(torch, like.device))
        fns = self._functions_of(dev, entry, problem)
        return Prepared(
            self.target, self.op, entry.params, problem, dev, fns, names, sample, outputs, torch
        )

    def _functions_of(self, dev, entry: DispatchEntry, problem: Problem) -> dict[str, Any]:
        """entry name -> CUfunction of every kernel one call of `entry` launches, loaded on `dev`."""
        if self.op.multi_kernel:
            names = tuple(self.op.launches(entry.params, problem, dev.sm_count))
        else:
            names = (self.manifest.variants[entry.binary].entry,)
        key = (dev.ordinal, entry.binary, names)
        if key not in self._functions:
            variant = self.manifest.variants[entry.binary]
            self._functions[key] = load_functions(self.target, self.build_dir, variant, dev, names)
        return self._functions[key]

    def problem_of(self, mode: _Mode, arrays: dict) -> Problem:
        primary = arrays[mode.names[0]]
        kinds = {kind(a) for a in arrays.values()}
        if not kinds <= {"torch", "cupy"} or len(kinds) != 1:
            got = ", ".join(
                f"{n}: {type(a).__module__}.{type(a).__name__}" for n, a in arrays.items()
            )
            raise LoaderError(
                f"{self.target}: inputs must all be torch tensors or all cupy arrays, got {got}"
            )
        dtype = dtype_of(primary)
        if dtype not in self.dtypes:
            raise LoaderError(
                f"{self.target}: dtype {dtype} of input {mode.names[0]} is not built; built dtypes: "
                f"{', '.join(self.dtypes)} (add it to the op's dtypes in kernelfile.toml and rebuild)"
            )
        problem = Problem.make(self.op.NAME, dtype, tuple(primary.shape), mode.options)
        for name, (shape, dt) in self._input_specs(problem).items():
            a = arrays[name]
            if (
                len(a.shape) != len(shape)
                or dtype_of(a) != dt
                or any(w not in (None, g) for g, w in zip(a.shape, shape))
            ):
                want = "x".join("?" if w is None else str(w) for w in shape)
                raise LoaderError(
                    f"{self.target}: input {name} is {dtype_of(a)}[{'x'.join(map(str, a.shape))}], "
                    f"expected {dt}[{want}] for {problem.label()}"
                )
            if kind(a) == "torch" and a.data_ptr() % 16:
                raise LoaderError(
                    f"{self.target}: input {name} is not 16-byte aligned (address "
                    f"{a.data_ptr():#x}); pass {name}.clone()"
                )
            if not contiguous(a):
                raise LoaderError(
                    f"{self.target}: input {name} is not contiguous (strides {strides(a)}); "
                    f"pass {name}.contiguous()"
                )
        return problem

    def run(self, *args, **kwargs) -> dict:
        """Like calling the kernel, but returns every output by name (scratch ones too)."""
        mode, arrays = self.bind(args, kwargs)
        problem = self.problem_of(mode, arrays)
        entry = self.select(problem)
        if entry is None:
            msg = (
                f"{self.target}: no built variant covers {problem.label()}; built shapes for "
                f"{problem.dtype}: {self._built_shapes(problem.dtype, problem.opts_json)} (add the "
                f"shape to kernelfile.toml and rebuild)"
            )
            if not self.allow_fallback:
                raise LoaderError(
                    msg + " or load with allow_fallback=True to run the op's reference"
                )
            return self._fallback(problem, arrays, msg)
        ordinal = self._device_of(arrays, mode)
        if ordinal is None:
            if self.allow_fallback:
                return self._fallback(problem, arrays, f"{self.target}: no CUDA GPU")
            raise LoaderError(
                f"{self.target}: no CUDA GPU is visible, and the built kernels need one "
                f"(or load with allow_fallback=True to run the op's reference on the CPU)"
            )
        dev = _device(ordinal)
        if kind(arrays[mode.names[0]]) == "torch":
            key = ("run", tuple((n, _meta(a)) for n, a in arrays.items()), json.dumps(mode.options))
            if key not in self._prepared:
                self._prepared[key] = self.prepare(entry, problem, dev, mode.names, arrays)
            self.calls += 1
            prep = self._prepared[key]
            return dict(zip(prep.out_names, prep([arrays[n] for n in mode.names])))
        import cupy

        outputs = self.op.make_outputs(problem, cupy)
        stream = cupy.cuda.get_current_stream().ptr
        fns = self._functions_of(dev, entry, problem)
        with _Current(dev):
            for e, geom, params in self.op.calls(
                entry.params, problem, dev.sm_count, arrays, outputs
            ):
                # the op's one kernel (entry None) is the variant's own, the only one loaded
                _launch(fns[e] if e else next(iter(fns.values())), geom, params, stream)
        self.calls += 1
        return outputs

    def _device_of(self, arrays: dict, mode: _Mode) -> int | None:
        primary = arrays[mode.names[0]]
        if kind(primary) == "torch":
            import torch

            if not torch.cuda.is_available():
                return None
            for name, a in arrays.items():
                if a.device != primary.device or a.device.type != "cuda":
                    raise LoaderError(
                        f"{self.target}: input {name} is on {a.device}; every input must be on one "
                        f"CUDA device (move it with .to('cuda'))"
                    )
            index = primary.device.index
            return index if index is not None else torch.cuda.current_device()
        import cupy

        try:
            if cupy.cuda.runtime.getDeviceCount() == 0:
                return None
        except Exception:  # noqa: BLE001 - no driver / no device
            return None
        for name, a in arrays.items():
            if a.device.id != primary.device.id:
                raise LoaderError(
                    f"{self.target}: input {name} is on device {a.device.id}, "
                    f"{mode.names[0]} on {primary.device.id}"
                )
        return primary.device.id

    def _fallback(self, problem: Problem, arrays: dict, why: str) -> dict:
        """The op's float reference on the host, rounded to the output types: explicit, slow,
        warned about once per reason."""
        if why not in self._warned:
            self._warned.add(why)
            warnings.warn(
                f"{why}; running {self.op.NAME}'s reference instead (allow_fallback=True; slow)",
                RuntimeWarning,
                stacklevel=4,
            )
        from ..dtypes import from_float

        ref = self.op.reference(problem, {n: to_numpy(a) for n, a in arrays.items()}, np)
        like = next(iter(arrays.values()))
        out = {}
        scratch = set(self.op.SCRATCH)  # the kernels' own: no reference value
        for name, empty in self.op.make_outputs(problem, np).items():
            if name in scratch:
                continue
            dt = dtype_of(empty)
            val = np.asarray(ref[name]).reshape(empty.shape)
            rounded = from_float(val, dt, np) if dt == "bfloat16" else val.astype(empty.dtype)
            out[name] = from_numpy(np.ascontiguousarray(rounded), like)
        return out
