"""Source-level candidates (issue 31): the store of proposed CUDA sources, the op seen with them,
the rewriter that applies a proposer's edits, and the proposer protocol's process client.

A proposed source is content-addressed: its digest (sha256 of the text, 16 hex digits) is the value
of SOURCE_PARAM in the candidate's config, beside the template parameters that give its launch and
arguments. The text and its lineage (parent, proposer, rationale, the problem it was written for)
are files under <kernelfile folder>/proposed/<op>/, so a committed winner is rebuilt by
`build --locked` in a fresh clone. What a proposer sends is data: text that is compiled and judged
like any candidate, never code that ptxbuild runs."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import select
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from ..errors import ConfigError
from ..problem import SOURCE_PARAM, Problem, op_params

PROTOCOL = "ptxbuild.proposer/1"
SCHEMA = Path(__file__).with_name("proposer.schema.json")
MAX_LINE_BYTES = 1 << 20  # the largest reply line a proposer may send
MAX_CANDIDATES = 16  # per reply; the rest are dropped (and said so in the results)
REPLY_SECONDS = 300.0  # how long a proposer may think before one reply


class ProposalError(Exception):
    """A proposer broke the protocol (bad JSON, too large, too slow, exited); one line."""


def source_digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class SourceStore:
    """Proposed sources of one op: <folder>/<digest>.cu and <digest>.json (the lineage)."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)

    def put(self, text: str, meta: dict) -> str:
        digest = source_digest(text)
        self.folder.mkdir(parents=True, exist_ok=True)
        lineage = json.dumps({**meta, "digest": digest}, indent=1, sort_keys=True)
        for path, data in ((f"{digest}.cu", text), (f"{digest}.json", lineage)):
            if not (self.folder / path).is_file():  # the first proposer of a text keeps its lineage
                (self.folder / path).write_text(data)
        return digest

    def get(self, digest: str) -> str | None:
        p = self.folder / f"{digest}.cu"
        text = p.read_text() if p.is_file() else ""
        return text if source_digest(text) == digest else None  # an edited file is not that source

    def meta(self, digest: str) -> dict:
        p = self.folder / f"{digest}.json"
        try:
            return json.loads(p.read_text())
        except (OSError, ValueError):
            return {}


class WithSources:
    """The op, with configs that name a proposed source: check() also asks that the source exists
    and was written for this problem, render() returns its text with the template's entry and
    flags for the config's parameters; every op function gets the parameters without SOURCE_PARAM."""

    def __init__(self, op, store: SourceStore):
        self._op, self.store = op, store

    def __getattr__(self, name):
        return getattr(self._op, name)

    def check(self, params: dict, problem: Problem) -> str | None:
        """A proposed source stands in for the template's text where the template renders the very
        text it replaced (the lineage's `template` digest): other row counts of its problem, say."""
        digest, p = params.get(SOURCE_PARAM), op_params(params)
        why = self._op.check(p, problem)
        if digest is None or why:
            return why
        if self.store.get(digest) is None:
            return f"proposed source {digest} is not in {self.store.folder}"
        meta = self.store.meta(digest)
        if meta.get("template") and meta["template"] != source_digest(
            self._op.render(p, problem, meta.get("arch", "")).source
        ):
            return f"proposed source {digest} was written for {meta.get('problem')}, where the template renders other code"
        return None

    def render(self, params: dict, problem: Problem, arch: str):
        kernel = self._op.render(op_params(params), problem, arch)
        if (digest := params.get(SOURCE_PARAM)) is None:
            return kernel
        if (text := self.store.get(digest)) is None:
            raise ConfigError(
                f"proposed source {digest} is missing from {self.store.folder} or was "
                "edited (its sha256 differs): restore it (git checkout)"
            )
        return replace(kernel, source=text)

    def launch(self, params: dict, problem: Problem, sm_count: int):
        return self._op.launch(op_params(params), problem, sm_count)

    def launches(self, params: dict, problem: Problem, sm_count: int):
        return self._op.launches(op_params(params), problem, sm_count)


def with_sources(op, root: Path) -> WithSources:
    return WithSources(op, SourceStore(Path(root) / "proposed" / op.NAME))


class EditError(ValueError):
    """A proposer's edit does not apply to its base source."""


