"""Where and when a build ran: the packages, the platform, the git revision and ptxbuild's own code."""

from __future__ import annotations

import hashlib
import platform
import subprocess
import sys
import time
from pathlib import Path

from ..keys import installed_version

# the compiler's wheels (a lock pins their versions)
WHEELS = ("cuda-bindings", "nvidia-cuda-nvrtc", "nvidia-nvjitlink")
PACKAGES = (
    "ptxbuild",
    *WHEELS,
    "numpy",
    "cupy-cuda13x",
    "torch",
    "pydantic",
    "sqlite-utils",
    "click",
)


def code_digest(pkg: Path = Path(__file__).parents[1]) -> str:
    """ptxbuild's own code, by content (each .py file's path and bytes): names the tool that built a
    report where git cannot (an installed package; a copy whose git metadata is stale)."""
    files = sorted(pkg.rglob("*.py"))
    if not files:  # the package is read from a zip: no name then
        return ""
    data = b"".join(f.relative_to(pkg).as_posix().encode() + b"\0" + f.read_bytes() for f in files)
    return hashlib.sha256(data).hexdigest()[:12]


def _git(root: Path, *args: str) -> str:
    run = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=5)
    return run.stdout.strip()


def environment(root: Path) -> dict:
    versions = {p: v for p in PACKAGES if (v := installed_version(p)) is not None}
    try:
        rev = _git(root, "rev-parse", "--short", "HEAD")
        dirty = bool(_git(root, "status", "--porcelain"))
    except (OSError, subprocess.SubprocessError):
        rev, dirty = "", False
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": versions,
        "git_revision": rev + ("-dirty" if dirty else ""),
        "ptxbuild_code": code_digest(),
    }


def utc_time(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))
