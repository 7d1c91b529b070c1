"""Correctness checks on output arrays (xp is numpy or cupy): poison, writes, inputs, determinism, tolerance,
and a scale-aware criterion beside the elementwise band (relative L1 and L2 error of the whole output and of every
row against the error that rounding the reference to the output's type costs)."""

from __future__ import annotations

import contextlib
import math

import numpy as np

from ..dtypes import from_float, to_float
from ..outcome import Outcome

_UINT = {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"}


def bits(arr, xp):
    """The array's bit pattern as unsigned integers of the same width (NaN-safe equality)."""
    return xp.ascontiguousarray(arr).view(getattr(xp, _UINT[arr.dtype.itemsize]))


def poison(arr, xp) -> None:
    """Fill with all-ones bytes: a NaN in every float type (f16, bf16, f32, f64), -1 in ints."""
    arr.view(getattr(xp, _UINT[arr.dtype.itemsize])).fill(np.iinfo(_UINT[arr.dtype.itemsize]).max)


def _where(mask, xp) -> tuple[int, tuple[int, ...] | None]:
    n = int(mask.sum())
    if not n:
        return 0, None
    return n, tuple(int(i) for i in np.unravel_index(int(xp.argmax(mask.reshape(-1))), mask.shape))


def unwritten(arr, xp) -> tuple[int, tuple[int, ...] | None]:
    """(how many elements still hold the poison, the first one)."""
    b = bits(arr, xp)
    return _where(b == np.iinfo(b.dtype).max, xp)


def differs(a, b, xp) -> tuple[int, tuple[int, ...] | None]:
    """(how many elements differ bit for bit, the first one)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return max(a.size, b.size), ()
    return _where(bits(a, xp) != bits(b, xp), xp)


def _quiet(xp):
    """numpy's floating-point warnings off (cupy has no errstate)."""
    if hasattr(xp, "errstate"):
        return xp.errstate(invalid="ignore", over="ignore", divide="ignore")
    return contextlib.nullcontext()


def compare(out, ref, dtype: str, atol: float, rtol: float, xp) -> dict:
    """Elementwise |out-ref| <= atol + rtol*|ref|; a NaN/inf where ref is finite (or finite where ref is
    NaN) always fails. Returns bad count, worst index, got/want there and max abs/rel error."""
    if tuple(out.shape) != tuple(ref.shape):
        return {
            "bad": max(out.size, 1),
            "worst": None,
            "shape": (tuple(out.shape), tuple(ref.shape)),
            "max_abs": float("inf"),
            "max_rel": float("inf"),
        }
    with _quiet(xp):
        if out.size <= CHUNK:
            return _compare(out, ref, dtype, atol, rtol, xp)
        return _compare_chunked(out, ref, dtype, atol, rtol, xp)


CHUNK = (
    1 << 26
)  # elements compared at once: float64 temporaries of a 2^31-element output would not fit


def _compare_chunked(out, ref, dtype, atol, rtol, xp) -> dict:
    """compare() over CHUNK-element slices of the flattened arrays (same result, bounded memory)."""
    o, r = xp.ascontiguousarray(out).reshape(-1), xp.ascontiguousarray(ref).reshape(-1)
    total = {"bad": 0, "worst": None, "max_abs": 0.0, "max_rel": 0.0}
    worst_score = -math.inf
    for start in range(0, o.size, CHUNK):
        c = _compare(o[start : start + CHUNK], r[start : start + CHUNK], dtype, atol, rtol, xp)
        total["bad"] += c["bad"]
        total["max_abs"], total["max_rel"] = (
            max(total["max_abs"], c["max_abs"]),
            max(total["max_rel"], c["max_rel"]),
        )
        if c["bad"] and (total["worst"] is None or c["score"] > worst_score):
            worst_score = c["score"]
            total["worst"] = tuple(
                int(i) for i in np.unravel_index(start + c["worst"][0], out.shape)
            )
            total["got"], total["want"] = c["got"], c["want"]
    return total


def _compare(out, ref, dtype, atol, rtol, xp) -> dict:
    r = ref.astype(xp.float64 if ref.dtype == xp.float64 else xp.float32)
    bf16 = out.dtype.kind == "u" and out.dtype.itemsize == 2 and dtype == "bfloat16"
    o = (to_float(out, dtype, xp) if bf16 else out).astype(r.dtype)
    err = xp.abs(o - r)
    excess = err - (atol + rtol * xp.abs(r))
    finite = xp.isfinite(o) & xp.isfinite(r)
    broken = (~xp.isfinite(o) & xp.isfinite(r)) | (xp.isnan(o) != xp.isnan(r))
    bad = (excess > 0) | broken
    n = int(bad.sum())
    errf = xp.where(finite, err, 0)
    max_abs = float(errf.max()) if errf.size else 0.0
    max_rel = (
        float((errf / xp.maximum(xp.abs(xp.where(finite, r, 1)), 1e-30)).max())
        if errf.size
        else 0.0
    )
    res = {
        "bad": n,
        "worst": None,
        "max_abs": max_abs if not int(broken.sum()) else float("inf"),
        "max_rel": max_rel,
    }
    if n:
        score = xp.where(broken, xp.inf, xp.where(xp.isnan(excess), -xp.inf, excess))
        flat = int(xp.argmax(score.reshape(-1)))
        res["score"] = float(score.reshape(-1)[flat])
        res["worst"] = tuple(int(i) for i in np.unravel_index(flat, bad.shape))
        res["got"], res["want"] = float(o.reshape(-1)[flat]), float(r.reshape(-1)[flat])
    return res


# The scale-aware criterion beside the band (issue 27). Per output, over the whole output and over
# every row (the last axis), for p = 1 (the mass: a softmax row's zeroed small values) and p = 2:
#     ||got - want||_p  <=  factor * ||round(want) - want||_p  +  floor * ||want||_p
# where round() rounds the float reference to the type the output is stored in: that error no kernel
# can avoid. An honest kernel computes in fp32 and rounds once: |round(w + e) - w| <= |round(w) - w|
# + 2|e| elementwise for an fp32 error e, so it is within factor 1 plus a floor of its fp32 error;
# factor 2 leaves room for an intermediate rounded to the output type. A kernel that loses precision
# inside (a bf16 accumulator: ~5x at 8N; values zeroed below atol: 40x and more) is far over. floor is
# the arithmetic's own allowance, relative to the row: for 16-bit outputs an eighth of the type's unit
# roundoff (fp32 arithmetic is ~100x under it); for fp32 outputs, whose rounding is ~1e-7, the
# reductions and fast intrinsics of fp32 kernels, 1e-4. An op declares its own (factor, floor) per
# output with error_bound(problem, output) (looser for legitimately lower-precision math, stricter
# where it knows better); the band's atol lets a kernel zero every value below it, this does not.
ROUNDING_FACTOR = 2.0
FLOOR = {"bfloat16": 2.0**-11, "float16": 2.0**-14, "float32": 1e-4, "float64": 1e-4}


def stored_type(out, dtype: str) -> str:
    """The element type an output array holds: bf16 is stored as uint16 (problem dtype bfloat16)."""
    if out.dtype.kind == "u" and out.dtype.itemsize == 2 and dtype == "bfloat16":
        return "bfloat16"
    return {2: "float16", 4: "float32", 8: "float64"}.get(out.dtype.itemsize, "float32")


def default_bound(kind: str) -> tuple[float, float]:
    return ROUNDING_FACTOR, FLOOR.get(kind, 1e-4)


def rounded(ref, kind: str, xp):
    """The float reference rounded to the element type `kind`, as float64 (non-finite: the reference)."""
    if kind == "bfloat16":
        q = to_float(from_float(ref.astype(xp.float32), "bfloat16", xp), "bfloat16", xp)
    else:
        q = ref.astype(getattr(xp, kind))
    q = q.astype(xp.float64)
    return xp.where(xp.isfinite(q), q, ref)


_STATS = ("err1", "err2", "rnd1", "rnd2", "mass1", "mass2")


def error_norms(out, ref, dtype: str, xp):
    """Yields (first row, {stat: per-row array}) over row chunks of the output (rows: the last axis;
    an output of one axis is one row): err_p = ||got - want||_p^p, rnd_p = ||round(want) - want||_p^p,
    mass_p = ||want||_p^p, p = 1, 2, over the elements finite in both (the band judges the others).
    Float64 sums, CHUNK elements at a time (a 2^31-element output's temporaries would not fit)."""
    o, r = xp.ascontiguousarray(out), xp.ascontiguousarray(ref)
    n = max(o.shape[-1] if o.ndim else 1, 1)
    o, r = o.reshape(-1, n), r.reshape(-1, n)
    kind = stored_type(out, dtype)
    step = max(1, CHUNK // n)
    for start in range(0, o.shape[0], step):
        oc = o[start : start + step]
        oc = (to_float(oc, dtype, xp) if kind == "bfloat16" else oc).astype(xp.float64)
        rc = r[start : start + step].astype(xp.float64)
        ok = xp.isfinite(oc) & xp.isfinite(rc)
        w = xp.where(ok, rc, 0.0)
        e = xp.abs(xp.where(ok, oc, 0.0) - w)
        d = xp.abs(xp.where(ok, rounded(rc, kind, xp), 0.0) - w)
        a = xp.abs(w)
        yield start, dict(zip(_STATS, (e.sum(1), (e * e).sum(1), d.sum(1), (d * d).sum(1),
                                       a.sum(1), (a * a).sum(1))))  # fmt: skip


def _norm(s: dict, p: int, i=None):
    """(err, rnd, mass) of norm p from the summed powers (of row i, or of scalars)."""
    vals = [s[f"{k}{p}"] if i is None else s[f"{k}{p}"][i] for k in ("err", "rnd", "mass")]
    return [float(v) ** (1 / p) for v in vals]


def scale_verdict(out, ref, dtype: str, bound: tuple[float, float], xp) -> str | None:
    """Why `out` fails the criterion above with bound (factor, floor), or None: the whole output
    first, then the worst row (rows whose reference is all zero are left to the band)."""
    factor, floor = bound
    kind = stored_type(out, dtype)
    with _quiet(xp):
        total = dict.fromkeys(_STATS, 0.0)
        worst = (1.0, None, None, None)  # (score, p, row, norms): score = err / bound
        for start, s in error_norms(out, ref, dtype, xp):
            for k in _STATS:
                total[k] += float(s[k].sum())
            for p in (1, 2):
                err, rnd, mass = (s[f"{k}{p}"] ** (1 / p) for k in ("err", "rnd", "mass"))
                lim = factor * rnd + floor * mass
                score = xp.where(mass > 0, err / xp.where(lim > 0, lim, 1e-300), 0.0)
                i = int(xp.argmax(score)) if score.size else 0
                if score.size and float(score[i]) > worst[0]:
                    worst = (float(score[i]), p, start + i, _norm(s, p, i))
    for p in (1, 2):
        err, rnd, mass = _norm(total, p)
        if mass > 0 and err > factor * rnd + floor * mass:
            return _why(p, "the whole output", err, rnd, mass, factor, floor, kind)
    if worst[1] is not None:
        return _why(worst[1], f"row {worst[2]}", *worst[3], factor, floor, kind)
    return None


def _why(p, where, err, rnd, mass, factor, floor, kind) -> str:
    return (
        f"relative L{p} {err / mass:.3g} of {where} exceeds {(factor * rnd + floor * mass) / mass:.3g}"
        f" = {factor:g} x {rnd / mass:.3g} (what rounding the reference to {kind} costs) + {floor:.3g}"
    )


def judge(
    dtype: str,
    inputs: dict,
    inputs_before: dict,
    outputs: dict,
    reference: dict,
    tolerance,
    xp,
    outputs_again: dict | None = None,
    custom=None,
    scale=None,
) -> tuple[Outcome, str, float, float]:
    """Classify one run: inputs modified > unwritten > wrong result > nondeterministic, else OK.
    `tolerance(name) -> (atol, rtol)`; `outputs_again` is a second run on the same inputs (or None);
    `custom(name, got, want) -> (ok, detail) | None` (an op's optional `compare` hook) judges an output
    instead of the elementwise band when it returns a verdict. An output judged by the band is also
    judged by the scale criterion (scale_verdict: L1 and L2, whole and per row) with the bound
    `scale(name, stored_type) -> (factor, floor) | None` (None: default_bound of the stored type). Returns (outcome, detail, max_abs_err, max_rel_err)."""
    for name, before in inputs_before.items():
        n, at = differs(inputs[name], before, xp)
        if n:
            return (
                Outcome.INPUT_MODIFIED,
                f"input {name}: {n} of {before.size} elements changed (first at {at})",
                0.0,
                0.0,
            )
    for name, out in outputs.items():
        n, at = unwritten(out, xp)
        if n:
            return (
                Outcome.UNWRITTEN,
                f"output {name}: {n} of {out.size} elements never written (first at {at})",
                0.0,
                0.0,
            )
    max_abs = max_rel = 0.0
    for name, want in reference.items():
        verdict = custom(name, outputs[name], want) if custom is not None else None
        if verdict is not None:
            ok, detail = verdict
            if not ok:
                return Outcome.WRONG_RESULT, f"output {name}: {detail}", max_abs, max_rel
            continue
        atol, rtol = tolerance(name)
        c = compare(outputs[name], want, dtype, atol, rtol, xp)
        max_abs, max_rel = max(max_abs, c["max_abs"]), max(max_rel, c["max_rel"])
        if c.get("shape"):
            return (
                Outcome.WRONG_RESULT,
                f"output {name}: shape {c['shape'][0]}, reference {c['shape'][1]}",
                max_abs,
                max_rel,
            )
        if c["bad"]:
            return (
                Outcome.WRONG_RESULT,
                f"output {name}: {c['bad']} of {want.size} elements outside atol={atol:g} "
                f"rtol={rtol:g}; worst at {c['worst']}: got {c['got']:.6g}, want {c['want']:.6g}",
                max_abs,
                max_rel,
            )
        kind = stored_type(outputs[name], dtype)
        bound = scale(name, kind) if scale is not None else None
        bound = default_bound(kind) if bound is None else tuple(float(b) for b in bound)
        why = scale_verdict(outputs[name], want, dtype, bound, xp)
        if why:
            return Outcome.WRONG_RESULT, f"output {name}: {why} (within the band)", max_abs, max_rel
    for name, out in (outputs_again or {}).items():
        n, at = differs(out, outputs[name], xp)
        if n:
            return (
                Outcome.NONDETERMINISTIC,
                f"output {name}: {n} of {out.size} elements differ between two runs "
                f"on the same inputs (first at {at})",
                max_abs,
                max_rel,
            )
    return Outcome.OK, "", max_abs, max_rel
