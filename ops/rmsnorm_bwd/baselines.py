"""RMSNorm backward baselines timed beside the built kernels (issue 29, item 3):

  torch_eager    autograd of the eager forward (torch.nn.functional.rms_norm): the forward graph is
                 built once per input set, untimed; each timed call runs its backward (retain_graph)
  torch_compile  a static torch.compile (dynamic=False) of the eager closed-form backward
  liger          liger_kernel.ops.rms_norm's backward (the Triton kernel Liger's autograd calls), fed
                 the same rstd; with a residual, + dres by one torch add. liger-kernel refuses
                 N > 65536 (its block holds a whole row): such rows report that, they do not crash.
                 Imported lazily: a machine without the wheel reports "liger-kernel is not installed".

Kept apart from op.py on purpose (not a build input: editing it rebuilds nothing).
"""

from __future__ import annotations

import inspect

from ptxbuild.problem import Problem

BASELINES_VERSION = "2"   # 2: casting_mode gemma (fp32 math, as the op's reference); llama
                          # rounds x * rstd to x's dtype before dweight (run 25b: outside the band)
LIGER_MAX_N = 65536


def baselines(problem: Problem, defaults: dict) -> dict:
    o = {**defaults, **problem.opts}
    n = problem.shape[1]
    eps = float(o["eps"])
    wdt = "float32" if o["weight"] == "fp32" else problem.dtype

    def _torch():
        try:
            import torch
        except ImportError as exc:  # pragma: no cover - depends on the machine
            raise RuntimeError("baselines need torch: pip install torch") from exc
        return torch

    def _t(torch, arr, dt):
        t = torch.from_dlpack(arr)
        return t.view(torch.bfloat16) if dt == "bfloat16" else t

    def _views(torch, inputs):
        return (_t(torch, inputs["x"], problem.dtype), _t(torch, inputs["dy"], problem.dtype),
                _t(torch, inputs["weight"], wdt) if "weight" in inputs else None,
                torch.from_dlpack(inputs["rstd"]) if "rstd" in inputs else None,
                _t(torch, inputs["dres"], problem.dtype) if "dres" in inputs else None)

    def _outs(x, dx, dw, db):
        out = {"dx": dx}
        if dw is not None:
            out["dweight"] = dw
        if db is not None:
            out["dbias"] = db
        return out

    def eager():
        cache = {}

        def run(inputs):
            torch = _torch()
            key = id(inputs["x"])
            if key not in cache:
                x, dy, w, _, dres = _views(torch, inputs)
                xg = x.detach().clone().requires_grad_(True)
                wg = w.detach().clone().requires_grad_(True) if w is not None else None
                xn = xg if (wg is None or wg.dtype == xg.dtype) else xg.float()
                y = torch.nn.functional.rms_norm(xn, (n,), wg, eps)
                bg = None
                if o["bias"]:
                    bg = torch.zeros(n, dtype=wg.dtype if wg is not None else x.dtype,
                                     device=x.device, requires_grad=True)
                    y = y + bg
                y = y.to(x.dtype)
                outs, grads = [y], [dy]
                if dres is not None:                     # the gradient arriving at residual_out = h
                    outs.append(xg)
                    grads.append(dres)
                want = [t for t in (xg, wg, bg) if t is not None]
                cache[key] = (outs, grads, want, wg is not None, bg is not None)
            outs, grads, want, hw, hb = cache[key]
            got = list(torch.autograd.grad(outs, want, grads, retain_graph=True))
            dx = got.pop(0)
            return _outs(None, dx, got.pop(0) if hw else None, got.pop(0) if hb else None)

        return run

    def compiled():
        state = {}

        def run(inputs):
            torch = _torch()
            if "f" not in state:

                def bwd(x, dy, w, rstd, dres):
                    xf, dyf = x.float(), dy.float()
                    if rstd is None:
                        rstd = torch.rsqrt(xf.pow(2).mean(-1) + eps)
                    r = rstd[:, None]
                    g = dyf * w.float() if w is not None else dyf
                    c = (g * xf).sum(-1, keepdim=True) * (r * r * r) / n
                    dx = r * g - xf * c
                    if dres is not None:
                        dx = dx + dres.float()
                    dw = (dyf * xf * r).sum(0).to(w.dtype) if w is not None else None
                    db = dyf.sum(0).to(w.dtype if w is not None else x.dtype) if o["bias"] else None
                    return dx.to(x.dtype), dw, db

                torch._dynamo.reset()   # a static compile for this shape (see ops/rmsnorm/baselines.py)
                state["f"] = torch.compile(bwd, dynamic=False)
            x, dy, w, rstd, dres = _views(torch, inputs)
            dx, dw, db = state["f"](x, dy, w, rstd, dres)
            return _outs(x, dx, dw, db)

        return run

    def liger():
        state = {}

        def run(inputs):
            if n > LIGER_MAX_N:
                raise RuntimeError(f"liger-kernel refuses N > {LIGER_MAX_N} (N = {n}): not timed")
            if o["weight"] == "none" or o["bias"]:
                raise RuntimeError("liger-kernel's RMSNorm backward needs a weight and has no bias: not timed")
            torch = _torch()
            if "mod" not in state:
                try:
                    from liger_kernel.ops import rms_norm as mod
                except ImportError as exc:
                    raise RuntimeError("liger-kernel is not installed on this machine: not timed "
                                       "(pip install liger-kernel)") from exc
                state["mod"] = mod
                state["fwd"] = inspect.signature(mod.rms_norm_forward).parameters
                state["bwd"] = inspect.signature(mod.rms_norm_backward).parameters
            mod = state["mod"]
            key = id(inputs["x"])
            if key not in state:
                x, dy, w, rstd, dres = _views(torch, inputs)
                have = {"X": x, "W": w, "eps": eps, "offset": 0.0, "casting_mode": "gemma",
                        "row_mode": None}
                res = mod.rms_norm_forward(**{k: v for k, v in have.items() if k in state["fwd"]})
                # (Y, X, RSTD, BLOCK_SIZE, num_warps, casting_mode) in liger-kernel 0.5-0.8
                names = ["Y", "X", "RSTD", "BLOCK_SIZE", "num_warps", "casting_mode"]
                got = dict(zip(names, res))
                if rstd is None:
                    rstd = got["RSTD"]
                kw = {"dY": dy, "X": x, "W": w, "RSTD": rstd, "offset": 0.0,
                      "casting_mode": got.get("casting_mode"), "BLOCK_SIZE": got.get("BLOCK_SIZE"),
                      "num_warps": got.get("num_warps"), "in_place": False, "row_mode": None}
                state[key] = ({k: v for k, v in kw.items() if k in state["bwd"]}, dres)
            kw, dres = state[key]
            if "in_place" not in state["bwd"]:   # old liger writes dX into dY: give it a copy (timed)
                kw = {**kw, "dY": kw["dY"].clone()}
            dx, dw = mod.rms_norm_backward(**kw)[:2]
            if dres is not None:
                dx = dx + dres
            return _outs(None, dx, dw, None)

        return run

    return {"torch_eager": eager(), "torch_compile": compiled(), "liger": liger()}
