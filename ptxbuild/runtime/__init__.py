"""Use built kernels from a model: load a target's manifest, check its artifacts, dispatch a call by
dtype, options and shape to a built variant, and launch it on the caller's current stream.

    import ptxbuild
    rmsnorm = ptxbuild.load("rmsnorm@h200")            # or ptxbuild.load("build/rmsnorm@h200")
    y = rmsnorm(x, weight)                             # torch tensors (or cupy arrays) in, same kind out
    kda = ptxbuild.load("kda@h200")                    # called like fla's chunk_kda (kda.py)

Modules: locate (finding a build), kernel (BuiltKernel: checks, the per-call path), dispatch
(modes, binding, variant choice), fast (the prepared launch), driver (CUDA driver side), arrays
(torch / cupy views), kda (chunk_kda's interface), fla (the flash-linear-attention drop-in).

Importing this package needs no compiler, torch or cupy: torch / cupy are imported when a call
sees their arrays, the CUDA driver (cuda.bindings.driver) when a kernel launches. Every refusal is
a one-line LoaderError saying what to do.
"""

from .dispatch import _Mode
from .driver import _cu, _Current, _device, _launch, _ok, arch_runs_on, load_choice
from .errors import LoaderError
from .kernel import BuiltKernel
from .locate import load

__all__ = [
    "BuiltKernel",
    "LoaderError",
    "_Current",
    "_Mode",
    "_cu",
    "_device",
    "_launch",
    "_ok",
    "arch_runs_on",
    "load",
    "load_choice",
]
