"""lab/mma_probe.py compiles on a machine without a GPU: one warp's chains stay independent
(the inner loop unrolled: a multiple of `chains` mma in the PTX) and fit in registers."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("mma_probe", ROOT / "lab" / "mma_probe.py")
probe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(probe)


@pytest.mark.parametrize("chains", probe.CHAINS)
def test_each_probe_kernel_has_its_chains_unrolled_and_no_spills(chains):
    pytest.importorskip("cuda.bindings", reason="needs the CUDA compiler wheels")
    from ptxbuild.compile.compiler import compile_kernel

    b = compile_kernel(probe.kernel(chains), "sm_90a")
    n = b.ptx.count("mma.sync.aligned.m16n8k16")
    assert n >= chains and n % chains == 0
    assert b.spill_bytes == 0 and b.local_bytes == 0
    assert b.registers >= 4 * chains  # every chain's accumulators live in registers
