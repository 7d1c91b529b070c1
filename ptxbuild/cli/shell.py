"""The CLI's shell: the click group, ptxbuild's errors turned into messages and exit codes (here
only), and the kernelfile, targets and build context every command starts from."""

from __future__ import annotations

import errno
import sqlite3
import sys

import click

from ..errors import BuildFailed, ConfigError, PtxbuildError, ToolError, shown


class _Failed(click.ClickException):
    """A PtxbuildError as click shows it: `error: ...` with the error's exit code (`Error: ...` for
    a ToolError, click's own form)."""

    def __init__(self, exc: PtxbuildError):
        super().__init__(str(exc))
        self.exit_code, self.tool = exc.exit_code, isinstance(exc, ToolError)

    def show(self, file=None):
        if self.tool:
            return super().show(file)
        for line in self.message.splitlines():  # every mistake found, one line each
            click.echo(f"error: {line}", err=True)


_WRITE_ERRNOS = {1, 13, 28, 30, 36, 122}  # EPERM EACCES ENOSPC EROFS ENAMETOOLONG EDQUOT


class Shell(click.Group):
    """ptxbuild's group: every command's PtxbuildError becomes its message and exit code, once;
    damaged state files and unwritable places are one line with the way out, never a traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except PtxbuildError as exc:
            raise _Failed(exc) from None
        except sqlite3.DatabaseError as exc:  # found after the cache opened (a page deep inside)
            from ..store.cache import Cache, cache_error

            if Cache.opened is None:
                raise
            raise _Failed(cache_error(Cache.opened, exc)) from None
        except OSError as exc:
            if exc.filename is None or exc.errno not in _WRITE_ERRNOS:
                raise
            how = (
                "read-only"
                if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS)
                else "not writable"
            )
            raise _Failed(
                ToolError(
                    f"{shown(exc.filename)}: {how} ({exc.strerror}); make it writable, or name "
                    "another folder in the kernelfile's [project] (build_dir, reports_dir, cache)"
                )
            ) from None


def first_line(exc: BaseException) -> BuildFailed:
    """A failure said in its first line (a compiler's log follows it), or by its kind if empty."""
    text = str(exc).strip()
    return BuildFailed(text.splitlines()[0] if text else type(exc).__name__)


@click.group(cls=Shell)
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


def _kernelfile(path: str, ops: bool = True):
    """The kernelfile, with every op's declaration mistakes found at once (one line each)."""
    from ..declare.checks import op_errors
    from ..declare.kernelfile import load

    kf = load(path)
    if ops and (errors := op_errors(kf)):  # dtypes, shapes, options, modes, search vs the op
        raise ConfigError("\n".join(dict.fromkeys(errors)))
    return kf


def _lock_sound(kf) -> None:
    """A lock that is there must parse (a plain build would otherwise rewrite it without its entries)."""
    from ..outputs.lockfile import LockError, LockUnreadable, read_lock

    try:
        read_lock(kf)
    except LockUnreadable:
        raise
    except LockError:
        pass  # none yet


def echo_table(rows: list[list[str]], indent: str = "") -> None:
    """Rows of text as columns padded to their widest cell."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        click.echo(indent + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


def _targets(kf, names):
    from ..declare.graph import parse_target

    return [t for n in names for t in parse_target(n, kf)] if names else None


def _context(kf, jobs: int | None, use_gpu: bool, progress, dry: bool = False):
    """The build context of a command (tests put a fake one here)."""
    from ..build.context import open_context

    return open_context(
        kf,
        jobs,
        use_gpu,
        progress,
        dry,
        command="ptxbuild " + " ".join(sys.argv[1:]),
        say=lambda line: click.echo(line, err=True),
    )


def _spread(ctx, gpus: int | None, cluster: str | None):
    """The GPUs a build spreads over (--gpus, --cluster), attached to `ctx` while the command runs
    (tests put fake ones here)."""
    from ..cluster import attached

    return attached(ctx, gpus, cluster, say=lambda line: click.echo(line, err=True))
