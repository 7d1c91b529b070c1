"""ptxbuild: a declarative build system for GPU kernels. `ptxbuild.load("op@gpu")` uses a built target."""


def load(target, **kwargs):
    """A callable for a built target; see ptxbuild.runtime.load (imported lazily: no compiler, torch or cupy)."""
    from .runtime import load as _load

    return _load(target, **kwargs)
