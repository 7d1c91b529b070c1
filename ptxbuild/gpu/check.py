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


# elements compared at once: float64 temporaries of a 2^31-element output would not fit
CHUNK = 1 << 26


def compare(out, ref, dtype: str, atol: float, rtol: float, xp) -> dict:
    """Elementwise |out-ref| <= atol + rtol*|ref|; a NaN/inf where ref is finite (or finite where ref is
    NaN) always fails. Returns bad count, worst index, got/want there and max abs/rel error. The
    flattened arrays are compared CHUNK elements at a time by _compare() (bounded memory)."""
    if tuple(out.shape) != tuple(ref.shape):
        return {
            "bad": max(out.size, 1),
            "worst": None,
            "shape": (tuple(out.shape), tuple(ref.shape)),
            "max_abs": float("inf"),
            "max_rel": float("inf"),
        }
    o, r = xp.ascontiguousarray(out).reshape(-1), xp.ascontiguousarray(ref).reshape(-1)
    total = {"bad": 0, "worst": None, "max_abs": 0.0, "max_rel": 0.0}
    worst_score = -math.inf
    with _quiet(xp):  # one path for every size: small outputs are one chunk
        for start in range(0, o.size, CHUNK):
            c = _compare(o[start : start + CHUNK], r[start : start + CHUNK], dtype, atol, rtol, xp)
            total["bad"] += c["bad"]
            total["max_abs"] = max(total["max_abs"], c["max_abs"])
            total["max_rel"] = max(total["max_rel"], c["max_rel"])
            if c["bad"] and (total["worst"] is None or c["score"] > worst_score):
                worst_score = c["score"]
                total["worst"] = tuple(map(int, np.unravel_index(start + c["worst"][0], out.shape)))
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
    rel = errf / xp.maximum(xp.abs(xp.where(finite, r, 1)), 1e-30)
    max_rel = float(rel.max()) if errf.size else 0.0
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


def _rounded(r, kind: str, xp):
    """The float64 reference `r` rounded to the element type `kind`, as float64."""
    if kind == "bfloat16":
        return to_float(from_float(r.astype(xp.float32), kind, xp), kind, xp).astype(xp.float64)
    return r.astype(getattr(xp, kind)).astype(xp.float64)


