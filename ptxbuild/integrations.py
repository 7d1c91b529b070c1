"""Built kernels inside models no one here wrote: one call swaps a model's RMSNorms for ptxbuild's.

    import ptxbuild
    model = transformers.AutoModelForCausalLM.from_config(config).cuda().bfloat16()
    n = ptxbuild.patch_rmsnorm(model, target="rmsnorm@h200")    # every *RMSNorm module, in place

A module counts as an RMSNorm when its class name ends in "RMSNorm" (transformers' LlamaRMSNorm,
Qwen2RMSNorm, MistralRMSNorm, ...; torch.nn.RMSNorm) and it holds a 1-D `weight` and its epsilon
as `variance_epsilon` or `eps`. Each is replaced by a PtxbuildRMSNorm that keeps the very same
weight Parameter (state_dict keys and values unchanged) and calls the built kernel on the rows of
its input; CPU tensors and dtypes other than the weight's take torch's own rms_norm. The built
kernel must have been built for the model's epsilon: a mismatch raises before anything is replaced.

Only `ptxbuild.load` is used to get the kernel (torch is imported here, never by ptxbuild itself).
"""

from __future__ import annotations

from typing import Any


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
    modes = getattr(kernel, "modes", None)
    if modes is None:
        return None
    defaults = dict(getattr(getattr(kernel, "op", None), "OPTIONS", {}))
    return {
        float({**defaults, **m.options}["eps"])
        for m in modes()
        if "eps" in {**defaults, **m.options} and not m.options.get("residual")
    }


def torch_callable(kernel):
    """What the replaced modules call: the kernel's torch custom op (no graph break under
    torch.compile), from the runtime's `torch_op` attribute where it has one, else torch_ops."""
    op = getattr(kernel, "torch_op", None)
    if op is not None:
        return op
    try:
        from .torch_ops import register
    except ImportError:
        return kernel
    return register(kernel)


def _module_class():
    import torch
    from torch import nn

    class PtxbuildRMSNorm(nn.Module):
        """An RMSNorm whose CUDA rows run a ptxbuild kernel; same weight, same epsilon."""

        def __init__(self, fn, weight, eps: float, target: str, cuda_only: bool = True):
            super().__init__()
            self.fn, self.weight, self.eps, self.target = fn, weight, eps, target
            self.cuda_only = cuda_only
            self.variance_epsilon = eps  # what transformers' RMSNorms call it

        def forward(self, x):
            n = self.weight.shape[0]
            if (
                (self.cuda_only and not x.is_cuda)
                or x.dtype != self.weight.dtype
                or x.shape[-1] != n
            ):
                return torch.nn.functional.rms_norm(x, (n,), self.weight, self.eps)
            y = self.fn(x.reshape(-1, n).contiguous(), self.weight)
            return y.reshape(x.shape)

        def extra_repr(self) -> str:
            return f"{self.weight.shape[0]}, eps={self.eps}, target={self.target}"

    return PtxbuildRMSNorm


_CLASS: dict[str, Any] = {}


def patch_rmsnorm(
    model, target: str = "rmsnorm@h200", *, kernelfile=None, kernel=None, check_eps: bool = True
) -> int:
    """Replace every RMSNorm module of `model` (in place) by one calling the built `target`; returns
    how many were replaced. `kernelfile`: where `target` is declared (default: ./kernelfile.toml or
    the nearest one above the working directory). `kernel`: an already loaded kernel, or any
    callable f(x2d, weight) -> y2d, instead of ptxbuild.load(target)."""
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

        kernel = load(target, **({"kernelfile": kernelfile} if kernelfile else {}))
    eps_built = built_eps(kernel) if check_eps else None
    if eps_built is not None:
        wrong = sorted({_eps_of(m) for _, m in found} - eps_built)
        if wrong:
            raise PatchError(
                f"{target} is built for eps {sorted(eps_built)}, the model's RMSNorms use {wrong}: "
                "declare that eps in the kernelfile's options and rebuild"
            )
    built = hasattr(kernel, "modes")  # a loaded kernel (CUDA only), not a plain callable
    fn = torch_callable(kernel) if built else kernel
    if "cls" not in _CLASS:
        _CLASS["cls"] = _module_class()
    for name, m in found:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, _CLASS["cls"](fn, m.weight, _eps_of(m), target, built))
    return len(found)
