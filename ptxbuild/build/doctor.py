"""What this machine has for the GPU stages, and what is missing with how to install it; never raises."""

from __future__ import annotations

import platform


def _version(module: str) -> str | None:
    try:
        return getattr(__import__(module), "__version__", "installed")
    except Exception:  # noqa: BLE001
        return None


def doctor() -> list[tuple[str, str]]:
    """(check, status) lines: python, numpy, cupy, torch, GPU + fingerprint, nvidia-smi, compiler."""
    from ..compile.compiler import INSTALL_HINT, toolchain
    from ..gpu.fingerprint import read, smi_line
    from ..outputs.environment import code_digest

    cupy_v = _version("cupy")
    lines = [
        ("ptxbuild", f"code {code_digest()} (as a report's header names it)"),
        ("python", f"{platform.python_version()} ({platform.machine()})"),
        ("numpy", _version("numpy") or "missing: pip install numpy"),
        (
            "cupy",
            cupy_v or "missing (needed to verify and time on a GPU): pip install cupy-cuda13x",
        ),
        ("torch", _version("torch") or "missing (optional: baselines): pip install torch"),
        (
            "nvidia-smi",
            smi_line()
            or "not found (clocks and driver version come from the CUDA runtime instead)",
        ),
    ]
    gpu = "unknown (cupy missing)"
    if cupy_v:
        try:
            gpu = str(read(0))
        except Exception as exc:  # noqa: BLE001
            gpu = (
                f"none usable ({type(exc).__name__}: {exc}); builds compile and write "
                "PTX marked 'not measured on hardware'"
            )
    lines.append(("gpu", gpu))
    try:
        lines.append(("compiler", str(toolchain())))
    except Exception as exc:  # noqa: BLE001
        lines.append(("compiler", f"missing ({exc}); run: {INSTALL_HINT}"))
    return lines
