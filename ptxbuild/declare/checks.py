"""Declaration checks: an op's kernelfile section against what the op offers, and the problems it declares."""

from __future__ import annotations

import math
from dataclasses import asdict

from ..oploader import OpError, load_op, op_dir
from ..problem import Problem
from . import memo
from .catalog import did_you_mean
from .kernelfile import KernelfileError


def problems_of(spec) -> list[Problem]:
    """Every (dtype, mode, shape) the op declares, ordered so neighbours follow each other."""
    shapes = sorted(spec.shapes, key=lambda s: (s[-1], s))
    return [
        Problem.make(spec.name, dtype, shape, {**dict(spec.options), **dict(mode)})
        for dtype in spec.dtypes
        for mode in spec.modes
        for shape in shapes
    ]


def op_errors(kf) -> list[str]:
    """Every op's mistakes, one line each: an op that does not load (or lacks a name of the
    contract) and every declaration_errors. Each command's kernelfile check; an op whose files and
    declaration passed as they are now (the memo, memo.py) is neither loaded nor checked again."""
    book, errors, trees = memo.Memo.of(kf.path), [], {}
    for spec in kf.ops.values():
        folder, sm = op_dir(spec.template, kf.root), min(kf.gpus[g].sm_count for g in spec.gpus)
        if folder.parent not in trees:  # None (a folder too big to digest) is kept too
            trees[folder.parent] = memo.tree_digest(folder.parent)
        tree = trees[folder.parent]
        key = tree and memo.digest(tree, memo.code_digest(), str(folder), asdict(spec), sm)
        if key and book.get(f"declared:{spec.name}", key) is True:
            continue
        try:
            op = load_op(spec.template, kf.root)
        except OpError as exc:
            errors.append(str(exc))
            continue
        mine = [f"{kf.path.name}: {e}" for e in declaration_errors(spec, op, sm)]
        if key and not mine:
            book.put(f"declared:{spec.name}", key, True)
        errors += mine
    return errors


def check_declaration(spec, op, sm_count: int = 132) -> None:
    """Raise KernelfileError (one line per mistake, all of them) for declaration_errors."""
    if errors := declaration_errors(spec, op, sm_count):
        raise KernelfileError("\n".join(errors))


GRID_LIMITS = (2**31 - 1, 65535, 65535)  # CUDA's gridDim limits in x, y, z


def _problem_error(spec, op, p, sm_count: int) -> str | None:
    """Why the op's default config cannot run `p`: default_params fails, its check() refuses it, or its
    launch leaves CUDA's grid or block limits."""
    try:
        cfg = op.default_params(p)
        if (reason := op.check(cfg, p)) is not None:
            return f"the op's default config {cfg} is refused for {p.label()}: {reason}"
        lau = op.launch(cfg, p, sm_count)
    except Exception as exc:  # noqa: BLE001 - the op's own code, on a problem the kernelfile declares
        return f"the op cannot build {p.label()} ({exc})"
    grid, block = tuple(lau.grid), tuple(lau.block)
    if any(g > lim for g, lim in zip(grid, GRID_LIMITS)) or math.prod(block) > 1024:
        return (
            f"the op's default config {cfg} launches a grid of {grid} blocks of {block} threads for "
            f"{p.label()}; CUDA allows at most (2147483647, 65535, 65535) blocks and 1024 threads a block"
        )
    return None


def declaration_errors(spec, op, sm_count: int = 132) -> list[str]:
    """Every mistake of an op's declaration against the op, each naming its key: a dtype the op lacks
    (DTYPES); a declared shape the op's default config cannot run (default_params, check, CUDA's grid
    limits); `search.candidates` or `search.polish` using a parameter the op lacks, or a value outside
    its space; `options` or a mode naming an option the op lacks or giving it a value of another type
    than the op's default (a misspelled key used to build the op's plain kernel under the wrong label)."""
    errors = []
    for where, opts in [("options", spec.options)] + [
        (f"modes[{i}]", m) for i, m in enumerate(spec.modes)
    ]:
        for k, v in dict(opts).items():
            d = op.OPTIONS.get(k, ...)
            if d is ...:
                errors.append(
                    f"ops.{spec.name}.{where}: unknown option {k!r}{did_you_mean(k, op.OPTIONS)}; "
                    f"the op's options are {', '.join(sorted(op.OPTIONS))}"
                )
            elif (
                None not in (d, v)
                and type(v) is not type(d)
                and not (type(d) is float and type(v) is int)
            ):
                errors.append(
                    f"ops.{spec.name}.{where}: {k} = {v!r} is not a {type(d).__name__} "
                    f"(the op's default is {d!r})"
                )
    options_ok, shapes, bad = not errors, [tuple(s) for s in spec.shapes], set()
    errors += [
        f"ops.{spec.name}.dtypes[{i}]: the op {op.NAME} does not support {d}; it supports "
        f"{', '.join(op.DTYPES)}"
        for i, d in enumerate(spec.dtypes)
        if d not in op.DTYPES
    ]
    if options_ok:  # options the op knows: each declared shape with its default config
        for p in (p for p in problems_of(spec) if p.dtype in op.DTYPES):
            i = shapes.index(tuple(p.shape))
            if i not in bad and (why := _problem_error(spec, op, p, sm_count)):
                bad.add(i)
                errors.append(f"ops.{spec.name}.shapes[{i}] = {list(p.shape)}: {why}")
    for i, name in enumerate(spec.search.get("polish") or ()):
        if name not in op.SPACE:
            errors.append(
                f"ops.{spec.name}.search.polish[{i}]: unknown parameter {name!r}"
                f"{did_you_mean(name, op.SPACE)}; the op's parameters are {', '.join(sorted(op.SPACE))}"
            )
    for i, entry in enumerate(spec.search.get("candidates") or ()):
        where = f"ops.{spec.name}.search.candidates[{i}]"
        if unknown := sorted(k for k in entry if k not in op.SPACE):
            errors.append(
                f"{where}: unknown parameter(s) {', '.join(unknown)}; "
                f"the op's parameters are {', '.join(sorted(op.SPACE))}"
            )
            continue
        # typed: True == 1 and 2.0 == 2 in Python, but they render and key differently
        errors += [
            f"{where}: {k} = {v!r} is not one of {op.SPACE[k]}"
            for k, v in entry.items()
            if not any(type(v) is type(s) and v == s for s in op.SPACE[k])
        ]
    return errors


def declared_candidates(spec, op, problem, default: dict, note) -> list[dict]:
    """The kernelfile's `search.candidates` for one problem (validated by check_declaration first):
    each entry merged over the op's default, those the op's check() rejects for this problem left
    out, each with its reason passed to `note`."""
    out = []
    for i, entry in enumerate(spec.search.get("candidates") or ()):
        cfg = {**default, **entry}
        reason = op.check(cfg, problem)
        if reason is not None:
            note(f"{problem.label()}: ops.{spec.name}.search.candidates[{i}] skipped: {reason}")
        elif cfg not in out:
            out.append(cfg)
    return out
