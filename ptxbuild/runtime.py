"""Use built kernels from a model: load a target's manifest, check its artifacts, dispatch a call by
dtype, options and shape to a built variant, and launch it on the caller's current stream.

    import ptxbuild
    rmsnorm = ptxbuild.load("rmsnorm@h200")            # or ptxbuild.load("build/rmsnorm@h200")
    y = rmsnorm(x, weight)                             # torch tensors (or cupy arrays) in, same kind out

Importing this module needs no compiler, torch or cupy: torch / cupy are imported when a call sees their arrays, the
CUDA driver (cuda.bindings.driver) when a kernel launches. Every refusal is a one-line LoaderError saying what to do.
"""

from __future__ import annotations

import hashlib
import json
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from .launch import (
    PORTABLE_CLUSTER,
    SMEM_DEFAULT_BYTES,
    launch_attributes,
    param,
    resident_grid,
)
from .oploader import load_op, op_dir, source_files
from .problem import Problem

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
_NP_TO_DTYPE = {
    "uint16": "bfloat16",
    "float16": "float16",
    "float32": "float32",
    "float64": "float64",
}


class LoaderError(RuntimeError):
    """A built kernel cannot be used for this call; the message is one line saying why and what to do."""


# ------------------------------------------------------------------ locating a target
def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _find_kernelfile(start: Path) -> Path | None:
    return next(
        (
            d / "kernelfile.toml"
            for d in [start, *start.parents]
            if (d / "kernelfile.toml").is_file()
        ),
        None,
    )


def load(
    target: str | Path,
    *,
    kernelfile: str | Path | None = None,
    allow_fallback: bool = False,
    op_folder: str | Path | None = None,
) -> BuiltKernel:
    """A callable for a built target: `target` is "op@gpu" (resolved through `kernelfile`, default
    ./kernelfile.toml) or a build directory holding manifest.json. `allow_fallback=True` runs the op's
    reference (slow, with a warning) for inputs no built variant covers instead of raising."""
    t = str(target)
    path = Path(t)
    if "@" in t and not (path / "manifest.json").is_file():
        kfp = (
            Path(kernelfile)
            if kernelfile
            else (_find_kernelfile(Path.cwd()) or Path("kernelfile.toml"))
        )
        kf = _load_kernelfile(kfp, f"load {t}")
        op_name = t.split("@")[0]
        if op_name not in kf.ops or t.split("@")[1] not in kf.ops[op_name].gpus:
            raise LoaderError(
                f"{t} is not a target of {kfp}; declare it there and run: ptxbuild build {t}"
            )
        build = kf.build_dir / t
        folder = Path(op_folder) if op_folder else op_dir(kf.ops[op_name].template, kf.root)
    else:
        build = path
        folder = Path(op_folder) if op_folder else None
    manifest_path = build / "manifest.json"
    if not manifest_path.is_file():
        raise LoaderError(
            f"{build} has no manifest.json: the target was never built; run: ptxbuild build "
            f"{build.name if '@' in build.name else '<op>@<gpu>'}"
        )
    manifest = json.loads(manifest_path.read_text())
    if manifest.get("incomplete"):
        warnings.warn(
            f"{build}: its build was interrupted ({manifest['incomplete']} problems built); run: ptxbuild "
            f"build {manifest['target']} to finish it",
            stacklevel=2,
        )
    if folder is None:
        kfp = Path(kernelfile) if kernelfile else _find_kernelfile(build.resolve().parent)
        if kfp:
            kf = _load_kernelfile(kfp, f"find the op of {manifest['target']}")
            spec = kf.ops.get(manifest["target"].split("@")[0])
            folder = (
                op_dir(spec.template, kf.root) if spec else kf.root / "ops" / manifest["template"]
            )
        else:
            folder = build.resolve().parent.parent / "ops" / manifest["template"]
    return BuiltKernel(build, manifest, folder, allow_fallback)


def _load_kernelfile(kfp: Path, what: str):
    from .declare.kernelfile import KernelfileError
    from .declare.kernelfile import load as load_kf

    try:
        return load_kf(kfp)
    except KernelfileError as exc:
        raise LoaderError(f"cannot {what}: {exc}") from None


