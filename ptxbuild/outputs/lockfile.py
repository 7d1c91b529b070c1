"""kernelfile.lock: what a build chose, pinned (`ptxbuild build --locked` is build/locked.py).

The lock sits beside kernelfile.toml as JSON with sorted keys (one stable text form). Per target it records the
kernelfile digest, the op's files, the toolchain (versions and wheel versions), the GPU spec, the hardware fingerprint
the numbers were measured on (or null), every chosen variant with its PTX and cubin sha256, and the dispatch table with
the measured numbers (an entry whose config shares its variant's cubin, not its PTX, has its own ptx_sha256). Each
target entry carries the sha256 of its own canonical form, so a hand edit is reported rather than used.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from pathlib import Path

from ..declare import memo
from ..declare.graph import all_targets
from ..errors import EXIT_CONFIG, BuildFailed
from ..keys import COMPILER_WHEELS, installed_version
from ..oploader import changed_files, file_digests, op_files
from ..problem import canonical_json
from ..records import Manifest
from .environment import WHEELS
from .manifest import read_manifest, target_dir

LOCK_VERSION = 1
# what a lock entry pins of each manifest variant besides its two digests
VARIANT_KEYS = ("entry", "arch", "ptx_isa", "registers", "spill_bytes", "compiler")
# what it copies from the manifest as it is
MANIFEST_KEYS = ("op", "op_version", "kernelfile_digest", "arch", "gpu", "toolchain", "hardware")


class LockError(BuildFailed):
    """The lock does not hold, or the build drifted from it; one line naming target, variant, expected, got."""


def lock_path(kf) -> Path:
    """The lock beside its kernelfile, named after it (kernelfiles sharing a folder must not overwrite each other's
    lock): kernelfile.toml -> kernelfile.lock, benchmarks/rmsnorm_bf16.toml -> benchmarks/rmsnorm_bf16.lock."""
    return kf.path.with_suffix(".lock")


def wheel_versions() -> dict[str, str | None]:
    """Installed versions of the compiler wheels (finer than NVRTC's major.minor)."""
    return {name: installed_version(name) for name in WHEELS}


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def declaration_digest(spec) -> str:
    """sha256 of an op's own section of the kernelfile (OpSpec.config()): what a lock entry depends on;
    editing another op's section leaves it valid."""
    return sha256(canonical_json(spec.config()).encode())


def entry_digest(entry: dict) -> str:
    return sha256(canonical_json({k: v for k, v in entry.items() if k != "entry_sha256"}).encode())


class LockUnreadable(LockError):
    """The lock file itself is damaged (not JSON, conflict markers, another shape): a kernelfile mistake
    (exit 2) that no command may paper over, since a build would rewrite the lock without its entries."""

    exit_code = EXIT_CONFIG


_CONFLICT = re.compile(r"^(<<<<<<<|>>>>>>>)", re.MULTILINE)
_ENTRY_KEYS = {"target": str, "variants": dict, "dispatch": list, "gpu": dict, "toolchain": dict}


def _unreadable(path: Path, why: str) -> LockUnreadable:
    name = path.name
    return LockUnreadable(
        f"{name} {why}; restore it from version control (git checkout -- {name}) or move it aside "
        f"(mv {name} {name}.bad) and build to relock from scratch"
    )


def lock_problem(path: Path, data: bytes) -> dict | LockUnreadable:
    """The parsed lock, or the LockUnreadable that says what is wrong with its bytes."""
    name = path.name
    text = data.decode("utf-8", "replace")
    mark = _CONFLICT.search(text) if "<<<<<<<" in text or ">>>>>>>" in text else None
    if mark:
        line = text.count("\n", 0, mark.start()) + 1
        return LockUnreadable(
            f"{name} holds git conflict markers (line {line}): resolve the merge first: take one "
            f"side (git checkout --ours {name} or --theirs), then ptxbuild build relocks what changed"
        )
    if not data.strip():
        return _unreadable(path, "is empty")
    try:
        lock = json.loads(data.decode())
    except UnicodeDecodeError as exc:
        return _unreadable(
            path, f"is not a JSON text (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        )
    except json.JSONDecodeError as exc:
        return _unreadable(path, f"is not valid JSON (truncated? {exc})")
    if not isinstance(lock, dict):
        return _unreadable(path, f"is not a lock: a JSON {type(lock).__name__}, not an object")
    if (v := lock.get("lock_version")) != LOCK_VERSION and isinstance(v, int) and v > LOCK_VERSION:
        return LockUnreadable(
            f"{name} has lock_version {v}, newer than this ptxbuild's; upgrade ptxbuild"
        )
    if lock.get("lock_version") != LOCK_VERSION:
        return LockUnreadable(
            f"{name} has lock_version {lock.get('lock_version')!r}, this ptxbuild writes "
            f"{LOCK_VERSION}; restore it from version control (git checkout -- {name}), or move it "
            f"aside (mv {name} {name}.bad) and build to relock"
        )
    targets = lock.get("targets")
    if not isinstance(targets, dict):
        return _unreadable(
            path, f"is not a lock: its targets is a {type(targets).__name__}, not an object"
        )
    for t, e in targets.items():
        bad = [
            k
            for k, typ in _ENTRY_KEYS.items()
            if not isinstance(e, dict) or not isinstance(e.get(k), typ)
        ]
        if bad:
            return _unreadable(path, f"is not a lock: targets.{t} lacks {', '.join(bad)}")
    return lock


def read_lock(kf) -> dict:
    path = lock_path(kf)
    if path.is_dir():
        raise LockUnreadable(
            f"{path.name} is a folder, not a lock; move it aside (mv {path.name} {path.name}.bad)"
        )
    if not path.is_file():
        raise LockError(
            f"{path} does not exist; run `ptxbuild build` once to write it, then commit it"
        )
    # parsed once per content: plan and build ask for the lock once per target, and a lock of 24
    # targets is ~1 MB of JSON (callers read the result, they never change it); memo.file_digest
    # reads it again only if its stat changed or it changed lately (git's racy files)
    lock = _parsed(path, memo.file_digest(path))
    if isinstance(lock, LockError):
        raise type(lock)(*lock.args)  # a new one per call: the memo's would collect tracebacks
    return lock


@functools.lru_cache(maxsize=1)
def _parsed(path: Path, digest: str) -> dict | LockUnreadable:
    return lock_problem(path, path.read_bytes())


def entry_from_manifest(kf, target, m: Manifest, folder: Path) -> dict:
    """The lock entry of one built target, from its manifest and its artifacts in `folder`."""
    spec = kf.ops[target.op]
    op = op_files(spec.template, kf.root)
    variants = {}
    for digest, v in sorted(m.variants.items()):
        cubin = (folder / v.cubin).read_bytes()
        ptx = (folder / v.ptx).read_bytes()
        if sha256(cubin) != digest:
            raise LockError(
                f"{target}: {v.cubin} does not match its manifest digest; rebuild before locking"
            )
        pinned = {k: getattr(v, k) for k in VARIANT_KEYS}
        variants[digest] = {**pinned, "cubin_sha256": digest, "ptx_sha256": sha256(ptx)}
    entry = {
        **{k: getattr(m, k) for k in MANIFEST_KEYS},
        "target": str(target),
        "template": spec.template,
        "declaration_sha256": declaration_digest(spec),
        "wheels": wheel_versions(),
        "op_files": file_digests(op),
        "measured_on_hardware": m.measured_on_hardware,
        "variants": variants,
        "dispatch": [d.to_json() for d in m.dispatch],
    }
    entry["entry_sha256"] = entry_digest(entry)
    return entry


def update_lock(kf, results, note=lambda message: None) -> Path | None:
    """Record every target built or up to date in `results` (failed ones keep their old entry; so
    does one measured on a GPU that this build only compiled, said through `note`); drop entries of
    targets the kernelfile no longer declares. Returns the lock path if its text changed, else None."""
    ok = [r for r in results if r.status in ("built", "up_to_date")]
    if not ok:
        return None
    path = lock_path(kf)
    # a damaged lock raises: never rewritten without its entries (a read one has its targets)
    targets = dict(read_lock(kf)["targets"]) if path.exists() else {}
    for r in ok:
        manifest = Path(r.manifest or (target_dir(kf, r.target) / "manifest.json"))
        # a build holds the manifest it wrote; an up-to-date target's is read (plan read it too)
        if r.built or manifest.is_file():
            m = r.built or read_manifest(manifest)
            new = entry_from_manifest(kf, r.target, m, manifest.parent)
            old = targets.get(str(r.target), {})
            if old.get("measured_on_hardware") and not new["measured_on_hardware"]:
                note(
                    f"{r.target} keeps its entry measured on {(old.get('hardware') or {}).get('name', 'a GPU')}: this build "
                    "was compile-only (build/ holds its kernels: `ptxbuild build --locked` puts the locked ones back)"
                )
                continue
            if _pins(new) != _pins(old) or old.get("entry_sha256") != entry_digest(
                old
            ):  # same kernels: left as is
                targets[str(r.target)] = new
    declared = {str(t) for t in all_targets(kf)}
    return write_lock(path, {k: v for k, v in targets.items() if k in declared})


def pinned_binaries(kf) -> dict[str, list[str]]:
    """Each locked target's dispatch binaries, in order ({} without a readable lock)."""
    try:
        return {
            k: [d["binary"] for d in e["dispatch"]] for k, e in read_lock(kf)["targets"].items()
        }
    except LockUnreadable:
        raise
    except LockError:
        return {}


def _pins(entry: dict) -> str:
    """What an entry pins: everything but cuda-bindings (not the compiler), each problem's lesson provenance and
    floor (the session's copy bandwidth), and the whole kernelfile's digest (a comment's edit changed every entry)."""
    skip = (
        "wheels",
        "entry_sha256",
        "dispatch",
        "kernelfile_digest",
    )  # the op's section: declaration_sha256
    return canonical_json(
        {
            **{k: v for k, v in entry.items() if k not in skip},
            "wheels": {k: v for k, v in entry.get("wheels", {}).items() if k != "cuda-bindings"},
            "dispatch": [
                {k: v for k, v in d.items() if k not in ("lesson", "floor_ms")}
                for d in entry.get("dispatch", [])
            ],
        }
    )


def write_lock(path: Path, targets: dict) -> Path | None:
    lock = {
        "lock_version": LOCK_VERSION,
        "note": "written by ptxbuild build; reproduce with ptxbuild build "
        "--locked; do not edit by hand",
        "targets": targets,
    }
    text = json.dumps(lock, indent=1, sort_keys=True) + "\n"
    if path.is_file() and path.read_text() == text:
        return None  # unchanged: not written, nothing to say
    (tmp := path.with_name(path.name + ".tmp")).write_text(text)
    tmp.replace(path)
    return path


def check_entry(kf, toolchain: dict, t, entry: dict | None, op, op_files: bool = True) -> None:
    """Raise LockError, naming what drifted, unless `entry` holds for `t` as the kernelfile, the
    installed toolchain (`toolchain`: Toolchain.key()) and the op's files are now."""
    if entry is None:
        raise LockError(
            f"{t} is not in {lock_path(kf).name}; build it unlocked once (ptxbuild build {t}) and commit the lock"
        )
    if entry.get("entry_sha256") != entry_digest(entry):
        raise LockError(
            f"{t}: its {lock_path(kf).name} entry was edited (entry sha256 {str(entry.get('entry_sha256'))[:16]}, "
            f"content {entry_digest(entry)[:16]}); refusing it; restore the lock or rebuild unlocked"
        )
    if "declaration_sha256" in entry:  # entries written before it: the whole file below
        now = declaration_digest(kf.ops[t.op]) if t.op in kf.ops else "(no such op)"
        if entry["declaration_sha256"] != now:
            raise LockError(
                f"{t}: [ops.{t.op}] in {kf.path.name} changed since the lock (locked sha256 "
                f"{entry['declaration_sha256'][:16]}, now {now[:16]}); rebuild unlocked to relock"
            )
    elif entry["kernelfile_digest"] != kf.digest:
        raise LockError(
            f"{t}: {kf.path.name} changed since the lock (locked sha256 {entry['kernelfile_digest'][:16]}, "
            f"now {kf.digest[:16]}); rebuild unlocked to relock"
        )
    if entry["gpu"] != kf.gpus[t.gpu].as_dict():
        raise LockError(
            f"{t}: GPU spec drift: locked {entry['gpu']}, now {kf.gpus[t.gpu].as_dict()}"
        )
    # the compilers decide the bytes; the cuda-bindings wrapper version is recorded but does not count
    for name in ("nvrtc", "nvjitlink"):
        if entry["toolchain"].get(name) != toolchain.get(name):
            raise LockError(
                f"{t}: toolchain drift: {name} locked {entry['toolchain'].get(name)}, "
                f"installed {toolchain.get(name)}"
            )
    now = wheel_versions()
    for name, want in sorted(entry.get("wheels", {}).items()):
        if name in COMPILER_WHEELS and now.get(name) != want:
            raise LockError(
                f"{t}: toolchain drift: {name} locked {want}, installed {now.get(name)}; "
                f"run: pip install '{name}=={want}'"
            )
    files = file_digests(op)
    for name in changed_files(entry["op_files"], files) if op_files else ():
        how = (
            RELOCK
            if name.endswith(KERNEL_SOURCE_SUFFIXES)
            else "the op's host code changed: " + RELOCK_GPU
        )
        raise LockError(
            f"{t}: op drift: {op.FOLDER.name}/{name} locked sha256 "
            f"{str(entry['op_files'].get(name))[:16]}, now {str(files.get(name))[:16]}; {how.format(t=t)}"
        )
    if entry["op_version"] != op.VERSION:
        raise LockError(
            f"{t}: op drift: VERSION locked {entry['op_version']}, now {op.VERSION}; {RELOCK.format(t=t)}"
        )


KERNEL_SOURCE_SUFFIXES = (".cu", ".cuh", ".h", ".hpp", ".ptx")  # what relock may accept edits to
RELOCK_GPU = (
    "check out the locked revision, or run `ptxbuild build {t}` (on the target's GPU when it was "
    "measured) to search, verify and lock again"
)
RELOCK = (
    "the op's sources changed since the lock was written: run `ptxbuild relock {t}` if only kernel "
    "sources changed and the edit cannot alter the kernels (it checks that every locked binary "
    "reproduces); otherwise " + RELOCK_GPU
)
