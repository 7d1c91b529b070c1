"""The store's commands: cache show / check / prune, lessons show / export / import, record."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ..errors import ConfigError
from .shell import _kernelfile, echo_table, main


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


def _cache(kf):
    """The kernelfile's cache (created empty where there is none yet); sqlite_utils is imported
    only by the commands that open it, so `check` and `--help` start without it."""
    from ..store.cache import Cache

    return Cache(kf.cache_path)


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
    counts = _cache(kf).counts()
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
    cache = _cache(kf)  # (creates an empty one if there is none yet)
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
    rows = listing(_cache(kf), op, _gpu(kf, gpu), show_all)
    if not rows:
        ops = sorted({r["op"] for r in listing(_cache(kf), None, None, True)}) if op else []
        click.echo(
            f"no lessons for op {op!r}; the cache has lessons for {', '.join(ops)}"
            if ops and op not in ops
            else "no lessons yet; "
            "build a target on a GPU (ptxbuild build op@gpu) or import some (ptxbuild lessons import FILE)"
        )
        return
    head = ["id", "op", "kind", "scope", "rule", "confidence", "evidence", "source"]
    echo_table([head] + [[r[k] for k in head] for r in rows])


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
    lines = export_lessons(_cache(kf), op, gpu, retired, kf.project)
    text = "".join(line + "\n" for line in lines)
    if out == "-":
        click.echo(text, nl=False)
        return
    path = kf.root / out  # an absolute out stays as it is
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
        n = import_lessons(_cache(kf), file)
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
    n = export_recording(_cache(kf), out, op=op, gpu=gpu, spaces=spaces, defaults=defaults)
    click.echo(f"{n} attempt(s) -> {out}")
