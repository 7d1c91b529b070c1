"""Training with built RMSNorm kernels (issue 29, item 2): the built backward (rmsnorm_bwd) as the
autograd formula of the forward's torch custom op, so torch.compile traces forward and backward as
one graph (no graph break).

    import ptxbuild
    from ptxbuild.runtime.autograd import register_rmsnorm_training
    fwd, bwd = ptxbuild.load("rmsnorm@h200"), ptxbuild.load("rmsnorm_bwd@h200")
    rms = register_rmsnorm_training(fwd, bwd, options={"rstd": True})   # the forward mode to use
    y = rms(x, weight)[0]                   # outputs as the forward op returns them (y, [residual_out], [rstd])
    torch.compile(lambda x, w: rms(x, w)[0], fullgraph=True)(x, w).sum().backward()

The forward's mode should write rstd (option rstd = true): the backward then reads it (its
rstd_in = true modes). Without it the backward runs a rstd_in = false mode if one is built, else
rstd is recomputed here with torch (one more read of x). With a residual, x's and residual's
gradients are the same tensor (h = x + residual), plus the gradient arriving at residual_out
(the backward's dresidual_in mode; without one the residual_out gradient is added with torch).
dbias comes from a bias mode of the backward, else dy.sum over rows in torch.

The backward target runs two kernels (KERNELS). run_stages() here is BuiltKernel.run minus its
input check (BuiltKernel.problem_of takes the [M] rstd input for a fixed-size one), launching
every kernel of the call through BuiltKernel._calls on the caller's stream.
torch is imported when this module is.
"""

from __future__ import annotations

import torch

from ..problem import Problem
from .arrays import Ptr, TorchXp
from .driver import _Current, _device, _launch
from .errors import LoaderError
from .kernel import BuiltKernel
from .torch_ops import NAMESPACE, _MetaXp, _mode_index, register

_registered: dict = {}


# ---------------------------------------------------------------- several kernels, one call
def run_stages(kernel: BuiltKernel, mode, **arrays) -> dict:
    """BuiltKernel.run for an op of several kernels (KERNELS / launches / stage_args), torch tensors
    in, every output out by name (scratch outputs included)."""
    # the mode is given: modes of one op can share input names (plain and fp32-weight + bias), so
    # binding by names alone could pick another
    arrays = {n: arrays[n] for n in mode.names}
    # not kernel.problem_of: its input check takes a [M] input (rstd) for a fixed-size one
    primary = arrays[mode.names[0]]
    for name, a in arrays.items():
        if a.device != primary.device or not a.is_contiguous():
            raise LoaderError(
                f"{kernel.target}: input {name} must be contiguous on {primary.device}"
            )
    dtype = str(primary.dtype).removeprefix("torch.")
    problem = Problem.make(kernel.op.NAME, dtype, tuple(primary.shape), mode.options)
    entry = kernel.select(problem)
    if entry is None:
        raise LoaderError(
            f"{kernel.target}: no built variant covers {problem.label()}; built shapes for "
            f"{problem.dtype}: {kernel._built_shapes(problem.dtype, problem.opts_json)}"
        )
    ordinal = (
        primary.device.index if primary.device.index is not None else torch.cuda.current_device()
    )
    dev = _device(ordinal)
    outputs = kernel._outputs(problem, primary)
    stream = torch.cuda.current_stream(primary.device).cuda_stream
    ins = {n: Ptr(a) for n, a in arrays.items()}
    outs = {n: Ptr(a) for n, a in outputs.items()}
    with _Current(dev):
        for fn, geom, args in kernel._calls(entry, problem, dev, ins, outs):
            _launch(fn, geom, args, stream)
    kernel.calls += 1
    return outputs


# ---------------------------------------------------------------- the backward as a custom op
def _bwd_mode(bwd: BuiltKernel, want: dict) -> dict | None:
    """The built backward mode whose options include `want` (the op's defaults filled in)."""
    defaults = dict(bwd.op.OPTIONS)
    for m in bwd.modes():
        full = {**defaults, **m.options}
        if all(full.get(k) == v for k, v in want.items()):
            return m
    return None


