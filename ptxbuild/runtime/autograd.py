"""Training with built RMSNorm kernels (issue 28 item 1, issue 29 item 2): the forward's torch
custom op with an autograd formula that runs the built backward (rmsnorm_bwd), so torch.compile
traces forward and backward as one graph (no graph break).

    import ptxbuild
    from ptxbuild.runtime.autograd import register_rmsnorm_training
    fwd = ptxbuild.load("rmsnorm@h200")
    bwd = [ptxbuild.load("rmsnorm_bwd@h200"), ptxbuild.load("rmsnorm_bwd_fp32@h200")]  # by dtype
    rms = register_rmsnorm_training(fwd, bwd, options={"rstd": True})   # the forward mode to use
    y = rms(x, weight)[0]                   # outputs as the forward op returns them (y, [residual_out], [rstd])
    torch.compile(lambda x, w: rms(x, w)[0], fullgraph=True)(x, w).sum().backward()

The backward of a call runs the first built backward target (of `bwd`, one kernel or a list: one
per dtype) that has the call's dtype, a mode for its options (eps, weight type, bias, residual)
and a variant for its shape; where none has, or a kernel refuses the call at run time, the same
gradients come from the closed form in torch (`reference_backward`): correct, never a silent cut.
`bwd=None` (no backward built) always takes the closed form.

The forward's mode should write rstd (option rstd = true): the backward then reads it (its
rstd_in = true modes). Without it the backward runs a rstd_in = false mode if one is built, else
rstd is computed here with torch (one more read of x). With a residual, x's and residual's
gradients are the same tensor (h = x + residual), plus the gradient arriving at residual_out
(the backward's dresidual_in mode). A backward mode must match the call's options (weight type,
bias, residual, eps) exactly; without one the call takes the closed form.
torch is imported when this module is.
"""

from __future__ import annotations

import warnings

import torch
from torch import library as torch_library

from ..problem import Problem
from . import torch_ops
from .errors import LoaderError
from .torch_ops import _META, _dtype, _mode_index, _option_kwargs, mode_with, register

_registered: dict = {}


# ---------------------------------------------------------------- the closed form, in torch
def reference_backward(x, dy, weight=None, rstd=None, dres=None, *, eps: float, bias=False):
    """(dx, dweight, dbias) of y = x * rstd(x) * weight [+ bias] for rows x [M, N] (x: the input,
    or the residual sum h; fp32 math, outputs in the inputs' types; dweight None without a weight,
    dbias None without a bias). The arguments are rmsnorm_bwd's inputs: `rstd` [M] as the forward
    wrote it, or None (computed here); `dres`: the gradient arriving at h itself (added to dx)."""
    acc = torch.promote_types(x.dtype, torch.float32)
    hf, g = x.to(acc), dy.to(acc)
    if rstd is None:
        rstd = _rstd(x, eps)
    r = rstd.to(acc).reshape(-1, 1)
    n = hf * r
    gw = g * weight.to(acc) if weight is not None else g
    dx = r * (gw - n * (gw * n).mean(-1, keepdim=True))
    if dres is not None:
        dx = dx + dres.to(acc)
    dw = (g * n).sum(0).to(weight.dtype) if weight is not None else None
    db = g.sum(0).to(weight.dtype if weight is not None else dy.dtype) if bias else None
    return dx.to(x.dtype), dw, db


def _rstd(h, eps: float):
    """1 / sqrt(mean(h^2) + eps) per row in fp32: one reduction over the stored h."""
    norm = torch.linalg.vector_norm(h, dim=-1, dtype=torch.promote_types(h.dtype, torch.float32))
    return torch.rsqrt(norm.square() / h.shape[-1] + eps)


# ---------------------------------------------------------------- the backward as a custom op
def _bwd_op(bwd, mode):
    """ptxbuild::<target>_m<i>: the backward mode's inputs -> its outputs (dx, dweight?, dbias?).
    The real call runs the built kernels (the per-call fast path); a call they refuse at run time
    (LoaderError: a shape outside what the build covers) gets the closed form, with a warning."""
    i = bwd.modes().index(mode)
    if (qual := _registered.get(("bwd", id(bwd), i))) is not None:  # every later backward call
        _registered["serving"][qual] = bwd
        return _registered[qual]
    outs, schema = torch_ops._op_schema(bwd, mode, single=False)
    opts, kwargs = {**dict(bwd.op.OPTIONS), **mode.options}, _option_kwargs(bwd, mode.options)
    qual = torch_ops.qualified(f"{bwd.target.replace('@', '_')}_m{i}", schema, kwargs)
    _registered.setdefault("serving", {})[qual] = bwd
    _registered[("bwd", id(bwd), i)] = qual
    if qual in _registered:
        return _registered[qual]

    def impl(*tensors):
        kernel = _registered["serving"][qual]
        try:
            got = kernel(*tensors, **kwargs)
        except LoaderError as exc:
            return _closed_form(kernel, opts, dict(zip(mode.names, tensors)), outs, exc)
        return got if isinstance(got, tuple) else (got,)

    _registered[qual] = (torch_ops._custom_op(qual, impl, bwd, mode, outs, schema), outs)
    return _registered[qual]


