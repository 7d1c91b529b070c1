"""`ptxbuild check --deep`: what a GPU build would find wrong with an op, found on a machine without one.

Every valid config of the op's SPACE (or a bounded, seeded sample, said so) is rendered and compiled
for each declared problem and GPU architecture with the compiler wheels; each distinct source is
compiled once. The op's Python side (make_inputs, make_outputs, kernel_args, reference, tolerance,
launch / launches, bytes_moved) runs once with numpy on a small problem; the kernel arguments are held
against the .entry parameters of the PTX (count and width: a Python float is a double). Compile errors
name the template file's lines where render() substitutes the template line for line."""

from __future__ import annotations

import contextlib
import difflib
import itertools
import math
import random
import re
from dataclasses import dataclass, field

import numpy as np

from ..compile.compiler import CompileError, compile_kernel
from ..declare.checks import problems_of
from ..dtypes import storage_dtype
from ..launch import param
from ..problem import Launch, Problem

SPACE_SAMPLE = 4096  # configs drawn from a larger space (seeded) before check() filters them
# the Python side runs on the first problem cut to this many rows (if check() allows)
SMALL_ROWS = 8


@dataclass
class Failure:
    kind: str  # "compile", "python", "missing", "args"
    what: str  # one line
    configs: list[dict] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    detail: list[str] = field(default_factory=list)


@dataclass
class OpResult:
    name: str
    lines: list[str] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    compiles: int = 0


def fmt_config(cfg: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in cfg.items())


def space_configs(space: dict) -> tuple[list[dict], int]:
    """(every config of the space, or a seeded sample of SPACE_SAMPLE of them; the space's size)."""
    names, values = list(space), [list(v) for v in space.values()]
    size = math.prod(len(v) for v in values)
    if size <= SPACE_SAMPLE:
        return [dict(zip(names, c)) for c in itertools.product(*values)], size
    rng, seen = random.Random(0), set()
    while len(seen) < SPACE_SAMPLE:
        seen.add(tuple(rng.randrange(len(v)) for v in values))
    return [dict(zip(names, (v[i] for v, i in zip(values, c)))) for c in sorted(seen)], size


def valid_configs(op, problem: Problem, configs: list[dict], limit: int) -> tuple[list[dict], int]:
    """(the configs check() accepts for `problem`, the default first, at most `limit` of them drawn
    with seed 0; how many were valid)."""
    default = {**{k: v[0] for k, v in op.SPACE.items()}, **op.default_params(problem)}
    valid = [c for c in configs if op.check(c, problem) is None and c != default]
    n = len(valid) + 1
    if len(valid) > limit - 1:
        valid = random.Random(0).sample(valid, max(0, limit - 1))
    return [default, *valid], n


# ------------------------------------------------------------------ compile errors -> template lines
_LOC = re.compile(r"^candidate\.cu\((\d+)\): ")


def line_map(op, rendered: str, root=None) -> tuple[str, list[str], dict[int, int]] | None:
    """(template path as shown, its lines, rendered line -> template line, both 1-based) for the
    op SOURCES file the rendered source matches best, where lines match one for one."""
    best = None
    for name in op.SOURCES:
        path = op.FOLDER / name
        try:
            tmpl = path.read_text().splitlines()
        except (OSError, UnicodeDecodeError):
            continue
        out = rendered.splitlines()
        sm = difflib.SequenceMatcher(None, tmpl, out, autojunk=False)
        m = {}
        for tag, i1, i2, j1, j2 in sm.get_opcodes():
            if tag == "equal" or (tag == "replace" and i2 - i1 == j2 - j1):
                m.update({j1 + k + 1: i1 + k + 1 for k in range(j2 - j1)})
        if best is None or len(m) > len(best[2]):
            best = (_shown(path, root), tmpl, m)
    return best if best and best[2] else None


def _shown(path, root) -> str:
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except (AttributeError, ValueError):
        return f"{path.parent.name}/{path.name}"


