"""What a command proved about unchanged inputs, kept so the next command need not prove it again.

`plan`, `check` and a no-op `build` validate the kernelfile (pydantic), load every op (its module and
whatever it imports: kda's reference imports numba) and run each op's declaration checks, though
nothing changed since the last command. Each of those answers is a function of files: the memo
keeps it under a digest of every file it depends on, so a command whose inputs are byte for byte
the same reads the answer instead (issue 26 item 11). What the memo keeps:

- a kernelfile's validated values, by its text (and ptxbuild's own code);
- an op's NAME, VERSION and SOURCES, by every file of the folder its op folder sits in (ops/: an op
  may load its neighbours' files, kda_prepare does) and ptxbuild's code;
- that an op's declaration passed its checks, by the same digest and the declaration's values;
- the compiler's identity, by the installed compiler wheels.

Only what passed is kept: a mistake is always found again, by the code that explains it. The memo is
JSON (never pickle) under $PTXBUILD_STATE (default ~/.cache/ptxbuild; "off" disables it), one file
per kernelfile; a memo that cannot be read or written is no memo, never an error.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

MAX_TREE_FILES = 2000  # a folder of more files than this is not hashed (no memo for its ops)
RACY_NS = 2 * 10**9  # a file changed this recently may change again within its mtime's granularity
_FILES: dict[str, tuple[tuple[int, int, int], str]] = {}  # path -> (its stat, its sha256)


def state_dir() -> Path | None:
    """Where memos live: $PTXBUILD_STATE, else $XDG_CACHE_HOME/ptxbuild or ~/.cache/ptxbuild."""
    env = os.environ.get("PTXBUILD_STATE")
    if env == "off":
        return None
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    try:
        return (Path(xdg) if xdg else Path.home() / ".cache") / "ptxbuild"
    except RuntimeError:  # no home directory (a bare container): no memo
        return None


def tree_digest(folder: Path) -> str | None:
    """sha256 over every file under `folder` (names and bytes; __pycache__ left out), or None past
    MAX_TREE_FILES files. A file is read again only where its stat changed (or changed lately)."""
    h, n, now = hashlib.sha256(), 0, time.time_ns()
    for dirpath, dirnames, names in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(names):
            path, n = os.path.join(dirpath, name), n + 1
            if n > MAX_TREE_FILES:
                return None
            h.update(f"{os.path.relpath(path, folder)}\0{file_digest(path, now)}".encode())
    return h.hexdigest()


def file_digest(path: str | Path, now: int | None = None) -> str:
    """sha256 of a file's bytes, read again only where its stat changed (or changed lately)."""
    st = os.stat(path)
    stat, seen = (st.st_ino, st.st_size, st.st_mtime_ns), _FILES.get(str(path))
    if seen is None or seen[0] != stat or (now or time.time_ns()) - st.st_mtime_ns < RACY_NS:
        with open(path, "rb") as f:
            seen = _FILES[str(path)] = (stat, hashlib.sha256(f.read()).hexdigest())
    return seen[1]


@functools.cache
def code_digest() -> str:
    """ptxbuild's own code (and the Python running it): an answer of another version is not reused."""
    pkg = Path(__file__).resolve().parents[1]
    return f"{sys.version}|{sys.prefix}|{tree_digest(pkg)}"


def digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


class Memo:
    """One memo file: section -> key -> a JSON value; written through at each put()."""

    def __init__(self, name: str) -> None:
        where = state_dir()
        self.path = where / f"{name}.json" if where is not None else None
        self.data: dict[str, dict[str, Any]] = {}
        if self.path is not None:
            with contextlib.suppress(OSError, ValueError):
                loaded = json.loads(self.path.read_bytes())
                self.data = loaded if isinstance(loaded, dict) else {}

    @staticmethod
    def of(kernelfile: Path) -> Memo:
        """The memo of one kernelfile (by its resolved path)."""
        return book("kf-" + digest(str(kernelfile.resolve()))[:24])

    def get(self, section: str, key: str) -> Any:
        return self.data.get(section, {}).get(key)

    def put(self, section: str, key: str, value: Any) -> None:
        self.data[section] = {key: value}  # one answer per section: the last inputs' answer
        if self.path is None:
            return
        with contextlib.suppress(OSError):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(self.data, sort_keys=True))
            tmp.replace(self.path)


@functools.cache
def book(name: str) -> Memo:
    """The memo file `name`, read once per process (put() writes it through)."""
    return Memo(name)
