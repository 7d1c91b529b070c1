"""The one launcher (issue 26 item 6): ptxbuild.launch loads modules and launches kernels for both
the GPU worker (gpu/device.py) and the runtime (runtime/driver.py), checked against a recording
stand-in for cuda.bindings.driver (no GPU): the images tried in order, PTX handed to the driver
NUL-terminated, a module missing an entry unloaded, the argument bytes, the function attributes,
cuLaunchKernel for a plain launch and cuLaunchKernelEx for a cluster one, nothing for an empty grid."""

import ctypes
import struct
import sys
import types

import numpy as np
import pytest

from ptxbuild import launch as shared
from ptxbuild.problem import Launch

cu_real = pytest.importorskip("cuda.bindings.driver", reason="needs cuda-bindings")


class FakeDriver:
    """cuda.bindings.driver's names the launcher uses; calls recorded, results as asked."""

    CUresult, CUfunction_attribute = cu_real.CUresult, cu_real.CUfunction_attribute
    CUlaunchAttribute, CUlaunchAttributeID = cu_real.CUlaunchAttribute, cu_real.CUlaunchAttributeID
    CUlaunchConfig, CUstream = cu_real.CUlaunchConfig, cu_real.CUstream
    OK, BAD = cu_real.CUresult.CUDA_SUCCESS, cu_real.CUresult.CUDA_ERROR_INVALID_IMAGE

    def __init__(self, refuse=(), missing=(), static_smem=0):
        self.calls, self.refuse, self.missing, self.next = [], set(refuse), set(missing), 100
        self.static_smem = static_smem

    def cuFuncGetAttribute(self, attr, fn):
        assert attr == self.CUfunction_attribute.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES
        return self.OK, self.static_smem

    def cuModuleLoadData(self, addr):
        head = ctypes.string_at(addr, 5)
        self.calls.append(("load", head))
        if head in self.refuse:
            return self.BAD, None
        self.next += 1
        return self.OK, self.next

    def cuModuleGetFunction(self, module, name):
        self.calls.append(("function", module, name))
        return (self.BAD, None) if name in self.missing else (self.OK, f"{module}:{name.decode()}")

    def cuModuleUnload(self, module):
        self.calls.append(("unload", module))
        return self.OK

    def cuFuncSetAttribute(self, fn, attr, value):
        self.calls.append(("attribute", fn, attr, value))
        return self.OK

    def cuLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        ptrs = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
        args = [ctypes.string_at(ptrs[i], 8) for i in range(3)]
        self.calls.append(("launch", fn, (gx, gy, gz), (bx, by, bz), smem, int(stream), args))
        return (self.OK,)

    def cuLaunchKernelEx(self, cfg, fn, params, extra):
        self.calls.append(("launch_ex", fn, int(cfg.gridDimX), cfg.numAttrs))
        return (self.OK,)


def _ok(result, what):
    err = result[0] if isinstance(result, tuple) else result
    if err != cu_real.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what}: {err.name}")


def test_load_module_takes_the_first_image_the_driver_loads():
    cu = FakeDriver(refuse={b"CUBIN"})
    module, fns = shared.load_module(cu, [("cubin", b"CUBIN"), ("ptx", b".vers")], ["a", "b"], _ok)
    assert module == 101 and fns == {"a": "101:a", "b": "101:b"}
    assert cu.calls[:2] == [("load", b"CUBIN"), ("load", b".vers")]
    cu = FakeDriver(missing={b"b"})  # the cubin loads but lacks an entry: unloaded, PTX tried
    module, why = shared.load_module(cu, [("cubin", b"CUBIN")], ["a", "b"], _ok)
    assert module is None and why == ["cubin: b: CUDA_ERROR_INVALID_IMAGE"]
    assert ("unload", 101) in cu.calls


def test_ptx_reaches_the_driver_nul_terminated(monkeypatch):
    seen = []

    class Cu(FakeDriver):
        def cuModuleLoadData(self, addr):
            seen.append(ctypes.string_at(addr))  # reads up to the first NUL
            return super().cuModuleLoadData(addr)

    ptx = b".version 9.0\n.target sm_90a"
    shared.load_module(Cu(), [("ptx", ptx)], ["k"], _ok)
    assert seen == [ptx]


