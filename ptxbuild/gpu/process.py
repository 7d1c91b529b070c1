"""A child process that answers JSON-line requests, with a deadline per request; killed on a hang."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import tempfile
import threading


class WorkerDied(Exception):
    """The child crashed or did not answer in time; `kind` is "crash" or "timeout"."""

    def __init__(self, kind: str, detail: str):
        super().__init__(f"{kind}: {detail}")
        self.kind, self.detail = kind, detail


class Child:
    """Started on the first request; after a crash or a kill the next request starts a fresh one."""

    def __init__(self, argv: list[str], env: dict | None = None):
        self.argv, self.env = argv, env
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        self._close_stderr()
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            env=self.env,
            text=True,
            bufsize=1,
        )
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(
            target=self._read, args=(self.proc.stdout, self.lines), daemon=True
        ).start()
        self.starts += 1

    @staticmethod
    def _read(stream, lines: queue.Queue) -> None:
        try:
            for line in stream:
                lines.put(line)
        finally:
            lines.put(None)
            stream.close()

    def stderr_tail(self, chars: int = 2000) -> str:
        with contextlib.suppress(Exception):  # the child is dead (or killed) when this is read
            self.stderr.seek(0, os.SEEK_END)
            self.stderr.seek(max(0, self.stderr.tell() - chars))
            return self.stderr.read().decode(errors="replace").strip()
        return ""

    def request(self, msg: dict, timeout_s: float) -> dict:
        """Send one request and wait for its reply; raises WorkerDied (and reaps the child) otherwise."""
        if not self.alive:
            self.start()
        try:
            self.proc.stdin.write(json.dumps(msg) + "\n")
            self.proc.stdin.flush()
            line = self.lines.get(timeout=timeout_s)
        except queue.Empty:
            self.kill()
            raise WorkerDied(
                "timeout", f"no answer to {msg.get('cmd')!r} within {timeout_s:g} s; worker killed"
            ) from None
        except (BrokenPipeError, OSError):
            line = None
        if line is None:
            rc = self.kill()
            raise WorkerDied(
                "crash",
                f"worker exited ({rc}) during {msg.get('cmd')!r}: {self.stderr_tail()[-1500:]}",
            )
        return json.loads(line)

    def kill(self) -> int | None:
        """Kill and reap the child (only ours, by its pid); returns its exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.kill()
        rc = self.proc.wait()
        with contextlib.suppress(Exception):  # the pipe is already broken
            self.proc.stdin.close()
        return rc

    def close(self, timeout_s: float = 2.0) -> None:
        """Ask the child to exit; kill it if it has not within `timeout_s`. An idle worker exits in
        well under a second; one still busy is a stopped build's call in flight (a baseline's
        autotune can run a minute), and waiting for it made Ctrl-C take 10 s: long enough that
        `timeout -s INT -k 10` killed the build before it said it had stopped (run 31b, rc 137)."""
        if self.alive:
            with contextlib.suppress(Exception):
                self.proc.stdin.write(json.dumps({"cmd": "exit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=timeout_s)
        self.kill()
        self.proc = None
        self._close_stderr()

    def _close_stderr(self) -> None:
        if getattr(self, "stderr", None) is not None:
            self.stderr.close()
            self.stderr = None
