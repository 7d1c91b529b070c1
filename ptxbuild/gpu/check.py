"""Correctness checks on output arrays (xp is numpy or cupy): poison, writes, inputs, determinism, tolerance."""

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
    quiet = (
        xp.errstate(invalid="ignore", over="ignore", divide="ignore")
        if hasattr(xp, "errstate")
        else contextlib.nullcontext()
    )  # cupy has no errstate
    with quiet:
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
) -> tuple[Outcome, str, float, float]:
    """Classify one run: inputs modified > unwritten > wrong result > nondeterministic, else OK.
    `tolerance(name) -> (atol, rtol)`; `outputs_again` is a second run on the same inputs (or None);
    `custom(name, got, want) -> (ok, detail) | None` (an op's optional `compare` hook) judges an output
    instead of the elementwise band when it returns a verdict. Returns (outcome, detail, max_abs_err, max_rel_err)."""
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
