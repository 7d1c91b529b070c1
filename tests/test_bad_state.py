"""Damaged state files (issue 27, item 5): a lock, a cache, build/ and its manifest that are broken,
foreign or unwritable. Each is either a one-line error naming the file and the way out (exit 2 for
the lock, a file the user merges and commits; exit 3 for the cache and folders, which stop the tool),
or, for build/ (derived files), a stale target that the next build writes again. Nothing is lost: a
lock entry survives every case, and an interrupted build leaves its old complete build/<target>/."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ptxbuild.cli import main

from .fakes import toy_project

pytestmark = pytest.mark.compile
REPO = Path(__file__).resolve().parents[1]


def cli(proj, *args):
    return CliRunner().invoke(main, ["-f", str(proj / "kernelfile.toml"), *args])


def one_error(res, code):
    """Exit `code`, no exception escaped (the user's traceback), exactly one line of output, an error."""
    assert res.exit_code == code, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].lower().startswith("error: "), res.output
    return lines[0]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The toy project built for both its targets (compile-only), once per module."""
    proj = toy_project(tmp_path_factory.mktemp("built"))
    res = cli(proj, "build", "--no-gpu", "-j", "1", "-q")
    assert res.exit_code == 0, res.output
    return proj


@pytest.fixture
def proj(built, tmp_path, monkeypatch):
    dest = tmp_path / "proj"
    shutil.copytree(built, dest, symlinks=True)
    monkeypatch.chdir(dest)  # errors name paths as typed from the project's folder
    return dest


def snapshot(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


# -- the lock -------------------------------------------------------------------------------------------------
def _conflict(text: str) -> str:
    lines = text.splitlines(keepends=True)
    i = next(i for i, ln in enumerate(lines) if '"scale@b200"' in ln)
    return "".join(lines[:i] + ["<<<<<<< HEAD\n"] + lines[i : i + 3] + ["=======\n"] + lines[i : i + 3]
                   + [">>>>>>> other\n"] + lines[i + 3 :])  # fmt: skip


LOCKS = {
    "conflict_markers": (_conflict, "conflict markers"),
    "truncated": (lambda t: t[: len(t) // 2], "not valid JSON"),
    "binary": (lambda t: b"\x89PNG\r\n\x1a\n\x00\xff\xfe" * 8, "not a JSON text"),
    "a_list": (lambda t: "[1, 2, 3]\n", "not a lock"),
    "no_version": (lambda t: json.dumps({"targets": json.loads(t)["targets"]}), "lock_version"),
    "targets_a_list": (lambda t: json.dumps({**json.loads(t), "targets": []}), "targets"),
    "entry_a_string": (lambda t: json.dumps({**json.loads(t), "targets": {"scale@h100": "x"}}), "scale@h100"),
    "empty_file": (lambda t: "", "empty"),
}  # fmt: skip
COMMANDS = {
    "build": ["build", "--no-gpu", "-j", "1"],
    "build_one": ["build", "--no-gpu", "-j", "1", "scale@h100"],
    "build_force": ["build", "--no-gpu", "-j", "1", "--force", "scale@h100"],
    "locked": ["build", "--locked", "--no-gpu"],
    "plan": ["plan", "--no-gpu"],
    "report": ["report"],
}


@pytest.mark.parametrize("cmd", sorted(COMMANDS))
@pytest.mark.parametrize("case", sorted(LOCKS))
def test_a_damaged_lock_is_one_error_naming_it_and_nothing_changes(proj, case, cmd):
    lock = proj / "kernelfile.lock"
    damage, what = LOCKS[case]
    bad = damage(lock.read_text())
    lock.write_bytes(bad if isinstance(bad, bytes) else bad.encode())
    before, build_before = lock.read_bytes(), snapshot(proj / "build")
    line = one_error(cli(proj, *COMMANDS[cmd]), 2)
    assert "kernelfile.lock" in line and what in line, line
    if case == "conflict_markers":
        assert "resolve" in line, line
    else:
        assert (
            "git checkout -- kernelfile.lock" in line
            and "mv kernelfile.lock kernelfile.lock.bad" in line
        )
    assert lock.read_bytes() == before and snapshot(proj / "build") == build_before


def test_a_build_of_one_target_keeps_the_other_targets_entries(proj):
    lock = proj / "kernelfile.lock"
    entries = json.loads(lock.read_text())["targets"]
    shutil.rmtree(proj / "build")
    res = cli(proj, "build", "--no-gpu", "-j", "1", "--force", "scale@b200")
    assert res.exit_code == 0, res.output
    assert json.loads(lock.read_text())["targets"]["scale@h100"] == entries["scale@h100"]


def test_a_lock_path_that_is_a_folder_is_an_error(proj):
    (proj / "kernelfile.lock").unlink()
    (proj / "kernelfile.lock").mkdir()
    line = one_error(cli(proj, "build", "--no-gpu", "-j", "1", "--force", "scale@h100"), 2)
    assert "kernelfile.lock is a folder" in line, line


# -- the cache ------------------------------------------------------------------------------------------------
def _newer(path: Path) -> None:
    import sqlite3

    con = sqlite3.connect(path)
    con.execute("update meta set value = '99' where key = 'schema_version'")
    con.commit()
    con.close()


CACHES = {
    "truncated": (lambda p: p.write_bytes(p.read_bytes()[:5000]), "damaged"),
    "garbage": (
        lambda p: p.write_bytes(b"this is not a database\n" * 300),
        "not an SQLite database",
    ),
    "zeros": (lambda p: p.write_bytes(b"\x00" * 8192), "not an SQLite database"),
    # the header intact, every page after the first overwritten: found by a query, not at open
    "corrupt_pages": (
        lambda p: p.write_bytes(p.read_bytes()[:4096] + b"\xa5" * (p.stat().st_size - 4096)),
        "damaged",
    ),
    "newer_schema": (_newer, "schema v99 is newer than this ptxbuild (v"),
    "a_folder": (lambda p: (p.unlink(), p.mkdir()), "is a folder"),
}
CACHE_COMMANDS = {
    "build": ["build", "--no-gpu", "-j", "1", "scale@h100"],
    "plan": ["plan", "--no-gpu"],
    "report": ["report"],
    "show": ["cache", "show"],
    "check": ["cache", "check"],
    "lessons": ["lessons", "show"],
}


def _checkpointed(proj) -> Path:
    """The cache as one file (its WAL folded in), as a copy or an old checkout leaves it."""
    import sqlite3

    path = proj / "cache/ptxbuild.sqlite"
    con = sqlite3.connect(path)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.execute("PRAGMA journal_mode=DELETE")
    con.close()
    return path


@pytest.mark.parametrize("cmd", sorted(CACHE_COMMANDS))
@pytest.mark.parametrize("case", sorted(CACHES))
def test_a_damaged_cache_is_one_error_with_the_way_out(proj, case, cmd):
    path = _checkpointed(proj)
    damage, what = CACHES[case]
    damage(path)
    lock_before = (proj / "kernelfile.lock").read_bytes()
    line = one_error(cli(proj, *CACHE_COMMANDS[cmd]), 3)
    assert "cache/ptxbuild.sqlite" in line and what in line, line
    if case == "newer_schema":
        assert "upgrade ptxbuild" in line, line
    assert "mv cache/ptxbuild.sqlite cache/ptxbuild.sqlite.bad" in line, line
    assert (proj / "kernelfile.lock").read_bytes() == lock_before


def test_cache_check_says_ok_on_a_sound_cache(proj):
    res = cli(proj, "cache", "check")
    assert res.exit_code == 0 and res.output.startswith(f"{proj / 'cache/ptxbuild.sqlite'}: ok"), (
        res.output
    )


def test_moving_a_damaged_cache_aside_as_told_lets_the_build_run(proj):
    path = _checkpointed(proj)
    path.write_bytes(b"garbage" * 100)
    one_error(cli(proj, "build", "--no-gpu", "-j", "1", "scale@h100"), 3)
    path.rename(path.with_name("ptxbuild.sqlite.bad"))
    res = cli(proj, "build", "--no-gpu", "-j", "1", "scale@h100")
    assert res.exit_code == 0 and "scale@h100: up to date" in res.output, res.output  # by the lock


# -- build/: derived files, so damage there makes the target stale -----------------------------------------
def _cubin(proj) -> Path:
    return sorted((proj / "build/scale@h100").glob("*.cubin"))[0]


BUILD_DAMAGE = {
    "deleted_cubin": (lambda proj: _cubin(proj).unlink(), "artifact missing: build/scale@h100/scale-"),
    "garbage_manifest": (lambda proj: (proj / "build/scale@h100/manifest.json").write_text("{garbage"),
                         "build/scale@h100/manifest.json is damaged"),
    "manifest_a_list": (lambda proj: (proj / "build/scale@h100/manifest.json").write_text("[]"),
                        "build/scale@h100/manifest.json is damaged"),
    "cubin_changed": (lambda proj: _cubin(proj).write_bytes(b"\x7fELF not the one"),
                      "build/scale@h100/scale-"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BUILD_DAMAGE))
def test_damage_in_build_makes_the_target_stale_and_a_build_repairs_it(proj, case):
    before = snapshot(proj / "build/scale@h100")
    lock = (proj / "kernelfile.lock").read_bytes()
    damage, why = BUILD_DAMAGE[case]
    damage(proj)
    res = cli(proj, "plan", "--no-gpu")
    assert res.exit_code == 0 and res.exception is None, res.output
    line = next(ln for ln in res.output.splitlines() if "scale@h100" in ln)
    assert line.startswith("build ") and why in line, res.output
    assert "up-to-date scale@b200" in res.output, res.output
    res = cli(proj, "build", "--no-gpu", "-j", "1")
    assert res.exit_code == 0 and res.exception is None, res.output
    assert "scale@h100: built" in res.output and "scale@b200: up to date" in res.output, res.output
    assert (
        snapshot(proj / "build/scale@h100") == before
        and (proj / "kernelfile.lock").read_bytes() == lock
    )


def test_a_copied_project_reads_its_own_build_not_the_originals(proj, tmp_path):
    """The cache named the manifest by its absolute path: a copy of the project (its cache with it)
    whose build/ was removed said 'up to date' from the original's build/ (and then crashed)."""
    copy = tmp_path / "copy"
    shutil.copytree(proj, copy)
    shutil.rmtree(copy / "build/scale@h100")
    (copy / "kernelfile.lock").unlink()  # or the lock's entry would put the kernels back
    res = cli(copy, "plan", "--no-gpu")
    assert res.exit_code == 0 and res.exception is None, res.output
    assert (
        "build      scale@h100  (artifact missing: build/scale@h100/manifest.json)" in res.output
    ), res.output


