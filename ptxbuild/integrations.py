"""Built kernels inside models no one here wrote: one call swaps a model's RMSNorms for ptxbuild's.

    import ptxbuild
    model = transformers.AutoModelForCausalLM.from_config(config).cuda().bfloat16()
    n = ptxbuild.patch_rmsnorm(model, target="rmsnorm@h200")    # every *RMSNorm module, in place

A module counts as an RMSNorm when its class name ends in "RMSNorm" (transformers' LlamaRMSNorm,
Qwen2RMSNorm, MistralRMSNorm, ...; torch.nn.RMSNorm) and it holds a 1-D `weight` and its epsilon
as `variance_epsilon` or `eps`. Each is replaced by a PtxbuildRMSNorm that keeps the very same
weight Parameter (state_dict keys and values unchanged) and calls the built kernel on the rows of
its input. The built kernel must have been built for the model's epsilon: a mismatch raises before
anything is replaced.

Where the built kernel does not run, the replaced module's own forward does (the stock path, the
same code as before the patch): CPU tensors, a dtype other than the weight's, a shape the build
does not cover (refused once, then remembered) and, by default, inside torch.compile regions
(`compiled="stock"`: inductor fuses the stock norm with the residual add before it and the cast
after it, where a custom op would stay a kernel of its own; `compiled="ptxbuild"` calls the
custom op there instead, no graph break).

Training: where autograd records, the forward is the kernel's custom op with an autograd formula
(runtime/autograd.py). Its backward runs a built backward target (`backward="auto"`: every built
target of the same GPU whose op is rmsnorm_bwd in the kernelfile, one per dtype) where one covers
the call, else the closed form in torch: gradients are always those of the module's math, never
cut. `backward=None`: the closed form only; or pass loaded backward kernels.

Only `ptxbuild.load` is used to get the kernels (torch is imported here, never by ptxbuild itself).
"""

from __future__ import annotations

import functools
import warnings

from .runtime.errors import LoaderError


class PatchError(ValueError):
    """The model's RMSNorms cannot take the built kernel; the message says why."""


def _eps_of(module) -> float | None:
    for name in ("variance_epsilon", "eps"):
        v = getattr(module, name, None)
        if isinstance(v, int | float):
            return float(v)
    return None


def is_rmsnorm(module) -> bool:
    """The modules patch_rmsnorm replaces (see the module docstring)."""
    w = getattr(module, "weight", None)
    return (
        type(module).__name__.endswith("RMSNorm")
        and getattr(w, "ndim", 0) == 1
        and _eps_of(module) is not None
    )


def built_eps(kernel) -> set[float] | None:
    """The epsilons a loaded rmsnorm kernel was built for (plain mode), or None if it cannot say."""
    if not hasattr(kernel, "modes"):
        return None
    full = [{**dict(kernel.op.OPTIONS), **m.options} for m in kernel.modes()]
    return {float(o["eps"]) for o in full if "eps" in o and not o.get("residual")}


def backward_kernels(kernel, kernelfile=None) -> list:
    """The built backward targets of a loaded forward kernel (its op's name + "_bwd", on its GPU),
    loaded as it was (allow_fallback); one that cannot be loaded is skipped with a warning (its
    calls take the closed form)."""
    from .runtime import load
    from .runtime.locate import declared_targets

    fallback = bool(getattr(kernel, "allow_fallback", False))  # as the forward
    declared = declared_targets(f"{kernel.op.NAME}_bwd", kernel.target.split("@", 1)[1], kernelfile)
    unbuilt = [t for t, built in declared.items() if not built]
    if unbuilt:  # declared for this GPU and never built: say so, do not fall back in silence
        warnings.warn(
            f"{', '.join(unbuilt)}: declared but not built, so the backward calls they would take "
            f"run torch's closed form; build them: ptxbuild build {' '.join(unbuilt)}",
            stacklevel=3,
        )
    out = []
    for t in (t for t, built in declared.items() if built):
        try:
            out.append(load(t, kernelfile=kernelfile, allow_fallback=fallback))
        except LoaderError as exc:
            warnings.warn(f"{exc}; backward calls it covers take torch's closed form", stacklevel=3)
    return out


def training_callable(kernel, eps: float | None, backward="auto", kernelfile=None):
    """What the replaced modules call: f(x2d, weight) -> y2d, the kernel itself in eager, its custom
    op under torch.compile and where autograd records (with the built or closed-form backward)."""
    from .runtime.autograd import register_rmsnorm_training
    from .runtime.torch_ops import mode_with, module_callable

    want = {} if eps is None else {"eps": eps}  # the modes called as f(x, weight), with rstd or not
    plain, train = (mode_with(kernel, {**want, "rstd": r}, ("x", "weight")) for r in (False, True))
    if (plain := plain or train) is None:
        modes = "; ".join(m.label() for m in kernel.modes())
        raise PatchError(f"{kernel.target}: no mode f(x, weight) for eps {eps}; built: {modes}")
    bwds = backward_kernels(kernel, kernelfile) if backward == "auto" else backward
    opts = {**dict(kernel.op.OPTIONS), **(train or plain).options}
    op = register_rmsnorm_training(kernel, bwds, opts)
    # eager: the mode's options as built (none for the default one: no per-call keywords; a mode
    # writing rstd that binds first then returns (y, rstd), still right)
    fn = module_callable(kernel, plain.options or None, op=op)
    fn.bwd, fn.backward = list(bwds or []), [b.target for b in bwds or []]
    return fn


