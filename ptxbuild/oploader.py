"""Find and load an op definition (ops/<name>/op.py) and check it honours the op contract.

The op contract: an op is a folder `ops/<name>/` with `op.py` defining

    NAME: str                       the op's name (the folder name)
    VERSION: str                    reference + test-suite version; bump when the reference,
                                    the input generator or the tolerances change (re-verifies)
    SOURCES: list[str]              files of the folder the kernels are rendered from (hashed)
    DTYPES: list[str]               element types it supports ("bfloat16", "float16", "float32")
    OPTIONS: dict[str, object]      option name -> default (e.g. {"residual": False})
    SPACE: dict[str, list]          parameter -> candidate values (the search space)
    SPILL_BUDGET_BYTES: int         spills above this are the outcome `spill`
    default_params(problem) -> dict a documented config used when no lessons exist
    check(params, problem) -> str | None       why a config is invalid for a problem, or None
    render(params, problem, arch) -> Kernel     CUDA C++ (no CUDA headers: NVRTC from pip has none)
    launch(params, problem, sm_count) -> Launch
    bytes_moved(problem) -> int     bytes a perfect kernel reads + writes (the roofline floor)
  GPU side (xp is numpy or cupy; bf16 arrays are uint16 bit patterns, see dtypes.py):
    make_inputs(problem, seed, xp) -> dict[str, array]
    make_outputs(problem, xp) -> dict[str, array]          (the verifier poisons them)
    kernel_args(params, problem, inputs, outputs) -> list  (arrays and numpy scalars, in order)
    reference(problem, inputs, xp) -> dict[str, array]     float32/64 expected outputs
    tolerance(problem, output) -> (atol, rtol)
    verify_problems(problem, params) -> list[Problem]  adversarial shapes checked with the same binary
                                    (params optional; shapes check() rejects for the config are dropped)
  optional:
    baselines(problem) -> dict[str, callable(inputs) -> dict[str, array]]  (torch etc.); or a
                                    baselines.py beside op.py with baselines(problem, defaults) and
                                    BASELINES_VERSION (not a build input: editing it rebuilds nothing)
    DEPENDS: list[str]              other ops whose targets must be built first
    compare(problem, output, got, want, xp) -> (ok, detail) | None   judges an output instead of the
                                    elementwise tolerance band (e.g. relative RMS); None: use the band
    SCRATCH: set[str]               outputs that are scratch (a workspace one kernel writes for the next):
                                    poisoned like every output, never checked (written, determinism)
  optional, an op of several kernels run in order on one stream (all entries of the one rendered
  source and cubin; render()'s entry is the main one, whose registers / spills the build reports and
  whose launch() geometry the build's resource check uses):
    KERNELS: list[str]              every entry the op may launch; launches() returns the ones a config runs, in order
    launches(params, problem, sm_count) -> dict[str, Launch]          every entry's geometry
    stage_args(entry, params, problem, inputs, outputs) -> list       every entry's arguments
                                    (the GPU worker verifies and times the whole sequence; launch() and
                                    kernel_args() stay those of the main entry)
"""
from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REQUIRED = ("NAME", "VERSION", "SOURCES", "DTYPES", "OPTIONS", "SPACE", "SPILL_BUDGET_BYTES",
            "default_params", "check", "render", "launch", "bytes_moved")


class OpError(Exception):
    """An op folder is missing or does not honour the op contract."""


def op_dir(template: str, root: Path) -> Path:
    """`template` is an op name under <root>/ops or a path to an op folder."""
    p = Path(template)
    cand = p if (p.is_absolute() or "/" in template) else root / "ops" / template
    if not cand.is_absolute():
        cand = root / cand
    return cand


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
            del sys.modules[name]   # a broken file is not cached: the next load shows the error again
            raise
    return sys.modules[name]


def load_op(template: str, root: Path) -> ModuleType:
    folder = op_dir(template, root)
    path = folder / "op.py"
    if not path.is_file():
        raise OpError(f"no op at {path}: create {path} or fix the template name")
    mod = load_module(path, f"ptxbuild_ops_{folder.name}_{abs(hash(str(folder.resolve())))}")
    if getattr(mod, "FOLDER", None) is None:
        missing = [a for a in REQUIRED if not hasattr(mod, a)]
        if missing:
            raise OpError(f"{path} does not define {', '.join(missing)} (see the op contract in ptxbuild/oploader.py)")
        mod.FOLDER = folder
        _attach_baselines(mod, folder)
    return mod


def _attach_baselines(mod: ModuleType, folder: Path) -> None:
    """An op's optional baselines.py (not a build input, so not hashed) provides `baselines`."""
    path = folder / "baselines.py"
    if not path.is_file():
        return
    bmod = load_module(path, f"{mod.__name__}_baselines")
    mod.baselines = functools.partial(bmod.baselines, defaults=dict(getattr(mod, "OPTIONS", {})))
    mod.BASELINES_VERSION = getattr(bmod, "BASELINES_VERSION", "")


def source_files(op: ModuleType) -> list[Path]:
    """op.py and every file it declares in SOURCES: what the build key hashes."""
    return [op.FOLDER / "op.py", *(op.FOLDER / s for s in op.SOURCES)]