def test_an_interrupted_rebuild_leaves_the_old_complete_build(proj, monkeypatch):
    """Ctrl-C while build/<target>/ is written: the old complete set stays (no file of the new set, no
    half-written folder beside it), and the next build writes the new complete set."""
    old = snapshot(proj / "build/scale@h100")
    kf = proj / "kernelfile.toml"
    kf.write_text(kf.read_text().replace("[7, 100]]", "[7, 100], [3, 36]]"))
    with (proj / "ops/scale/scale.cu").open("a") as f:  # a global in the PTX: every binary is new
        f.write("\n__device__ int ptxbuild_test_marker;\n")
    real, seen = Path.write_bytes, []

    def interrupted(self, data):
        if "build" in self.parts:
            seen.append(self)
            if len(seen) == 3:
                raise KeyboardInterrupt
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", interrupted)
    res = cli(proj, "build", "--no-gpu", "-j", "1", "scale@h100")
    assert res.exit_code == 130 and len(seen) == 3, res.output
    monkeypatch.undo()
    assert snapshot(proj / "build/scale@h100") == old
    assert sorted(p.name for p in (proj / "build").iterdir()) == ["scale@b200", "scale@h100"]
    res = cli(proj, "build", "--no-gpu", "-j", "1", "scale@h100")
    assert res.exit_code == 0, res.output
    new = snapshot(proj / "build/scale@h100")
    named = {
        v[k]
        for v in json.loads(new["manifest.json"])["variants"].values()
        for k in ("ptx", "cubin")
    }
    assert (
        set(new) == named | {"manifest.json"}
        and len(json.loads(new["manifest.json"])["dispatch"]) == 6
    )


