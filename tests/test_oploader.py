"""The op loader and the op contract (ptxbuild/contract.py): every op an Op, checked at load, what
is missing named in one error; the module form served unchanged by ModuleOp."""

import pytest

from ptxbuild import contract
from ptxbuild.oploader import OpError, file_digests, load_op, shipped_ops
from ptxbuild.problem import Problem

GPU_SIDE = """
def make_inputs(problem, seed, xp): return {}
def make_outputs(problem, xp): return {}
def kernel_args(cfg, problem, inputs, outputs): return []
def reference(problem, inputs, xp): return {}
def tolerance(problem, output): return (0.0, 0.0)
def verify_problems(problem): return [problem]
"""
FULL = (
    """
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
    + GPU_SIDE
)

CLASS = """
from ptxbuild.contract import Op

class Toy(Op):
    NAME = "toy"
    VERSION = "1"
    SOURCES = ()
    DTYPES = ("float32",)
    OPTIONS = {}
    SPACE = {"threads": [128]}
    SPILL_BUDGET_BYTES = 0

    def default_params(self, problem): return {"threads": 128}
    def check(self, params, problem): return None
    def render(self, params, problem, arch): return None
    def launch(self, params, problem, sm_count): return None
    def bytes_moved(self, problem): return 0
    def make_inputs(self, problem, seed, xp): return {}
    def make_outputs(self, problem, xp): return {}
    def kernel_args(self, params, problem, inputs, outputs): return []
    def reference(self, problem, inputs, xp): return {}
    def tolerance(self, problem, output): return (0.0, 0.0)
    def verify_problems(self, problem, params=None): return [problem.with_shape((1, 1))]
"""
P = Problem.make("toy", "float32", (4, 8))


def _op(tmp_path, name, text):
    (tmp_path / "ops" / name).mkdir(parents=True)
    (tmp_path / "ops" / name / "op.py").write_text(text)
    return name


def test_every_missing_name_is_named_at_load_in_one_error(tmp_path):
    text = FULL.replace("def launch(", "def _launch(").replace("def tolerance(", "def _tol(")
    name = _op(tmp_path, "nolaunch", text.replace('VERSION = "1"', ""))
    with pytest.raises(OpError) as exc:
        load_op(name, tmp_path)
    assert str(exc.value) == (
        "ops/nolaunch/op.py does not define VERSION, launch, tolerance (the op contract: "
        "ptxbuild/contract.py, ops/README.md)"
    )


def test_a_multi_kernel_op_must_define_launches_and_stage_args(tmp_path):
    name = _op(tmp_path, "multi", FULL + 'KERNELS = ["a", "b"]\n')
    with pytest.raises(OpError, match=r"op.py does not define launches, stage_args \(the op"):
        load_op(name, tmp_path)
    cls = _op(tmp_path, "multicls", CLASS + '    KERNELS = ("a", "b")\n')
    with pytest.raises(OpError, match=r"op.py does not define launches, stage_args \(the op"):
        load_op(cls, tmp_path)


def test_an_op_that_defines_folder_is_checked_all_the_same(tmp_path):
    """FOLDER used to mark a module as checked: an op.py setting it skipped the contract check and
    lost its baselines.py. The folder is the loader's: the op's own FOLDER is not read."""
    name = _op(
        tmp_path, "sneaky", 'FOLDER = "elsewhere"\n' + FULL.replace("def render(", "def _r(")
    )
    with pytest.raises(OpError, match="does not define render"):
        load_op(name, tmp_path)
    name = _op(tmp_path, "owned", 'FOLDER = "elsewhere"\n' + FULL)
    (tmp_path / "ops" / name / "baselines.py").write_text(
        'BASELINES_VERSION = "2"\ndef baselines(problem, defaults): return {"b": defaults}\n'
    )
    op = load_op(name, tmp_path)
    assert isinstance(op, contract.ModuleOp)
    assert op.FOLDER == tmp_path / "ops" / name and op.BASELINES_VERSION == "2"
    assert op.baselines(P) == {"b": {}}
    assert load_op(name, tmp_path) is op  # loaded and checked once


def test_the_module_form_gets_the_contract_defaults(tmp_path):
    op = load_op(_op(tmp_path, "plain", FULL), tmp_path)
    assert (op.DEPENDS, op.SCRATCH, op.KERNELS, op.BASELINES_VERSION) == ((), frozenset(), None, "")
    assert not op.multi_kernel and op.deterministic({"threads": 128}) is True
    assert op.compare(P, "y", 1, 1, None) is None and op.error_bound(P, "y") is None
    assert op.size_classes(P, {}) is None and op.baselines(P) == {}
    assert not any(op.has(h) for h in contract.HOOKS)
    # verify_problems(problem) without the config is called without it
    assert op.verify_problems(P, {"threads": 128}) == [P]
    with pytest.raises(NotImplementedError, match="runs one kernel"):
        op.launches({}, P, 132)


def test_the_module_forms_optional_names_are_read(tmp_path):
    text = FULL.replace("def verify_problems(problem)", "def verify_problems(problem, params)")
    text += (
        "DETERMINISTIC = lambda params: params['threads'] < 256\nSCRATCH = {'ws'}\n"
        "DEPENDS = ['other']\ndef compare(problem, output, got, want, xp): return (got == want, 'eq')\n"
        "def size_classes(problem, params): return []\nHELPER = 7\n"
    )
    op = load_op(_op(tmp_path, "rich", text), tmp_path)
    assert op.deterministic({"threads": 128}) and not op.deterministic({"threads": 512})
    assert op.SCRATCH == frozenset({"ws"}) and op.DEPENDS == ("other",)
    assert op.has("compare") and op.compare(P, "y", 1, 2, None) == (False, "eq")
    assert op.size_classes(P, {}) == [] and not op.has("error_bound")
    assert op.HELPER == 7  # an op's own names stay reachable (the runtime reads kda's `host`)
    assert op.verify_problems(P, {"threads": 1}) == [P]


def test_the_class_form_is_loaded_and_checked(tmp_path):
    op = load_op(_op(tmp_path, "cls", CLASS), tmp_path)
    assert isinstance(op, contract.Op) and not isinstance(op, contract.ModuleOp)
    assert op.NAME == "toy" and op.FOLDER == tmp_path / "ops" / "cls"
    assert op.verify_problems(P, {}) == [P.with_shape((1, 1))]
    assert file_digests(op).keys() == {"op.py"}
    broken = CLASS.replace("    def reference(", "    def _reference(").replace(
        "    SPILL_BUDGET_BYTES = 0\n", ""
    )
    with pytest.raises(OpError) as exc:
        load_op(_op(tmp_path, "clsbad", broken), tmp_path)
    assert str(exc.value) == (
        "ops/clsbad/op.py does not define SPILL_BUDGET_BYTES, reference (the op contract: "
        "ptxbuild/contract.py, ops/README.md)"
    )


def test_a_class_forms_hooks_are_its_own(tmp_path):
    text = CLASS + "    def compare(self, problem, output, got, want, xp): return (True, 'own')\n"
    op = load_op(_op(tmp_path, "clshook", text), tmp_path)
    assert op.has("compare") and not op.has("size_classes")
    assert op.compare(P, "y", 0, 1, None) == (True, "own")


def test_two_op_classes_in_one_file_are_refused(tmp_path):
    text = CLASS + "\nclass Other(Toy):\n    pass\n"
    with pytest.raises(OpError, match=r"defines 2 Op classes \(Other, Toy\); an op.py defines one"):
        load_op(_op(tmp_path, "two", text), tmp_path)


SHIPPED = sorted(p.parent.name for p in shipped_ops().glob("*/op.py"))


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_op_honours_the_contract(name):
    """Today's module-form ops, unchanged, load as Ops with the contract's names read from them."""
    op = load_op(name, shipped_ops().parent)
    assert isinstance(op, contract.Op) and op.FOLDER.resolve() == (shipped_ops() / name).resolve()
    assert op.NAME == name and "op.py" in file_digests(op)
    assert op.multi_kernel == ("KERNELS = " in (op.FOLDER / "op.py").read_text())
