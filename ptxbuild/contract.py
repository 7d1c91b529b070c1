"""The op contract as a class (layer L1): what every op provides, what is optional and its default.

An op is `Op`'s subclass in ops/<name>/op.py (the class form, ops/_template/) or, as every op written
before this class, a module of names (the module form, ops/README.md), served by `ModuleOp` without a
byte of it changing: op files are hashed into every build key and lock. The loader (oploader.py)
returns an Op either way and checks it here first: `missing(...)` names everything an op lacks, so
one error lists them all. Callers use these attributes; nobody probes an op with getattr.

The constants keep the module form's upper-case names (NAME, SPACE, ...), so a module-form op moves
to the class form by indenting its file into a class (and adding `self`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, cast

from .problem import Kernel, Launch, Problem

Params = dict[str, Any]
Arrays = dict[str, Any]  # output or input name -> a numpy or cupy array
Baseline = Callable[[Arrays], Arrays] | str  # a str: why the baseline is not run here

# what every op must define: constants, then methods (the host side, then the GPU side)
REQUIRED_CONSTANTS = tuple("NAME VERSION SOURCES DTYPES OPTIONS SPACE SPILL_BUDGET_BYTES".split())
HOST_SIDE = ("default_params", "check", "render", "launch", "bytes_moved")
# what the GPU worker calls; a compile-only build never does, so it is checked at load all the same
GPU_SIDE = tuple("make_inputs make_outputs kernel_args reference tolerance verify_problems".split())
MULTI_KERNEL = ("launches", "stage_args")  # besides, for an op of several kernels (KERNELS)
# optional hooks: Op's defaults below; a module-form op's own function, where it has one
HOOKS = ("compare", "error_bound", "size_classes", "baselines")


class Op(ABC):
    """One op: its search space and how to render, launch, run and judge one config on one problem."""

    NAME: str  # the op's name (its folder's name)
    VERSION: str  # reference + tests version: bump when reference, inputs or tolerance change
    SOURCES: Sequence[str]  # files of the op's folder its kernels are rendered from (hashed)
    DTYPES: Sequence[str]  # element types it supports
    OPTIONS: Mapping[str, Any]  # option name -> default
    SPACE: Mapping[str, Sequence[Any]]  # parameter -> candidate values (the first: the old default)
    SPILL_BUDGET_BYTES: int  # spills above this are the outcome `spill`
    # optional, with their defaults
    DEPENDS: Sequence[str] = ()  # other ops whose targets are built first
    SCRATCH: frozenset[str] = frozenset()  # outputs that are a workspace: never checked
    KERNELS: Sequence[str] | None = None  # every entry of an op of several kernels; None: one
    BASELINES_VERSION: str = ""  # the version of baselines() (not a build input)
    FOLDER: Path  # the op's folder, as the loader found it (bind(); an op's own is overwritten)

    def bind(self, folder: Path) -> Op:
        """The loader's: the folder the op was loaded from."""
        self.FOLDER = folder
        return self

    @property
    def multi_kernel(self) -> bool:
        """Whether the op runs several kernels in order (KERNELS, launches(), stage_args())."""
        return self.KERNELS is not None

    # ------------------------------------------------------------------ host side
    @abstractmethod
    def default_params(self, problem: Problem) -> Params:
        """A documented config used when no lessons exist."""

    @abstractmethod
    def check(self, params: Params, problem: Problem) -> str | None:
        """Why a config is invalid for a problem, or None."""

    @abstractmethod
    def render(self, params: Params, problem: Problem, arch: str) -> Kernel:
        """CUDA C++ (no CUDA headers: NVRTC from pip has none)."""

    @abstractmethod
    def launch(self, params: Params, problem: Problem, sm_count: int) -> Launch:
        """The main kernel's launch geometry."""

    @abstractmethod
    def bytes_moved(self, problem: Problem) -> int:
        """Bytes a perfect kernel reads and writes (the roofline floor)."""

    # ------------------------------------------------------------------ GPU side (xp: numpy or cupy)
    @abstractmethod
    def make_inputs(self, problem: Problem, seed: int, xp: Any) -> Arrays:
        """Fresh inputs (bf16 arrays are uint16 bit patterns, dtypes.py)."""

    @abstractmethod
    def make_outputs(self, problem: Problem, xp: Any) -> Arrays:
        """The output arrays (the verifier poisons them)."""

    @abstractmethod
    def kernel_args(
        self, params: Params, problem: Problem, inputs: Arrays, outputs: Arrays
    ) -> list[Any]:
        """The main kernel's arguments, in order (arrays and numpy scalars: ops/README.md's ABI)."""

    @abstractmethod
    def reference(self, problem: Problem, inputs: Arrays, xp: Any) -> Arrays:
        """The expected outputs in float32/64."""

    @abstractmethod
    def tolerance(self, problem: Problem, output: str) -> tuple[float, float]:
        """(atol, rtol) of an output."""

    @abstractmethod
    def verify_problems(self, problem: Problem, params: Params | None = None) -> list[Problem]:
        """Adversarial shapes verified with the same binary (those check() rejects for the config,
        where one is given, are dropped)."""

    # ------------------------------------------------------------------ several kernels (KERNELS)
    def launches(self, params: Params, problem: Problem, sm_count: int) -> dict[str, Launch]:
        """Every entry a config runs, in order, with its geometry (KERNELS ops only)."""
        raise NotImplementedError(f"op {self.NAME} runs one kernel: launch()")

    def stage_args(
        self, entry: str, params: Params, problem: Problem, inputs: Arrays, outputs: Arrays
    ) -> list[Any]:
        """The arguments of one entry (KERNELS ops only)."""
        raise NotImplementedError(f"op {self.NAME} runs one kernel: kernel_args()")

    def calls(
        self, params: Params, problem: Problem, sm_count: int, inputs: Arrays, outputs: Arrays
    ) -> list[tuple[str | None, Launch, list[Any]]]:
        """(entry, geometry, arguments) of every kernel one call runs, in order: the op's one kernel
        (entry None: launch(), kernel_args()), or each entry of launches() with its stage_args()."""
        if not self.multi_kernel:
            args = self.kernel_args(params, problem, inputs, outputs)
            return [(None, self.launch(params, problem, sm_count), args)]
        geoms = self.launches(params, problem, sm_count)
        return [
            (e, g, self.stage_args(e, params, problem, inputs, outputs)) for e, g in geoms.items()
        ]

    # ------------------------------------------------------------------ optional hooks
    def deterministic(self, params: Params) -> bool:
        """Whether every call on the same inputs writes the same bits (the verifier checks it)."""
        return True

    def compare(
        self, problem: Problem, output: str, got: Any, want: Any, xp: Any
    ) -> tuple[bool, str] | None:
        """(ok, detail) judging an output instead of the elementwise band; None: the band."""
        return None

    def error_bound(self, problem: Problem, output: str) -> tuple[float, float] | None:
        """(factor, floor) of the scale criterion for an output judged by the band: its L1 and L2
        error at most factor x what rounding the reference to the output type costs, plus floor;
        None: the stored type's default (gpu/check.py ROUNDING_FACTOR, FLOOR)."""
        return None

    def size_classes(self, problem: Problem, params: Params) -> list[Problem] | None:
        """Larger / odd sizes the binary is verified at besides verify_problems; None: 2N, 8N, 2N+1."""
        return None

    def baselines(self, problem: Problem) -> dict[str, Baseline]:
        """Name -> a callable(inputs) -> outputs timed beside the op (torch etc.), or why not run."""
        return {}

    def has(self, hook: str) -> bool:
        """Whether the op defines the optional hook itself (else Op's default above serves)."""
        return getattr(type(self), hook) is not getattr(Op, hook)


