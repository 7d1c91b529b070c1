"""Map a CUDA error message to an outcome, and say whether it left the context unusable."""

from __future__ import annotations

import re

from ..launch import NotResident
from ..outcome import Outcome

# (pattern over the error text, outcome, sticky: the process must die and be restarted)
_RULES = [
    (
        r"ILLEGAL_ADDRESS|IllegalAddress|illegal memory access|MISALIGNED_ADDRESS|MisalignedAddress|"
        r"misaligned address|INVALID_ADDRESS_SPACE|InvalidAddressSpace",
        Outcome.ILLEGAL_ADDRESS,
        True,
    ),
    (r"LAUNCH_TIMEOUT|LaunchTimeout", Outcome.TIMEOUT, True),
    (
        r"ILLEGAL_INSTRUCTION|IllegalInstruction|INVALID_PC|InvalidPc|HARDWARE_STACK_ERROR|HardwareStackError|"
        r"LAUNCH_FAILED|LaunchFailure|unspecified launch failure|ERROR_ASSERT|cudaErrorAssert|"
        r"device-side assert|ECC_UNCORRECTABLE|CONTEXT_IS_DESTROYED|cudaErrorContextIsDestroyed",
        Outcome.LAUNCH_ERROR,
        True,
    ),
    (
        r"OUT_OF_RESOURCES|LaunchOutOfResources|too many resources|can be resident|COOPERATIVE_LAUNCH_TOO_LARGE|"
        r"CooperativeLaunchTooLarge",
        Outcome.RESOURCE,
        False,
    ),
    (
        r"INVALID_VALUE|InvalidValue|INVALID_CONFIGURATION|InvalidConfiguration|invalid argument|"
        r"UNSUPPORTED_PTX_VERSION|UnsupportedPtxVersion|NO_BINARY_FOR_GPU|NoKernelImageForDevice|INVALID_IMAGE|"
        r"InvalidKernelImage|INVALID_PTX|InvalidPtx|NOT_FOUND|SymbolNotFound|INVALID_HANDLE|InvalidResourceHandle|"
        r"CLUSTER|Cluster|OUT_OF_MEMORY|MemoryAllocation|[Oo]ut of memory",
        Outcome.LAUNCH_ERROR,
        False,
    ),
]


def is_cuda_error(exc: BaseException) -> bool:
    """CUDA errors from cupy, cuda-bindings or our own launcher (CudaError; NotResident, its finding
    that not one cluster of the shape fits, which is the candidate's failure as OUT_OF_RESOURCES is)."""
    n = type(exc).__name__
    return "CUDA" in n.upper() or isinstance(exc, CudaError | NotResident) or "OutOfMemory" in n


class CudaError(RuntimeError):
    """A CUDA driver call returned an error (raised by the launcher for cuda-bindings results)."""


def classify(message: str) -> tuple[Outcome, bool]:
    """(outcome, sticky) for a CUDA error text; an unknown CUDA error is treated as sticky."""
    for pattern, outcome, sticky in _RULES:
        if re.search(pattern, message):
            return outcome, sticky
    return Outcome.LAUNCH_ERROR, True