# ------------------------------------------------------------------ arrays of torch / cupy
def _kind(arr) -> str:
    """The top-level module of an array's type: "torch", "cupy", "numpy", ..."""
    return type(arr).__module__.split(".")[0]


def _dtype_of(arr) -> str:
    """The ptxbuild element type of a torch tensor / cupy / numpy array (16-bit unsigned = bf16 bits)."""
    if _kind(arr) == "torch":
        return str(arr.dtype).removeprefix("torch.")
    return _NP_TO_DTYPE.get(str(arr.dtype), str(arr.dtype))


def _contiguous(arr) -> bool:
    return bool(arr.is_contiguous() if _kind(arr) == "torch" else arr.flags.c_contiguous)


def _strides(arr) -> tuple:
    return (
        tuple(arr.stride())
        if _kind(arr) == "torch"
        else tuple(s // arr.itemsize for s in arr.strides)
    )


class _Ptr:
    """What op.kernel_args sees for a torch tensor: cupy's `.data.ptr` plus shape and storage dtype."""

    def __init__(self, tensor):
        self.tensor = tensor
        self.data = SimpleNamespace(ptr=int(tensor.data_ptr()))
        self.shape = tuple(tensor.shape)
        self.size = int(tensor.numel())
        self.dtype = np.dtype({"bfloat16": "uint16"}.get(_dtype_of(tensor), _dtype_of(tensor)))
        self.nbytes = self.size * self.dtype.itemsize


class _TorchXp:
    """Just enough of numpy's namespace for op.make_outputs to allocate torch tensors on a device."""

    def __init__(self, torch, device):
        self._torch, self._device = torch, device
        self.uint16, self.float16, self.float32, self.float64 = (
            "bfloat16",
            "float16",
            "float32",
            "float64",
        )
        self.int32, self.int64 = "int32", "int64"

    def empty(self, shape, dtype="float32"):
        dt = getattr(
            self._torch,
            dtype if isinstance(dtype, str) else np.dtype(dtype).name.replace("uint16", "bfloat16"),
        )
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        return self._torch.empty(shape, dtype=dt, device=self._device)


def _to_numpy(arr):
    if _kind(arr) == "torch":
        import torch

        t = arr.detach().cpu().contiguous()
        return (
            t.view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.bfloat16 else t.numpy()
        )
    return arr.get() if _kind(arr) == "cupy" else np.asarray(arr)


def _from_numpy(a: np.ndarray, like):
    if _kind(like) == "torch":
        import torch

        t = (
            torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
            if a.dtype == np.uint16
            else torch.from_numpy(a)
        )
        return t.to(like.device)
    if _kind(like) == "cupy":
        import cupy

        return cupy.asarray(a)
    return a


def _param(arg) -> np.ndarray:
    try:
        return param(arg)
    except TypeError as exc:
        raise LoaderError(str(exc)) from None


# ------------------------------------------------------------------ the CUDA driver side
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
        major = _ok(
            cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev),
            "attribute",
        )
        minor = _ok(
            cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev),
            "attribute",
        )
        sms = _ok(
            cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev), "attribute"
        )
        name = _ok(cu.cuDeviceGetName(256, dev), "cuDeviceGetName")
        name = (
            name.split(b"\0")[0].decode(errors="replace") if isinstance(name, bytes) else str(name)
        )
        version = _ok(cu.cuDriverGetVersion(), "cuDriverGetVersion")
        ctx = _ok(cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
        _devices[ordinal] = _Device(ordinal, name, major * 10 + minor, sms, version, ctx)
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


# ------------------------------------------------------------------ the built kernel
@dataclass(frozen=True)
class _Mode:
    """One option set of the target: the options the build used and the op's input names for it."""

    options: dict
    names: tuple[str, ...]

    def label(self) -> str:
        opts = ", ".join(f"{k}={v}" for k, v in sorted(self.options.items()))
        return f"({', '.join(self.names)})" + (f" {{{opts}}}" if opts else "")


class BuiltKernel:
    """A built target as a callable; see load()."""

    def __init__(self, build: Path, manifest: dict, folder: Path, allow_fallback: bool = False):
        self.build_dir, self.manifest, self.allow_fallback = Path(build), manifest, allow_fallback
        self.target, self.arch = manifest["target"], manifest["arch"]
        self.op = load_op(str(Path(folder).resolve()), Path("/"))
        self._check_artifacts()
        self._check_op_files()
        self.entries = [e for e in manifest["dispatch"] if e.get("params") is not None]
        self.dtypes = sorted({e["problem"]["dtype"] for e in self.entries})
        self._modes: list[_Mode] | None = None
        self._choice: dict[tuple, dict | None] = {}
        self._specs: dict[tuple, dict] = {}
        self._functions: dict[tuple[int, str], Any] = {}
        self._warned: set = set()
        self.calls = 0  # kernel launches made (not fallbacks)

    def __repr__(self) -> str:
        return f"<ptxbuild kernel {self.target} ({self.arch}), {len(self.entries)} problem(s)>"

    # ---------------------------------------------------------- checks at load time
    def _check_artifacts(self) -> None:
        for digest, v in sorted(self.manifest["variants"].items()):
            for kind, want in (("cubin", digest), ("ptx", v.get("ptx_sha256"))):
                path = self.build_dir / v[kind]
                if not path.is_file():
                    raise LoaderError(f"{path} is missing; rebuild: ptxbuild build {self.target}")
                if want is not None and _sha256(path) != want:
                    raise LoaderError(
                        f"{path} does not match its digest in manifest.json (sha256 "
                        f"{_sha256(path)[:16]}..., manifest {want[:16]}...): the artifact was modified; "
                        f"refusing it; rebuild: ptxbuild build --locked {self.target}"
                    )

    def _check_op_files(self) -> None:
        built = self.manifest.get("op_files")
        if not built:
            return
        now = {p.name: _sha256(p) for p in source_files(self.op) if p.is_file()}
        changed = sorted(n for n in set(built) | set(now) if built.get(n) != now.get(n))
        if changed:
            raise LoaderError(
                f"{self.op.FOLDER}/{changed[0]} changed since {self.target} was built: its kernels may "
                f"no longer match the op's arguments; rebuild: ptxbuild build {self.target}"
            )

    # ---------------------------------------------------------- dispatch
    def modes(self) -> list[_Mode]:
        """The option sets built, each with the op's input names for it (from make_inputs on a tiny problem)."""
        if self._modes is None:
            out = []
            for e in self.entries:
                p = e["problem"]
                if not any(m.options == p["options"] for m in out):
                    out.append(_Mode(p["options"], tuple(self._tiny_inputs(Problem.make(**p)))))
            self._modes = out
        return self._modes

    def problem_like(self, mode: _Mode) -> Problem:
        """A built problem of `mode` (its first dispatch entry)."""
        return Problem.make(
            **next(e["problem"] for e in self.entries if e["problem"]["options"] == mode.options)
        )

    def _tiny_inputs(self, problem: Problem) -> dict:
        tiny = problem.with_shape(tuple(min(d, 3) for d in problem.shape[:-1]) + problem.shape[-1:])
        return self.op.make_inputs(tiny, 0, np)

    def _input_specs(self, problem: Problem) -> dict[str, tuple[tuple[int, ...], str]]:
        """name -> (shape, dtype) the op expects for `problem`: inputs shaped like the problem scale with it."""
        key = (problem.dtype, problem.shape, json.dumps(problem.opts, sort_keys=True, default=str))
        if key in self._specs:
            return self._specs[key]
        tiny_shape = tuple(min(d, 3) for d in problem.shape[:-1]) + problem.shape[-1:]
        self._specs[key] = {
            name: (problem.shape if tuple(a.shape) == tiny_shape else tuple(a.shape), _dtype_of(a))
            for name, a in self._tiny_inputs(problem).items()
        }
        return self._specs[key]

    def bind(self, args: tuple, kwargs: dict) -> tuple[_Mode, dict]:
        """Match positional and keyword arguments to one built option set: (mode, name -> array)."""
        opt_names = set(getattr(self.op, "OPTIONS", {}))

        # a tensor is always an input, even when an option shares its name (rmsnorm's `weight`)
        def is_array(v):
            return (
                hasattr(v, "data_ptr")
                or hasattr(v, "__cuda_array_interface__")
                or hasattr(v, "shape")
            )

        given_opts = {k: v for k, v in kwargs.items() if k in opt_names and not is_array(v)}
        arrays = {k: v for k, v in kwargs.items() if k not in given_opts}
        defaults = dict(getattr(self.op, "OPTIONS", {}))
        for mode in self.modes():
            full = {**defaults, **mode.options}
            if len(args) > len(mode.names) or any(full.get(k) != v for k, v in given_opts.items()):
                continue
            bound = dict(zip(mode.names, args))
            if set(bound) & set(arrays) or set(bound) | set(arrays) != set(mode.names):
                continue
            return mode, {n: (bound | arrays)[n] for n in mode.names}
        got = (
            [f"{len(args)} positional"]
            + sorted(arrays)
            + [f"{k}={v}" for k, v in sorted(given_opts.items())]
        )
        raise LoaderError(
            f"{self.target}: arguments ({', '.join(got)}) match no built mode; built: "
            + "; ".join(m.label() for m in self.modes())
        )

    def select(self, problem: Problem) -> dict | None:
        """The dispatch entry whose binary is correct for `problem`, or None: an entry of another shape qualifies
        only if the op accepts its config for this problem (op.check) and renders the very same kernel for it (so
        shape constants baked into the binary agree); among those the nearest built shape wins."""
        key = (problem.dtype, problem.shape, json.dumps(problem.opts, sort_keys=True, default=str))
        if key in self._choice:
            return self._choice[key]
        same = [
            e
            for e in self.entries
            if e["problem"]["dtype"] == problem.dtype
            and e["problem"]["options"] == problem.opts_json
        ]
        choice = next((e for e in same if tuple(e["problem"]["shape"]) == problem.shape), None)
        if choice is None:

            def distance(e):
                s = e["problem"]["shape"]
                return (
                    len(s) != len(problem.shape),
                    sum(abs(np.log2(max(a, 1) / max(b, 1))) for a, b in zip(s, problem.shape)),
                )

            for e in sorted(same, key=distance):
                if (
                    len(e["problem"]["shape"]) != len(problem.shape)
                    or self.op.check(e["params"], problem) is not None
                ):
                    continue
                built = Problem.make(**e["problem"])
                if self.op.render(e["params"], problem, self.arch) == self.op.render(
                    e["params"], built, self.arch
                ):
                    choice = e
                    break
        self._choice[key] = choice
        return choice

    def _built_shapes(self, dtype: str, opts: dict) -> str:
        labels = sorted(
            {
                "x".join(map(str, e["problem"]["shape"]))
                for e in self.entries
                if e["problem"]["dtype"] == dtype and e["problem"]["options"] == opts
            }
        )
        return ", ".join(labels) or "none"

    # ---------------------------------------------------------- the call
    def __call__(self, *args, **kwargs):
        vals = list(self.run(*args, **kwargs).values())
        return vals[0] if len(vals) == 1 else tuple(vals)

    def problem_of(self, mode: _Mode, arrays: dict) -> Problem:
        primary = arrays[mode.names[0]]
        kinds = {_kind(a) for a in arrays.values()}
        if not kinds <= {"torch", "cupy"} or len(kinds) != 1:
            raise LoaderError(
                f"{self.target}: inputs must all be torch tensors or all cupy arrays, got "
                + ", ".join(
                    f"{n}: {type(a).__module__}.{type(a).__name__}" for n, a in arrays.items()
                )
            )
        dtype = _dtype_of(primary)
        if dtype not in self.dtypes:
            raise LoaderError(
                f"{self.target}: dtype {dtype} of input {mode.names[0]} is not built; built dtypes: "
                f"{', '.join(self.dtypes)} (add it to the op's dtypes in kernelfile.toml and rebuild)"
            )
        problem = Problem.make(self.op.NAME, dtype, tuple(primary.shape), mode.options)
        for name, (shape, dt) in self._input_specs(problem).items():
            a = arrays[name]
            if tuple(a.shape) != shape or _dtype_of(a) != dt:
                raise LoaderError(
                    f"{self.target}: input {name} is {_dtype_of(a)}[{'x'.join(map(str, a.shape))}], "
                    f"expected {dt}[{'x'.join(map(str, shape))}] for {problem.label()}"
                )
            if not _contiguous(a):
                raise LoaderError(
                    f"{self.target}: input {name} is not contiguous (strides {_strides(a)}); "
                    f"pass {name}.contiguous()"
                )
        return problem

    def run(self, *args, **kwargs) -> dict:
        """Like calling the kernel, but returns every output by name."""
        mode, arrays = self.bind(args, kwargs)
        problem = self.problem_of(mode, arrays)
        entry = self.select(problem)
        if entry is None:
            msg = (
                f"{self.target}: no built variant covers {problem.label()}; built shapes for {problem.dtype}: "
                f"{self._built_shapes(problem.dtype, problem.opts_json)} (add the shape to kernelfile.toml and rebuild)"
            )
            if not self.allow_fallback:
                raise LoaderError(
                    msg + " or load with allow_fallback=True to run the op's reference"
                )
            return self._fallback(problem, arrays, msg)
        primary = arrays[mode.names[0]]
        ordinal = self._device_of(arrays, mode)
        if ordinal is None:
            if self.allow_fallback:
                return self._fallback(problem, arrays, f"{self.target}: no CUDA GPU")
            raise LoaderError(
                f"{self.target}: no CUDA GPU is visible, and the built kernels need one "
                f"(or load with allow_fallback=True to run the op's reference on the CPU)"
            )
        if hasattr(self.op, "KERNELS"):  # one launch below: the other entries would never run
            raise LoaderError(
                f"{self.target}: {self.op.NAME} runs several kernels in order (KERNELS); "
                f"ptxbuild.load runs single-kernel ops only"
            )
        dev = _device(ordinal)
        fn = self._function(dev, entry["binary"])
        outputs = self._outputs(problem, primary)
        if _kind(primary) == "torch":
            import torch

            stream = torch.cuda.current_stream(primary.device).cuda_stream
            ins = {n: _Ptr(a) for n, a in arrays.items()}
            outs = {n: _Ptr(a) for n, a in outputs.items()}
        else:
            import cupy

            stream = cupy.cuda.get_current_stream().ptr
            ins, outs = arrays, outputs
        params = self.op.kernel_args(entry["params"], problem, ins, outs)
        geom = self.op.launch(entry["params"], problem, dev.sm_count)
        with _Current(dev):
            _launch(fn, geom, params, stream)
        self.calls += 1
        return outputs

    def _device_of(self, arrays: dict, mode: _Mode) -> int | None:
        primary = arrays[mode.names[0]]
        if _kind(primary) == "torch":
            import torch

            if not torch.cuda.is_available():
                return None
            for name, a in arrays.items():
                if a.device != primary.device or a.device.type != "cuda":
                    raise LoaderError(
                        f"{self.target}: input {name} is on {a.device}; every input must be on one "
                        f"CUDA device (move it with .to('cuda'))"
                    )
            return (
                primary.device.index
                if primary.device.index is not None
                else torch.cuda.current_device()
            )
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

    def _outputs(self, problem: Problem, like) -> dict:
        if _kind(like) == "torch":
            import torch

            return self.op.make_outputs(problem, _TorchXp(torch, like.device))
        import cupy

        return self.op.make_outputs(problem, cupy)

    def _function(self, dev: _Device, digest: str):
        """The kernel of variant `digest` loaded on `dev`: the cubin if the driver takes it, else its PTX."""
        key = (dev.ordinal, digest)
        if key in self._functions:
            return self._functions[key]
        v = self.manifest["variants"][digest]
        if not arch_runs_on(v["arch"], dev.cc):
            raise LoaderError(
                f"{self.target} was built for {v['arch']}; this GPU ({dev.name}) is sm_{dev.cc}: "
                f"declare a target for it in kernelfile.toml and build it"
            )
        cu = _cu()
        why = []
        with _Current(dev):
            for kind in ("cubin", "ptx"):
                data = (self.build_dir / v[kind]).read_bytes()
                if kind == "ptx":
                    if too_new := load_choice(v.get("ptx_isa", ""), dev.driver_version):
                        why.append(f"ptx: {too_new}")
                        continue
                    data += b"\0"
                buf = np.frombuffer(data, dtype=np.uint8)
                res = cu.cuModuleLoadData(buf.ctypes.data)
                if res[0] != cu.CUresult.CUDA_SUCCESS:
                    why.append(f"{kind}: {res[0].name}")
                    continue
                self._functions[key] = _ok(
                    cu.cuModuleGetFunction(res[1], v["entry"].encode()), "cuModuleGetFunction"
                )
                return self._functions[key]
        raise LoaderError(
            f"{self.target}: this driver (CUDA {driver_cuda(dev.driver_version)}) can load neither the "
            f"cubin nor the PTX of {v['entry']} ({'; '.join(why)}); upgrade the NVIDIA driver, or "
            f"rebuild with a compiler no newer than the driver"
        )

    def _fallback(self, problem: Problem, arrays: dict, why: str) -> dict:
        """The op's float reference on the host, rounded to the output types: explicit, slow, warned about."""
        if why not in self._warned:
            self._warned.add(why)
            warnings.warn(
                f"{why}; running {self.op.NAME}'s reference instead (allow_fallback=True; slow)",
                RuntimeWarning,
                stacklevel=4,
            )
        from .dtypes import from_float

        ref = self.op.reference(problem, {n: _to_numpy(a) for n, a in arrays.items()}, np)
        like = next(iter(arrays.values()))
        out = {}
        for name, empty in self.op.make_outputs(problem, np).items():
            dt = _NP_TO_DTYPE.get(str(empty.dtype), str(empty.dtype))
            val = np.asarray(ref[name]).reshape(empty.shape)
            out[name] = _from_numpy(
                np.ascontiguousarray(
                    from_float(val, dt, np) if dt == "bfloat16" else val.astype(empty.dtype)
                ),
                like,
            )
        return out


def _launch(fn, geom, args: list, stream: int) -> None:
    """cuLaunchKernel on `stream`, or cuLaunchKernelEx with launch attributes (cluster, PDL)."""
    cu = _cu()
    if 0 in tuple(geom.grid):
        return  # nothing to do (e.g. M = 0)
    smem = int(geom.smem_bytes)
    if smem > SMEM_DEFAULT_BYTES:
        _ok(
            cu.cuFuncSetAttribute(
                fn, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem
            ),
            "cuFuncSetAttribute(max dynamic shared memory)",
        )
    params = [_param(a) for a in args]
    ptrs = np.array([p.ctypes.data for p in params], dtype=np.uint64)
    hstream = cu.CUstream(int(stream))
    if geom.plain:
        _ok(
            cu.cuLaunchKernel(
                fn,
                *(int(v) for v in geom.grid),
                *(int(v) for v in geom.block),
                smem,
                hstream,
                ptrs.ctypes.data,
                0,
            ),
            "cuLaunchKernel",
        )
        return
    if int(np.prod(geom.cluster)) > PORTABLE_CLUSTER:
        _ok(
            cu.cuFuncSetAttribute(
                fn, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1
            ),
            "cuFuncSetAttribute(non-portable cluster)",
        )
    cfg = cu.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = (int(v) for v in geom.grid)
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = (int(v) for v in geom.block)
    cfg.sharedMemBytes, cfg.hStream = smem, hstream
    attrs = launch_attributes(cu, geom)
    cfg.attrs, cfg.numAttrs = attrs, len(attrs)
    cfg.gridDimX = resident_grid(cu, fn, cfg, geom)
    _ok(cu.cuLaunchKernelEx(cfg, fn, ptrs.ctypes.data, 0), "cuLaunchKernelEx")
