"""The worker process: reads JSON-line requests on stdin, runs them on one GPU, answers on stdout."""

from __future__ import annotations

import argparse
import base64
import json
import os
import signal
import sys
import traceback
from dataclasses import asdict

from ..problem import Binary, Problem, op_params
from . import errors


def encode_problem(p: Problem) -> dict:
    return p.key()


def decode_problem(d: dict) -> Problem:
    """The problem again, its options frozen (JSON's lists as tuples) so that it hashes."""
    return Problem.make(d["op"], d["dtype"], d["shape"], d["options"])


def encode_binary(b: Binary) -> dict:
    fields = {k: getattr(b, k) for k in ("entry", "digest", "arch", "ptx")}
    return {**fields, "cubin": base64.b64encode(b.cubin).decode()}


def decode_binary(d: dict) -> dict:
    return {**d, "cubin": base64.b64decode(d["cubin"])}


def encode_config(c: tuple | None) -> list | None:
    """A (params, Binary) pair the worker times beside a candidate (incumbent, winner), or None."""
    return [c[0], encode_binary(c[1])] if c else None


def decode_config(c: list | None) -> tuple | None:
    return (op_params(c[0]), decode_binary(c[1])) if c else None


_DECODE = {
    "params": op_params,
    "problem": decode_problem,
    "binary": decode_binary,
    "incumbent": decode_config,
    "winner": decode_config,
}


def handle(gpu, cmd: str, a: dict):
    if cmd == "hello":
        return {"fingerprint": asdict(gpu.fingerprint), "pid": os.getpid()}
    if cmd == "copy_bandwidth":
        return {"tbps": gpu.copy_bandwidth(**a)}
    if cmd in ("verify", "measure", "baselines"):  # the session's keywords are the Gpu's
        return getattr(gpu, cmd)(**{k: _DECODE[k](v) if k in _DECODE else v for k, v in a.items()})
    raise ValueError(f"unknown request {cmd!r}")


def serve(device: int, make_gpu=None, stdin=None) -> int:
    """The request loop. Kernel printf and stray prints go to stderr; stdout carries only replies.
    A sticky CUDA error (illegal address, ...) is answered, then the process exits: its context is lost."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    gpu = None
    for line in stdin or sys.stdin:
        req = json.loads(line)
        if req.get("cmd") == "exit":
            break
        fatal = False
        try:
            if gpu is None:
                if make_gpu is None:
                    from .runs import Gpu as make_gpu
                gpu = make_gpu(device)
            reply = {"ok": True, "result": handle(gpu, req["cmd"], req.get("args", {}))}
        except Exception as exc:  # noqa: BLE001 - everything goes back to the parent as data
            if errors.is_cuda_error(exc):
                outcome, fatal = errors.classify(str(exc))
                reply = {
                    "ok": False,
                    "fatal": fatal,
                    "cuda_error": {
                        "outcome": outcome.value,
                        "detail": f"{type(exc).__name__}: {exc}",
                    },
                }
            else:
                reply = {"ok": False, "error": traceback.format_exc()}
        proto.write(json.dumps(reply) + "\n")
        proto.flush()
        if fatal:
            os._exit(3)
    return 0


if __name__ == "__main__":
    # Ctrl-C is the build's (its process group gets it): the build stops this worker itself, after
    # it has marked the call in flight as cut short, so that the call is never taken for a crash
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", type=int, default=0)
    sys.exit(serve(ap.parse_args().device))
