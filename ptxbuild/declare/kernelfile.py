"""Parse and validate kernelfile.toml (pydantic at this boundary only) into plain values."""

from __future__ import annotations

import hashlib
import os
import re
import tomllib
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from . import memo
from .catalog import CATALOG, Gpu, did_you_mean, toml_key


class KernelfileError(ConfigError):
    """A mistake in kernelfile.toml: one line naming the key path and what to write instead."""


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def name_problem(name: str) -> str | None:
    """Why an op or GPU name cannot name build/<op>@<gpu>/ and reports/ folders, or None."""
    if _NAME.fullmatch(name) and ".." not in name:
        return None
    return (
        f"not a usable name ({len(name)} characters): it names the folders build/<op>@<gpu>/ and "
        "reports/<op>@<gpu>/; use letters, digits, '_', '-' and '.', at most 64 characters, starting "
        "with a letter or digit"
    )


@dataclass(frozen=True)
class OpSpec:
    name: str
    template: str
    dtypes: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    options: tuple[tuple[str, Any], ...]
    modes: tuple[tuple[tuple[str, Any], ...], ...]
    gpus: tuple[str, ...]
    metric: str
    gates: dict
    search: dict
    depends: tuple[str, ...]

    def config(self) -> dict:
        """Everything of this op's declaration that can change what gets built. The metric and gates judge a
        build and never change it: hashed as their defaults (the digests of locks written before), so editing
        them re-judges what is built and locked (gates.judge) instead of searching again."""
        return {
            "template": self.template,
            "dtypes": list(self.dtypes),
            "shapes": [list(s) for s in self.shapes],
            "options": dict(self.options),
            "modes": [dict(m) for m in self.modes],
            "metric": "geomean_time",
            "gates": {"min_bandwidth_fraction": None, "max_time_ms": None},
            "search": self.search,
            "depends": list(self.depends),
        }


@dataclass(frozen=True)
class Kernelfile:
    path: Path
    root: Path
    digest: str
    project: str
    cache_path: Path
    build_dir: Path
    reports_dir: Path
    gpus: dict[str, Gpu]
    ops: dict[str, OpSpec]


def _fail(path: Path, errors: list[str]) -> None:
    if errors:
        raise KernelfileError("\n".join(f"{path.name}: {e}" for e in errors))


def parse(text: str, path: Path) -> Kernelfile:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise KernelfileError(f"{path.name}: not valid TOML: {exc}") from None
    from .schema import validate  # pydantic: only where a kernelfile is validated (not memoized)

    model, errors = validate(raw)
    _fail(path, errors)
    root = path.parent.resolve()
    errors = [
        f"{table}.{toml_key(n)}: {why}"
        for table, names in (("gpus", model.gpus), ("ops", model.ops))
        for n in names
        if (why := name_problem(n))
    ]
    for key in ("build_dir", "reports_dir"):
        if (root / getattr(model.project, key)).is_file():
            errors.append(
                f"project.{key}: {getattr(model.project, key)} is a file, not a folder; name a folder "
                "(ptxbuild writes into it) or move the file"
            )
    _fail(path, errors)
    gpus = _resolve_gpus(model, path.name)
    ops = {}
    for name, op in model.ops.items():
        targets = tuple(op.gpus) if op.gpus is not None else tuple(gpus)
        if not targets:
            errors.append(
                f"ops.{name}.gpus: empty, so nothing would be built; name at least one of "
                f"{', '.join(gpus)} (or leave the key out: every [gpus.*])"
            )
        errors += [
            f"ops.{name}.gpus[{i}]: unknown GPU {g!r}"
            f"{did_you_mean(g, gpus)}; declare [gpus.{g}] or use one of {', '.join(gpus)}"
            for i, g in enumerate(targets)
            if g not in gpus
        ]
        errors += [
            f"ops.{name}.depends[{i}]: unknown op {dep!r}"
            f"{did_you_mean(dep, model.ops)}; declare [ops.{dep}]"
            for i, dep in enumerate(op.depends)
            if dep not in model.ops
        ]
        template = op.template or name
        from ..oploader import op_dir, shipped_ops

        if not (op_dir(template, root) / "op.py").is_file():
            local, own = (
                sorted(p.parent.name for p in d.glob("[!_]*/op.py")) if d else []
                for d in (root / "ops", shipped_ops())
            )
            errors.append(
                f"ops.{name}.template: no op.py in {os.path.relpath(op_dir(template, root), root)}"
                f"{did_you_mean(template, local + own)}; ops/ holds: {', '.join(local) or 'none'}"
                + (f"; ptxbuild ships: {', '.join(own)}" if own else "")
            )
        ops[name] = OpSpec(
            name=name,
            template=template,
            dtypes=tuple(op.dtypes),
            shapes=tuple(tuple(s) for s in op.shapes),
            options=tuple(sorted(op.options.items())),
            modes=tuple(tuple(sorted(m.items())) for m in op.modes),
            gpus=targets,
            metric=op.metric,
            gates=op.gates.model_dump(
                exclude={
                    k for k in ("min_speedup", "speedup_evidence") if getattr(op.gates, k) is None
                }
            ),
            search=op.search.model_dump(
                exclude={
                    k for k in ("candidates", "polish", "proposers") if not getattr(op.search, k)
                }
                | ({"rounds"} if not op.search.proposers else set())
            ),
            depends=tuple(op.depends),
        )
    _fail(path, errors)
    from .graph import find_cycle

    if cycle := find_cycle({n: list(o.depends) for n, o in ops.items()}):
        raise KernelfileError(
            f"{path.name}: ops.{cycle[0]}.depends: dependency cycle {' -> '.join(cycle)}; "
            f"remove one of these dependencies"
        )
    return Kernelfile(
        path=path,
        root=root,
        digest=hashlib.sha256(text.encode()).hexdigest(),
        project=model.project.name,
        cache_path=root / model.project.cache,
        build_dir=root / model.project.build_dir,
        reports_dir=root / model.project.reports_dir,
        gpus=gpus,
        ops=ops,
    )