# -- unwritable places: root writes through a mode, so it runs without CAP_DAC_OVERRIDE --------------------
def _run_unprivileged(proj: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [
        sys.executable,
        "-c",
        "from ptxbuild.cli import main; main()",
        "-f",
        str(proj / "kernelfile.toml"),
    ]
    if os.geteuid() == 0:
        if not shutil.which("setpriv"):
            pytest.skip("running as root without setpriv: a mode does not stop root's writes")
        cmd = ["setpriv", "--bounding-set=-dac_override", "--", *cmd]
    return subprocess.run(
        [*cmd, *args], capture_output=True, text=True, env=env, cwd=proj, timeout=120
    )


UNWRITABLE = {
    "build_dir": ("build", ["build", "--no-gpu", "-j", "1", "--force", "scale@h100"], "build"),
    "cache_file": ("cache/ptxbuild.sqlite", ["build", "--no-gpu", "-j", "1", "--force", "scale@h100"],
                   "cache/ptxbuild.sqlite"),
    "cache_dir": ("cache", ["build", "--no-gpu", "-j", "1", "--force", "scale@h100"], "cache"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(UNWRITABLE))
def test_an_unwritable_build_or_cache_is_one_error_naming_it(proj, case):
    rel, args, named = UNWRITABLE[case]
    open_proj = proj
    _checkpointed(open_proj)
    for p in (open_proj / "cache").glob("ptxbuild.sqlite-*"):
        p.unlink()
    lock, build = (open_proj / "kernelfile.lock").read_bytes(), snapshot(open_proj / "build")
    target = open_proj / rel
    for p in [target, *target.rglob("*")]:
        p.chmod(0o555 if p.is_dir() else 0o444)
    res = _run_unprivileged(open_proj, *args)
    assert "Traceback" not in res.stderr, res.stderr
    lines = [ln for ln in (res.stdout + res.stderr).splitlines() if ln.strip()]
    assert res.returncode == 3 and lines and lines[-1].lower().startswith("error: "), lines
    assert named in lines[-1] and ("read-only" in lines[-1] or "not writable" in lines[-1]), lines
    assert (open_proj / "kernelfile.lock").read_bytes() == lock and snapshot(
        open_proj / "build"
    ) == build
    for p in [target, *target.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)


# -- a killed build leaves no compile workers behind -------------------------------------------------------
DRIVER = """
import importlib, os, pkgutil, sys, time
from pathlib import Path
from tests.fakes import FakeCompiler, FakeToolchain
import ptxbuild.build
from ptxbuild.declare.kernelfile import load
from ptxbuild.store.cache import Cache

MODS = [importlib.import_module(f"ptxbuild.build.{m.name}") for m in pkgutil.iter_modules(ptxbuild.build.__path__)]

def defined(name):  # wherever the build package keeps it
    return next(getattr(m, name) for m in MODS if getattr(getattr(m, name, None), "__module__", "") == m.__name__)

PIDS = Path(sys.argv[2])

def slow(kernel, arch):
    (PIDS / str(os.getpid())).write_text("")
    time.sleep(60)
    return FakeCompiler()(kernel, arch)

for m in MODS:  # a pool is made for the real compiler only
    if hasattr(m, "compile_kernel"):
        m.compile_kernel = slow
kf = load(Path(sys.argv[1]) / "kernelfile.toml")
ctx = defined("Context")(kf=kf, cache=Cache(kf.cache_path), toolchain=FakeToolchain(), compile_fn=slow, jobs=2,
                         force=True)
defined("build")(ctx)
"""


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            pass
    return out


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_a_killed_build_leaves_no_compile_workers(proj, tmp_path, how):
    import signal
    import time

    workers: list[int] = []
    pids = tmp_path / "pids"
    pids.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    parent = subprocess.Popen([sys.executable, "-c", DRIVER, str(proj), str(pids)], cwd=REPO, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not list(pids.iterdir()) and time.monotonic() < deadline and parent.poll() is None:
            time.sleep(0.1)
        busy = [int(p.name) for p in pids.iterdir()]
        assert busy, parent.stderr.read() if parent.poll() is not None else "no compile started"
        workers = _children(parent.pid)
        assert set(busy) <= set(workers) and len(workers) == 2, (busy, workers)
        parent.send_signal(getattr(signal, how))
        parent.wait(timeout=30)
        deadline = time.monotonic() + 10
        while any(map(_alive, workers)) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [w for w in workers if _alive(w)]
        assert not left, f"compile workers {left} outlived their build ({how})"
    finally:
        if parent.poll() is None:
            parent.kill()
        for w in [int(p.name) for p in pids.iterdir()] + workers:
            if _alive(w):
                os.kill(w, 9)


def test_ctrl_c_during_the_search_leaves_the_old_complete_build(proj, monkeypatch):
    """A stop after 2 of 6 problems: build/<target>/ used to be replaced by those 2 (on the H200, 66
    problems went to 26). The old complete set stays; the lock keeps its entry; the next build
    finishes the target."""
    old, lock = snapshot(proj / "build"), (proj / "kernelfile.lock").read_bytes()
    kf = proj / "kernelfile.toml"
    kf.write_text(kf.read_text().replace("[7, 100]]", "[7, 100], [3, 36]]"))
    real, renders = Path.read_text, []

    def stop_at_the_third_render(self, *a, **k):
        if self.name == "scale.cu":
            renders.append(self)
            if len(renders) == 3:
                raise KeyboardInterrupt
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "read_text", stop_at_the_third_render)
    res = cli(proj, "build", "--no-gpu", "-j", "1", "scale@h100")
    monkeypatch.undo()
    assert res.exit_code == 130 and len(renders) == 3, res.output
    assert snapshot(proj / "build") == old and (proj / "kernelfile.lock").read_bytes() == lock
    res = cli(proj, "plan", "--no-gpu", "scale@h100")
    assert res.exit_code == 0 and res.output.startswith("build      scale@h100"), res.output
    res = cli(proj, "build", "--no-gpu", "-j", "1", "scale@h100")
    assert res.exit_code == 0, res.output
    m = json.loads((proj / "build/scale@h100/manifest.json").read_text())
    assert len(m["dispatch"]) == 6 and "incomplete" not in m
