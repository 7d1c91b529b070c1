"""Op authoring on the command line: `ptxbuild new NAME` and `ptxbuild check --deep [OP]` (issue 31)."""

from __future__ import annotations

from pathlib import Path

import click


@click.command()
@click.argument("name")
@click.pass_obj
def new(kernelfile, name):
    """Write a new op folder ops/NAME/ (op.py, a plain kernel) and its kernelfile entry.

    Example: ptxbuild new demo_op && ptxbuild check --deep demo_op
    """
    from ..declare.scaffold import ScaffoldError, create_op

    try:
        made = create_op(name, Path(kernelfile))
    except ScaffoldError as exc:
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(2) from None
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
