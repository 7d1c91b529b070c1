"""Hold a stream until the host has enqueued a timed call (a "blocking kernel", as nvbench has).

Without it, a call whose host side is slow (torch.compile's guards: tens of microseconds) reaches the GPU after its
start event fired, and the idle gap counts as kernel time (H200, run 16d: torch.compile at bf16 32768 x 512 read 34.6 us
in one build, 20.8 in another). Behind the gate the start event, the call and the end event reach the GPU together.

The gate is one thread spinning on a word in pinned host memory (mapped into the device's address space), released when
the host writes the hold number there. It gives up after `max_wait_s`, so a call that synchronizes on the host cannot
deadlock the stream (`timed_out()`: the timer retries or drops it).
"""

from __future__ import annotations

import numpy as np

SRC = r"""
extern "C" __global__ void ptxbuild_gate(const volatile unsigned int* flag, unsigned int want,
                                         long long max_cycles, unsigned int* timed_out) {
  const long long start = clock64();
  while (*flag < want) {
    if (clock64() - start > max_cycles) { *timed_out = 1u; return; }
  }
}
"""


class Gate:
    def __init__(self, cp, max_wait_s: float = 0.25):
        self.cp = cp
        self._mem = cp.cuda.alloc_pinned_memory(4)
        self._host = np.frombuffer(self._mem, dtype=np.uint32, count=1)
        self._host[0] = 0
        get_dev = getattr(
            cp.cuda.runtime, "hostGetDevicePointer", None
        )  # under UVA: the same address
        self._dev = get_dev(self._mem.ptr, 0) if get_dev else self._mem.ptr
        self._timed_out = cp.zeros(1, dtype=cp.uint32)
        self._max_cycles = np.int64(
            max_wait_s * cp.cuda.Device().attributes["ClockRate"] * 1e3
        )  # ClockRate: kHz
        self._kernel = cp.RawKernel(SRC, "ptxbuild_gate")
        self._batch = 0

    def hold(self, stream) -> None:
        """Enqueue a gate on `stream`: work enqueued after it waits until release()."""
        self._batch += 1
        self._kernel(
            (1,),
            (1,),
            (np.uint64(self._dev), np.uint32(self._batch), self._max_cycles, self._timed_out),
            stream=stream,
        )

    def release(self) -> None:
        """Open the last gate held (the host has enqueued everything behind it)."""
        self._host[0] = self._batch

    def timed_out(self) -> bool:
        """Did a gate give up waiting since the last reset()? (read after the stream synchronized)"""
        return bool(int(self._timed_out.get()[0]))

    def reset(self) -> None:
        self._timed_out.fill(0)