def test_a_plain_launch_packs_its_arguments_and_sets_what_it_needs():
    cu = FakeDriver()
    ptr = types.SimpleNamespace(data=types.SimpleNamespace(ptr=0xABC0))  # cupy's .data.ptr
    geom = Launch((7, 1, 1), (256, 1, 1), 64 * 1024)
    shared.launch(cu, "fn", geom, [ptr, np.int64(5), np.float32(2.5)], 77, _ok)
    attr, launch = cu.calls
    smem = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    assert attr == ("attribute", "fn", smem, 64 * 1024)
    assert launch[:6] == ("launch", "fn", (7, 1, 1), (256, 1, 1), 64 * 1024, 77)
    p, n, x = launch[6]
    assert struct.unpack("<Q", p)[0] == 0xABC0 and struct.unpack("<q", n)[0] == 5
    assert struct.unpack("<f", x[:4])[0] == 2.5
    cu.calls.clear()
    shared.launch(cu, "fn", Launch((0, 1, 1), (256, 1, 1)), [], 77, _ok)  # M = 0: nothing
    assert cu.calls == []


def test_dynamic_shared_memory_is_opted_in_where_the_static_part_takes_it_past_48_kb():
    """Run 31d: a stream stage of exactly 48 KB of dynamic shared memory (3 x 16 KB) and ~200 B of
    mbarriers was launched without the opt-in, so not one cluster of it fit ("not resident")."""
    smem = FakeDriver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    geom = Launch((7, 1, 1), (512, 1, 1), 48 * 1024)
    cu = FakeDriver(static_smem=208)
    shared.set_function_attributes(cu, "fn", geom, _ok)
    assert cu.calls == [("attribute", "fn", smem, 48 * 1024)]
    cu = FakeDriver(static_smem=0)  # 48 KB in all: the default holds it, nothing to set
    shared.set_function_attributes(cu, "fn", geom, _ok)
    assert cu.calls == []


def test_a_cluster_launch_goes_through_cuLaunchKernelEx(monkeypatch):
    cu = FakeDriver()
    geom = Launch((32, 1, 1), (128, 1, 1), 0, (16, 1, 1))
    shared.launch(cu, "fn", geom, [np.int64(1)], 5, _ok)
    attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED
    assert cu.calls[0] == ("attribute", "fn", attr, 1)  # 16 CTAs: a non-portable cluster
    assert cu.calls[1] == ("launch_ex", "fn", 32, 1)


def test_the_worker_and_the_runtime_launch_through_the_one_launcher(monkeypatch):
    """gpu/device.py and runtime/driver.py both end in ptxbuild.launch (load_module, launch)."""
    from ptxbuild.gpu import device
    from ptxbuild.runtime import driver

    calls = []
    monkeypatch.setattr(shared, "launch", lambda *a: calls.append(("launch", a[1], a[4])))
    monkeypatch.setattr(shared, "load_module", lambda cu, images, entries, ok: (
        calls.append(("load", [k for k, _ in images], list(entries))) or 9, {e: e for e in entries}))  # fmt: skip
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(
        cuda=types.SimpleNamespace(runtime=types.SimpleNamespace(free=lambda p: None))))  # fmt: skip
    k = device.load("entry", b"CUBIN", ".version")
    device.launch(k, Launch((1, 1, 1), (32, 1, 1)), [], types.SimpleNamespace(ptr=3))
    monkeypatch.setattr(driver, "_cu", lambda: cu_real)
    driver._launch("fn", Launch((1, 1, 1), (32, 1, 1)), [], 4)
    assert calls[:3] == [
        ("load", ["cubin", "ptx"], ["entry"]),
        ("launch", "entry", 3),
        ("launch", "fn", 4),
    ]
    assert isinstance(k, device.Kernel) and k.fn == "entry"
    k.cu = types.SimpleNamespace(cuModuleUnload=lambda m: calls.append(("unload", m)))
    del k
    assert calls[-1] == ("unload", 9)  # a kernel the worker drops unloads its module
