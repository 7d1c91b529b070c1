"""A non-editable install serves the shipped ops and lessons to a model repository (issue 28, item 3).

The wheel is built from a copy of the source (`pip wheel --no-deps`), installed into a fresh venv
(--no-deps: this interpreter's installed dependencies are linked into the venv's site-packages,
all but ptxbuild's own editable install, so `import ptxbuild` can only find the wheel), and the venv's
`ptxbuild` builds a kernelfile in a folder outside the repository compile-only, with
`template = "rmsnorm"` and no ops/ or lessons of its own.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.compile, pytest.mark.wheel]

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ["pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "ptxbuild", "ops"]
KERNELFILE = """\
[project]
name = "a-model-repo"

[gpus.h100]

[ops.rmsnorm]
template = "rmsnorm"
dtypes = ["bfloat16"]
shapes = [[8192, 4096]]
"""


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _run(cmd, cwd, env, timeout=300):
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, (
        f"{cmd} exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    )
    return r


def _can_build_wheels() -> bool:
    """setuptools >= 70.1 has bdist_wheel; an older one needs the `wheel` package beside it."""
    if importlib.util.find_spec("setuptools") is None:
        return False
    from importlib.metadata import version

    major, minor = (int(x) for x in version("setuptools").split(".")[:2])
    return (major, minor) >= (70, 1) or importlib.util.find_spec("wheel") is not None


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(venv, wheel): the wheel built from a copy of the source and installed in a fresh venv."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "_ops", "_lessons")
    for name in SOURCE:
        p = ROOT / name
        (
            shutil.copytree(p, src / name, ignore=ignore)
            if p.is_dir()
            else shutil.copy2(p, src / name)
        )
    (src / "cache").mkdir()
    shutil.copy2(ROOT / "cache" / "lessons.jsonl", src / "cache" / "lessons.jsonl")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # this interpreter's setuptools where it can build a wheel (no build environment to download)
    isolation = ["--no-build-isolation"] if _can_build_wheels() else []
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "-q",
            *isolation,
            "-w",
            tmp / "dist",
            src,
        ],
        tmp,
        env,
    )
    (wheel,) = (tmp / "dist").glob("ptxbuild-*.whl")
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], tmp, env)
    py = venv / "bin" / "python"
    site = Path(
        _run(
            [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp, env
        ).stdout.strip()
    )
    for d in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
        for entry in Path(d).iterdir():  # the dependencies, linked in (ptxbuild itself is not)
            skip = entry.name.startswith(("ptxbuild", "__editable__", "__pycache__"))
            if not skip and entry.suffix != ".pth" and not (site / entry.name).exists():
                (site / entry.name).symlink_to(entry)
    _run(
        [sys.executable, "-m", "pip", "--python", py, "install", "-q", "--no-deps", wheel], tmp, env
    )
    return venv, wheel, env


def test_the_wheel_ships_the_ops_and_lessons_byte_for_byte(installed):
    _, wheel, _ = installed
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        tracked = [
            p for p in (ROOT / "ops").rglob("*") if p.is_file() and "__pycache__" not in p.parts
        ]
        for p in tracked:
            arc = "ptxbuild/_ops/" + p.relative_to(ROOT / "ops").as_posix()
            assert arc in names, f"{arc} is not in the wheel"
            assert hashlib.sha256(z.read(arc)).hexdigest() == _sha(p), f"{arc} differs from {p}"
        lessons = z.read("ptxbuild/_lessons/lessons.jsonl")
        assert hashlib.sha256(lessons).hexdigest() == _sha(ROOT / "cache" / "lessons.jsonl")
        assert not any(n.startswith(("ops/", "cache/")) for n in names)  # no top-level folders


def test_a_model_repo_outside_the_repository_builds_the_shipped_rmsnorm(installed, tmp_path):
    venv, _, env = installed
    repo = tmp_path / "model-repo"
    repo.mkdir()
    (repo / "kernelfile.toml").write_text(KERNELFILE)
    where = _run(
        [venv / "bin" / "python", "-c", "import ptxbuild.oploader as o; print(o.shipped_ops())"],
        repo,
        env,
    ).stdout.strip()
    assert Path(where).is_relative_to(venv) and where.endswith("ptxbuild/_ops"), where

    r = _run(
        [venv / "bin" / "ptxbuild", "build", "rmsnorm@h100", "--no-gpu"], repo, env, timeout=600
    )
    assert "(shipped with ptxbuild)" in r.stderr and "into a new cache" in r.stderr, r.stderr

    out = repo / "build" / "rmsnorm@h100"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["target"] == "rmsnorm@h100" and not manifest["measured_on_hardware"]
    for v in manifest["variants"].values():
        assert (out / v["ptx"]).stat().st_size > 0 and (out / v["cubin"]).stat().st_size > 0
    assert (out / v["ptx"]).read_text().lstrip().startswith("//")  # PTX text
    reports = list((repo / "reports").rglob("report.md"))
    assert reports, "no report written"
    text = reports[0].read_text()
    assert "- shipped with ptxbuild: 1 of the 1 used" in text, text[-2000:]

    # the op resolved from the wheel keys its build by its files' digest, as the repository does:
    # the lock made here lists the same op files as this repository's lock
    lock = json.loads((repo / "kernelfile.lock").read_text())
    repo_lock = json.loads((ROOT / "kernelfile.lock").read_text())
    assert (
        lock["targets"]["rmsnorm@h100"]["op_files"]
        == repo_lock["targets"]["rmsnorm@h200"]["op_files"]
    )
    assert lock["targets"]["rmsnorm@h100"]["template"] == "rmsnorm"
