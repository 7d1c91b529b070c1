"""fla's chunk_kda beside ptxbuild's kda@h200 on the H200 (a separate file: fla's Triton autotuning
costs about a minute on a cold machine, once per head count; both tests use H = 64 so it is paid
once). Skipped with the reason where fla is not installed."""

import os

import pytest

from .test_runtime_gpu import FLAGS, _case, _load, _rel_rms, pytestmark, torch  # noqa: F401

os.environ.setdefault("FLA_FLASH_KDA", "0")  # fla's own Triton kernels, not FlashKDA's, if present

# one sequence and varlen, both H64: FLA's autotune keys on (H, K, V, chunk), so it runs once
FLA_CASES = [(64, (300,)), (64, (17, 100, 183))]


@pytest.fixture(scope="module")
def kda():
    return _load("kda@h200")


def test_kda_agrees_with_fla_chunk_kda(kda):
    fla = pytest.importorskip("fla.ops.kda", reason="fla is not installed (pip install fla-core)")
    import inspect

    names = set(inspect.signature(fla.chunk_kda).parameters)
    for H, lengths in FLA_CASES:
        ins, ref = _case(kda, H, lengths)
        o, hT = kda(**ins, output_final_state=True, state_v_first=True, **FLAGS)
        kw = dict(ins, output_final_state=True, **FLAGS)
        if "state_v_first" in names:
            kw["state_v_first"] = True
        else:
            kw["initial_state"] = ins["initial_state"].transpose(-1, -2).contiguous()
        with torch.inference_mode():
            o_f, hT_f = fla.chunk_kda(**kw)
        if "state_v_first" not in names:
            hT_f = hT_f.transpose(-1, -2)
        e = _rel_rms(o.float().cpu().numpy(), o_f.float().cpu().numpy())
        e_h = _rel_rms(hT.cpu().numpy(), hT_f.float().cpu().numpy())
        e_ref = _rel_rms(o_f[0].float().cpu().numpy(), ref["o"])
        print(
            f"H{H} {lengths}: ptxbuild vs fla o {e:.2e} hT {e_h:.2e}; fla vs float64 o {e_ref:.2e}"
        )
        assert e <= 1e-2 and e_h <= 1e-2


def test_fla_layer_runs_ptxbuild_after_install(kda):
    pytest.importorskip("fla.layers.kda", reason="fla is not installed (pip install fla-core)")
    from fla.layers.kda import KimiDeltaAttention

    from ptxbuild.runtime import fla as ptxfla

    torch.manual_seed(0)
    layer = KimiDeltaAttention(hidden_size=2048, head_dim=128, num_heads=64, safe_gate=True,
                               lower_bound=-5.0).cuda().bfloat16().eval()  # fmt: skip
    x = torch.randn(1, 1024, 2048, device="cuda").bfloat16()
    with torch.inference_mode():
        want = layer(x)[0]
        how = ptxfla.install(kda)
        before = kda.calls
        try:
            got = layer(x)[0]
        finally:
            ptxfla.uninstall()
    print(f"{how}; kernel calls {kda.calls - before}")
    assert kda.calls - before == 1
    e = _rel_rms(got.float().cpu().numpy(), want.float().cpu().numpy())
    print(f"fla layer output, ptxbuild vs fla: relative RMS {e:.2e}")
    assert e <= 2e-2