def _module_function(name: str, default: Callable[..., Any] | None = None) -> Any:
    """A ModuleOp method: the module's function `name`, else (a hook) Op's `default`."""

    def method(self: ModuleOp, *args: Any) -> Any:
        fn = getattr(self.module, name, None)
        if default is not None and not callable(fn):
            return default(self, *args)
        return fn(*args)  # type: ignore[misc]  # checked at load: missing() names it

    method.__name__ = method.__qualname__ = name
    return method


class ModuleOp(Op):
    """An op of the module form (ops/README.md) as an Op: today's op.py files, served unchanged.

    Every contract member reads the module's name of the same spelling; DETERMINISTIC (a bool or a
    function of the config) becomes deterministic(), a verify_problems(problem) without the config
    is called without it. Other module names (an op's own helpers) are reached as attributes too."""

    def __init__(self, module: Any) -> None:
        self.module = module
        for name in REQUIRED_CONSTANTS:
            if hasattr(module, name):
                setattr(self, name, getattr(module, name))
        self.DEPENDS = tuple(getattr(module, "DEPENDS", ()))
        self.SCRATCH = frozenset(getattr(module, "SCRATCH", ()))
        self.KERNELS = None if (k := getattr(module, "KERNELS", None)) is None else tuple(k)
        self.BASELINES_VERSION = str(getattr(module, "BASELINES_VERSION", ""))
        import inspect  # here: a command that loads no op does not import it

        vp = getattr(module, "verify_problems", None)
        self._vp_params = callable(vp) and len(inspect.signature(vp).parameters) > 1

    def __getattr__(self, name: str) -> Any:  # only names not found on the object: the op's own
        if (name.startswith("__") and name not in ("__name__", "__file__")) or name == "module":
            raise AttributeError(name)
        return getattr(self.module, name)

    def bind(self, folder: Path) -> Op:
        self.module.FOLDER = folder  # a global of the module form's (the loader injected it always)
        return super().bind(folder)

    def has(self, hook: str) -> bool:
        return callable(getattr(self.module, hook, None))

    # the module's function of each name (Op's default where the module has none, for a hook)
    default_params = _module_function("default_params")
    check = _module_function("check")
    render = _module_function("render")
    launch = _module_function("launch")
    bytes_moved = _module_function("bytes_moved")
    make_inputs = _module_function("make_inputs")
    make_outputs = _module_function("make_outputs")
    kernel_args = _module_function("kernel_args")
    reference = _module_function("reference")
    tolerance = _module_function("tolerance")
    launches = _module_function("launches", Op.launches)
    stage_args = _module_function("stage_args", Op.stage_args)
    compare = _module_function("compare", Op.compare)
    error_bound = _module_function("error_bound", Op.error_bound)
    size_classes = _module_function("size_classes", Op.size_classes)
    baselines = _module_function("baselines", Op.baselines)

    def verify_problems(self, problem: Problem, params: Params | None = None) -> list[Problem]:
        args = (problem, params) if self._vp_params and params is not None else (problem,)
        return cast(list[Problem], self.module.verify_problems(*args))

    def deterministic(self, params: Params) -> bool:
        det = getattr(self.module, "DETERMINISTIC", True)
        return bool(det(params)) if callable(det) else bool(det)


