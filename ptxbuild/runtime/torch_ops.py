"""Built kernels as PyTorch custom ops (torch's library.custom_op), so they work under torch.compile.

    import ptxbuild
    from ptxbuild.torch_ops import register
    rms = register(ptxbuild.load("rmsnorm@h200"))      # torch.ops.ptxbuild.rmsnorm_h200
    y = torch.compile(lambda x, w: rms(x, w))(x, w)

One custom op per (target, option set): its schema lists the op's input names as Tensors and
returns the op's outputs; a fake (meta) implementation allocates the outputs exactly as the real
one does, so the compiler can trace shapes and dtypes without a GPU. No autograd formula is
registered here: calling one on tensors that require grad raises in backward (autograd.py
registers RMSNorm's, running the built backward). torch is imported when this module is, never by ptxbuild.runtime itself (kernel.torch_op
imports this module when asked). Public path: ptxbuild.torch_ops.
"""

from __future__ import annotations

import re

import torch
from torch import library as torch_library

from ..problem import Problem, digest
from .arrays import TorchXp as _TorchXp
from .errors import LoaderError

NAMESPACE = "ptxbuild"
_registered: dict[str, object] = {}
# the kernel each op runs: the one registered last (a target loaded again, e.g. by another test or
# with another launcher, takes over the op already defined for its name)
_serving: dict[str, tuple] = {}
_signatures: dict[str, tuple] = {}  # the schema and options each name was defined with
_META = _TorchXp(torch, "meta")  # make_outputs' outputs as shapes and dtypes, no memory


def op_name(kernel, options: dict | None = None) -> str:
    """ptxbuild::<op>_<gpu>, plus _m<i> for option sets after the first."""
    base = re.sub(r"\W", "_", kernel.target.replace("@", "_"))
    i = _mode_index(kernel, options)
    return base if i == 0 or len(kernel.modes()) == 1 else f"{base}_m{i}"


def mode_with(kernel, options: dict, names: tuple | None = None):
    """The first built mode whose options (the op's defaults filled in) include `options` (and
    whose input names are `names`), or None."""
    defaults = dict(kernel.op.OPTIONS)
    for m in kernel.modes():
        full = {**defaults, **m.options}
        if all(full.get(k) == v for k, v in options.items()) and names in (None, m.names):
            return m
    return None


def _mode_index(kernel, options: dict | None) -> int:
    if not options:
        return 0
    modes = kernel.modes()
    if (m := mode_with(kernel, options)) is not None:
        return modes.index(m)
    raise LoaderError(
        f"{kernel.target}: no built mode has options {options}; built: "
        + "; ".join(m.label() for m in modes)
    )


def register(kernel, options: dict | None = None):
    """The torch.ops callable for `kernel`'s option set matching `options` (default: the first built)."""
    if kernel.op.NAME == "kda" and hasattr(kernel, "covers"):  # a ChunkKDA (runtime/kda.py)
        return register_kda(kernel)
    name = op_name(kernel, options)
    mode = kernel.modes()[_mode_index(kernel, options)]
    outs, schema = _op_schema(kernel, mode)
    opt_kwargs = _option_kwargs(kernel, mode.options)
    qual = qualified(name, schema, opt_kwargs)
    _serving[qual] = (kernel, opt_kwargs)
    if qual in _registered:
        return _registered[qual]

    def impl(*tensors):  # the kernel's per-call path (a dictionary lookup, one launch)
        k, kwargs = _serving[qual]
        return k(*tensors, **kwargs)

    _registered[qual] = _custom_op(qual, impl, kernel, mode, outs, schema)
    return _registered[qual]


def qualified(name: str, schema: str, opt_kwargs: dict) -> str:
    """ptxbuild::<name>, where no other schema and options hold it. Another build of the same
    target (another project, a test's) can build other modes: it takes over the name only when its
    schema and options are the same, else it gets a name of its own."""
    signature = (schema, tuple(sorted(opt_kwargs.items())))
    qual = NAMESPACE + "::" + re.sub(r"\W", "_", name)
    if _signatures.setdefault(qual, signature) != signature:
        qual = f"{qual}_{digest(*map(str, signature))[:8]}"
        _signatures[qual] = signature
    return qual


