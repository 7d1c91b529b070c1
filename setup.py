"""The wheel carries what a model repository needs besides the code: the ops (ops/ -> ptxbuild/_ops)
and this repository's committed lessons (cache/lessons.jsonl -> ptxbuild/_lessons/lessons.jsonl),
copied byte for byte: an op's files are hashed into every build key and lock entry, so a lock made
in this repository matches one made from the wheel. The repository keeps its layout (ops/ at the
root); an editable install reads ops/ and cache/ in place (ptxbuild/oploader.py: shipped_ops).
Everything else is declared in pyproject.toml."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
SHIPPED = {"ops": "_ops", "cache/lessons.jsonl": "_lessons/lessons.jsonl"}


def _files(src: Path):
    if src.is_file():
        yield src, Path()
        return
    for p in sorted(src.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc":
            yield p, p.relative_to(src)


class BuildPyShipping(build_py):
    """build_py, then the shipped ops and lessons copied into the built package."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        pkg = Path(self.build_lib) / "ptxbuild"
        for src, dst in SHIPPED.items():
            for path, rel in _files(HERE / src):
                out = pkg / dst / rel
                out.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, out)


setup(cmdclass={"build_py": BuildPyShipping})
