"""Correctness checks on output arrays (xp is numpy or cupy): poison, writes, inputs, determinism, tolerance,
and a scale-aware criterion (relative L2 of the whole output and of every row) beside the elementwise band."""

from __future__ import annotations

import contextlib
import math

import numpy as np

from ..dtypes import to_float
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


# Relative L2 (||got - want|| / ||want||, of the whole output and of every row) an output may have,
# by the element type it is stored in. Rounding to a type of unit roundoff u has relative L2 <= u per
# element, so <= u for any set of elements: bf16 u = 2^-8 (RMS ~2^-9), fp16 u = 2^-11. The 16-bit
# limits are 4u (an output rounded twice, fp32 arithmetic besides); fp32 kernels' own arithmetic
# (reductions, fast intrinsics) dominates their ~1e-7 rounding: 1e-4. An op may declare its own
# (contract: rel_l2_tolerance). The band's atol lets a kernel zero every value below it; this does not.
REL_L2 = {"bfloat16": 2.0**-6, "float16": 2.0**-9, "float32": 1e-4, "float64": 1e-4}


def stored_type(out, dtype: str) -> str:
    """The element type an output array holds: bf16 is stored as uint16 (problem dtype bfloat16)."""
    if out.dtype.kind == "u" and out.dtype.itemsize == 2 and dtype == "bfloat16":
        return "bfloat16"
    return {2: "float16", 4: "float32", 8: "float64"}.get(out.dtype.itemsize, "float32")


def rel_l2(out, ref, dtype: str, xp) -> tuple[float, float, int | None]:
    with _quiet(xp):
        return _rel_l2(out, ref, dtype, xp)


def _rel_l2(out, ref, dtype: str, xp) -> tuple[float, float, int | None]:
    """(relative L2 of the whole output, the worst row's, that row's index or None). Rows are the
    last axis (an output of one axis is one row); only elements finite in both count (the band judges
    the others); a row whose reference is all zero is left to the band. Float64 sums, CHUNK elements
    at a time (a 2^31-element output's float64 temporaries would not fit)."""
    o = xp.ascontiguousarray(out)
    r = xp.ascontiguousarray(ref)
    n = o.shape[-1] if o.ndim else 1
    o, r = o.reshape(-1, max(n, 1)), r.reshape(-1, max(n, 1))
    bf16 = stored_type(out, dtype) == "bfloat16"
    step = max(1, CHUNK // max(n, 1))
    err_sq, ref_sq, worst, worst_row = 0.0, 0.0, 0.0, None
    for start in range(0, o.shape[0], step):
        oc = (
            to_float(o[start : start + step], dtype, xp) if bf16 else o[start : start + step]
        ).astype(xp.float64)
        rc = r[start : start + step].astype(xp.float64)
        ok = xp.isfinite(oc) & xp.isfinite(rc)
        e = xp.where(ok, oc - rc, 0.0)
        w = xp.where(ok, rc, 0.0)
        e_row, r_row = (e * e).sum(axis=1), (w * w).sum(axis=1)
        err_sq, ref_sq = err_sq + float(e_row.sum()), ref_sq + float(r_row.sum())
        ratio = xp.where(r_row > 0, xp.sqrt(e_row / xp.where(r_row > 0, r_row, 1.0)), 0.0)
        if ratio.size:
            i = int(xp.argmax(ratio))
            if float(ratio[i]) > worst:
                worst, worst_row = float(ratio[i]), start + i
    whole = math.sqrt(err_sq / ref_sq) if ref_sq > 0 else 0.0
    return whole, worst, worst_row


def scale_verdict(out, ref, dtype: str, limit: float, xp) -> str | None:
    """Why `out` fails the relative-L2 criterion (whole output, then the worst row), or None."""
    whole, row, at = rel_l2(out, ref, dtype, xp)
    if whole > limit:
        return f"relative L2 {whole:.3g} of the whole output exceeds {limit:.3g}"
    if row > limit:
        return f"relative L2 {row:.3g} of row {at} exceeds {limit:.3g}"
    return None


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
    judged by relative L2 (whole and per row) against `scale(name, stored_type) -> limit` (default
    REL_L2 of the type it is stored in). Returns (outcome, detail, max_abs_err, max_rel_err)."""
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
        limit = scale(name, kind) if scale is not None else None
        limit = REL_L2.get(kind, 1e-4) if limit is None else float(limit)
        why = scale_verdict(outputs[name], want, dtype, limit, xp)
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
