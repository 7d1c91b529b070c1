"""The build commands: check, plan, build, relock, report, doctor."""

from __future__ import annotations

import sys
from contextlib import ExitStack, closing

import click

from ..errors import EXIT_BUILD_FAILED, EXIT_INTERRUPTED, ConfigError, ToolError
from . import shell
from .progress import Progress
from .shell import _kernelfile, _lock_sound, _targets, echo_table, first_line, main


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
        from ..compile.compiler import toolchain
        from .authoring import run_deep

        if op is not None and op not in kf.ops:
            raise ConfigError(
                f"{kf.path.name} declares no op {op!r}; it declares {', '.join(kf.ops)}"
            )
        toolchain()  # ToolchainMissing (a ToolError) before anything is compiled
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
    from ..build.plan import plan as do_plan

    kf = _kernelfile(kernelfile)
    chosen = _targets(kf, targets)  # a target mistake is exit 2 before the toolchain is looked for
    # with a GPU present its fingerprint is part of each key: the worker that read it is stopped after
    with closing(shell._context(kf, None, not no_gpu, lambda *a, **k: None, dry=True)) as ctx:
        verdicts = do_plan(ctx, chosen)
    for t, fresh, why in verdicts:
        click.echo(f"{'up-to-date' if fresh else 'build':10} {t}  ({why})")


def _hardware(measured: bool) -> str:
    return "measured on hardware" if measured else "not measured on hardware"


def _say_missed(r) -> None:
    """Built and locked all the same: the gates judge the kernels, they do not build them."""
    if r.missed:
        click.echo(
            f"{r.target}: {len(r.missed)} gate(s) missed (ops.{r.target.op}.gates):\n"
            + "\n".join(f"  - {m}" for m in r.missed)
        )


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
@click.option(
    "--gpus",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Spread each measured target's problems over N GPUs of this machine, one "
    "worker pinned to each (with --cluster: N of the cluster's, default all). The lock does not "
    "depend on N: each problem is seeded by the lessons alone, not by the run's other problems.",
)
@click.option(
    "--cluster",
    metavar="ADDRESS|auto",
    default=None,
    help="Spread over the GPUs of a Ray cluster, one actor per GPU "
    "(pip install 'ptxbuild[cluster]'); auto: the running one, else one started on this machine.",
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
    gpus,
    cluster,
):
    """Build targets (op@gpu, op, or @gpu); with none, the whole kernelfile.

    Example: ptxbuild build rmsnorm@b200 rmsnorm@h100; ptxbuild build rmsnorm@h200 --gpus 8
    """
    from ..build.plan import plan as do_plan
    from ..build.run import build_and_lock
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
    # a typo would time nothing again and look like success (checked before a GPU starts)
    labels = [p.label() for t in chosen or all_targets(kf) for p in problems_of(kf.ops[t.op])]
    for text in remeasure_only:
        if not any(text in label for label in labels):
            raise ConfigError(
                f"--remeasure-only {text!r} matches no problem of these targets (labels look like {labels[0]!r})"
            )
    spreading = gpus is not None or cluster is not None
    for flag, on in (("--no-gpu", no_gpu), ("--locked", locked)):
        if spreading and on:
            raise ConfigError(
                f"--gpus / --cluster spread a search's GPU work; {flag} has none to spread"
            )
    ctx = shell._context(kf, jobs, not no_gpu and not spreading, Progress(quiet))
    ctx.force, ctx.remeasure, ctx.resume = force or remeasure, remeasure, not no_resume
    ctx.remeasure_only = tuple(remeasure_only)
    with ExitStack() as stack:
        if spreading:
            stack.enter_context(shell._spread(ctx, gpus, cluster))
        stack.enter_context(closing(ctx))
        if explain:
            for t, fresh, why in do_plan(ctx, chosen):
                # a fresh why starts "up to date"
                click.echo(f"{t}: {why}" if fresh else f"{t}: stale ({why})")
        done = build_and_lock(
            ctx, chosen, locked, note=lambda m: click.echo(f"lock: {m}", err=True)
        )
    results, lock = done.results, done.lock
    if done.stop is not None:  # the targets that finished before it are locked
        if lock:
            click.echo(f"lock: {lock} (the targets finished before the stop)", err=True)
        for r in results:
            _say_missed(r)
        if not isinstance(done.stop, KeyboardInterrupt):  # the GPU worker is gone
            raise ToolError(
                f"{done.stop}; finished attempts are saved in the cache, rerun to continue"
            )
        click.echo(
            "interrupted: finished attempts are saved in the cache; rerun to continue", err=True
        )
        sys.exit(EXIT_INTERRUPTED)
    for r in results:
        line = f"{r.target}: {r.status.replace('_', ' ')}"
        if locked or r.status != "up_to_date":
            line += f" ({r.reason if locked else _hardware(r.measured)})"
        if r.status == "failed":
            line += f": {r.reason}"
        elif r.manifest:
            line += f" -> {r.manifest.parent.relative_to(kf.root)}"
        click.echo(line)
        _say_missed(r)
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
    ctx = shell._context(kf, None, False, Progress(True))
    try:
        done = do_relock(ctx, _targets(kf, targets))
    except (LockError, CompileError) as exc:
        raise first_line(exc) from None
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
    from ..outputs.report import HEAD, rerender, table_rows
    from ..store.cache import Cache

    kf = _kernelfile(kernelfile, ops=False)
    cache, locked = Cache(kf.cache_path), pinned_binaries(kf)
    for t, data, path in rerender(kf, cache, _targets(kf, targets) or all_targets(kf)):
        # e.g. a GPU machine's report, committed: rendered again from its report.json
        if data is None:
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
        if path is None:
            click.echo(
                f"{t}: left as it is: its report comes from a later build (another machine's?) than this "
                f"cache's last one; bring that machine's cache here to re-render it"
            )
            continue
        measured = _hardware(data["summary"].measured)
        click.echo(f"{t} ({data['status']}, {measured}) -> {path.relative_to(kf.root)}")
        echo_table([HEAD] + table_rows(data), indent="  ")


@main.command()
@click.option("--cluster", metavar="ADDRESS|auto", help="Also list the GPUs of that Ray cluster.")
def doctor(cluster):
    """Show the GPU, driver, compiler and packages ptxbuild sees, and what is missing.

    Example: ptxbuild doctor; ptxbuild doctor --cluster auto
    """
    from ..build.doctor import doctor as run_doctor

    for name, status in run_doctor():
        click.echo(f"{name:12} {status}")
    if cluster is not None:
        from ..cluster.ray_lanes import gpus_of, shutdown

        try:
            for node, n in gpus_of(cluster):
                click.echo(f"{'cluster':12} node {node}: {n} GPU(s)")
        finally:
            shutdown()