def explain_log(op, rendered: str, log: str, root=None, limit: int = 12) -> list[str]:
    """The compiler log with every `candidate.cu(L)` location as template-file:line (the rendered
    line beside it where they differ), each followed by the offending source line."""
    mapped, src, out = line_map(op, rendered, root), rendered.splitlines(), []
    for raw in log.splitlines():
        m = _LOC.match(raw)
        if not m:  # NVRTC's own echo of the line and its caret, and its count, are left out
            noise = raw[:1].isspace() or "detected in the compilation of" in raw
            if raw.strip() and not noise and len(out) < 3 * limit:
                out.append(raw)
            continue
        r = int(m.group(1))
        msg = raw[m.end() :]
        t = mapped[2].get(r) if mapped else None
        if t is not None:
            where = mapped[0] + f":{t}" + ("" if t == r else f" (rendered line {r})")
        else:
            where = f"rendered line {r} (no template line matches)"
        out.append(f"{where}: {msg}")
        if 0 < r <= len(src):
            out.append(f"    {t or r:>5} | {src[r - 1].strip()}")
        if sum(1 for o in out if not o.startswith("    ")) >= limit:
            break
    return out


# ------------------------------------------------------------------ kernel arguments vs .entry params
_PTX_SIZE = {"8": 1, "16": 2, "32": 4, "64": 8}


def entry_params(ptx: str, entry: str) -> list[str] | None:
    """The .param types of `entry` in the PTX ("u64", "f32", ..., "b8[16]" for an aggregate)."""
    m = re.search(rf"\.entry\s+{re.escape(entry)}\s*\((.*?)\)", ptx, re.S)
    if not m:
        return None
    out = []
    for decl in (d.split() for d in m.group(1).split(",") if d.strip()):
        # .param [.align N] .TYPE [.ptr [.space] [.align N]] NAME[[N]]
        kind = next((t[1:] for t in decl[1:] if re.fullmatch(r"\.[usbf]\d+", t)), "?")
        size = re.search(r"(\[\d+\])$", decl[-1])
        out.append(kind + (size.group(1) if size else ""))
    return out


def args_mismatch(args: list, types: list[str]) -> str | None:
    """Why these kernel arguments do not fit the .entry parameters, or None."""
    if len(args) != len(types):
        return f"kernel_args gives {len(args)} argument(s); the kernel's .entry takes {len(types)}"
    for i, (a, t) in enumerate(zip(args, types)):
        if "[" in t:  # an aggregate passed by value: not judged here
            continue
        try:
            d = np.dtype(np.uint64) if isinstance(a, np.ndarray) else param(a).dtype
        except TypeError as exc:
            return f"argument {i}: {exc}"
        size = _PTX_SIZE.get(t[1:])
        if size is not None and d.itemsize != size or (t[0] == "f" and d.kind != "f"):
            hint = (
                "; a Python float is passed as a double: give np.float32(...)" if t == "f32" else ""
            )
            return (
                f"argument {i} is {'a pointer' if isinstance(a, np.ndarray) else d.name} "
                f"({d.itemsize} bytes); the kernel's parameter {i} is .{t}{hint}"
            )
    return None


# ------------------------------------------------------------------ the Python side, once, with numpy
def small_problem(op, first: Problem) -> Problem:
    if len(first.shape) >= 2 and first.shape[0] > SMALL_ROWS:
        small = first.with_shape((SMALL_ROWS, *first.shape[1:]))
        with contextlib.suppress(Exception):  # the op's own code; the declared problem then
            if op.check(op.default_params(small), small) is None:
                return small
    return first


def _arrays(what: str, d) -> str | None:
    if not isinstance(d, dict) or not d:
        return f"{what} returned {type(d).__name__}, not a dict of arrays"
    bad = [k for k, v in d.items() if not isinstance(v, np.ndarray)]
    return f"{what}: {', '.join(bad)} not numpy arrays (xp = numpy)" if bad else None


