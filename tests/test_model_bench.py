"""benchmarks/model_bench.py's report (pure) and ptxbuild.patch_rmsnorm on a tiny transformers Llama
(CPU; skipped where torch or transformers is not installed)."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import model_bench as mb  # noqa: E402


def _t(p50, lo, hi):
    return {"p50": p50, "p20": lo, "p80": hi}


def test_summary_takes_the_median_and_the_20th_and_80th_percentiles():
    s = mb.summary([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (s["p50"], s["p20"], s["p80"], s["n"]) == (3.0, 2.0, 4.0, 5)


def test_report_json_rows_and_the_md_says_why_a_row_is_slower(tmp_path):
    rows = [
        mb.row("llama", "prefill", "eager", (1, 8192), _t(50.0, 49, 51), _t(48.0, 47, 49)),
        # slower by 1% with overlapping ranges: a tie at this resolution
        mb.row("llama", "decode", "cudagraph", (8, 1), _t(1.00, 0.99, 1.02), _t(1.01, 1.0, 1.03)),
        # slower in eager, with the host time per norm call measured
        mb.row(
            "llama",
            "decode",
            "eager",
            (1, 1),
            _t(5.0, 4.9, 5.1),
            _t(7.0, 6.9, 7.1),
            norms=17,
            norm_host_us={"stock": 20.0, "ptxbuild": 150.0},
        ),  # fmt: skip
        mb.row("fla-kda", "prefill", "eager", (1, 8192, 96), skipped="fla is not installed"),
    ]
    mb.write_report(tmp_path, {"gpu": {"name": "NVIDIA H200"}, "packages": {}}, rows)
    data = json.loads((tmp_path / "report.json").read_text())
    assert set(data) == {"environment", "rows"}
    first = data["rows"][0]
    assert {
        k: first[k] for k in ("model", "phase", "mode", "shape", "stock_ms", "ptxbuild_ms")
    } == {
        "model": "llama",
        "phase": "prefill",
        "mode": "eager",
        "shape": [1, 8192],
        "stock_ms": 50.0,
        "ptxbuild_ms": 48.0,
    }
    assert first["speedup"] == pytest.approx(50 / 48, abs=1e-4)
    assert data["rows"][3]["stock_ms"] is None and data["rows"][3]["ptxbuild_ms"] is None
    assert [mb.slower(r) for r in data["rows"]] == [False, True, True, False]
    md = (tmp_path / "report.md").read_text()
    slow = md.split("## Rows where ptxbuild is slower")[1].split("## Rows not measured")[0]
    assert "decode cudagraph 8x1: 1.010 against 1.000 ms — within timing noise: 1.010x" in slow
    assert "decode eager 1x1" in slow and "ptxbuild 150.0 us, stock 20.0 us x 17 norms" in slow
    assert "prefill eager 1x8192" not in slow
    assert "- fla-kda prefill eager 1x8192x96: fla is not installed" in md


def test_merge_keeps_an_earlier_runs_rows_this_run_did_not_measure(tmp_path):
    kda = dict(scenario="8x1024")
    earlier = [
        mb.row("llama", "prefill", "eager", (1, 8192), _t(50.0, 49, 51), _t(48.0, 47, 49)),
        mb.row("fla-kda", "prefill", "eager", (1, 8192, 96), _t(5.0, 4.9, 5.1), _t(4.0, 3.9, 4.1)),
        mb.row("fla-kda", "prefill", "eager", (1, 8192, 96), skipped="time budget spent", **kda),
    ]
    mb.write_report(tmp_path, {"git_revision": "abc1234", "gpu": {"name": "H200"}}, earlier)
    kept = mb.earlier_rows(tmp_path)
    assert len(kept) == 2  # the skipped row is not kept: this run's row replaces it
    assert kept[0]["measured_in"] == {"git_revision": "abc1234", "command": None, "gpu": "H200"}
    now = [
        mb.row("llama", "prefill", "eager", (1, 8192), _t(51.0, 50, 52), _t(47.0, 46, 48)),
        mb.row("fla-kda", "prefill", "eager", (1, 8192, 96), skipped="budget spent"),
        mb.row(
            "fla-kda", "prefill", "eager", (1, 8192, 96), _t(3.0, 2.9, 3.1), _t(2.0, 1.9, 2), **kda
        ),
    ]
    rows = mb.merged(kept, now)
    assert [(r["stock_ms"], "measured_in" in r) for r in rows] == [
        (51.0, False),  # measured again now: the new measurement
        (5.0, True),  # skipped now: the earlier measurement stays, and says where it came from
        (3.0, False),  # new
    ]
    mb.write_report(tmp_path, {"git_revision": "def5678"}, rows)
    assert "(measured in an earlier run: git abc1234)" in (tmp_path / "report.md").read_text()
    assert mb.merged([], now) == now


def test_a_clear_loss_is_not_called_noise():
    r = mb.row("llama", "decode", "cudagraph", (8, 1), _t(1.0, 0.99, 1.01), _t(1.1, 1.09, 1.11))
    assert mb.why_slower(r) == "not known"
    r = mb.row("llama", "decode", "compile", (8, 1), _t(1.0, 0.99, 1.01), _t(1.1, 1.09, 1.11))
    assert mb.why_slower(r).startswith("likely: inductor fuses the residual add")


def _tiny_llama():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        rms_norm_eps=1e-6,
    )
    torch.manual_seed(0)
    return torch, transformers.AutoModel.from_config(cfg, attn_implementation="sdpa").eval()


def test_patch_rmsnorm_replaces_every_norm_of_a_transformers_llama_and_keeps_its_weights():
    torch, model = _tiny_llama()
    import copy

    import ptxbuild
    from ptxbuild.integrations import PatchError

    for m in model.modules():  # non-trivial weights, so a lost weight would show in the output
        if type(m).__name__.endswith("RMSNorm"):
            m.weight.data.uniform_(0.5, 1.5)
    patched = copy.deepcopy(model)
    kernel = mb.fake_kernel(1e-6)
    assert ptxbuild.patch_rmsnorm(patched, kernel=kernel) == 3 * 2 + 1
    names = {type(m).__name__ for m in patched.modules()}
    assert "PtxbuildRMSNorm" in names and not any(n == "LlamaRMSNorm" for n in names)
    assert list(patched.state_dict()) == list(model.state_dict())
    ids = torch.randint(0, 128, (2, 5))
    with torch.inference_mode():
        want = model(input_ids=ids).last_hidden_state
        got = patched(input_ids=ids).last_hidden_state
    assert kernel.calls["n"] == 7  # one call per norm per forward
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)

    class Built:  # what ptxbuild.load returns, as far as the eps check looks: built for 1e-5 only
        op = type("Op", (), {"OPTIONS": {"eps": 1e-6}})

        def modes(self):
            return [type("Mode", (), {"options": {"eps": 1e-5}})()]

    with pytest.raises(
        PatchError, match=r"built for eps \[1e-05\], the model's RMSNorms use \[1e-06\]"
    ):
        ptxbuild.patch_rmsnorm(copy.deepcopy(model), kernel=Built())
    with pytest.raises(PatchError, match="has no RMSNorm module"):
        ptxbuild.patch_rmsnorm(torch.nn.Linear(2, 2), kernel=kernel)


def test_patch_rmsnorm_on_torch_modules_alone():
    """Without transformers (CI has CPU torch only): torch.nn.RMSNorm and a model's own *RMSNorm
    class are replaced, other modules are not, and the outputs keep their values."""
    torch = pytest.importorskip("torch")
    import ptxbuild

    class MyRMSNorm(torch.nn.Module):
        def __init__(self, n):
            super().__init__()
            self.weight, self.variance_epsilon = torch.nn.Parameter(torch.rand(n) + 0.5), 1e-6

        def forward(self, x):
            v = x.float().pow(2).mean(-1, keepdim=True)
            return self.weight * (x.float() * torch.rsqrt(v + self.variance_epsilon)).to(x.dtype)

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 16), MyRMSNorm(16), torch.nn.Linear(16, 16), torch.nn.RMSNorm(16, 1e-6)
    )
    x = torch.randn(3, 4, 16)
    with torch.no_grad():
        want = model(x)
        kernel = mb.fake_kernel(1e-6)
        assert ptxbuild.patch_rmsnorm(model, kernel=kernel) == 2
        got = model(x)
    assert [type(m).__name__ for m in model] == [
        "Linear",
        "PtxbuildRMSNorm",
        "Linear",
        "PtxbuildRMSNorm",
    ]
    assert kernel.calls["n"] == 2
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
