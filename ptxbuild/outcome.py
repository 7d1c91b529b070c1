"""What happened to one candidate: an outcome is data, never an exception."""

from __future__ import annotations

from enum import Enum


class Outcome(str, Enum):
    OK = "ok"  # compiled (and, where a GPU ran it, verified and timed)
    INVALID = "invalid"  # rejected by the op's constraints before compiling
    PRUNED = "pruned"  # skipped because a lesson says it fails
    COMPILE_ERROR = "compile_error"
    SPILL = "spill"  # spills over the op's budget
    RESOURCE = "resource"  # registers/shared memory/threads over the GPU's limits
    LAUNCH_ERROR = "launch_error"
    ILLEGAL_ADDRESS = "illegal_address"
    TIMEOUT = "timeout"  # hang: the worker was killed and restarted
    UNWRITTEN = "unwritten"  # some outputs still hold the poison
    WRONG_RESULT = "wrong_result"
    INPUT_MODIFIED = "input_modified"
    NONDETERMINISTIC = "nondeterministic"
    SUSPICIOUS = "suspicious"  # faster than the roofline floor
    WORKER_CRASH = "worker_crash"
    STATEFUL = (
        "stateful"  # right on fresh poison, wrong after earlier calls (state kept between calls)
    )
    MEMCHECK = (
        "memcheck"  # compute-sanitizer memcheck reported an error (an out-of-bounds read, ...)
    )

    @property
    def failed(self) -> bool:
        return self is not Outcome.OK
