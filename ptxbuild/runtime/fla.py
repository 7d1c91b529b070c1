"""flash-linear-attention's KDA on ptxbuild's kernels: a drop-in with `chunk_kda`'s signature, and
two ways to make fla use it.

    import ptxbuild
    from ptxbuild.runtime import fla as ptxfla
    kda = ptxbuild.load("kda@h200")
    ptxfla.install(kda)          # fla's KimiDeltaAttention layers now run the built kernels

install() registers a backend in fla's own KDA backend registry (fla.ops.kda.backends, where
FlashKDA plugs in; priority 0, so it is asked first; FLA_PTXBUILD_KDA=0 turns it off): fla's
chunk_kda asks its verifier, which accepts exactly the calls the build covers outside autograd,
and fla's own kernels run every other call. Where that registry does not exist (older fla), the
drop-in replaces the module attribute fla's layer calls (fla.layers.kda.chunk_kda), keeping fla's
function as the fallback. `chunk_kda_from(kda, fallback)` is the drop-in itself, for a model that
calls chunk_kda directly. uninstall() undoes install(). Needs torch (and fla for install)."""

from __future__ import annotations

import warnings

from .errors import LoaderError

_installed: list = []  # (undo callable, what) of each install()


def _needs_grad(q, k, v, g, beta, kw: dict) -> bool:
    """Whether a chunk_kda call (`kw`: its keywords) needs gradients of any of its tensors."""
    import torch

    tensors = (q, k, v, g, beta, kw.get("initial_state"), kw.get("A_log"), kw.get("dt_bias"))
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def chunk_kda_from(kernel, fallback=None):
    """A function with fla's chunk_kda signature running `kernel` (a loaded KDA target). A call the
    build does not cover (a one-line LoaderError), or that needs gradients (the kernels are forward
    only), goes to `fallback` (fla's own chunk_kda) with one warning per reason, or raises."""
    warned: set = set()

    def chunk_kda(
        q,
        k,
        v,
        g,
        beta,
        scale=None,
        initial_state=None,
        output_final_state=False,
        use_qk_l2norm_in_kernel=False,
        use_gate_in_kernel=False,
        use_beta_sigmoid_in_kernel=False,
        allow_neg_eigval=False,
        safe_gate=False,
        lower_bound=None,
        disable_recompute=False,
        return_intermediate_states=False,
        state_v_first=False,
        cu_seqlens=None,
        cu_seqlens_cpu=None,
        cp_context=None,
        **kwargs,
    ):
        call = dict(
            scale=scale, initial_state=initial_state, output_final_state=output_final_state,
            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, use_gate_in_kernel=use_gate_in_kernel,
            use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
            allow_neg_eigval=allow_neg_eigval, safe_gate=safe_gate, lower_bound=lower_bound,
            disable_recompute=disable_recompute,
            return_intermediate_states=return_intermediate_states, state_v_first=state_v_first,
            cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu, cp_context=cp_context, **kwargs,
        )  # fmt: skip
        why = None
        if _needs_grad(q, k, v, g, beta, call):
            why = "the built kernels are forward only (gradients needed)"
        if why is None:
            try:
                return kernel(q, k, v, g, beta, **call)
            except LoaderError as exc:
                if fallback is None:
                    raise
                why = str(exc)
        if fallback is None:
            raise LoaderError(f"{kernel.target}: {why}; pass fallback=fla's chunk_kda")
        if why not in warned:
            warned.add(why)
            warnings.warn(f"{why}; running fla's chunk_kda instead", RuntimeWarning, stacklevel=2)
        return fallback(q, k, v, g, beta, **call)

    chunk_kda.kernel = kernel
    return chunk_kda


def backend_class(kernel):
    """A backend for fla's KDA registry (fla.ops.backends.BaseBackend) running `kernel`."""
    from fla.ops.backends import BaseBackend

    class PtxbuildKDABackend(BaseBackend):
        backend_type = "ptxbuild"
        package_name = None
        env_var = "FLA_PTXBUILD_KDA"
        default_enable = True
        priority = 0

        def chunk_kda_verifier(self, q, k, v, g, beta, **kw):
            if _needs_grad(q, k, v, g, beta, kw):
                return False, "ptxbuild's KDA kernels are forward only"
            return kernel.covers(q, k, v, g, beta, **kw)

        def chunk_kda(self, q, k, v, g, beta, **kw):
            return kernel(q, k, v, g, beta, **kw)

    return PtxbuildKDABackend


def install(kernel) -> str:
    """Make fla's KDA layers run `kernel` where it covers the call; says how (registry or patch)."""
    try:
        from fla.ops.kda.backends import kda_registry
    except ImportError:
        kda_registry = None
    if kda_registry is not None:
        backend = backend_class(kernel)()
        kda_registry.register(backend)

        def undo():
            with kda_registry._lock:
                kda_registry._backends.pop(backend.backend_type, None)
                kda_registry._update_active_backend()

        _installed.append((undo, "fla.ops.kda.backends.kda_registry"))
        return "registered backend 'ptxbuild' in fla.ops.kda.backends.kda_registry"
    try:
        import fla.layers.kda as layer
    except ImportError as exc:
        raise LoaderError(
            f"flash-linear-attention is not importable ({exc}); pip install fla-core"
        ) from None
    original = layer.chunk_kda
    layer.chunk_kda = chunk_kda_from(kernel, fallback=original)
    _installed.append((lambda: setattr(layer, "chunk_kda", original), "fla.layers.kda.chunk_kda"))
    return "replaced fla.layers.kda.chunk_kda (fla's own kept as the fallback)"


def uninstall() -> None:
    """Undo every install(), newest first."""
    while _installed:
        undo, _ = _installed.pop()
        undo()
