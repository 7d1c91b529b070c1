"""The build's progress on stderr: one line per problem, one method per event kind."""

from __future__ import annotations

import math
import sys
import time

import click


class Progress:
    """Prints one line per problem with candidates tried / failed / best so far; problems only compiled (no GPU
    of the target here) make one line per target, on a terminal rewritten in place."""

    LINES = {
        "target_start": "{target}: building ({reason})",
        "note": "  {message}",  # events of one plain line
        "target_skip": "{target}: skipped, {reason}",
    }  # an up-to-date target: its result line says so
    CLEAR = "\r\x1b[K"  # a terminal: back to the line's start and clear it

    def __init__(self, quiet: bool = False):
        self.quiet = quiet
        self.tried, self.failed, self.best, self.t0 = 0, 0, math.inf, time.monotonic()

    def __call__(self, kind: str, **ev):
        if self.quiet:
            return
        if kind in self.LINES:
            click.echo(self.LINES[kind].format(**ev), err=True)
        elif kind == "problem_start":
            self.tried, self.failed, self.best, self.t0 = 0, 0, math.inf, time.monotonic()
            self.label = f"  [{ev['index'] + 1}/{ev['total']}] {ev['problem'].label()}"
            if ev["index"] == 0:
                self.compiled, self.t_target = 0, self.t0
            self.total, self.last = ev["total"], ev["index"] + 1 == ev["total"]
        elif kind == "attempt":
            self.tried += 1
            self.failed += ev["outcome"].failed
            if ev["score"] is not None and math.isfinite(ev["score"]):
                self.best = min(self.best, ev["score"])
            if sys.stderr.isatty():
                click.echo(f"\r{self._so_far()}   ", err=True, nl=False)
        elif kind == "baselines_start":
            note = "timing the baselines (a first call may compile or autotune them)"
            if sys.stderr.isatty():
                click.echo(f"\r{self._so_far()}; {note}   ", err=True, nl=False)
            else:
                click.echo(
                    f"{self.label}: tried {self.tried}, best {self._best()}; {note} ...", err=True
                )
        elif kind == "problem_done" and self.best == 0:  # compiled, not timed
            self.compiled += 1
            tty = sys.stderr.isatty()
            if self.last or tty:  # a terminal: rewritten in place; a log: one line
                click.echo(
                    f"{self.CLEAR if tty else ''}  {self.compiled}/{self.total} problems compiled and resource-"
                    f"checked, not timed ({time.monotonic() - self.t_target:.1f}s)",
                    err=True,
                    nl=self.last,
                )
        elif kind in ("problem_done", "problem_fail"):
            end = "\r" if sys.stderr.isatty() else ""
            status = "NO VALID CANDIDATE" if kind == "problem_fail" else f"best {self._best()}"
            click.echo(
                f"{end}{self.label}: tried {self.tried}, failed {self.failed}, {status} "
                f"({self._seconds(ev)})",
                err=True,
            )
            for line in ev.get("why") or ():  # the rejected candidates' evidence
                click.echo(f"      {line}", err=True)

    def _seconds(self, ev) -> str:
        total = f"{time.monotonic() - self.t0:.1f}s"
        base = ev.get("baseline_s")
        return total if base is None else f"{total}, of which baselines {base:.1f}s"

    def _so_far(self) -> str:
        return f"{self.label}: tried {self.tried}, failed {self.failed}, best {self._best()}"

    def _best(self) -> str:
        if not math.isfinite(self.best):
            return "-"
        return "compiled" if self.best == 0 else f"{self.best * 1000:.1f} us"
