"""benchmarks/host_overhead.py without a GPU: its timing loop (a stand-in torch.cuda) and the
report it writes (the issue's JSON row keys, the .md table and its bar)."""

import importlib.util
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("host_overhead", ROOT / "benchmarks/host_overhead.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_time_calls_keeps_the_gpu_busy_and_alternates():
    events = []
    cuda = SimpleNamespace(
        _sleep=lambda cycles: events.append(("sleep", cycles)),
        synchronize=lambda: events.append(("sync",)),
        get_device_properties=lambda i: SimpleNamespace(clock_rate=1_980_000),  # kHz
    )
    fake_torch = SimpleNamespace(cuda=cuda)
    fns = {"a": lambda: events.append("a"), "b": lambda: time.sleep(0.0002) or events.append("b")}
    us = bench.time_calls(fns, 4, fake_torch)
    assert us["b"] > 150 and us["a"] < us["b"]
    assert events.count("a") == events.count("b") == 4 * bench.PER_ROUND
    assert events[0] == ("sleep", int(300e-6 * 1_980_000 * 1e3))  # ~300 us of spinning first
    first = [
        events[i + 1] for i, e in enumerate(events) if isinstance(e, tuple) and e[0] == "sleep"
    ]
    assert first == ["a", "b", "b", "a", "a", "b", "b", "a"]  # a spin before each batch; the
    # callable that goes first alternates per round


def test_report_rows_and_bar():
    rows = [
        dict(target="rmsnorm@h200", dtype="bfloat16", shape=[1, 4096], ptxbuild_host_us=6.0,
             torch_host_us=15.0),
        dict(target="rmsnorm@h200", dtype="bfloat16", shape=[64, 8192], ptxbuild_host_us=19.0,
             torch_host_us=15.0),
        dict(target="rmsnorm@h200", dtype="bfloat16", shape=[3, 100], ptxbuild_host_us=None,
             torch_host_us=15.0),
    ]  # fmt: skip
    env = dict(
        gpu="H200", torch="2.11", git_revision="abc", method="m", rounds=40, calls_per_round=16
    )
    md = bench.markdown(env, rows, [], ["3x100: no built variant covers"])
    assert "1 of 3 rows pass" in md
    assert "| 1 x 4096 | 6.0 | 15.0 | 0.40 |" in md and "| 64 x 8192 | 19.0 | 15.0 | 1.27 |" in md
    assert "| 3 x 100 | not built | 15.0 | - |" in md and "- 3x100: no built variant covers" in md
    assert set(rows[0]) == {"target", "dtype", "shape", "ptxbuild_host_us", "torch_host_us"}
