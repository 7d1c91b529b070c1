"""Build artifacts of one target: PTX + cubin per variant and the dispatch manifest (written atomically)."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from pathlib import Path
from typing import NamedTuple

from .. import coverage
from ..oploader import file_digests
from ..records import DispatchEntry, Manifest


def ptx_isa(ptx: str) -> str:
    m = re.search(r"^\.version\s+(\S+)", ptx, re.M)
    return m.group(1) if m else "unknown"


def target_dir(kf, target) -> Path:
    return kf.build_dir / str(target)


def pin_ptx(dispatch: list[dict], shas: list, variants: dict) -> None:
    """PTX digests: a cubin's first config gives its variant's; a later one with another PTX keeps its own."""
    first: dict[str, str] = {}
    for d, sha in ((d, sha) for d, sha in zip(dispatch, shas) if sha is not None):
        d.pop("ptx_sha256", None)
        variants[d["binary"]]["ptx_sha256"] = first.setdefault(d["binary"], sha)
        if (
            sha != first[d["binary"]]
        ):  # same cubin, other PTX (e.g. a min_blocks that does not bind)
            d["ptx_sha256"] = sha


class Built(NamedTuple):
    """How a target's kernels were built, as its manifest records it."""

    measured: bool
    toolchain: dict
    hardware: dict | None
    incomplete: str | None = None  # "built/declared" problems: an interrupted build


def assemble(
    kf, target, gpu, op, chosen: list[DispatchEntry], how: Built, cover: bool = False
) -> tuple[Manifest, dict[str, bytes]]:
    """The manifest of a target's build and every file of its folder (name -> bytes), in memory;
    `cover`: with the "coverage" record (coverage.record: it renders every entry's plan)."""
    files, variants, shas = {}, {}, []
    for c in chosen:
        b = c.compiled
        shas.append(b and hashlib.sha256(b.ptx.encode()).hexdigest())
        if b is None or b.digest in variants:
            continue
        stem = f"{b.entry}-{b.digest[:12]}"
        files[f"{stem}.ptx"], files[f"{stem}.cubin"] = b.ptx.encode(), b.cubin
        variants[b.digest] = {
            **{k: getattr(b, k) for k in ("entry", "arch", "registers", "spill_bytes", "compiler")},
            "ptx": f"{stem}.ptx",
            "cubin": f"{stem}.cubin",
            "ptx_isa": ptx_isa(b.ptx),
        }
    dispatch = [c.to_json() for c in chosen]
    pin_ptx(dispatch, shas, variants)
    manifest = {
        "target": str(target),
        "op": op.NAME,
        "op_version": op.VERSION,
        "template": str(op.FOLDER.name),
        "gpu": gpu.as_dict(),
        "arch": gpu.arch,
        "measured_on_hardware": how.measured,
        "kernelfile_digest": kf.digest,
        "toolchain": how.toolchain,
        "variants": variants,
        "dispatch": dispatch,
        "hardware": how.hardware,
        "op_files": file_digests(op),
        **({"incomplete": how.incomplete} if how.incomplete else {}),
        **({"coverage": coverage.record(op, dispatch, gpu.arch)} if cover else {}),
    }  # coverage: what the runtime may serve
    files["manifest.json"] = json.dumps(manifest, indent=1, sort_keys=True).encode()
    return Manifest.from_json(manifest), files


def replace_folder(out: Path, files: dict[str, bytes]) -> None:
    """`out` holds exactly `files`, replaced as a whole: they are written to a folder beside it, which
    then takes its place (a stop at any point leaves the old complete folder, or the new one)."""
    import shutil  # an import that only a build that writes needs

    out.parent.mkdir(parents=True, exist_ok=True)
    tag = os.urandom(8).hex()  # this write's own pair of folders
    new, old = (out.with_name(f".{out.name}.{kind}-{tag}") for kind in ("new", "old"))
    # mkdir, not tempfile.mkdtemp: its folder is the umask's, as out's was (mkdtemp's is 0o700, and
    # reading the umask means setting it, process-wide, for a moment)
    new.mkdir()
    try:
        for name, data in files.items():
            (new / name).write_bytes(data)
        if out.exists():
            os.replace(out, old)
        os.replace(new, out)
    except BaseException:
        if old.exists() and not out.exists():
            os.replace(old, out)
        shutil.rmtree(new, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)


def write_artifacts(
    kf, target, gpu, op, chosen, how: Built, keep_complete: bool = False
) -> tuple[Path, Manifest | None]:
    """Write build/<target>/ (variants and manifest.json) as a whole; returns the manifest's path and
    the manifest written. keep_complete (an interrupted build): a complete folder there stays as it
    is (None: not written)."""
    out = target_dir(kf, target)
    if keep_complete and not built(kf, target)[1]:
        return out / "manifest.json", None
    manifest, files = assemble(kf, target, gpu, op, chosen, how, cover=True)
    replace_folder(out, files)
    return out / "manifest.json", manifest


def read_manifest(path: Path) -> Manifest:
    """The one reader of a manifest.json (OSError, ValueError, KeyError, TypeError where it is not
    one)."""
    return Manifest.from_json(json.loads(path.read_bytes()))


def built(kf, target) -> tuple[Manifest | None, str | None]:
    """build/<target>/'s manifest (None: missing or damaged), and why the folder does not hold a
    complete build as its manifest lists it (None: it does): a file missing, a manifest that does not
    parse, a cubin that is not the one its manifest names."""
    folder = target_dir(kf, target)
    path = folder / "manifest.json"
    rel = functools.partial(os.path.relpath, start=kf.root)
    if not path.is_file():
        return None, f"artifact missing: {rel(path)}"
    try:
        m = read_manifest(path)
        files = [(d, folder / v.ptx, folder / v.cubin) for d, v in m.variants.items()]
    except (ValueError, KeyError, TypeError, AttributeError):
        return (
            None,
            f"{rel(path)} is damaged (not a manifest of this ptxbuild); a build writes it again",
        )
    if m.incomplete:
        return m, f"{rel(folder)} is incomplete ({m.incomplete} problems, an interrupted build)"
    for digest, ptx, cubin in files:
        if missing := next((f for f in (ptx, cubin) if not f.is_file()), None):
            return m, f"artifact missing: {rel(missing)}"
        if hashlib.sha256(cubin.read_bytes()).hexdigest() != digest:
            return m, f"{rel(cubin)} is not the cubin its manifest names (edited?)"
    return m, None
