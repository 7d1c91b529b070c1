"""The planted_softmax kernels (tests/planted_softmax/op.py) emulated in numpy, launched through a
runs.Gpu with no device: the CPU tests run the worker's real verify() and timer on each cheat."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np

from ptxbuild.dtypes import from_float, to_float
from ptxbuild.oploader import load_op

OP_DIR = str(Path(__file__).with_name("planted_softmax").resolve())


def op():
    return load_op(OP_DIR, Path("."))


def bf16_round(a):
    return to_float(from_float(np.asarray(a, np.float32), "bfloat16", np), "bfloat16", np)


def kernel(bad: str, threads: int, state: dict, atol: float, counter_calls: int):
    """launch(kern, geom, args, stream) of planted_softmax with BAD=bad, as the CUDA source does it."""

    def launch(kern, geom, args, stream):
        x, y, m, n = args[0], args[1], int(args[2]), int(args[3])
        xv, yv = x.reshape(m, n), y.reshape(m, n)
        old = state["calls"]
        state["calls"] += 1
        rows = np.arange(m)
        skip = np.zeros(m, bool)
        if bad == "skip":
            skip = (rows % 16 == 0) & (yv[:, 0] != 0xFFFF)
        if bad == "counter" and old > counter_calls:
            skip = rows % 16 == 0
        xf = to_float(xv, "bfloat16", np)
        e = np.exp(xf - xf.max(axis=1, keepdims=True)).astype(np.float32)
        if bad == "bf16acc":
            acc = np.zeros((m, threads), np.float32)
            for k in range(0, n, threads):
                part = np.zeros((m, threads), np.float32)
                part[:, : min(threads, n - k)] = e[:, k : k + threads]
                acc = np.where(
                    np.arange(threads) < n - k, bf16_round(acc + part), acc
                )  # threads past the end add nothing
            s = acc.sum(axis=1, dtype=np.float32)
        else:
            s = e.sum(axis=1, dtype=np.float32)
        p = e / s[:, None]
        if bad == "zeros":
            p = np.where(p < atol, np.float32(0), p)
        if bad == "oob":
            state["read_past_end"] = True  # what memcheck would see; the values are right
        yv[~skip] = from_float(p, "bfloat16", np)[~skip]

    return launch


class XP:
    """numpy, plus a cuda namespace of fake events (1 ms a call) for the timer."""

    def __init__(self):
        class Event:
            def record(self, stream=None):
                pass

        self.cuda = SimpleNamespace(
            Event=Event,
            get_elapsed_time=lambda a, b: 1.0,
            runtime=SimpleNamespace(memGetInfo=lambda: (16 << 30, 32 << 30)),
        )

    def __getattr__(self, name):
        return getattr(np, name)


class Gate:
    def reset(self):
        pass

    def hold(self, stream):
        pass

    def release(self):
        pass

    def timed_out(self):
        return False


def gpu(monkeypatch, bad: str, threads: int = 128, state: dict | None = None):
    """(a runs.Gpu on numpy running planted_softmax's `bad` kernel, the kernel's state)."""
    from ptxbuild.gpu import runs

    o = op()
    state = state if state is not None else {"calls": 0}
    monkeypatch.setattr(runs, "load_op", lambda folder, root: o)
    monkeypatch.setattr(runs.device, "load", lambda entry, cubin, ptx="": entry)
    monkeypatch.setattr(runs.device, "launch", kernel(bad, threads, state, o.ATOL, o.COUNTER_CALLS))
    g = object.__new__(runs.Gpu)
    g.cp, g._pool, g._pool_key, g.kernels = XP(), [], None, {}
    g.stream = __import__("contextlib").nullcontext()
    g.sync = g.release = g.flush = lambda: None
    g.fingerprint = SimpleNamespace(sm_count=132, l2_bytes=50 << 20)
    g.gate, g.rotation, g.l2_bytes = Gate(), 0, 50 << 20
    return g, state


def binary(bad: str) -> dict:
    return {"entry": "planted_softmax", "digest": f"d-{bad}", "cubin": b"C", "arch": "sm_90a"}
