"""The small decoder the training tests patch (CPU and GPU): two pre-norm residual blocks and a
final norm (torch.nn.RMSNorm), as a decoder stacks them. Import it after importorskip("torch")."""

from __future__ import annotations

import torch


class TinyDecoder(torch.nn.Module):
    def __init__(self, n: int, dtype):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.ModuleList(torch.nn.Linear(n, n, dtype=dtype) for _ in range(2))
        self.norms = torch.nn.ModuleList(torch.nn.RMSNorm(n, 1e-6, dtype=dtype) for _ in range(3))
        for norm in self.norms:
            norm.weight.data.uniform_(0.5, 1.5)

    def forward(self, x):
        for lin, norm in zip(self.lin, self.norms):
            x = x + lin(norm(x))
        return self.norms[2](x)