def _op_schema(kernel, mode, single: bool = True) -> tuple[list, str]:
    """(output names, schema) of a custom op running `mode`: its input names as Tensors -> its
    outputs in order (scratch buffers are the kernel's own), one Tensor where `single` and there
    is one, else a tuple."""
    like = kernel.problem_like(mode)
    outs = [n for n in kernel.op.make_outputs(like, _META) if n not in kernel.op.SCRATCH]
    ret = "Tensor" if single and len(outs) == 1 else "(" + ", ".join(["Tensor"] * len(outs)) + ")"
    return outs, "(" + ", ".join(f"Tensor {n}" for n in mode.names) + f") -> {ret}"


def _custom_op(qual: str, impl, kernel, mode, outs: list, schema: str):
    """torch's custom op `qual` running `impl`, with a fake (meta) implementation allocating
    `outs` exactly as the real call does (the kernel's make_outputs), returned as the schema says:
    one Tensor or a tuple."""
    custom = torch_library.custom_op(qual, impl, mutates_args=(), schema=schema)

    @custom.register_fake
    def _fake(*tensors):
        x = tensors[0]
        problem = Problem.make(kernel.op.NAME, _dtype(x), tuple(x.shape), mode.options)
        res = kernel.op.make_outputs(problem, _TorchXp(torch, x.device))
        return res[outs[0]] if schema.endswith("-> Tensor") else tuple(res[n] for n in outs)

    return custom


def _option_kwargs(kernel, opts: dict) -> dict:
    """Options to pass to BuiltKernel.run so it picks this mode even when modes share input names."""
    return {k: v for k, v in opts.items() if k in kernel.op.OPTIONS}


def _dtype(t) -> str:
    """A tensor's (or a torch dtype's) element type as ptxbuild names it."""
    return str(getattr(t, "dtype", t)).removeprefix("torch.")


def register_kda(kernel):
    """The torch.ops callable of a built KDA target (ptxbuild.runtime.kda.ChunkKDA), traceable by
    torch.compile with no graph break: ptxbuild::<target>(q, k, v, g, beta, A_log?, dt_bias?,
    initial_state?, lengths?, output_final_state) -> (o, final_state), states V-first ([N, HV, V,
    K]), the safe-gate path with every in-kernel flag on (ChunkKDA's checks run on the real call).
    Segment lengths are a static int list (cu_seqlens' values on the host). Without
    output_final_state, final_state is an empty tensor."""
    qual = f"{NAMESPACE}::{op_name(kernel)}"
    _serving[qual] = kernel
    if qual in _registered:
        return _registered[qual]
    lb = float(kernel.op.host.ref.LOWER_BOUND)
    schema = (
        "(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, Tensor? A_log, Tensor? dt_bias, "
        "Tensor? initial_state, int[]? lengths, bool output_final_state) -> (Tensor, Tensor)"
    )

    def impl(q, k, v, g, beta, A_log, dt_bias, initial_state, lengths, output_final_state):
        o, hT = _serving[qual](
            q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, initial_state=initial_state,
            output_final_state=output_final_state, use_qk_l2norm_in_kernel=True,
            use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, safe_gate=True,
            lower_bound=lb, state_v_first=True, lengths=lengths,
        )  # fmt: skip
        return o, hT if hT is not None else q.new_empty((0,), dtype=torch.float32)

    custom = torch_library.custom_op(qual, impl, mutates_args=(), schema=schema)

    @custom.register_fake
    def _fake(q, k, v, g, beta, A_log, dt_bias, initial_state, lengths, output_final_state):
        B, T, H, K = q.shape
        n = len(lengths) if lengths else B
        shape = (n, v.shape[2], v.shape[3], K) if output_final_state else (0,)
        return v.new_empty(v.shape), q.new_empty(shape, dtype=torch.float32)

    _registered[qual] = custom
    return custom


def module_callable(kernel, options: dict | None = None, op=None):
    """What a torch module should call for `kernel` (BuiltKernel.torch_op): the registered custom
    op while torch.compile traces (no graph break) or where autograd records, else the kernel
    itself: eager calls skip the dispatcher's round trip into Python (a few microseconds of host
    time per call). `op`: the custom op to call there instead of register(kernel, options) (e.g.
    autograd.register_rmsnorm_training's, whose backward runs the built backward).
    Without an autograd formula the custom op raises in backward: never a silent cut."""
    op = op if op is not None else register(kernel, options)
    opt_kwargs = {} if not options else _option_kwargs(kernel, options)
    compiling, grad_on = torch.compiler.is_compiling, torch.is_grad_enabled

    def call(*tensors):
        if compiling() or (grad_on() and any(t.requires_grad for t in tensors)):
            return op(*tensors)
        return kernel(*tensors, **opt_kwargs)

    call.op, call.kernel = op, kernel
    return call
