"""On a GPU: a persistent cluster kernel (rmsnorm stage=pipe, cluster regime) through the user-facing
launcher (ptxbuild.runtime), whose grid must be lowered to the clusters that fit at once."""

from pathlib import Path

import numpy as np
import pytest

from ptxbuild.dtypes import to_float
from ptxbuild.gpu import gpu_available

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not gpu_available(), reason="needs an NVIDIA GPU and cupy (pip install cupy-cuda13x)"
    ),
]

ROOT = Path(__file__).resolve().parents[1]


def test_runtime_launches_persistent_clusters_no_more_than_fit(monkeypatch):
    """83 rows asked as 83 clusters of 8 (no SM count given to launch()): the launcher must lower the
    grid to the clusters that fit, and those clusters must still compute every row."""
    import cupy as cp

    from ptxbuild import launch as kernel_params
    from ptxbuild import runtime
    from ptxbuild.compile.compiler import compile_kernel
    from ptxbuild.oploader import load_op
    from ptxbuild.problem import Problem
    from ptxbuild.runtime import driver

    op = load_op("rmsnorm", ROOT)
    dev = runtime._device(0)
    if dev.cc < 90:
        pytest.skip(f"clusters need sm_90 or newer (this GPU is sm_{dev.cc})")
    arch = f"sm_{dev.cc}" + ("a" if dev.cc in (90, 100) else "")
    problem = Problem.make("rmsnorm", "bfloat16", (83, 65536), {"rstd": True})
    params = op._full(
        {"regime": "cluster", "cluster": 8, "threads": 512, "stage": "pipe", "load_hint": "nc"}
    )
    assert op.check(params, problem) is None
    binary = compile_kernel(op.render(params, problem, arch), arch)
    inputs, outputs = op.make_inputs(problem, 1, cp), op.make_outputs(problem, cp)
    geom = op.launch(params, problem, 0)
    assert geom.persistent and geom.grid == (83 * 8, 1, 1)

    real, launched = runtime._cu(), []

    class Driver:  # the driver, with the launch's grid recorded
        def __getattr__(self, name):
            return getattr(real, name)

        def cuLaunchKernelEx(self, cfg, *rest):
            launched.append(int(cfg.gridDimX))
            return real.cuLaunchKernelEx(cfg, *rest)

    monkeypatch.setattr(driver, "_cu", lambda: Driver())
    kernel_params._RESIDENT.clear()
    with runtime._Current(dev):
        buf = np.frombuffer(binary.cubin, dtype=np.uint8)
        module = runtime._ok(real.cuModuleLoadData(buf.ctypes.data), "cuModuleLoadData")
        fn = runtime._ok(
            real.cuModuleGetFunction(module, binary.entry.encode()), "cuModuleGetFunction"
        )
        runtime._launch(
            fn,
            geom,
            op.kernel_args(params, problem, inputs, outputs),
            cp.cuda.get_current_stream().ptr,
        )
    cp.cuda.get_current_stream().synchronize()
    (fits,) = kernel_params._RESIDENT.values()  # the launcher asked the driver, once
    # run 15f on an H200: 30 clusters of 8 x 512 fit at this N (2 CTAs per SM)
    assert 1 <= fits < 83 and launched == [fits * 8]
    ref = op.reference(problem, inputs, cp)
    for name in ("y", "rstd"):
        got = outputs[name] if name == "rstd" else to_float(outputs[name], "bfloat16", cp)
        atol, rtol = op.tolerance(problem, name)
        np.testing.assert_allclose(
            cp.asnumpy(got), cp.asnumpy(ref[name]).reshape(got.shape), atol=atol, rtol=rtol
        )
