"""Values that describe one kernel problem and one compiled candidate, shared by every stage."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from typing import Any


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no spaces: the form every content key hashes."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def digest(*parts: Any) -> str:
    """sha256 over the canonical JSON of the parts (bytes are hashed as they are)."""
    h = hashlib.sha256()
    for part in parts:
        data = part if isinstance(part, bytes) else canonical_json(part).encode()
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def params_text(params: dict) -> str:
    """A config as reports and messages print it: `name=value` pairs by name."""
    return " ".join(f"{k}={v}" for k, v in sorted(params.items()))


@dataclass(frozen=True)
class Problem:
    """One shape of one op in one dtype, with the op's options (residual, rstd, ...)."""

    op: str
    dtype: str
    shape: tuple[int, ...]
    options: tuple[tuple[str, Any], ...] = ()

    @property
    def opts(self) -> dict[str, Any]:
        return dict(self.options)

    @property
    def opts_json(self) -> dict[str, Any]:
        """The options as JSON reads them back (tuples as lists): compare these with options stored in
        the cache, lessons or a lock, never opts (a frozen `lengths` tuple never equals a stored list)."""
        return json.loads(canonical_json(dict(self.options)))

    def key(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "options": dict(self.options),
        }

    def label(self) -> str:
        shape = "x".join(str(s) for s in self.shape)
        opts = ",".join(f"{k}={v}" for k, v in self.options if v not in (False, None, ""))
        return f"{self.dtype}[{shape}]" + (f"{{{opts}}}" if opts else "")

    def with_shape(self, shape: tuple[int, ...]) -> Problem:
        return Problem(self.op, self.dtype, tuple(shape), self.options)

    @staticmethod
    def make(op: str, dtype: str, shape, options: dict[str, Any] | None = None) -> Problem:
        """Options are frozen (lists become tuples: a kernelfile's `lengths = [...]`), so a problem
        hashes; its key() and JSON are unchanged (a tuple encodes as a list)."""
        return Problem(
            op,
            dtype,
            tuple(int(s) for s in shape),
            tuple(sorted((k, _freeze(v)) for k, v in (options or {}).items())),
        )


def _freeze(value: Any) -> Any:
    return tuple(_freeze(v) for v in value) if isinstance(value, (list, tuple)) else value


@dataclass(frozen=True)
class Kernel:
    """Rendered CUDA C++ for one candidate: source text, entry point, compile flags."""

    source: str
    entry: str
    flags: tuple[str, ...] = ()

    def with_defines(self, *defines: str) -> Kernel:
        """Also compiled with -DNAME=VALUE per "NAME=VALUE": a source path render() does not pick yet."""
        if bad := [d for d in defines if not d.split("=", 1)[0].isidentifier()]:
            raise ValueError(f"not a macro definition: {bad[0]!r} (write NAME or NAME=VALUE)")
        return replace(self, flags=self.flags + tuple(f"-D{d}" for d in defines))


@dataclass(frozen=True)
class Launch:
    """Launch geometry of one candidate on one problem."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem_bytes: int = 0
    cluster: tuple[int, int, int] = (1, 1, 1)
    # programmatic dependent launch: may start before the previous kernel on the stream has finished
    # (once all its blocks ran griddepcontrol.launch_dependents); the kernels synchronize themselves
    pdl: bool = False
    # persistent kernel: grid is an upper bound (the kernel loops with stride gridDim); the launcher
    # lowers it to the clusters that can be resident at once (cuOccupancyMaxActiveClusters), since a
    # cluster that waits for a free GPC would run its whole share of rows after the others
    persistent: bool = False

    @property
    def plain(self) -> bool:
        """No launch attributes: cuLaunchKernel does (no cluster, no programmatic dependency)."""
        return tuple(self.cluster) == (1, 1, 1) and not self.pdl


@dataclass(frozen=True)
class Binary:
    """A compiled candidate: PTX text, cubin bytes and the resources ptxas reported."""

    arch: str
    entry: str
    ptx: str
    cubin: bytes
    registers: int
    spill_bytes: int
    smem_static_bytes: int
    local_bytes: int
    log: str = ""
    compiler: str = ""

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.cubin).hexdigest()


# A candidate may be a whole CUDA source a proposer wrote (issue 31): its config then holds the
# source's digest under this key beside the template's parameters (which give its launch and
# arguments). Only the build's proposal store (search/proposals.py) reads the key; the op's own
# functions always get op_params, the config without it.
SOURCE_PARAM = "source"


def op_params(params: dict | None) -> dict | None:
    """`params` without SOURCE_PARAM: what an op's check/launch/kernel_args are given."""
    if not params or SOURCE_PARAM not in params:
        return params
    return {k: v for k, v in params.items() if k != SOURCE_PARAM}
