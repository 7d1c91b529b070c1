"""The memo (ptxbuild/declare/memo.py): plan, check and a no-op build do not load op modules,
pydantic or sqlite-utils when nothing changed since the last command; a change to any file an
answer depends on is seen (issue 26 item 11). Asserted on sys.modules, not on timings."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ptxbuild import cli
from ptxbuild.declare import memo
from ptxbuild.declare.kernelfile import load, parse

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("numpy", "numba", "pydantic", "sqlite_utils", "cuda.bindings")
PROBE = f"""
import json, runpy, sys
sys.argv = ["ptxbuild", *sys.argv[1:]]
try:
    runpy.run_module("ptxbuild.cli", run_name="__main__")
except SystemExit as exc:
    code = exc.code or 0
mods = sorted(m for m in sys.modules if m.startswith("ptxbuild_ops_") or m in {repr(set(HEAVY))})
print(json.dumps({{"code": code, "modules": mods}}), file=sys.stderr)
"""


def _run(project: Path, state: Path, *args: str) -> tuple[int, list[str]]:
    """Exit code and the op modules and heavy packages a command imported (its own interpreter)."""
    env = {**os.environ, "PTXBUILD_STATE": str(state), "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args], cwd=project, env=env, capture_output=True, text=True
    )
    report = json.loads(done.stderr.strip().splitlines()[-1])
    return report["code"], report["modules"]


@pytest.fixture
def this_repo(tmp_path):
    """This repository's kernelfile and lock in a folder of their own (its ops: the shipped ones,
    kda's reference importing numba at module level among them)."""
    for name in ("kernelfile.toml", "kernelfile.lock"):
        shutil.copy(REPO / name, tmp_path / name)
    return tmp_path


@pytest.mark.compile  # plan keys the toolchain in, and kda's reference needs numba (cpu-ref)
def test_plan_and_check_import_no_op_and_no_numba_when_nothing_changed(this_repo, tmp_path):
    state = tmp_path / "state"
    code, first = _run(this_repo, state, "plan")  # the memo is empty: every op is loaded
    assert code == 0 and "numba" in first and any(m.startswith("ptxbuild_ops_") for m in first)
    for command in ("plan", "check"):
        assert _run(this_repo, state, command) == (0, []), command


def test_an_edited_op_is_loaded_and_checked_again(proj, tmp_path):
    state = tmp_path / "state"
    code, mods = _run(proj, state, "check")
    assert code == 0 and any(m.startswith("ptxbuild_ops_scale_") for m in mods)
    assert _run(proj, state, "check") == (0, [])
    op_py = proj / "ops" / "scale" / "op.py"
    op_py.write_text(op_py.read_text().replace("def make_inputs(", "def _make_inputs("))
    code, mods = _run(proj, state, "check")
    assert code == 2 and any(m.startswith("ptxbuild_ops_scale_") for m in mods)


def test_an_edited_declaration_is_validated_again(proj, monkeypatch):
    monkeypatch.chdir(proj)
    assert CliRunner().invoke(cli.main, ["check"]).exit_code == 0
    kf = proj / "kernelfile.toml"
    kf.write_text(kf.read_text().replace("[ops.scale]", "[ops.scale]\ndtype = 1"))
    res = CliRunner().invoke(cli.main, ["check"])
    assert res.exit_code == 2 and "ops.scale.dtype: unknown key" in res.output


def test_a_removed_op_file_is_seen_though_the_kernelfile_is_the_same(proj, monkeypatch):
    monkeypatch.chdir(proj)
    assert CliRunner().invoke(cli.main, ["check"]).exit_code == 0
    shutil.rmtree(proj / "ops" / "scale")
    res = CliRunner().invoke(cli.main, ["check"])
    assert res.exit_code == 2 and "ops.scale.template: no op.py in ops/scale" in res.output


def test_the_memo_gives_back_the_kernelfile_parse_gives(proj):
    for path in (REPO / "kernelfile.toml", proj / "kernelfile.toml"):
        want = parse(path.read_text(), path)
        assert load(path) == want  # the first: parsed and kept
        assert load(path) == want  # the second: from the memo
        assert memo.Memo.of(path).data["kernelfile"]


def test_off_keeps_no_memo_file(monkeypatch, tmp_path):
    monkeypatch.setenv("PTXBUILD_STATE", "off")
    book = memo.Memo("probe")
    book.put("section", "key", 1)
    assert book.path is None and book.get("section", "key") == 1
    monkeypatch.setenv("PTXBUILD_STATE", str(tmp_path))
    memo.Memo("probe").put("section", "key", 2)
    assert json.loads((tmp_path / "probe.json").read_text()) == {"section": {"key": 2}}


def test_file_digests_follow_edits(tmp_path):
    f = tmp_path / "a.cu"
    f.write_text("one")
    first = memo.file_digest(f)
    f.write_text("two")  # same size, maybe the same mtime: a recent file is always read again
    assert memo.file_digest(f) != first
    before = memo.tree_digest(tmp_path)
    (tmp_path / "b.cu").write_text("x")
    assert memo.tree_digest(tmp_path) != before


@pytest.mark.compile
def test_a_no_op_build_imports_no_op_and_neither_sqlite_utils_nor_the_gpu_side(proj, tmp_path):
    state = tmp_path / "state"
    assert _run(proj, state, "build", "--no-gpu", "-q")[0] == 0  # compiles, builds, locks
    assert _run(proj, state, "build", "--no-gpu", "-q") == (0, [])


def test_a_tree_too_big_to_digest_is_digested_once_per_folder(monkeypatch):
    """memo.tree_digest gives None for a folder of too many files; op_errors keeps that None, so
    every op of one folder does not walk the folder again (the ops are then loaded and checked)."""
    from ptxbuild.declare import checks
    from ptxbuild.oploader import OpError, op_dir

    kf = load(REPO / "kernelfile.toml")
    walked, loaded = [], []
    monkeypatch.setattr(memo, "tree_digest", walked.append)  # returns None: too big to digest

    def refuse(template, root):
        loaded.append(template)
        raise OpError(f"{template}: not loaded here")

    monkeypatch.setattr(checks, "load_op", refuse)
    errors = checks.op_errors(kf)
    folders = {op_dir(s.template, kf.root).parent for s in kf.ops.values()}
    assert len(kf.ops) > len(folders)  # several ops share a folder: the case this is about
    assert sorted(walked) == sorted(folders)
    assert len(loaded) == len(errors) == len(kf.ops)  # no memo without a digest: each op checked
