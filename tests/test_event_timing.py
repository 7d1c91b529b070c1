"""benchmarks/event_timing.py and benchmarks/copy_floor.py: the parts that run without a GPU."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "lab"))  # chunk_regs_sweep.py

import copy_floor  # noqa: E402
from event_timing import event_times_us, quantile  # noqa: E402


def fake_cupy(durations_ms):
    """A cupy stand-in whose events measure the next duration of `durations_ms` and log the order."""
    log, left = [], list(durations_ms)

    class Event:
        def record(self):
            log.append("record")

        def synchronize(self):
            log.append("sync")

    def elapsed(start, end):
        return left.pop(0)

    stream = SimpleNamespace(synchronize=lambda: log.append("wait"))
    return SimpleNamespace(
        cuda=SimpleNamespace(
            Event=Event, get_elapsed_time=elapsed, get_current_stream=lambda: stream
        )
    ), log


def test_event_times_are_sorted_microseconds_each_after_a_flush():
    cp, log = fake_cupy([0.030, 0.010, 0.020])
    flush = SimpleNamespace(fill=lambda v: log.append(f"flush {v}"))
    calls = []
    times = event_times_us(cp, lambda: (calls.append(1), log.append("call")), flush, 3)
    assert times == [10.0, 20.0, 30.0]
    assert len(calls) == 2 + 3  # two warm-up calls, then one per rep
    # warm-up calls waited for; then flush, start event, the call, end event, wait for the end event
    assert log[:8] == ["call", "call", "wait", "flush 0", "record", "call", "record", "sync"]
    assert (
        quantile(times, 0.5) == 20.0
        and quantile(times, 0.0) == 10.0
        and quantile(times, 1.0) == 30.0
    )


def test_event_times_batch_and_cold_pacing():
    cp, log = fake_cupy([0.001] * 8)
    flush = SimpleNamespace(fill=lambda v: log.append("flush"))
    assert event_times_us(cp, lambda: log.append("call"), flush, 3, batch=3) == [1.0] * 3
    one = ["flush", "record", "call", "record"]
    assert log[3:] == one * 3 + ["sync"]  # three calls enqueued, then one wait
    del log[:]
    assert event_times_us(cp, lambda: log.append("call"), flush, 3, batch=3, cold=True) == [1.0] * 3
    cold = ["flush", "wait", "record", "call", "record", "sync"]
    assert log[3:] == cold * 3  # each flush waited for, each call alone
    del log[:]
    gate = SimpleNamespace(
        hold=lambda stream: log.append("hold"),
        release=lambda: log.append("release"),
        reset=lambda: log.append("reset"),
        timed_out=lambda: False,
    )
    event_times_us(cp, lambda: log.append("call"), flush, 1, cold=True, gate=gate)
    assert log[:1] + log[4:] == [
        "reset",
        "flush",
        "wait",
        "hold",
        "record",
        "call",
        "record",
        "release",
        "sync",
    ]
    gate.timed_out = lambda: True  # a call waited on the GPU from the host
    with pytest.raises(RuntimeError, match="gate timed out"):
        event_times_us(cp, lambda: None, flush, 1, cold=True, gate=gate)


def test_copy_floor_reads_the_plain_bf16_rows_of_a_report(tmp_path):
    report = tmp_path / "report.json"
    rows = [
        {"problem": {"dtype": "bfloat16", "options": {}, "shape": [32768, 512]}, "p50_ms": 0.0215},
        {
            "problem": {"dtype": "bfloat16", "options": {"residual": True}, "shape": [32768, 512]},
            "p50_ms": 0.037,
        },
        {"problem": {"dtype": "float16", "options": {}, "shape": [32768, 256]}, "p50_ms": 0.0134},
        {"problem": {"dtype": "bfloat16", "options": {}, "shape": [32768, 256]}, "p50_ms": None},
    ]
    report.write_text(json.dumps({"dispatch": rows}))
    assert copy_floor.report_p50(report) == {(32768, 512): 21.5}
    assert (
        copy_floor.report_p50(tmp_path / "missing.json") == {} and copy_floor.report_p50(None) == {}
    )


def test_chunk_regs_sweep_yields_chunk_configs_refused_only_for_registers():
    import chunk_regs_sweep as sweep

    from ptxbuild.oploader import load_op

    op = load_op("rmsnorm", ROOT)
    rows = list(sweep.configs(op))
    assert rows and all(p["stage"] == "chunk" and p["regime"] == "block" for _, p, _, _ in rows)
    for problem, params, est, cap in rows:
        why = op.check(params, problem)
        assert (why is None) == (est <= cap), (problem.label(), params, why)
        assert why is None or "registers" in why
    assert any(est > cap for _, _, est, cap in rows)  # the sweep covers refusals too