def _closed_form(kernel, opts: dict, ins: dict, outs: list, why: Exception) -> tuple:
    warnings.warn(f"{why}; the gradients come from torch's closed form", RuntimeWarning, 3)
    got = reference_backward(**ins, eps=float(opts["eps"]), bias=bool(opts.get("bias")))
    return tuple(dict(zip(("dx", "dweight", "dbias"), got))[n] for n in outs)


def _plan(bwds: list, dtype, shape: tuple, want: dict):
    """(kernel, mode, rstd computed here) of the first built backward whose mode has exactly the
    call's options (`want`; a rstd_in = true mode also serves a call without rstd: it is computed
    here) and a variant for its shape, or None (the closed form then)."""
    for bwd in bwds:
        for w in (want, {**want, "rstd_in": True}):
            mode = mode_with(bwd, w) if _dtype(dtype) in bwd.dtypes else None
            problem = mode and Problem.make(bwd.op.NAME, _dtype(dtype), shape, mode.options)
            if mode is not None and bwd.select(problem) is not None:
                return bwd, mode, w is not want and want.get("rstd_in") is False
    return None


def register_rmsnorm_training(fwd, bwd=None, options: dict | None = None):
    """The forward's custom op (torch_ops.register) with autograd registered: the built backward
    (`bwd`: a loaded rmsnorm_bwd target, a list of them, or None) where it covers the call, else
    the closed form in torch. Returns the op."""
    bwds = [] if bwd is None else list(bwd) if isinstance(bwd, list | tuple) else [bwd]
    fop = register(fwd, options)
    _registered.setdefault("bwds", {})[id(fop)] = bwds  # the latest registration serves
    if ("autograd", id(fop)) in _registered:
        return fop
    fmode = fwd.modes()[_mode_index(fwd, options)]
    fo = {**dict(fwd.op.OPTIONS), **fmode.options}
    outs = list(fwd.op.make_outputs(fwd.problem_like(fmode), _META))
    names = list(fmode.names)
    res, bias = bool(fo.get("residual")), bool(fo.get("bias"))
    has_w = fo.get("weight", "x") != "none"
    eps = float(fo.get("eps", 1e-6))
    base = {"weight": fo.get("weight", "x"), "eps": eps, "residual": False}
    if fo.get("residual_out_fp32"):
        raise LoaderError(f"{fwd.target}: no backward for residual_out_fp32 yet (issue 29)")

    def setup_context(ctx, inputs, output):
        got = dict(zip(names, inputs))
        out = dict(zip(outs, output if isinstance(output, tuple) else (output,)))
        h = out["residual_out"] if res else got["x"]
        ctx.save_for_backward(h, got.get("weight"), out.get("rstd"))

    def backward(ctx, *grads):
        h, w, rstd = ctx.saved_tensors
        g = dict(zip(outs, grads))
        dy = g["y"] if g.get("y") is not None else torch.zeros_like(h)
        dres = g.get("residual_out")
        n = h.shape[-1]
        flat = {
            "x": h.reshape(-1, n),
            "dy": dy.reshape(-1, n).contiguous(),
            "weight": w,
            "rstd": None if rstd is None else rstd.reshape(-1),
            "dres": None if dres is None else dres.reshape(-1, n).contiguous(),
        }
        want = dict(base, bias=bias, rstd_in=rstd is not None)
        if dres is not None:
            want.update(residual=True, dresidual_in=True)
        plan = _plan(_registered["bwds"][id(fop)], h.dtype, tuple(flat["x"].shape), want)
        if plan is None:
            dx, dw, db = reference_backward(**flat, eps=eps, bias=bias)
        else:
            kernel, mode, compute_rstd = plan
            if compute_rstd:
                flat["rstd"] = _rstd(flat["x"], eps)
            op, bouts = _bwd_op(kernel, mode)
            got = dict(zip(bouts, op(*(flat[k] for k in mode.names))))
            dx, dw, db = got["dx"], got.get("dweight"), got.get("dbias")
        dx = dx.reshape(h.shape)
        per = {"x": dx, "residual": dx, "weight": dw if has_w else None, "bias": db}
        return tuple(per.get(k) for k in names)

    torch_library.register_autograd(fop, backward, setup_context=setup_context)
    _registered[("autograd", id(fop))] = True
    return fop
