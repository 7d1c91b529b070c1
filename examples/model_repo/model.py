"""A tiny model whose RMSNorm runs the kernel ptxbuild built for this repository (build/rmsnorm@h200).

The kernel is loaded once through ptxbuild's runtime and registered as the custom op
torch.ops.ptxbuild.rmsnorm_h200, so the module works eagerly and under torch.compile. When the
kernel is not built or no GPU is present, RMSNorm uses torch's own rms_norm instead, and says why
once (`kernel_status()`); inputs the built kernel does not cover raise a one-line LoaderError.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
TARGET = "rmsnorm@h200"
_state: dict = {}


def load_kernel():
    """(custom op, BuiltKernel) for TARGET, or (None, None) with the reason in kernel_status()."""
    if "op" not in _state:
        _state.update(op=None, kernel=None, why="")
        try:
            import ptxbuild
            from ptxbuild.runtime import LoaderError
            from ptxbuild.torch_ops import register

            if not torch.cuda.is_available():
                raise LoaderError("no CUDA GPU is visible")
            kernel = ptxbuild.load(TARGET, kernelfile=HERE / "kernelfile.toml")
            _state.update(
                op=register(kernel),
                kernel=kernel,
                eps=kernel.modes()[0].options.get("eps"),
                why="using " + repr(kernel),
            )
        except (ImportError, LoaderError) as exc:
            _state["why"] = (
                f"{TARGET} not used ({exc}); falling back to torch.nn.functional.rms_norm"
            )
    return _state["op"], _state["kernel"]


def kernel_status() -> str:
    load_kernel()
    return _state["why"]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6, use_kernel: bool = True):
        super().__init__()
        self.dim, self.eps, self.use_kernel = dim, eps, use_kernel
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        op, _ = load_kernel() if self.use_kernel else (None, None)
        if op is None or not x.is_cuda:
            return torch.nn.functional.rms_norm(x, (self.dim,), self.weight, self.eps)
        if _state["eps"] != self.eps:
            raise ValueError(
                f"{TARGET} is built for eps={_state['eps']}, this RMSNorm has eps={self.eps}"
            )
        y = op(x.reshape(-1, self.dim).contiguous(), self.weight)
        return y.reshape(x.shape)


class TinyModel(nn.Module):
    """embedding -> (RMSNorm -> MLP, residual) x depth -> RMSNorm -> logits."""

    def __init__(self, vocab: int = 256, dim: int = 2048, depth: int = 2, use_kernel: bool = True):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.norms = nn.ModuleList(RMSNorm(dim, use_kernel=use_kernel) for _ in range(depth))
        self.mlps = nn.ModuleList(
            nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
            for _ in range(depth)
        )
        self.final = RMSNorm(dim, use_kernel=use_kernel)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        for norm, mlp in zip(self.norms, self.mlps):
            h = h + mlp(norm(h))
        return self.head(self.final(h))
