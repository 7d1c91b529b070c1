"""softmax baselines timed beside the built kernel: PyTorch eager `torch.softmax` (bf16 in and out).

Not a build input (ptxbuild/oploader.py binds it): editing it rebuilds nothing."""

from __future__ import annotations

from ptxbuild.problem import Problem

BASELINES_VERSION = "1"


def baselines(problem: Problem, defaults: dict) -> dict:
    """name -> callable(inputs) -> outputs."""
    views: dict = {}

    def eager(inputs: dict) -> dict:
        import torch

        key = id(inputs["x"])
        if key not in views:
            views[key] = (inputs["x"], torch.from_dlpack(inputs["x"]).view(torch.bfloat16))
        return {"y": torch.softmax(views[key][1], dim=-1)}  # bf16, as stored

    return {"torch_eager": eager}
