"""The ptxbuild command line: parse arguments, call the library, print. Nothing else lives here."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import click

from ..store.cache import Cache

EXIT_BUILD_FAILED = 1
EXIT_CONFIG = 2
EXIT_TOOL = 3


class ToolError(click.ClickException):
    """ptxbuild itself could not run (no compiler, GPU worker down): not a failed build."""

    exit_code = EXIT_TOOL


class ConfigError(click.ClickException):
    exit_code = EXIT_CONFIG

    def show(self, file=None):  # every mistake found, one line each
        for line in self.message.splitlines():
            click.echo(f"error: {line}", err=True)


def _kernelfile(path: str, ops: bool = True):
    from ..declare.checks import declaration_errors
    from ..declare.graph import TargetError
    from ..declare.kernelfile import KernelfileError, load
    from ..oploader import OpError, load_op

    try:
        kf = load(path)
    except (KernelfileError, TargetError, OpError) as exc:
        raise ConfigError(str(exc)) from None
    errors = []
    for spec in kf.ops.values() if ops else ():  # dtypes, shapes, options, modes, search vs the op
        try:
            op = load_op(spec.template, kf.root)
        except OpError as exc:
            errors.append(str(exc))
            continue
        sm = min(kf.gpus[g].sm_count for g in spec.gpus)
        errors += [f"{kf.path.name}: {e}" for e in declaration_errors(spec, op, sm)]
    if errors:
        raise ConfigError("\n".join(dict.fromkeys(errors)))
    return kf


def _targets(kf, names):
    from ..declare.graph import TargetError, parse_target

    try:
        return [t for n in names for t in parse_target(n, kf)] if names else None
    except TargetError as exc:
        raise ConfigError(str(exc)) from None


def _context(kf, jobs: int | None, use_gpu: bool, progress, dry: bool = False):
    from ..build.target import Context
    from ..compile.compiler import ToolchainMissing, toolchain

    try:
        tc = toolchain()
    except ToolchainMissing as exc:
        raise ToolError(str(exc)) from None
    cache = Cache(
        ":memory:" if dry and not kf.cache_path.exists() else kf.cache_path
    )  # dry: plan creates none
    ctx = Context(
        kf=kf,
        cache=cache,
        toolchain=tc,
        report=progress,
        command="ptxbuild " + " ".join(sys.argv[1:]),
    )
    from ..oploader import from_shipped
    from ..store.lessons_io import LessonsFileError, import_shared

    shared = kf.cache_path.parent / "lessons.jsonl"
    try:
        shipped = any(from_shipped(spec.template, kf.root) for spec in kf.ops.values())
        counts = None if dry else import_shared(ctx.cache, shared, shipped)
    except LessonsFileError as exc:
        raise ConfigError(f"{exc}; fix or remove {shared.name}") from None
    if counts:
        src = Path(counts["from"])
        where = src.relative_to(kf.root) if src.is_relative_to(kf.root) else counts["from"]
        click.echo(f"lessons: imported {counts['added']} from {where} into a new cache", err=True)
    if jobs:
        ctx.jobs = jobs
    if use_gpu:
        try:
            from ..gpu import GpuSession, gpu_available, match_gpu
            from ..gpu.session import GpuError
        except ImportError:
            return ctx
        if gpu_available():
            click.echo("gpu: starting the worker and measuring copy bandwidth ...", err=True)
            try:
                ctx.gpu = GpuSession()
            except GpuError as exc:
                raise ToolError(f"{exc}; or build without it: ptxbuild build --no-gpu") from exc
            click.echo(
                f"gpu: {ctx.gpu.fingerprint}; copy bandwidth {ctx.gpu.copy_tbps:.2f} TB/s", err=True
            )
            ctx.gpu_match = lambda fp, gpu: match_gpu(
                fp, gpu.name, {**gpu.as_dict(), "models": [gpu.model]}
            )
    return ctx


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
                click.echo(
                    f"\r{self.label}: tried {self.tried}, failed {self.failed}, best {self._best()}   ",
                    err=True,
                    nl=False,
                )
        elif kind == "baselines_start":
            note = "timing the baselines (a first call may compile or autotune them)"
            if sys.stderr.isatty():
                click.echo(
                    f"\r{self.label}: tried {self.tried}, failed {self.failed}, best {self._best()}; {note}   ",
                    err=True,
                    nl=False,
                )
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

    def _seconds(self, ev) -> str:
        total = f"{time.monotonic() - self.t0:.1f}s"
        base = ev.get("baseline_s")
        return total if base is None else f"{total}, of which baselines {base:.1f}s"

    def _best(self) -> str:
        return (
            "-"
            if not math.isfinite(self.best)
            else "compiled"
            if self.best == 0
            else f"{self.best * 1000:.1f} us"
        )


class _Main(click.Group):
    """Damaged state files and unwritable places are one line with the way out, never a traceback."""

    def invoke(self, ctx):
        import errno
        import sqlite3

        from ..outputs.lockfile import LockUnreadable
        from ..store.cache import CacheError, cache_error, shown

        try:
            return super().invoke(ctx)
        except CacheError as exc:
            raise ToolError(str(exc)) from None
        except LockUnreadable as exc:
            raise ConfigError(str(exc)) from None
        except sqlite3.DatabaseError as exc:  # found after the cache opened (a page deep inside)
            if Cache.opened is None:
                raise
            raise ToolError(str(cache_error(Cache.opened, exc))) from None
        except OSError as exc:
            if exc.filename is None or exc.errno not in _WRITE_ERRNOS:
                raise
            how = (
                "read-only"
                if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS)
                else "not writable"
            )
            raise ToolError(
                f"{shown(exc.filename)}: {how} ({exc.strerror}); make it writable, or name another "
                "folder in the kernelfile's [project] (build_dir, reports_dir, cache)"
            ) from None


_WRITE_ERRNOS = {1, 13, 28, 30, 36, 122}  # EPERM EACCES ENOSPC EROFS ENAMETOOLONG EDQUOT


def _lock_sound(kf) -> None:
    """A lock that is there must parse (a plain build would otherwise rewrite it without its entries)."""
    from ..outputs.lockfile import LockError, LockUnreadable, read_lock

    try:
        read_lock(kf)
    except LockUnreadable as exc:
        raise ConfigError(str(exc)) from None
    except LockError:
        pass  # none yet


@click.group(cls=_Main)
@click.version_option(package_name="ptxbuild", prog_name="ptxbuild")
@click.option(
    "--kernelfile",
    "-f",
    default="kernelfile.toml",
    show_default=True,
    help="Path to the kernelfile.",
)
@click.pass_context
def main(ctx, kernelfile):
    """ptxbuild: build GPU kernels from kernelfile.toml by a cached, verified search.

    Example: ptxbuild build rmsnorm@h100
    """
    ctx.obj = kernelfile


@main.command()
@click.argument("op", required=False)
@click.option(
    "--deep",
    is_flag=True,
    help="Also compile every valid config (no GPU) and run the op's Python side once with numpy.",
)
@click.option(
    "--max-configs",
    default=64,
    show_default=True,
    help="--deep: at most this many configs per problem (a seeded sample beyond).",
)
@click.pass_obj
def check(kernelfile, op, deep, max_configs):
    """Validate the kernelfile and list its targets; --deep checks each op (or OP) without a GPU.

    Example: ptxbuild check --deep rmsnorm
    """
    from ..declare.graph import all_targets

    if op is not None and not deep:
        raise click.UsageError("an OP is checked with --deep: ptxbuild check --deep OP")
    kf = _kernelfile(kernelfile)
    if deep:
        from ..compile.compiler import ToolchainMissing, toolchain
        from .authoring import run_deep

        if op is not None and op not in kf.ops:
            raise ConfigError(
                f"{kf.path.name} declares no op {op!r}; it declares {', '.join(kf.ops)}"
            )
        try:
            toolchain()
        except ToolchainMissing as exc:
            raise ToolError(str(exc)) from None
        return run_deep(kf, op, max_configs)
    targets = all_targets(kf)
    click.echo(
        f"{kf.path.name}: ok, {len(kf.ops)} op(s), {len(targets)} target(s): "
        + " ".join(map(str, targets))
    )


@main.command()
@click.argument("targets", nargs=-1)
@click.option("--no-gpu", is_flag=True, help="Plan as if no GPU were present.")
@click.pass_obj
def plan(kernelfile, targets, no_gpu):
    """Show what a build would do and why each target is stale or up to date.

    Example: ptxbuild plan rmsnorm@b200
    """
    from ..build.target import plan as do_plan

    kf = _kernelfile(kernelfile)
    ctx = _context(kf, None, not no_gpu, lambda *a, **k: None, dry=True)
    try:  # with a GPU present its fingerprint is part of each key: the worker that read it is stopped after
        for t, fresh, why in do_plan(ctx, _targets(kf, targets)):
            click.echo(f"{'up-to-date' if fresh else 'build':10} {t}  ({why})")
    finally:
        if ctx.gpu is not None:
            ctx.gpu.close()


@main.command()
@click.argument("targets", nargs=-1)
@click.option(
    "--explain",
    is_flag=True,
    help="Say why each target is built or skipped, then build (`ptxbuild plan` only says).",
)
@click.option(
    "--force", is_flag=True, help="Rebuild even up-to-date targets (cached steps are still reused)."
)
@click.option(
    "--jobs",
    "-j",
    type=click.IntRange(min=1),
    default=None,
    help="Parallel compiles (default: all cores).",
)
@click.option(
    "--no-gpu", is_flag=True, help="Do not verify or time on a GPU even if one is present."
)
@click.option("--quiet", "-q", is_flag=True, help="Print only the result lines (no progress).")
@click.option(
    "--locked",
    is_flag=True,
    help="Rebuild exactly what kernelfile.lock records (compile + verify, no "
    "search); fail on any drift.",
)
@click.option(
    "--remeasure",
    is_flag=True,
    help="Time every candidate and baseline again (implies --force; "
    "compiles and verdicts still come from the cache): all of a report's numbers from one run. "
    "After an interrupted --remeasure build it resumes, keeping that run's successful timings.",
)
@click.option(
    "--remeasure-only",
    "remeasure_only",
    multiple=True,
    metavar="TEXT",
    help="Like --remeasure, but only "
    "for problems whose label contains TEXT (repeatable), e.g. 'float32[32768x2048]'; the others keep "
    "their cached timings, and each report row says when it was timed.",
)
@click.option(
    "--no-resume",
    is_flag=True,
    help="With --remeasure: start over even after an interrupted "
    "--remeasure build (e.g. when the GPU was shared while it ran).",
)
@click.pass_obj
def build(
    kernelfile,
    targets,
    explain,
    force,
    jobs,
    no_gpu,
    quiet,
    locked,
    remeasure,
    remeasure_only,
    no_resume,
):
    """Build targets (op@gpu, op, or @gpu); with none, the whole kernelfile.

    Example: ptxbuild build rmsnorm@b200 rmsnorm@h100
    """
    from ..build.target import build as do_build
    from ..build.target import plan as do_plan
    from ..declare.checks import problems_of
    from ..declare.graph import all_targets

    kf = _kernelfile(kernelfile)
    chosen = _targets(kf, targets)
    _lock_sound(kf)
    if remeasure and remeasure_only:
        raise ConfigError(
            "give --remeasure (every problem) or --remeasure-only TEXT (some), not both"
        )
    remeasure = remeasure or bool(remeasure_only)
    if no_resume and not remeasure:
        raise ConfigError("--no-resume only applies with --remeasure")
    labels = (
        [p.label() for t in chosen or all_targets(kf) for p in problems_of(kf.ops[t.op])]
        if remeasure_only
        else []
    )
    for text in (
        remeasure_only
    ):  # a typo would time nothing again and look like success (checked before a GPU starts)
        if not any(text in label for label in labels):
            raise ConfigError(
                f"--remeasure-only {text!r} matches no problem of these targets (labels look like {labels[0]!r})"
            )
    ctx = _context(kf, jobs, not no_gpu, Progress(quiet))
    ctx.force, ctx.remeasure, ctx.resume = force or remeasure, remeasure, not no_resume
    ctx.remeasure_only = tuple(remeasure_only)
    if explain:
        for t, fresh, why in do_plan(ctx, chosen):
            click.echo(
                f"{t}: {why}" if fresh else f"{t}: stale ({why})"
            )  # a fresh why starts "up to date"
    from ..build.locked import build_locked
    from ..gpu.session import GpuError
    from ..outputs.lockfile import LockError, update_lock

    def say_missed(
        r,
    ):  # built and locked all the same: the gates judge the kernels, they do not build them
        if r.missed:
            click.echo(
                f"{r.target}: {len(r.missed)} gate(s) missed (ops.{r.target.op}.gates):\n"
                + "\n".join(f"  - {m}" for m in r.missed)
            )

    try:
        results = build_locked(ctx, chosen) if locked else do_build(ctx, chosen)
        lock = (
            None
            if locked
            else update_lock(kf, results, note=lambda m: click.echo(f"lock: {m}", err=True))
        )
    except LockError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_BUILD_FAILED)
    except (
        GpuError,
        KeyboardInterrupt,
    ) as exc:  # targets that finished before it keep their lock entries
        if not locked and (
            lock := update_lock(
                kf, getattr(exc, "finished", []), note=lambda m: click.echo(f"lock: {m}", err=True)
            )
        ):
            click.echo(f"lock: {lock} (the targets finished before the stop)", err=True)
        for r in getattr(exc, "finished", []):
            say_missed(r)
        if isinstance(exc, GpuError):
            raise ToolError(
                f"{exc}; finished attempts are saved in the cache, rerun to continue"
            ) from None
        click.echo(
            "interrupted: finished attempts are saved in the cache; rerun to continue", err=True
        )
        sys.exit(130)
    finally:
        if ctx.gpu is not None:
            ctx.gpu.close()
    for r in results:
        extra = (
            f" ({r.reason})"
            if locked
            else ""
            if r.status == "up_to_date"
            else " (measured on hardware)"
            if r.measured
            else " (not measured on hardware)"
        )
        line = f"{r.target}: {r.status.replace('_', ' ')}{extra}"
        if r.status == "failed":
            line += f": {r.reason}"
        elif r.manifest:
            line += f" -> {r.manifest.parent.relative_to(kf.root)}"
        click.echo(line)
        say_missed(r)
    if lock is not None and not quiet:
        click.echo(f"lock: {lock}", err=True)
    if any(r.status == "failed" or r.missed for r in results):
        sys.exit(EXIT_BUILD_FAILED)


@main.command()
@click.argument("targets", nargs=-1)
@click.pass_obj
def relock(kernelfile, targets):
    """Accept edits to an op's kernel sources that leave its locked kernels byte-identical (no GPU).

    Each target's locked configs are compiled from the current sources; the lock's op file digests
    are updated only if every PTX, cubin and launch geometry matches (with no source edit since the lock,
    a PTX that alone differs is recorded anew). An edit to the op's Python, or any other drift, is an error.

    Example: ptxbuild relock rmsnorm@h200
    """
    from ..build.locked import relock as do_relock
    from ..compile.compiler import CompileError
    from ..outputs.lockfile import LockError

    kf = _kernelfile(kernelfile)
    _lock_sound(kf)
    ctx = _context(kf, None, False, Progress(True))
    try:
        done = do_relock(ctx, _targets(kf, targets))
    except (LockError, CompileError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        click.echo(f"error: {first}", err=True)
        sys.exit(EXIT_BUILD_FAILED)
    for t, what in done:
        click.echo(f"{t}: {what}")
    if any(what != "unchanged" for _, what in done):
        click.echo(
            "the lock changed: run `ptxbuild build --locked` to rewrite build/ from it, then commit both",
            err=True,
        )


@main.command()
@click.argument("targets", nargs=-1)
@click.pass_obj
def report(kernelfile, targets):
    """Print and (re)write the report of each target's last build under reports/.

    Example: ptxbuild report rmsnorm@h200
    """
    from ..declare.graph import all_targets
    from ..outputs.lockfile import pinned_binaries
    from ..outputs.report import HEAD, collect, rejudge, table_rows, write_report

    kf = _kernelfile(kernelfile, ops=False)
    cache, locked = Cache(kf.cache_path), pinned_binaries(kf)
    for t in _targets(kf, targets) or all_targets(kf):
        data = collect(kf, cache, t)
        rejudge(
            kf, t, rerender=data is None
        )  # the report there by this kernelfile's gates, whatever comes next
        if (
            data is None
        ):  # e.g. a GPU machine's report, committed: rendered again from its report.json
            md, how = kf.reports_dir / str(t) / "report.md", "--locked " if str(t) in locked else ""
            click.echo(
                f"{t}: no build in this cache"
                + (
                    f"; its report {md.relative_to(kf.root)} is rendered again from report.json"
                    if md.with_suffix(".json").is_file()
                    else f"; its report is {md.relative_to(kf.root)}"
                    if md.is_file()
                    else ""
                )
                + f"; run: ptxbuild build {how}{t}"
            )
            continue
        path = write_report(kf, cache, t, keep_newer=True)
        if path is None:
            click.echo(
                f"{t}: left as it is: its report comes from a later build (another machine's?) than this "
                f"cache's last one; bring that machine's cache here to re-render it"
            )
            continue
        measured = (
            "measured on hardware" if data["summary"]["measured"] else "not measured on hardware"
        )
        click.echo(f"{t} ({data['status']}, {measured}) -> {path.relative_to(kf.root)}")
        rows = [HEAD] + table_rows(data)
        widths = [max(len(r[i]) for r in rows) for i in range(len(HEAD))]
        for r in rows:
            click.echo("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


@main.command()
def doctor():
    """Show the GPU, driver, compiler and packages ptxbuild sees, and what is missing.

    Example: ptxbuild doctor
    """
    from ..build.doctor import doctor as run_doctor

    for name, status in run_doctor():
        click.echo(f"{name:12} {status}")


class _ShowByDefault(click.Group):
    """`ptxbuild lessons [op] [--gpu g]` means `ptxbuild lessons show [op] [--gpu g]`."""

    def parse_args(self, ctx, args):
        if not args or (args[0] not in self.commands and args[0] not in ("--help", "-h")):
            args = ["show", *args]
        return super().parse_args(ctx, args)


def _gpu(kf, name):
    from ..declare.catalog import CATALOG, did_you_mean

    if name is None:
        return None
    gpu = kf.gpus.get(name) or CATALOG.get(name)
    if gpu is None:
        raise ConfigError(f"--gpu {name}: unknown GPU{did_you_mean(name, [*kf.gpus, *CATALOG])}")
    return gpu


def _mib(path: Path) -> str:
    return f"{path.stat().st_size / 2**20:.1f} MiB"


@main.group("cache", cls=_ShowByDefault)
def cache_group():
    """The SQLite cache: what it holds, and dropping what a build can redo.

    Example: ptxbuild cache prune --older-than 7
    """


@cache_group.command("show")
@click.pass_obj
def cache_show(kernelfile):
    """Where the cache is, its size and the rows of each table.

    Example: ptxbuild cache show
    """
    kf = _kernelfile(kernelfile, ops=False)
    counts = Cache(kf.cache_path).counts()
    click.echo(f"{kf.cache_path}: {_mib(kf.cache_path)}")
    for table, n in counts.items():
        click.echo(f"  {table:13s} {n:8d} row(s)")


@cache_group.command("check")
@click.pass_obj
def cache_check(kernelfile):
    """Say whether the cache can be used (SQLite integrity, schema), or what is wrong and the way out.

    Example: ptxbuild cache check
    """
    from ..store.cache import check as do_check

    kf = _kernelfile(kernelfile, ops=False)
    click.echo(f"{kf.cache_path}: ok, {do_check(kf.cache_path)}")


@cache_group.command("prune")
@click.option(
    "--older-than",
    "days",
    type=click.FloatRange(min=0),
    default=7.0,
    show_default=True,
    help="Drop compiled PTX and cubin stored more than this many days ago.",
)
@click.pass_obj
def cache_prune(kernelfile, days):
    """Drop old compiled PTX and cubin (a build compiles them again when it needs them); attempts,
    verdicts, timings, builds and lessons stay. For a cache that must travel small.

    Example: ptxbuild cache prune --older-than 0
    """
    kf = _kernelfile(kernelfile, ops=False)
    cache = Cache(kf.cache_path)  # (creates an empty one if there is none yet)
    before = _mib(kf.cache_path)
    n = cache.prune_compiles(days * 86400)
    click.echo(f"{kf.cache_path}: {n} compile(s) dropped, {before} -> {_mib(kf.cache_path)}")


@main.group(cls=_ShowByDefault)
def lessons():
    """What builds learned: best configs, failure rules, sensitive parameters.

    Example: ptxbuild lessons rmsnorm --gpu h200
    """


@lessons.command("show")
@click.argument("op", required=False)
@click.option("--gpu", help="Only lessons for this GPU (and rules for its architecture).")
@click.option("--all", "show_all", is_flag=True, help="Include retired lessons.")
@click.pass_obj
def lessons_show(kernelfile, op, gpu, show_all):
    """Print the lessons as a table.

    Example: ptxbuild lessons show rmsnorm --gpu h100
    """
    from ..store.lessons import listing

    kf = _kernelfile(kernelfile, ops=False)
    rows = listing(Cache(kf.cache_path), op, _gpu(kf, gpu), show_all)
    ops = (
        sorted({r["op"] for r in listing(Cache(kf.cache_path), None, None, True)})
        if op and not rows
        else []
    )
    if not rows:
        click.echo(
            f"no lessons for op {op!r}; the cache has lessons for {', '.join(ops)}"
            if ops and op not in ops
            else "no lessons yet; "
            "build a target on a GPU (ptxbuild build op@gpu) or import some (ptxbuild lessons import FILE)"
        )
        return
    head = ["id", "op", "kind", "scope", "rule", "confidence", "evidence", "source"]
    table = [head] + [[r[k] for k in head] for r in rows]
    widths = [max(len(t[i]) for t in table) for i in range(len(head))]
    for t in table:
        click.echo("  ".join(c.ljust(w) for c, w in zip(t, widths)).rstrip())


@lessons.command("export")
@click.argument("out", default="cache/lessons.jsonl")
@click.option("--op", help="Only this op's lessons.")
@click.option("--gpu", help="Only lessons for this GPU (and rules for its architecture).")
@click.option("--retired", is_flag=True, help="Include retired lessons.")
@click.pass_obj
def lessons_export(kernelfile, out, op, gpu, retired):
    """Write the lessons as JSONL (one lesson a line, sorted), the form a model repo checks in; - = stdout.

    Example: ptxbuild lessons export cache/lessons.jsonl --op rmsnorm
    """
    from ..store.lessons_io import export_lessons

    kf = _kernelfile(kernelfile, ops=False)
    _gpu(kf, gpu)
    lines = export_lessons(Cache(kf.cache_path), op, gpu, retired, kf.project)
    text = "".join(line + "\n" for line in lines)
    if out == "-":
        click.echo(text, nl=False)
        return
    path = Path(out) if Path(out).is_absolute() else kf.root / out
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    click.echo(f"{len(lines)} lesson(s) -> {path}")


@lessons.command("import")
@click.argument("file", type=click.Path(dir_okay=False))
@click.pass_obj
def lessons_import(kernelfile, file):
    """Validate a JSONL lessons file and merge it into the cache: all or nothing, no duplicates.

    Example: ptxbuild lessons import cache/lessons.jsonl
    """
    from ..store.lessons_io import LessonsFileError, import_lessons

    kf = _kernelfile(kernelfile, ops=False)
    try:
        n = import_lessons(Cache(kf.cache_path), file)
    except LessonsFileError as exc:
        raise ConfigError(f"{exc}; nothing imported") from None
    click.echo(
        f"{file}: {n['read']} lesson(s) read, {n['added']} added, {n['already_present']} already present, "
        f"{n['duplicates_in_file']} duplicate(s) in the file"
    )


@main.command()
@click.argument("out")
@click.option("--op", help="Only this op's attempts.")
@click.option("--gpu", help="Only attempts on this GPU.")
@click.pass_obj
def record(kernelfile, out, op, gpu):
    """Export the recorded attempts of past builds as a replay recording (JSONL) for offline search.

    Example: ptxbuild record recordings/rmsnorm-h200.jsonl --op rmsnorm
    """
    from ..search.replay import export_recording

    kf = _kernelfile(kernelfile)
    from ..declare.checks import problems_of
    from ..oploader import load_op

    spaces, defaults = {}, {}
    for name, spec in kf.ops.items():
        mod = load_op(spec.template, kf.root)
        spaces[name] = mod.SPACE
        defaults[name] = {
            json.dumps(p.key(), sort_keys=True): mod.default_params(p) for p in problems_of(spec)
        }
    n = export_recording(
        Cache(kf.cache_path), out, op=op, gpu=gpu, spaces=spaces, defaults=defaults
    )
    click.echo(f"{n} attempt(s) -> {out}")


from .authoring import new as _new  # noqa: E402 - after main exists

main.add_command(_new)

if __name__ == "__main__":
    main()