def python_side(op, p: Problem, sm_count: int) -> tuple[list[str], dict | None]:
    """Run the op's Python side once on `p`; (every mistake, one line each; (inputs, outputs))."""
    errs: list[str] = []
    try:
        cfg = op.default_params(p)
        inputs = op.make_inputs(p, 0, np)
        if e := _arrays("make_inputs", inputs):
            return [e], None
        outputs = op.make_outputs(p, np)
        if e := _arrays("make_outputs", outputs):
            return [e], None
        ref = op.reference(p, {k: v.copy() for k, v in inputs.items()}, np)
        if e := _arrays("reference", ref):
            return [e], None
        judged = [k for k in outputs if k not in op.SCRATCH]
        if sorted(ref) != sorted(judged):
            errs.append(f"reference gives {sorted(ref)}; make_outputs (less SCRATCH) has {judged}")
        for k in set(ref) & set(judged):
            if tuple(ref[k].shape) != tuple(outputs[k].shape):
                errs.append(
                    f"output {k}: reference shape {ref[k].shape}, make_outputs {outputs[k].shape}"
                )
            if ref[k].dtype.kind != "f" and not op.has("compare"):
                errs.append(f"output {k}: reference dtype {ref[k].dtype}, not a float type")
            elif not np.isfinite(ref[k]).all():
                errs.append(f"output {k}: the reference is not finite on seed 0")
            tol = op.tolerance(p, k)
            if len(tol) != 2 or not all(isinstance(t, (int, float)) and t >= 0 for t in tol):
                errs.append(f"tolerance(problem, {k!r}) = {tol!r}, not (atol, rtol) >= 0")
        store = np.dtype(storage_dtype(p.dtype, np))
        if not any(v.dtype == store for v in (*inputs.values(), *outputs.values())):
            errs.append(f"no input or output is stored as {p.dtype} ({store}) for {p.label()}")
        geoms = (
            op.launches(cfg, p, sm_count)
            if op.multi_kernel
            else {None: op.launch(cfg, p, sm_count)}
        )
        if not all(isinstance(g, Launch) for g in geoms.values()):
            errs.append("launch/launches did not return Launch values")
        if not isinstance(op.bytes_moved(p), (int, np.integer)) or op.bytes_moved(p) <= 0:
            errs.append(f"bytes_moved({p.label()}) = {op.bytes_moved(p)!r}, not a positive int")
        extra = op.verify_problems(p)
        if not all(isinstance(q, Problem) for q in extra):
            errs.append("verify_problems did not return a list of Problem")
    except Exception as exc:  # noqa: BLE001 - the op's own code
        return [f"{type(exc).__name__}: {exc} (on {p.label()})"], None
    return errs, {"inputs": inputs, "outputs": outputs}