def required(kernels: object) -> tuple[str, ...]:
    """Every name an op must define (with the several-kernel functions where KERNELS is set)."""
    return REQUIRED_CONSTANTS + HOST_SIDE + GPU_SIDE + (MULTI_KERNEL if kernels is not None else ())


def missing(op: object) -> list[str]:
    """The names of the contract an op class, an op module (or any object) lacks, in order."""
    need = required(getattr(op, "KERNELS", None))
    if isinstance(op, type):
        abstract = set(getattr(op, "__abstractmethods__", ()))
        return [
            n
            for n in need
            if (n in REQUIRED_CONSTANTS and not hasattr(op, n))
            or n in abstract
            or (n in MULTI_KERNEL and getattr(op, n) is getattr(Op, n))
        ]
    return [
        n
        for n in need
        if (not hasattr(op, n) if n in REQUIRED_CONSTANTS else not callable(getattr(op, n, None)))
    ]


def op_class(module: ModuleType) -> type[Op] | None:
    """The Op subclass a class-form op.py defines (None: the module form). More than one: an error."""
    own = [
        v
        for v in vars(module).values()
        if isinstance(v, type) and issubclass(v, Op) and v.__module__ == module.__name__
    ]
    if len(own) > 1:
        names = ", ".join(sorted(c.__name__ for c in own))
        raise TypeError(f"defines {len(own)} Op classes ({names}); an op.py defines one")
    return own[0] if own else None


def from_module(module: ModuleType) -> tuple[Op | None, list[str]]:
    """(the op of an op.py's module, []) or (None, the contract's names it lacks)."""
    cls = op_class(module)
    lacks = missing(cls if cls is not None else module)
    if lacks:
        return None, lacks
    return (cls() if cls is not None else ModuleOp(module)), []
