"""Build artifacts of one target: PTX + cubin per variant and the dispatch manifest (written atomically)."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from ..oploader import source_files


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


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


def write_artifacts(kf, target, gpu, op, chosen: list[dict], summary: dict) -> Path:
    """Write variants and manifest.json; the manifest is written last, so a kill leaves the old one."""
    out = target_dir(kf, target)
    out.mkdir(parents=True, exist_ok=True)
    variants, shas = {}, []
    for c in chosen:
        b = c.get("_binary")
        shas.append(b and hashlib.sha256(b.ptx.encode()).hexdigest())
        if b is None or b.digest in variants:
            continue
        stem = f"{b.entry}-{b.digest[:12]}"
        _atomic_write(out / f"{stem}.ptx", b.ptx.encode())
        _atomic_write(out / f"{stem}.cubin", b.cubin)
        variants[b.digest] = {
            "entry": b.entry,
            "ptx": f"{stem}.ptx",
            "cubin": f"{stem}.cubin",
            "arch": b.arch,
            "ptx_isa": ptx_isa(b.ptx),
            "registers": b.registers,
            "spill_bytes": b.spill_bytes,
            "compiler": b.compiler,
        }
    dispatch = [{k: v for k, v in c.items() if k != "_binary"} for c in chosen]
    pin_ptx(dispatch, shas, variants)
    manifest = {
        "target": str(target),
        "op": op.NAME,
        "op_version": op.VERSION,
        "template": str(op.FOLDER.name),
        "gpu": gpu.as_dict(),
        "arch": gpu.arch,
        "measured_on_hardware": summary["measured"],
        "kernelfile_digest": kf.digest,
        "toolchain": summary["toolchain"],
        "variants": variants,
        "dispatch": dispatch,
        "hardware": summary.get("hardware"),
        "op_files": {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in source_files(op)},
        **({"incomplete": summary["incomplete"]} if summary.get("incomplete") else {}),
    }  # problems built/declared
    path = out / "manifest.json"
    _atomic_write(path, json.dumps(manifest, indent=1, sort_keys=True).encode())
    return path
