"""Op authoring on the command line: `ptxbuild new NAME` and `ptxbuild check --deep [OP]` (issue 31)."""

from __future__ import annotations

import json
import sys
from contextlib import closing
from pathlib import Path

import click


@click.command()
@click.argument("name")
@click.pass_obj
def new(kernelfile, name):
    """Write a new op folder ops/NAME/ (op.py, a plain kernel) and its kernelfile entry.

    Example: ptxbuild new demo_op && ptxbuild check --deep demo_op
    """
    from ..declare.scaffold import create_op

    made = create_op(name, Path(kernelfile))  # a ScaffoldError: exit 2, said as every ConfigError
    root = made.kernelfile.parent
    for f in made.files:
        click.echo(f"wrote {f.relative_to(root)}")
    how = "created" if made.kernelfile_created else "appended [ops." + name + "] to"
    click.echo(f"{how} {made.kernelfile.name}")
    click.echo(f"next: ptxbuild check --deep {name}")


def run_deep(kf, op_name: str | None, max_configs: int) -> None:
    """check --deep on a loaded kernelfile (its ops checked, OP declared, the compiler there): print
    each op's checks and failures; exit 1 if any config or check failed."""
    from ..build.deep import deep_check, describe
    from ..oploader import load_op

    failed = compiles = 0
    specs = [kf.ops[op_name]] if op_name else list(kf.ops.values())
    for spec in specs:
        res = deep_check(kf, spec, load_op(spec.template, kf.root), max_configs)
        compiles += res.compiles
        for line in res.lines:
            click.echo(f"{spec.name}: {line}")
        for f in res.failures:
            lines = describe(f)
            click.echo(f"FAIL {spec.name}: {lines[0]}")
            for line in lines[1:]:
                click.echo(line)
        failed += len(res.failures)
    verdict = "ok" if not failed else f"{failed} failure(s)"
    click.echo(f"{kf.path.name}: check --deep {verdict}, {len(specs)} op(s), {compiles} compile(s)")
    if failed:
        raise SystemExit(1)


@click.command("try")
@click.argument("target")
@click.option(
    "--proposer",
    "proposers",
    multiple=True,
    required=True,
    metavar="CMD",
    help="A proposer command (repeatable): the proposer protocol over its stdin/stdout.",
)
@click.option(
    "--rounds",
    default=1,
    show_default=True,
    type=click.IntRange(1, 1000),
    help="Rounds of propose -> build -> feedback a problem.",
)
@click.option("--no-gpu", is_flag=True, help="Compile and check only, even with a GPU present.")
@click.pass_obj
def try_(kernelfile, target, proposers, rounds, no_gpu):
    """Build TARGET with proposers: after the template search, rounds of propose -> compile ->
    verify -> time -> feedback; a proposed winner is built and locked like any (cached steps
    reused). Prints one JSON line a problem: its winner, each proposer's attempts by outcome, the
    winner's lineage and its p50 in one window with the best template config.

    Example: ptxbuild try softmax@h200 --proposer 'python my_agent.py' --rounds 3
    """
    from ..build.run import build_and_lock
    from .progress import Progress
    from .shell import _context, _kernelfile, _targets

    kf = _kernelfile(kernelfile)
    chosen, ctx = _targets(kf, [target]), _context(kf, None, not no_gpu, Progress())
    ctx.force, ctx.proposers, ctx.rounds = True, tuple(proposers), rounds
    with closing(ctx):
        done = build_and_lock(ctx, chosen, False, note=lambda m: None)
    for r in done.results:
        for d in json.loads(r.manifest.read_text())["dispatch"] if r.manifest else []:
            row = {"target": str(r.target), "problem": d["label"], "params": d["params"]}
            click.echo(json.dumps({**row, "p50_ms": d.get("p50_ms"), **(d.get("factory") or {})}))
    if done.stop is not None or any(r.status == "failed" for r in done.results):
        sys.exit(1)  # EXIT_BUILD_FAILED
