"""Declaration checks: an op's kernelfile section against what the op offers, and the problems it declares."""

from __future__ import annotations

from ..problem import Problem
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


def check_declaration(spec, op) -> None:
    """Raise KernelfileError, naming the key, when `search.candidates` or `search.polish` uses a parameter the op lacks,
    or a candidate a value outside its space; when `options` or a mode names an option the op lacks or gives it a value
    of another type than the op's default (a misspelled key used to build the op's plain kernel under the wrong label);
    when the op has no config at all for a declared problem (a shape of the wrong rank)."""
    for where, opts in [("options", spec.options)] + [
        (f"modes[{i}]", m) for i, m in enumerate(spec.modes)
    ]:
        for k, v in dict(opts).items():
            d = op.OPTIONS.get(k, ...)
            if d is ...:
                raise KernelfileError(
                    f"ops.{spec.name}.{where}: unknown option {k!r}{did_you_mean(k, op.OPTIONS)}; "
                    f"the op's options are {', '.join(sorted(op.OPTIONS))}"
                )
            if (
                None not in (d, v)
                and type(v) is not type(d)
                and not (type(d) is float and type(v) is int)
            ):
                raise KernelfileError(
                    f"ops.{spec.name}.{where}: {k} = {v!r} is not a {type(d).__name__} "
                    f"(the op's default is {d!r})"
                )
    for p in problems_of(spec):
        try:
            op.default_params(p)
        except Exception as exc:  # noqa: BLE001 - the op's own code, on a problem the kernelfile declares
            i = [tuple(s) for s in spec.shapes].index(tuple(p.shape))
            raise KernelfileError(
                f"ops.{spec.name}.shapes[{i}] = {list(p.shape)}: the op cannot build "
                f"{p.label()} ({exc})"
            ) from None
    for i, name in enumerate(spec.search.get("polish") or ()):
        if name not in op.SPACE:
            raise KernelfileError(
                f"ops.{spec.name}.search.polish[{i}]: unknown parameter {name!r}"
                f"{did_you_mean(name, op.SPACE)}; the op's parameters are {', '.join(sorted(op.SPACE))}"
            )
    for i, entry in enumerate(spec.search.get("candidates") or ()):
        where = f"ops.{spec.name}.search.candidates[{i}]"
        unknown = sorted(k for k in entry if k not in op.SPACE)
        if unknown:
            raise KernelfileError(
                f"{where}: unknown parameter(s) {', '.join(unknown)}; "
                f"the op's parameters are {', '.join(sorted(op.SPACE))}"
            )
        for k, v in entry.items():
            # typed: True == 1 and 2.0 == 2 in Python, but they render and key differently
            if not any(type(v) is type(s) and v == s for s in op.SPACE[k]):
                raise KernelfileError(f"{where}: {k} = {v!r} is not one of {op.SPACE[k]}")


def declared_candidates(spec, op, problem, default: dict, note=None) -> list[dict]:
    """The kernelfile's `search.candidates` for one problem (validated by check_declaration first):
    each entry merged over the op's default, those the op's check() rejects for this problem left
    out, each with its reason passed to `note`."""
    out = []
    for i, entry in enumerate(spec.search.get("candidates") or ()):
        cfg = {**default, **entry}
        reason = op.check(cfg, problem)
        if reason is not None:
            if note:
                note(f"{problem.label()}: ops.{spec.name}.search.candidates[{i}] skipped: {reason}")
        elif cfg not in out:
            out.append(cfg)
    return out
