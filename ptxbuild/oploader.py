"""Find and load an op definition (ops/<name>/op.py) and check it honours the op contract
(written out in ops/README.md: the names op.py must define, required and optional)."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from .contract import Op, from_module
from .declare import memo
from .errors import ConfigError, shown


class OpError(ConfigError):
    """An op folder is missing or does not honour the op contract."""


@functools.cache
def shipped(in_wheel: str, in_tree: str) -> Path | None:
    """A file or folder this ptxbuild ships: ptxbuild/<in_wheel> in an installed wheel (setup.py
    copies it there), <in_tree> of the checkout when ptxbuild runs from its source tree (an
    editable install); None if neither exists."""
    pkg = Path(__file__).resolve().parent
    if (pkg / in_wheel).exists():
        return pkg / in_wheel
    src = pkg.parent / in_tree
    return src if src.exists() and (pkg.parent / "pyproject.toml").is_file() else None


def shipped_ops() -> Path | None:
    """The folder of the ops ptxbuild ships (ops/ of this repository)."""
    return shipped("_ops", "ops")


def from_shipped(template: str, root: Path) -> bool:
    """Whether `template` resolves to one of the ops ptxbuild ships (not the kernelfile's own)."""
    own = shipped_ops()
    return own is not None and op_dir(template, root).resolve().is_relative_to(own.resolve())


def op_dir(template: str, root: Path) -> Path:
    """`template` is an op name under <root>/ops, else one of the ops ptxbuild ships (shipped_ops),
    or a path to an op folder. The folder's files, not its place, enter the build key."""
    p = Path(template)
    if p.is_absolute() or "/" in template:
        return p if p.is_absolute() else root / p
    local = root / "ops" / template
    own = shipped_ops()
    if own is not None and (own / template / "op.py").is_file() and not (local / "op.py").is_file():
        return own / template
    return local


def load_module(path: Path, name: str) -> ModuleType:
    """Execute a Python file once under the module name `name`; later calls return that module.
    Ops use it for their sibling files (a shared host module, a reference) so names never collide."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        try:
            spec.loader.exec_module(mod)
        except BaseException:
            del sys.modules[
                name
            ]  # a broken file is not cached: the next load shows the error again
            raise
    return sys.modules[name]


def import_failure(exc: BaseException) -> str:
    """What went wrong importing an op file, in one line."""
    if isinstance(exc, SystemExit):
        return f"called sys.exit({exc.code!r}) while being imported; an op file defines names, it must not exit"
    if isinstance(exc, SyntaxError):
        return f"SyntaxError: {exc.msg} (line {exc.lineno}); fix the op file"
    return f"cannot be imported: {type(exc).__name__}: {exc}"


_LOADED: dict[str, tuple[ModuleType, Op]] = {}  # module name -> (its module, its checked Op)


def load_op(template: str, root: Path) -> Op:
    """The op of `template` (contract.Op: a class-form op's instance, or a module-form op served
    by contract.ModuleOp), checked against the contract once per module object: every name it lacks
    in one error naming the op file. Its folder is the loader's (op.FOLDER); an op cannot set it."""
    folder = op_dir(template, root)
    path = folder / "op.py"
    if not path.is_file():
        raise OpError(f"no op at {path}: create {path} or fix the template name")
    name = f"ptxbuild_ops_{folder.name}_{abs(hash(str(folder.resolve())))}"
    try:
        mod = load_module(path, name)
        done = _LOADED.get(name)
        if done is not None and done[0] is mod:
            return done[1]
        op, lacks = from_module(mod)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - an op's import: SystemExit included
        raise OpError(f"{shown(path, root)}: {import_failure(exc)}") from None
    if op is None:
        raise OpError(
            f"{shown(path, root)} does not define {', '.join(lacks)} (the op contract: "
            "ptxbuild/contract.py, ops/README.md)"
        )
    op.bind(folder)
    _attach_baselines(op, mod, folder)
    _LOADED[name] = (mod, op)
    return op


def _attach_baselines(op: Op, mod: ModuleType, folder: Path) -> None:
    """An op's optional baselines.py (not a build input, so not hashed) provides `baselines`."""
    path = folder / "baselines.py"
    if not path.is_file():
        return
    bmod = load_module(path, f"{mod.__name__}_baselines")
    op.baselines = functools.partial(bmod.baselines, defaults=dict(op.OPTIONS))  # type: ignore[method-assign]
    op.BASELINES_VERSION = getattr(bmod, "BASELINES_VERSION", "")


@dataclass(frozen=True)
class OpFiles:
    """What build keys, manifests and locks read of an op: its name, version, folder and sources."""

    NAME: str
    VERSION: str
    SOURCES: tuple[str, ...]
    FOLDER: Path


def op_files(template: str, root: Path) -> OpFiles:
    """The OpFiles of `template`, without importing the op where the memo holds them for its files
    as they are (memo.py: every file of the folder its op folder sits in), else from load_op."""
    folder = op_dir(template, root)
    tree, where = memo.tree_digest(folder.parent), f"op:{folder.resolve()}"
    key, book = tree and memo.digest(tree, memo.code_digest()), memo.book("ops")
    hit = book.get(where, key) if key else None
    if isinstance(hit, list) and len(hit) == 3 and (folder / "op.py").is_file():
        return OpFiles(hit[0], hit[1], tuple(hit[2]), folder)
    op = load_op(template, root)
    files = OpFiles(op.NAME, op.VERSION, tuple(op.SOURCES), folder)
    if key and all(isinstance(v, str) for v in (files.NAME, files.VERSION, *files.SOURCES)):
        book.put(where, key, [files.NAME, files.VERSION, list(files.SOURCES)])
    return files


def source_files(op: Op | OpFiles) -> list[Path]:
    """op.py and every file it declares in SOURCES: what the build key hashes."""
    return [op.FOLDER / "op.py", *(op.FOLDER / s for s in op.SOURCES)]


def changed_files(then: dict[str, str], now: dict[str, str]) -> list[str]:
    """The names whose digests differ between two file_digests() (a file either side lacks too)."""
    return sorted(n for n in then.keys() | now.keys() if then.get(n) != now.get(n))


def file_digests(op: Op | OpFiles) -> dict[str, str]:
    """sha256 of each of source_files, by file name: what build keys, manifests and locks record."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in source_files(op)}
