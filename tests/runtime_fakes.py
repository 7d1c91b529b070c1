"""A fake CUDA driver for the runtime's CPU tests: CPU tensors stand in for device memory, and
every kernel launch is recorded with the bytes of its arguments, so the prepared launch path
(pointer patching, packed scalars, grids, streams) is checked without a GPU."""

from __future__ import annotations

import ctypes
import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
DEV = SimpleNamespace(
    ordinal=0, name="fake H200", cc=90, sm_count=132, driver_version=13000, context=0
)


class _NoContext:
    def __init__(self, dev):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def install(monkeypatch) -> list[dict]:
    """Patch the runtime's driver side; returns the list each launch is appended to."""
    from ptxbuild.runtime import driver, fast, kda, kernel

    launches: list[dict] = []
    monkeypatch.setattr(kernel, "_device", lambda i: DEV)
    monkeypatch.setattr(driver, "_device", lambda i: DEV)
    monkeypatch.setattr(kda, "_device", lambda i: DEV)
    monkeypatch.setattr(kernel.BuiltKernel, "_device_of", lambda self, arrays, mode: 0)

    def load_functions(target, build_dir, variant, dev, entries):
        return {e: 1000 + i for i, e in enumerate(entries)}

    monkeypatch.setattr(kernel, "load_functions", load_functions)
    monkeypatch.setattr(fast, "_Current", _NoContext)
    monkeypatch.setattr(fast.shared, "set_function_attributes", lambda cu, fn, geom, ok: None)

    def launch(*args):  # cuLaunchKernel's arguments as ctypes objects (no argtypes)
        handle, gx, gy, gz, bx, by, bz, smem, stream, params = (a.value for a in args[:10])
        launches.append(
            dict(
                handle=handle,
                grid=(gx, gy, gz),
                block=(bx, by, bz),
                smem=smem,
                stream=stream,
                params=params,
            )  # fmt: skip
        )
        return 0

    monkeypatch.setattr(fast, "_ctypes_launch", lambda: launch)
    monkeypatch.setattr(fast, "raw_stream", lambda torch: lambda index: 77)
    monkeypatch.setenv("PTXBUILD_LAUNCHER", "ctypes")
    return launches


def arg(launch: dict, j: int, size: int = 8) -> bytes:
    """The bytes argument j of a recorded launch was given."""
    ptrs = ctypes.cast(launch["params"], ctypes.POINTER(ctypes.c_void_p))
    return ctypes.string_at(ptrs[j], size)


def ptr(launch: dict, j: int) -> int:
    return int.from_bytes(arg(launch, j), "little")


def fake_kda_build(
    dest: Path, problems: list[tuple[tuple, dict]], target: str = "kda@h200", params_of=None
) -> Path:
    """A build directory of the kda op with one fake binary per problem (params_of(op, problem), by
    default its default config): the manifest, dispatch table and artifacts the loader checks,
    without a compiler."""
    from ptxbuild.oploader import load_op
    from ptxbuild.problem import Problem

    op = load_op("kda", ROOT)
    build = dest / target
    build.mkdir(parents=True)
    variants, dispatch = {}, []
    for i, (shape, options) in enumerate(problems):
        cubin, ptx = f"kernel {i}".encode(), f"ptx {i}".encode()
        digest = hashlib.sha256(cubin).hexdigest()
        (build / f"k{i}.cubin").write_bytes(cubin)
        (build / f"k{i}.ptx").write_bytes(ptx)
        variants[digest] = dict(cubin=f"k{i}.cubin", ptx=f"k{i}.ptx", entry="kda_recurrence",
                                ptx_sha256=hashlib.sha256(ptx).hexdigest(), arch="sm_90a",
                                ptx_isa="9.0", registers=32, spill_bytes=0, compiler="fake")  # fmt: skip
        p = Problem.make("kda", "bfloat16", shape, options)
        dispatch.append(dict(problem=dict(op="kda", dtype="bfloat16", shape=list(shape),
                                          options=json.loads(json.dumps(options))),
                             params=(params_of or (lambda op, p: op.default_params(p)))(op, p), binary=digest, label=p.label()))  # fmt: skip
    manifest = dict(target=target, arch="sm_90a", op="kda", op_version=op.VERSION, template="kda",
                    gpu={}, measured_on_hardware=False, kernelfile_digest="", toolchain={},
                    hardware=None, variants=variants, dispatch=dispatch)  # fmt: skip
    (build / "manifest.json").write_text(json.dumps(manifest))
    return build