def _bwd_op(bwd: BuiltKernel, mode) -> object:
    """ptxbuild::<target>_bwd_m<i>: the backward mode's inputs -> (dx, dweight?, dbias?)."""
    i = bwd.modes().index(mode)
    qual = f"{NAMESPACE}::{bwd.target.replace('@', '_')}_m{i}"
    if qual in _registered:
        return _registered[qual]
    like = bwd.problem_like(mode)
    outs = [n for n in bwd.op.make_outputs(like, _MetaXp()) if n not in bwd.op.SCRATCH]
    schema = (
        "("
        + ", ".join(f"Tensor {n}" for n in mode.names)
        + ") -> ("
        + ", ".join("Tensor" for _ in outs)
        + ")"
    )

    def impl(*tensors):
        res = run_stages(bwd, mode, **dict(zip(mode.names, tensors)))
        return tuple(res[n] for n in outs)

    custom = torch.library.custom_op(qual, impl, mutates_args=(), schema=schema)

    @custom.register_fake
    def _fake(*tensors):
        x = tensors[0]
        prob = Problem.make(
            bwd.op.NAME, str(x.dtype).removeprefix("torch."), tuple(x.shape), mode.options
        )
        res = bwd.op.make_outputs(prob, TorchXp(torch, x.device))
        return tuple(res[n] for n in outs)

    _registered[qual] = (custom, outs)
    return _registered[qual]


def register_rmsnorm_training(fwd: BuiltKernel, bwd: BuiltKernel, options: dict | None = None):
    """The forward's custom op (torch_ops.register) with the built backward registered as its
    autograd formula (torch.library.register_autograd). Returns the op."""
    fop = register(fwd, options)
    fmode = fwd.modes()[_mode_index(fwd, options)]
    fo = {**dict(fwd.op.OPTIONS), **fmode.options}
    if ("autograd", id(fop)) in _registered:
        return fop
    outs = list(fwd.op.make_outputs(fwd.problem_like(fmode), _MetaXp()))
    names = list(fmode.names)
    res, bias = bool(fo.get("residual")), bool(fo.get("bias"))
    has_w = fo.get("weight", "x") != "none"
    eps = float(fo.get("eps", 1e-6))
    base = {"weight": fo.get("weight", "x"), "residual": False}
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
        dy = g["y"].contiguous()
        dres = g.get("residual_out")
        flat_h, flat_dy = h.reshape(-1, h.shape[-1]), dy.reshape(-1, dy.shape[-1])
        want = dict(base)
        if rstd is None:
            want["rstd_in"] = False
        if res and dres is not None:
            want.update(residual=True, dresidual_in=True)
        if bias:
            want["bias"] = True
        mode = _bwd_mode(bwd, want)
        if mode is None and "bias" in want:
            want.pop("bias")
            mode = _bwd_mode(bwd, want)
        if mode is None and want.get("residual"):
            want.update(residual=False, dresidual_in=False)
            mode = _bwd_mode(bwd, want)
        if mode is None and want.get("rstd_in") is False:
            want.pop("rstd_in")
            rstd = torch.rsqrt(flat_h.float().pow(2).mean(-1) + eps)
            mode = _bwd_mode(bwd, want)
        if mode is None:
            raise LoaderError(
                f"{bwd.target}: no built mode for {want}; built: "
                + "; ".join(m.label() for m in bwd.modes())
            )
        op, bouts = _bwd_op(bwd, mode)
        have = {
            "x": flat_h,
            "dy": flat_dy,
            "weight": w,
            "rstd": None if rstd is None else rstd.reshape(-1),
            "dres": None if dres is None else dres.reshape(-1, dres.shape[-1]).contiguous(),
        }
        got = dict(zip(bouts, op(*(have[n] for n in mode.names))))
        dx = got["dx"].reshape(h.shape)
        if dres is not None and not {**dict(bwd.op.OPTIONS), **mode.options}.get("dresidual_in"):
            dx = dx + dres
        dw = got.get("dweight") if has_w else None
        db = None
        if bias:
            db = (
                got["dbias"]
                if "dbias" in got
                else flat_dy.sum(0).to(w.dtype if w is not None else dy.dtype)
            )
        per = {"x": dx, "residual": dx, "weight": dw, "bias": db}
        return tuple(per.get(n) for n in names)

    torch.library.register_autograd(fop, backward, setup_context=setup_context)
    _registered[("autograd", id(fop))] = True
    return fop