def _resolve_gpus(model: Any, file: str) -> dict[str, Gpu]:
    if not model.gpus:
        return dict(CATALOG)
    out = {}
    for name, g in model.gpus.items():
        base = CATALOG.get(name)
        if base is None and g.arch is None:
            raise KernelfileError(
                f"{file}: gpus.{name}: unknown GPU{did_you_mean(name, CATALOG)}; "
                f'use a catalog name ({", ".join(CATALOG)}) or give arch = "sm_90a"'
            )
        # a custom GPU: what the kernelfile gives (below) over these
        base = base or Gpu(name, name, g.arch, "custom", 1, 1.0, 48 * 1024, 1)
        given = {k: v for k, v in g.model_dump().items() if v is not None}
        out[name] = replace(base, **given, name=name)
    return out


def load(path: str | Path = "kernelfile.toml") -> Kernelfile:
    p = Path(path)
    if not p.is_file():
        raise KernelfileError(
            f"{p}: no kernelfile here; create one (see README.md) or pass --kernelfile PATH"
        )
    try:
        text = p.read_bytes().decode()
    except UnicodeDecodeError as exc:
        line = exc.object[: exc.start].count(b"\n") + 1
        raise KernelfileError(
            f"{p.name}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}, line "
            f"{line}); save it as UTF-8"
        ) from None
    return memoized(text, p)


def memoized(text: str, path: Path) -> Kernelfile:
    """parse(text, path), or the values the memo holds for this very text (and ptxbuild's code):
    pydantic not imported, the files the kernelfile names looked at again (a missing op.py, a
    build_dir that became a file: parse says so)."""
    book, key = memo.Memo.of(path), memo.digest(text, str(path.resolve()), memo.code_digest())
    kf = _from_json(path, book.get("kernelfile", key))
    if kf is not None and not _fs_problem(kf):
        return kf
    kf = parse(text, path)
    if _from_json(path, value := _to_json(kf)) == kf:  # JSON gives back these very values
        book.put("kernelfile", key, value)
    return kf


def _fs_problem(kf: Kernelfile) -> bool:
    from ..oploader import op_dir

    ops = (op_dir(spec.template, kf.root) / "op.py" for spec in kf.ops.values())
    return kf.build_dir.is_file() or kf.reports_dir.is_file() or not all(p.is_file() for p in ops)


_PATHS = ("root", "cache_path", "build_dir", "reports_dir")


def _to_json(kf: Kernelfile) -> dict:
    return {
        **{k: str(getattr(kf, k)) for k in _PATHS},
        "digest": kf.digest,
        "project": kf.project,
        "gpus": {n: g.as_dict() for n, g in kf.gpus.items()},
        "ops": {n: asdict(o) for n, o in kf.ops.items()},
    }


def _from_json(path: Path, v: Any) -> Kernelfile | None:
    """The Kernelfile of _to_json's value (None for none, or one of another shape)."""
    try:
        ops = {
            n: OpSpec(
                **{
                    **o,
                    **{k: tuple(o[k]) for k in ("dtypes", "gpus", "depends")},
                    "shapes": tuple(map(tuple, o["shapes"])),
                    "options": tuple(map(tuple, o["options"])),
                    "modes": tuple(tuple(map(tuple, m)) for m in o["modes"]),
                }
            )
            for n, o in v["ops"].items()
        }
        paths = {k: Path(v[k]) for k in _PATHS}
        gpus = {n: Gpu(**g) for n, g in v["gpus"].items()}
        return Kernelfile(
            path, **paths, digest=v["digest"], project=v["project"], gpus=gpus, ops=ops
        )
    except (TypeError, KeyError, ValueError):
        return None
