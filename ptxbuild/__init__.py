"""ptxbuild: a declarative build system for GPU kernels. `ptxbuild.load("op@gpu")` uses a built target."""


def load(target, **kwargs):
    """A callable for a built target; see ptxbuild.runtime.load (imported lazily: no compiler, torch or cupy)."""
    from .runtime import load as _load

    return _load(target, **kwargs)


def patch_rmsnorm(model, target="rmsnorm@h200", **kwargs):
    """Swap every RMSNorm module of a torch model for one running the built `target`; see
    ptxbuild.integrations.patch_rmsnorm (imports torch, which ptxbuild itself never does)."""
    from .integrations import patch_rmsnorm as _patch

    return _patch(model, target, **kwargs)
