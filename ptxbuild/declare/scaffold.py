"""`ptxbuild new NAME`: a new op folder (op.py, a plain kernel template) and its kernelfile entry.

The op is a copy of ops/_template/ (shipped with ptxbuild), the class form of the op contract
(ptxbuild/contract.py): `_template` renamed NAME, its class named after it. It has a numpy
reference, the GPU-side methods, a tolerance, a small SPACE, and a template whose placeholders
($T, $VEC, $UNROLL) render() substitutes one for one, so every line of the rendered source is the
same line of the template (compile errors name template lines)."""

from __future__ import annotations

import keyword
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from ..oploader import shipped

_VALID = re.compile(r"[a-z][a-z0-9_]{0,47}")


class ScaffoldError(ConfigError):
    """The op cannot be created (an invalid name, or one already taken); one line (exit 2)."""


@dataclass(frozen=True)
class Created:
    folder: Path
    files: tuple[Path, ...]
    kernelfile: Path
    kernelfile_created: bool


def name_error(name: str) -> str | None:
    """Why `name` cannot name a new op (it is a folder, a Python module name and a C identifier)."""
    if not _VALID.fullmatch(name) or keyword.iskeyword(name):
        return (
            f"invalid op name {name!r}: use lowercase letters, digits and '_', starting with a "
            "letter, at most 48 characters (it names ops/<name>/, the kernel entry and targets)"
        )
    return None


def camel(name: str) -> str:
    """The class name of op `name`: demo_op -> DemoOp."""
    return "".join(w[:1].upper() + w[1:] for w in name.split("_") if w) or "Op"


def create_op(name: str, kernelfile: Path) -> Created:
    """Write ops/<name>/{op.py,<name>.cu} beside `kernelfile` and append [ops.<name>] to it (a new
    kernelfile with one GPU, h200, when there is none). ScaffoldError for an invalid or taken name."""
    if why := name_error(name):
        raise ScaffoldError(why)
    root = kernelfile.parent
    folder = root / "ops" / name
    if folder.exists():
        raise ScaffoldError(f"{folder} already exists: pick another name or remove it")
    text = kernelfile.read_text() if kernelfile.is_file() else None
    gpus = ["h200"]
    if text is not None:
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ScaffoldError(
                f"{kernelfile.name} is not valid TOML ({exc}): fix it first"
            ) from None
        if name in doc.get("ops", {}):
            raise ScaffoldError(
                f"{kernelfile.name} already declares [ops.{name}]: pick another name"
            )
        gpus = list(doc.get("gpus", {})) or gpus
    template = shipped("_ops/_template", "ops/_template")
    if template is None:
        raise ScaffoldError("this ptxbuild ships no ops/_template/ to copy: reinstall ptxbuild")
    op_py = (
        (template / "op.py").read_text().replace("class Template(Op):", f"class {camel(name)}(Op):")
    )
    folder.mkdir(parents=True)
    files = (folder / "op.py", folder / f"{name}.cu")
    files[0].write_text(op_py.replace("_template", name))
    files[1].write_text((template / "_template.cu").read_text().replace("_template", name))
    entry = ENTRY.replace("@NAME@", name).replace("@GPUS@", ", ".join(f'"{g}"' for g in gpus))
    if text is None:
        kernelfile.write_text(NEW_KERNELFILE + entry)
    else:
        kernelfile.write_text(text + ("" if text.endswith("\n") or not text else "\n") + entry)
    return Created(folder, files, kernelfile, text is None)


NEW_KERNELFILE = """\
# What this project builds: [gpus.*] the GPUs it targets, [ops.*] its ops (ptxbuild new NAME adds one).
[project]
name = "kernels"

[gpus.h200]
"""

ENTRY = """
# @NAME@ (ptxbuild new): ops/@NAME@/op.py and its plain kernel ops/@NAME@/@NAME@.cu. Check it without a
# GPU with `ptxbuild check --deep @NAME@` (every valid config compiled, the Python side run once).
[ops.@NAME@]
template = "@NAME@"
dtypes = ["float32", "bfloat16"]
shapes = [[4096, 1024], [1024, 4096]]
gpus = [@GPUS@]
"""
