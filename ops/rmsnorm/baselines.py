"""RMSNorm baselines timed beside the built kernel: PyTorch eager `rms_norm` and `torch.compile` of it.

Kept apart from op.py on purpose: baselines are not inputs of a kernel build, so editing them must
not rebuild kernels or break a lockfile. The loader binds this module's `baselines` to the op.
"""
from __future__ import annotations

from ptxbuild.problem import Problem

# bump when the baselines change how they are timed (their cached timings are then re-measured)
BASELINES_VERSION = "3"


def baselines(problem: Problem, defaults: dict) -> dict:
    """name -> callable(inputs) -> outputs, for `problem`; `defaults` are the op's OPTIONS."""
    o = {**defaults, **problem.opts}

    def _torch():
        try:
            import torch
        except ImportError as exc:  # pragma: no cover - depends on the machine
            raise RuntimeError("baselines need torch: pip install torch") from exc
        return torch

    def _t(torch, arr, dt):
        t = torch.from_dlpack(arr)
        return t.view(torch.bfloat16) if dt == "bfloat16" else t

    def make(compiled: bool):
        state = {}
        views = {}   # torch views of each input set, made once: only the op itself is timed

        def run(inputs: dict) -> dict:
            torch = _torch()
            if "f" not in state:
                eps = float(o["eps"])

                def fn(x, r, w, b):
                    h = x
                    if r is not None:
                        h = x.float() + r.float() if o["residual_out_fp32"] else x + r
                    hn = h if (w is None or w.dtype == h.dtype) else h.float()
                    y = torch.nn.functional.rms_norm(hn, (h.shape[-1],), w, eps)
                    if b is not None:
                        y = y + b
                    rstd = torch.rsqrt(h.float().pow(2).mean(-1) + eps) if o["rstd"] else None
                    return y.to(x.dtype), h, rstd

                if compiled:
                    # a static compile for this shape, as a user with one model shape gets. Without the
                    # reset, dynamo's cache (shared by every problem's closure) recompiles the second
                    # shape as a dynamic-shape kernel, up to 2x slower, and stops compiling after 8.
                    torch._dynamo.reset()
                    fn = torch.compile(fn, dynamic=False)
                state["f"] = fn
            key = id(inputs["x"])
            if key not in views:
                wdt = "float32" if o["weight"] == "fp32" else problem.dtype
                views[key] = (inputs["x"], _t(torch, inputs["x"], problem.dtype),
                              _t(torch, inputs["residual"], problem.dtype) if o["residual"] else None,
                              _t(torch, inputs["weight"], wdt) if "weight" in inputs else None,
                              _t(torch, inputs["bias"], wdt) if "bias" in inputs else None)
            _, x, r, w, b = views[key]
            y, h, rstd = state["f"](x, r, w, b)
            # outputs in their own dtype: an upcast here would be timed as part of the baseline
            out = {"y": y}
            if o["residual"]:
                out["residual_out"] = h
            if o["rstd"]:
                out["rstd"] = rstd
            return out

        return run

    return {"torch_eager": make(False), "torch_compile": make(True)}