@functools.cache
def _module_class():
    import torch
    from torch import nn

    class PtxbuildRMSNorm(nn.Module):
        """An RMSNorm whose CUDA rows run a ptxbuild kernel; same weight, same epsilon."""

        def __init__(self, fn, weight, eps: float, target: str, cuda_only: bool, stock, compiled):
            super().__init__()
            self.fn, self.weight, self.eps, self.target = fn, weight, eps, target
            self.cuda_only, self.compiled = cuda_only, compiled
            self.variance_epsilon = eps  # what transformers' RMSNorms call it
            self.__dict__["_stock"] = stock  # not a submodule: state_dict keys stay the model's
            self._refused: set = set()

        def stock_forward(self, x):
            """The replaced module's own forward (it holds the same weight Parameter)."""
            return self._stock(x)

        def forward(self, x):
            n = self.weight.shape[0]
            if (
                self.compiled == "stock"
                if torch.compiler.is_compiling()
                else (self.cuda_only and not x.is_cuda)
                or x.dtype != self.weight.dtype
                or x.shape[-1] != n
                or (x.shape, x.dtype) in self._refused
            ):
                return self.stock_forward(x)
            try:
                y = self.fn(x.reshape(-1, n).contiguous(), self.weight)
            except LoaderError as exc:  # a shape the build does not cover: the stock path
                self._refused.add((x.shape, x.dtype))
                warnings.warn(f"{exc}; running the model's own RMSNorm", stacklevel=2)
                return self.stock_forward(x)
            return (y[0] if isinstance(y, tuple) else y).reshape(x.shape)

        def extra_repr(self) -> str:
            bwd = ", ".join(getattr(self.fn, "backward", ["?"])) or "torch closed form"
            return f"{self.weight.shape[0]}, eps={self.eps}, target={self.target}, backward={bwd}"

    return PtxbuildRMSNorm


def patch_rmsnorm(
    model,
    target: str = "rmsnorm@h200",
    *,
    kernelfile=None,
    kernel=None,
    check_eps: bool = True,
    backward="auto",
    compiled: str = "stock",
    cuda_only: bool | None = None,
) -> int:
    """Replace every RMSNorm module of `model` (in place) by one calling the built `target`; returns
    how many were replaced. `kernelfile`: where `target` (and its backward) is declared (default:
    ./kernelfile.toml or the nearest one above the working directory). `kernel`: an already loaded
    kernel, or any callable f(x2d, weight) -> y2d (used as it is, autograd through its own ops),
    instead of ptxbuild.load(target). `backward`: "auto", None or loaded backward kernels (see the
    module docstring). `compiled`: "stock" or "ptxbuild", what runs inside torch.compile regions.
    `cuda_only`: take the stock path for CPU tensors (default: for a loaded kernel)."""
    if compiled not in ("stock", "ptxbuild"):
        raise PatchError(f"compiled={compiled!r}: use 'stock' or 'ptxbuild'")
    found = [(name, m) for name, m in model.named_modules() if is_rmsnorm(m)]
    if any(name == "" for name, _ in found):
        raise PatchError("the model itself is an RMSNorm: patch the model that holds it")
    if not found:
        raise PatchError(
            f"{type(model).__name__} has no RMSNorm module (a class named *RMSNorm with a 1-D weight "
            "and variance_epsilon or eps)"
        )
    if kernel is None:
        from .runtime import load  # what ptxbuild.load calls

        kernel = load(target, kernelfile=kernelfile)
    eps_built = built_eps(kernel) if check_eps else None
    if eps_built is not None:
        wrong = sorted({_eps_of(m) for _, m in found} - eps_built)
        if wrong:
            raise PatchError(
                f"{target} is built for eps {sorted(eps_built)}, the model's RMSNorms use {wrong}: "
                "declare that eps in the kernelfile's options and rebuild"
            )
    built = hasattr(kernel, "modes")  # a loaded kernel (CUDA only), not a plain callable
    fns = {  # check_eps=False: the first mode, whatever its eps
        eps: training_callable(kernel, eps if check_eps else None, backward, kernelfile)
        if built
        else kernel
        for eps in {_eps_of(m) for _, m in found}
    }
    cls = _module_class()
    only = built if cuda_only is None else cuda_only  # the stock path for CPU tensors
    for name, m in found:
        parent, _, attr = name.rpartition(".")
        eps = _eps_of(m)
        new = cls(fns[eps], m.weight, eps, target, only, stock=m, compiled=compiled)
        setattr(model.get_submodule(parent), attr, new)  # "": the model itself
    return len(found)
