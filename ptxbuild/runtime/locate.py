"""Finding a built target: "op@gpu" through a kernelfile, or a build directory holding manifest.json."""

from __future__ import annotations

import warnings
from pathlib import Path

from ..oploader import op_dir
from ..outputs.manifest import read_manifest
from .errors import LoaderError
from .kda import ChunkKDA
from .kernel import BuiltKernel


def _find_kernelfile(kernelfile: str | Path | None, start: Path) -> Path | None:
    """`kernelfile` if given, else the nearest kernelfile.toml in `start` or above it."""
    if kernelfile:
        return Path(kernelfile)
    dirs = [start, *start.parents]
    return next((d / "kernelfile.toml" for d in dirs if (d / "kernelfile.toml").is_file()), None)


def _load_kernelfile(kfp: Path, what: str):
    from ..declare.kernelfile import KernelfileError
    from ..declare.kernelfile import load as load_kf

    try:
        return load_kf(kfp)
    except KernelfileError as exc:
        raise LoaderError(f"cannot {what}: {exc}") from None


def load(
    target: str | Path,
    *,
    kernelfile: str | Path | None = None,
    allow_fallback: bool = False,
    op_folder: str | Path | None = None,
):
    """A callable for a built target: `target` is "op@gpu" (resolved through `kernelfile`, default
    ./kernelfile.toml) or a build directory holding manifest.json. `allow_fallback=True` runs the
    op's reference (slow, with a warning) for inputs no built variant covers instead of raising.
    A KDA target (op kda) is called like flash-linear-attention's chunk_kda (runtime/kda.py)."""
    t = str(target)
    build = Path(t)
    folder = Path(op_folder) if op_folder else None
    if "@" in t and not (build / "manifest.json").is_file():
        kfp = _find_kernelfile(kernelfile, Path.cwd()) or Path("kernelfile.toml")
        kf = _load_kernelfile(kfp, f"load {t}")
        op_name, gpu = t.split("@", 1)
        if op_name not in kf.ops or gpu not in kf.ops[op_name].gpus:
            raise LoaderError(
                f"{t} is not a target of {kfp}; declare it there and run: ptxbuild build {t}"
            )
        build = kf.build_dir / t
        folder = folder or op_dir(kf.ops[op_name].template, kf.root)
    manifest_path = build / "manifest.json"
    rebuild = build.name if "@" in build.name else "<op>@<gpu>"
    if not manifest_path.is_file():
        raise LoaderError(
            f"{build} has no manifest.json: the target was never built; run: ptxbuild build "
            f"{rebuild}"
        )
    try:
        manifest = read_manifest(manifest_path)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise LoaderError(
            f"{manifest_path} is damaged (not a manifest of this ptxbuild: {exc!r}); rebuild: "
            f"ptxbuild build {rebuild}"
        ) from None
    if manifest.incomplete:
        warnings.warn(
            f"{build}: its build was interrupted ({manifest.incomplete} problems built); run: "
            f"ptxbuild build {manifest.target} to finish it",
            stacklevel=2,
        )
    if folder is None:
        kfp = _find_kernelfile(kernelfile, build.resolve().parent)
        if kfp:
            kf = _load_kernelfile(kfp, f"find the op of {manifest.target}")
            spec = kf.ops.get(manifest.target.split("@")[0])
            folder = op_dir(spec.template if spec else manifest.template, kf.root)
        else:  # <project>/build/<target>: the project's ops/<template>, else the installed op
            folder = op_dir(manifest.template, build.resolve().parent.parent)
    # ChunkKDA for the KDA forward op (chunk_kda's interface), else BuiltKernel
    cls = ChunkKDA if manifest.op == "kda" else BuiltKernel
    return cls(build, manifest, folder, allow_fallback)


def declared_targets(template: str, gpu: str, kernelfile: str | Path | None = None) -> dict:
    """The targets "<op>@<gpu>" of `kernelfile` (default: ./kernelfile.toml or the nearest one
    above) whose op is `template` (e.g. every rmsnorm_bwd target, one per dtype), in declaration
    order, each -> whether it has been built (a manifest.json in the build directory); {} without
    a kernelfile."""
    kfp = _find_kernelfile(kernelfile, Path.cwd())
    if kfp is None or not kfp.is_file():
        return {}
    kf = _load_kernelfile(kfp, f"find the {template} targets")
    return {
        f"{name}@{gpu}": (kf.build_dir / f"{name}@{gpu}" / "manifest.json").is_file()
        for name, spec in kf.ops.items()
        if gpu in spec.gpus and op_dir(spec.template, kf.root).name == template
    }