def apply_edits(base: str, edits: list) -> str:
    """The rewriter: each edit {"find": text, "replace": text, "count": n (default 1; 0 = every
    occurrence)} applied in order; a `find` that occurs fewer than `count` times is an EditError."""
    text = base
    for i, e in enumerate(edits):
        e = e if isinstance(e, dict) else {}
        find, new, count = e.get("find"), e.get("replace"), e.get("count", 1)
        if not (isinstance(find, str) and find and isinstance(new, str)):
            raise EditError(f"edit {i}: needs a non-empty string 'find' and a string 'replace'")
        if type(count) is not int or count < 0:
            raise EditError(f"edit {i}: 'count' must be an integer >= 0")
        if (found := text.count(find)) == 0 or found < count:
            raise EditError(
                f"edit {i}: 'find' occurs {found} time(s) in the base, not {count or '1+'}"
            )
        text = text.replace(find, new, count or found)
    return text


def candidate_errors(c) -> str | None:
    """Why one candidate of a reply is not one (proposer.schema.json), or None; the optional
    strings (base, edit, rationale, parent) are taken as given."""
    if not isinstance(c, dict) or ("source" in c) == ("edits" in c):
        return "a candidate is an object with exactly one of 'source' (the whole text) and 'edits'"
    if not (
        isinstance(c.get("source", "-"), str)
        and isinstance(c.get("edits", []), list)
        and isinstance(c.get("params", {}), dict)
    ):
        return "'source' is a string, 'edits' a list and 'params' an object"
    return None


def parse_reply(line: bytes) -> list:
    """The candidates of one reply line (a ProposalError if it is not a reply of this protocol)."""
    try:
        msg = json.loads(line)
    except ValueError as exc:
        raise ProposalError(f"a reply is not JSON ({exc})") from None
    if not (
        isinstance(msg, dict)
        and msg.get("protocol") == PROTOCOL
        and msg.get("type") == "candidates"
        and isinstance(msg.get("candidates"), list)
    ):
        raise ProposalError(
            f'a reply is {{"protocol": "{PROTOCOL}", "type": "candidates", "candidates": [...]}}'
        )
    return msg["candidates"]


def command_argv(cmd: str) -> list[str]:
    """A proposer command line as argv; a leading `python`/`python3` is this interpreter."""
    argv = shlex.split(cmd)
    return [sys.executable, *argv[1:]] if argv[:1] in (["python"], ["python3"]) else argv


class Proposer:
    """One proposer process, JSON lines over its stdin/stdout: ask() sends a task and reads one
    reply (within `seconds`, at most MAX_LINE_BYTES), tell() sends the results, close() ends it."""

    def __init__(self, cmd: str, cwd: Path, seconds: float = REPLY_SECONDS):
        self.cmd, self.seconds = cmd, seconds
        self._err = tempfile.TemporaryFile()  # a pipe could fill and stop a chatty proposer
        try:
            self.proc = subprocess.Popen(
                command_argv(cmd),
                cwd=cwd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._err,
            )
        except OSError as exc:
            raise ProposalError(f"proposer {cmd!r} cannot start: {exc.strerror}") from None
        self._buf = b""

    def _send(self, msg: dict) -> None:
        try:
            self.proc.stdin.write((json.dumps(msg, sort_keys=True) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            raise ProposalError(f"proposer {self.cmd!r} exited ({self._stderr()})") from None

    def _stderr(self) -> str:
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            return "closed its output"
        self._err.seek(0)
        tail = self._err.read().decode(errors="replace").strip().splitlines()
        return f"exit {self.proc.returncode}" + (f": {tail[-1][:300]}" if tail else "")

    def _line(self) -> bytes:
        deadline = time.monotonic() + self.seconds
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf and len(self._buf) <= MAX_LINE_BYTES:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise ProposalError(f"proposer {self.cmd!r}: no reply within {self.seconds:g} s")
            chunk = os.read(fd, 65536)
            if not chunk:
                raise ProposalError(f"proposer {self.cmd!r} exited ({self._stderr()})")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        if len(line) > MAX_LINE_BYTES:
            raise ProposalError(f"proposer {self.cmd!r}: a reply over {MAX_LINE_BYTES} bytes")
        return line

    def ask(self, task: dict) -> list:
        self._send({"protocol": PROTOCOL, "type": "task", **task})
        return parse_reply(self._line())

    def tell(self, results: dict) -> None:
        self._send({"protocol": PROTOCOL, "type": "results", **results})

    def close(self) -> None:
        with contextlib.suppress(ProposalError, OSError):
            self._send({"protocol": PROTOCOL, "type": "done"})
            self.proc.stdin.close()
        if self._stderr() == "closed its output":  # did not end within 5 s of "done"
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()
        self._err.close()
