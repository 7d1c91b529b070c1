"""ptxbuild's errors, one tree: each kind carries the exit code the CLI gives it (mapped there, once).

A failed build is kept apart from a tool that could not run (doit's task failed / tool failed): a
wrong kernelfile or target is the user's to fix (2), a build that ran and did not give what was
asked is 1, ptxbuild unable to run at all (no compiler, the GPU worker gone) is 3.
"""

from __future__ import annotations

from pathlib import Path

EXIT_BUILD_FAILED = 1
EXIT_CONFIG = 2
EXIT_TOOL = 3
EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports SIGINT


class PtxbuildError(Exception):
    """An error ptxbuild reports to its user in one message, naming where and what next."""

    exit_code = EXIT_BUILD_FAILED


class BuildFailed(PtxbuildError):
    """The build ran and did not give what was asked (a lock that does not hold, a compile)."""

    exit_code = EXIT_BUILD_FAILED


class ConfigError(PtxbuildError):
    """The kernelfile, a target, an option, an op or a lessons file is wrong: the user's to fix."""

    exit_code = EXIT_CONFIG


class ToolError(PtxbuildError):
    """ptxbuild itself could not run (no compiler, the GPU worker down): not a failed build."""

    exit_code = EXIT_TOOL


class GpuError(RuntimeError):
    """The tool failed on the GPU side (worker cannot start, an op's own code raised): not a
    candidate outcome. Here, not in gpu/, so a build that catches it need not import the GPU side."""


def shown(path: str | Path, root: Path | None = None) -> str:
    """A path as a message names it: relative to `root` (default: the working folder) when under it."""
    try:
        return str(Path(path).resolve().relative_to((root or Path.cwd()).resolve()))
    except ValueError:
        return str(path)