# ------------------------------------------------------------------ the whole op
def deep_check(kf, spec, op, max_configs: int = 64, compile_fn=compile_kernel) -> OpResult:
    """Check one declared op: the Python side once, every valid config compiled."""
    res = OpResult(spec.name)  # an op lacking a GPU-side function does not load (contract.py)
    problems = [p for p in problems_of(spec) if p.dtype in op.DTYPES]
    gpus = [kf.gpus[g] for g in spec.gpus]
    sm = min(g.sm_count for g in gpus)
    arrays: dict = {}  # dtype -> the arrays of its small problem (the Python side ran clean)
    for dtype in dict.fromkeys(p.dtype for p in problems):
        small = small_problem(op, next(p for p in problems if p.dtype == dtype))
        errs, got = python_side(op, small, sm)
        if errs:
            res.failures.append(Failure("python", f"Python side on {small.label()}", detail=errs))
        else:
            arrays[dtype] = got
            res.lines.append(f"python side ok on {small.label()} (numpy, seed 0)")
    space, size = space_configs(op.SPACE)
    archs = sorted({g.arch for g in gpus})
    sampled = (
        f"a seeded sample of {len(space)} of the space's {size}"
        if size > len(space)
        else f"all {size}"
    )
    compiled: dict = {}  # (source, entry, flags, arch) -> error lines or PTX
    groups: dict = {}  # (kind, key) -> Failure
    for p in problems:
        try:
            cfgs, n_valid = valid_configs(op, p, space, max_configs)
        except Exception as exc:  # noqa: BLE001
            res.failures.append(Failure("python", f"check/default_params on {p.label()}: {exc}"))
            continue
        took = "all" if len(cfgs) == n_valid else f"a seeded sample of {len(cfgs)} (--max-configs)"
        res.lines.append(
            f"{p.label()}: {n_valid} valid config(s) of {sampled}, compiled {took} for {', '.join(archs)}"
        )
        for cfg, arch in itertools.product(cfgs, archs):
            try:
                k = op.render(cfg, p, arch)
            except Exception as exc:  # noqa: BLE001
                what = f"render failed: {type(exc).__name__}: {exc}"
                _group(groups, ("render", str(exc)), what, cfg, p)
                continue
            key = (k.source, k.entry, k.flags, arch)
            if key not in compiled:
                res.compiles += 1
                try:
                    compiled[key] = compile_fn(k, arch).ptx
                except CompileError as exc:
                    compiled[key] = explain_log(op, k.source, str(exc), kf.root)
            got = compiled[key]
            if isinstance(got, list):
                what = f"compile error ({arch})"
                _group(groups, ("compile", arch, tuple(got)), what, cfg, p, got)
            elif p.dtype in arrays:
                _check_args(op, cfg, p, arch, k.entry, got, arrays[p.dtype], groups, sm)
    res.failures += list(groups.values())
    return res


def _check_args(op, cfg, p, arch, main_entry, ptx, arrays, groups, sm) -> None:
    try:  # the small problem's arrays stand in for p's: the count and types of arguments, not sizes
        io = arrays["inputs"], arrays["outputs"]
        for e in op.launches(cfg, p, sm) if op.multi_kernel else [None]:
            name = e or main_entry
            types = entry_params(ptx, name)
            if types is None:
                _group(groups, ("args", e), f"no .entry {name} in the PTX", cfg, p)
                continue
            args = op.kernel_args(cfg, p, *io) if e is None else op.stage_args(e, cfg, p, *io)
            if why := args_mismatch(args, types):
                _group(groups, ("args", name, why), f"{name}: {why}", cfg, p)
    except Exception as exc:  # noqa: BLE001
        _group(groups, ("args", str(exc)), f"kernel_args: {type(exc).__name__}: {exc}", cfg, p)


def _group(groups, key, what, cfg, p, detail=None) -> None:
    """Add `cfg` on `p` to the failure of `key` (its kind: key[0]), made on first sight."""
    f = groups.setdefault(key, Failure(key[0], what, detail=list(detail or [])))
    if cfg not in f.configs:
        f.configs.append(cfg)
    if p.label() not in f.problems:
        f.problems.append(p.label())


def shared_params(configs: list[dict]) -> dict:
    """The parameters every one of these configs has at the same value (what a failure hangs on)."""
    return {k: v for k, v in configs[0].items() if all(c.get(k) == v for c in configs)}


def describe(f: Failure, limit: int = 12) -> list[str]:
    """A failure as terminal lines: what, the configs by their parameters, the problems, the detail."""
    out = [f.what]
    if f.configs:
        common = shared_params(f.configs) if len(f.configs) > 1 else {}
        shared = f", all with {fmt_config(common)}" if common else ""
        out.append(f"  {len(f.configs)} config(s){shared}:")
        out += [f"    {fmt_config(c)}" for c in f.configs[:limit]]
        if len(f.configs) > limit:
            out.append(f"    ... and {len(f.configs) - limit} more")
        out.append(f"  on {', '.join(f.problems)}")
    out += [f"  {d}" for d in f.detail]
    return out