def error_norms(out, ref, dtype: str, xp):
    """Yields (first row, {stat: per-row array}) over row chunks of the output (rows: the last axis;
    an output of one axis is one row): errP = ||got - want||_P^P, rndP = ||round(want) - want||_P^P,
    massP = ||want||_P^P, P = 1, 2, over the elements finite in got, want and round(want) (the band
    judges the others). Float64, CHUNK elements at a time (a 2^31-element output's would not fit)."""
    kind, n = stored_type(out, dtype), max(out.shape[-1] if out.ndim else 1, 1)
    o, r = xp.ascontiguousarray(out).reshape(-1, n), xp.ascontiguousarray(ref).reshape(-1, n)
    step = max(1, CHUNK // n)
    for at in range(0, o.shape[0], step):
        oc, rc = o[at : at + step], r[at : at + step].astype(xp.float64)
        oc = (to_float(oc, dtype, xp) if kind == "bfloat16" else oc).astype(xp.float64)
        q = _rounded(rc, kind, xp)
        ok = xp.isfinite(oc) & xp.isfinite(rc) & xp.isfinite(q)
        w = xp.where(ok, rc, 0.0)
        dev = {
            k: abs(xp.where(ok, d, 0.0)) for k, d in zip(("err", "rnd", "mass"), (oc - w, q - w, w))
        }
        yield at, {f"{k}{p}": (v**p).sum(1) for k, v in dev.items() for p in (1, 2)}


def scale_verdict(out, ref, dtype: str, bound: tuple[float, float], xp) -> str | None:
    """Why `out` fails the criterion above with bound (factor, floor), or None: the whole output
    first, then the worst row (rows whose reference is all zero are left to the band)."""
    factor, floor = bound
    total, worst = {}, (1.0, 0, "", ())  # (err / bound, p, where, (err, rnd, mass))
    with _quiet(xp):
        for at, s in error_norms(out, ref, dtype, xp):
            total = {k: total.get(k, 0.0) + float(v.sum()) for k, v in s.items()}
            for p in (1, 2):
                err, rnd, mass = (s[f"{k}{p}"] ** (1 / p) for k in ("err", "rnd", "mass"))
                score = xp.where(mass > 0, err / xp.maximum(factor * rnd + floor * mass, 1e-300), 0)
                i = int(xp.argmax(score)) if score.size else 0
                if score.size and float(score[i]) > worst[0]:
                    norms = (float(err[i]), float(rnd[i]), float(mass[i]))  # cupy: to the host
                    worst = (float(score[i]), p, f"row {at + i}", norms)
    for p in (1, 2):
        err, rnd, mass = (total.get(f"{k}{p}", 0.0) ** (1 / p) for k in ("err", "rnd", "mass"))
        if mass > 0 and err > factor * rnd + floor * mass:
            worst = (2.0, p, "the whole output", (err, rnd, mass))
            break
    if worst[0] <= 1.0:
        return None
    _, p, where, (err, rnd, mass) = worst
    return (
        f"relative L{p} {err / mass:.3g} of {where} exceeds {(factor * rnd + floor * mass) / mass:.3g}"
        f" = {factor:g} x {rnd / mass:.3g} (what rounding the reference to "
        f"{stored_type(out, dtype)} costs) + {floor:.3g}"
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
    `scale(name, stored_type) -> (factor, floor) | None` (None: ROUNDING_FACTOR, FLOOR of the type). Returns (outcome, detail, max_abs_err, max_rel_err)."""
    max_abs = max_rel = 0.0

    def result(outcome: Outcome, detail: str) -> tuple[Outcome, str, float, float]:
        """The verdict with the largest errors of the outputs judged so far."""
        return outcome, detail, max_abs, max_rel

    for name, before in inputs_before.items():
        n, at = differs(inputs[name], before, xp)
        if n:
            return result(
                Outcome.INPUT_MODIFIED,
                f"input {name}: {n} of {before.size} elements changed (first at {at})",
            )
    for name, out in outputs.items():
        n, at = unwritten(out, xp)
        if n:
            return result(
                Outcome.UNWRITTEN,
                f"output {name}: {n} of {out.size} elements never written (first at {at})",
            )
    for name, want in reference.items():
        verdict = custom(name, outputs[name], want) if custom is not None else None
        if verdict is not None:
            ok, detail = verdict
            if not ok:
                return result(Outcome.WRONG_RESULT, f"output {name}: {detail}")
            continue
        atol, rtol = tolerance(name)
        c = compare(outputs[name], want, dtype, atol, rtol, xp)
        max_abs, max_rel = max(max_abs, c["max_abs"]), max(max_rel, c["max_rel"])
        if c.get("shape"):
            return result(
                Outcome.WRONG_RESULT,
                f"output {name}: shape {c['shape'][0]}, reference {c['shape'][1]}",
            )
        if c["bad"]:
            return result(
                Outcome.WRONG_RESULT,
                f"output {name}: {c['bad']} of {want.size} elements outside atol={atol:g} "
                f"rtol={rtol:g}; worst at {c['worst']}: got {c['got']:.6g}, want {c['want']:.6g}",
            )
        kind = stored_type(outputs[name], dtype)
        bound = (scale(name, kind) if scale else None) or (ROUNDING_FACTOR, FLOOR.get(kind, 1e-4))
        why = scale_verdict(outputs[name], want, dtype, tuple(map(float, bound)), xp)
        if why:
            return result(Outcome.WRONG_RESULT, f"output {name}: {why} (within the band)")
    for name, out in (outputs_again or {}).items():
        n, at = differs(out, outputs[name], xp)
        if n:
            return result(
                Outcome.NONDETERMINISTIC,
                f"output {name}: {n} of {out.size} elements differ between two runs "
                f"on the same inputs (first at {at})",
            )
    return result(Outcome.OK, "")
