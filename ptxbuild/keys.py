"""Content keys of the four cached steps: compile, verify, measure, build; the versions they name."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import sys

from .problem import Kernel, Problem, digest

PIPELINE_VERSION = "1"  # bump when the build pipeline changes what it produces
# bump when how a timing is taken changes (every measurement is taken again): gpu/stats.py, runs.py
# 2: batches behind a gate (gpu/gate.py); 3: each call alone, nvbench-cold (gpu/runs.py);
# 4: outputs poisoned again before every timed call, the first timed call of every window judged
# (gpu/runs.py _timer)
PROTOCOL_VERSION = "4"
SUITE_VERSION = "3"  # the worker's own checks beside the op's (history: gpu/runs.py SUITE_VERSION)


def compile_key(kernel: Kernel, arch: str, toolchain: dict) -> str:
    return digest("compile", kernel.source, kernel.entry, list(kernel.flags), arch, toolchain)


def verify_key(binary_digest: str, suite_version: str, problem: Problem, params: dict) -> str:
    # params change the launch geometry, so they are part of what was verified
    # the worker's suite too: verdicts taken before its checks changed are taken again
    return digest("verify", binary_digest, suite_version, SUITE_VERSION, problem.key(), params)


def measure_key(binary_digest: str, fingerprint: dict, problem: Problem, params: dict) -> str:
    return digest("measure", binary_digest, fingerprint, problem.key(), params, PROTOCOL_VERSION)


def build_key(
    op_files: dict[str, str],
    config: dict,
    gpu: dict,
    toolchain: dict,
    deps: list[str],
    hardware: dict | None,
) -> str:
    return digest("build", PIPELINE_VERSION, op_files, config, gpu, toolchain, deps, hardware)


# the compiler wheels whose versions are part of the toolchain (compile/) and of the lock (outputs/)
COMPILER_WHEELS = ("nvidia-cuda-nvrtc", "nvidia-nvjitlink")


def installed_version(name: str) -> str | None:
    """The installed version of the Python distribution `name` (a compiler wheel, a package), or None:
    read from its dist-info folder's name where there is one (what pip writes), else from
    importlib.metadata (~0.1 s to import: plan and a no-op build ask for the compiler wheels')."""
    found = _dist_infos().get(re.sub(r"[-_.]+", "_", name).lower())
    if found is not None:
        return found
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


@functools.cache
def _dist_infos() -> dict[str, str]:
    """Normalized distribution name -> version, of the dist-info folders on sys.path (the first
    of a name wins, as importlib.metadata's does)."""
    out: dict[str, str] = {}
    for entry in sys.path:
        with contextlib.suppress(OSError):
            for n in sorted(os.listdir(entry or ".")):
                dist, _, version = n.removesuffix(".dist-info").partition("-")
                if n.endswith(".dist-info") and version and "-" not in version:
                    out.setdefault(re.sub(r"[-_.]+", "_", dist).lower(), version)
    return out
