"""The op loader: the contract checked at load, naming what is missing, for every op.py."""

import pytest

from ptxbuild.oploader import OpError, load_op

FULL = """
NAME = "toy"
VERSION = "1"
SOURCES = []
DTYPES = ["float32"]
OPTIONS = {}
SPACE = {"threads": [128]}
SPILL_BUDGET_BYTES = 0
def default_params(problem): return {"threads": 128}
def check(cfg, problem): return None
def render(cfg, problem, arch): return None
def launch(cfg, problem, sm_count): return None
def bytes_moved(problem): return 0
"""


def _op(tmp_path, name, text):
    (tmp_path / "ops" / name).mkdir(parents=True)
    (tmp_path / "ops" / name / "op.py").write_text(text)
    return name


def test_a_missing_name_fails_at_load_by_name(tmp_path):
    name = _op(tmp_path, "nolaunch", FULL.replace("def launch(", "def _launch("))
    with pytest.raises(OpError, match=r"op.py does not define launch \(see the op contract"):
        load_op(name, tmp_path)


def test_an_op_that_defines_folder_is_checked_all_the_same(tmp_path):
    """FOLDER used to mark a module as checked: an op.py setting it skipped the contract check and
    lost its baselines.py. The loader sets FOLDER itself, to the op's folder."""
    name = _op(
        tmp_path, "sneaky", 'FOLDER = "elsewhere"\n' + FULL.replace("def render(", "def _r(")
    )
    with pytest.raises(OpError, match="does not define render"):
        load_op(name, tmp_path)
    name = _op(tmp_path, "owned", 'FOLDER = "elsewhere"\n' + FULL)
    (tmp_path / "ops" / name / "baselines.py").write_text(
        'BASELINES_VERSION = "2"\ndef baselines(problem, defaults): return {}\n'
    )
    op = load_op(name, tmp_path)
    assert op.FOLDER == tmp_path / "ops" / name and op.BASELINES_VERSION == "2"
    assert load_op(name, tmp_path) is op  # loaded and checked once
