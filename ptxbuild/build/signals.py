"""Ctrl-C and SIGTERM while a target builds: stop the search, hold a stop while a finished build is saved."""

from __future__ import annotations

import os
import signal
import sys
import threading
from contextlib import suppress
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (multiprocessing: ~20 ms to import, for a build that compiles nothing)
    from concurrent.futures import ProcessPoolExecutor


def compile_worker(parent: int) -> None:
    """A compile process leaves Ctrl-C to the build, which stops it (no traceback per process); takes
    SIGTERM (fork copied the build's handler, which made it a KeyboardInterrupt the pool caught); and
    dies with its build, even one killed with SIGKILL (Linux: PR_SET_PDEATHSIG)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        import ctypes

        with suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the build died before prctl took effect
        os._exit(1)


def stop_pool(pool: ProcessPoolExecutor, interrupted: bool) -> None:
    """Stopped: compiles in flight are killed, not waited for (one can take minutes)."""
    if interrupted:
        for proc in list((getattr(pool, "_processes", None) or {}).values()):
            with suppress(OSError):
                proc.terminate()
    pool.shutdown(wait=not interrupted, cancel_futures=True)


class Interrupts:
    """SIGINT (or SIGTERM) while a target builds: the first one stops the search (KeyboardInterrupt); the next
    one, which `timeout -s INT` (the child, then its process group) or a second Ctrl-C sends while
    the partial results are written, is ignored; a third stops at once. A first one that arrives
    while a finished build is saved (`saving`) is held like a second until the build is recorded."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)  # SIGTERM: plain `timeout`, job schedulers

    def __init__(self):
        self.count, self.prev, self.saving = 0, {}, False

    def _handle(self, signum, frame):
        self.count += 1
        if self.count != 2 and not (self.saving and self.count == 1):
            raise KeyboardInterrupt

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self.prev = {sig: signal.signal(sig, self._handle) for sig in self.SIGNALS}
        return self

    def __exit__(self, *exc):
        for sig, handler in self.prev.items():
            signal.signal(sig, handler)
