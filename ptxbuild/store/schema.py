"""The cache's tables, versioned: each migration takes a cache one schema version up (Cache.migrate
runs them, each in its own transaction), and how compiled PTX and cubins are stored."""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the migrations get a Cache's sqlite-utils Database (imported at its first use)
    import sqlite_utils

SCHEMA_VERSION = 4
_ELF = b"\x7fELF"
# the lessons table as v1 makes it: the columns put_lessons writes. The v1 migration reads this,
# so a later schema version that adds a lessons column adds it in its own migration, not here.
LESSON_COLUMNS = {
    "id": str,
    "op": str,
    "kind": str,
    "scope": str,
    "rule": str,
    "evidence": str,
    "confidence": float,
    "source": str,
    "retired": int,
    "created": float,
}


def pack_binary(ptx: str | None, cubin: bytes | None) -> tuple[bytes | None, bytes | None]:
    """PTX and cubin as stored: zlib-compressed (PTX text shrinks ~10x, a cubin ~3x; a cache that
    travels with a model repo or to a GPU machine stays small)."""
    return (
        zlib.compress(ptx.encode(), 6) if ptx is not None else None,
        zlib.compress(cubin, 6) if cubin is not None else None,
    )


def unpack_binary(ptx: str | bytes | None, cubin: bytes | None) -> tuple[str | None, bytes | None]:
    """Inverse of pack_binary; rows written before schema v4 (PTX as text, a raw ELF cubin) read as they are."""
    if isinstance(ptx, bytes):
        ptx = zlib.decompress(ptx).decode()
    if cubin is not None and not cubin.startswith(_ELF):
        cubin = zlib.decompress(cubin)
    return ptx, cubin


def _v1(db: sqlite_utils.Database) -> None:
    db["meta"].create({"key": str, "value": str}, pk="key", if_not_exists=True)
    db["compiles"].create(
        {
            "key": str,
            "arch": str,
            "entry": str,
            "outcome": str,
            "error": str,
            "ptx": str,
            "cubin": bytes,
            "digest": str,
            "registers": int,
            "spill_bytes": int,
            "smem_static_bytes": int,
            "local_bytes": int,
            "log": str,
            "toolchain": str,
            "seconds": float,
            "created": float,
        },
        pk="key",
        if_not_exists=True,
    )
    db["verdicts"].create(
        {
            "key": str,
            "binary": str,
            "suite": str,
            "problem": str,
            "outcome": str,
            "detail": str,
            "max_abs_err": float,
            "max_rel_err": float,
            "cases": int,
            "seconds": float,
            "created": float,
        },
        pk="key",
        if_not_exists=True,
    )
    db["measurements"].create(
        {
            "key": str,
            "binary": str,
            "fingerprint": str,
            "problem": str,
            "outcome": str,
            "p50_ms": float,
            "p20_ms": float,
            "p80_ms": float,
            "samples": int,
            "floor_ms": float,
            "copy_tbps": float,
            "detail": str,
            "seconds": float,
            "created": float,
        },
        pk="key",
        if_not_exists=True,
    )
    db["attempts"].create(
        {
            "id": int,
            "run": str,
            "target": str,
            "op": str,
            "gpu": str,
            "arch": str,
            "problem": str,
            "params": str,
            "outcome": str,
            "detail": str,
            "binary": str,
            "registers": int,
            "spill_bytes": int,
            "compile_s": float,
            "verify_s": float,
            "measure_s": float,
            "p50_ms": float,
            "measured_on": str,
            "created": float,
        },
        pk="id",
        if_not_exists=True,
    )
    db["builds"].create(
        {
            "id": int,
            "target": str,
            "key": str,
            "kernelfile": str,
            "status": str,
            "measured": int,
            "manifest": str,
            "summary": str,
            "created": float,
        },
        pk="id",
        if_not_exists=True,
    )
    db["lessons"].create(LESSON_COLUMNS, pk="id", if_not_exists=True)


def _v2(db: sqlite_utils.Database) -> None:
    db["attempts"].create_index(["target", "problem"], if_not_exists=True)
    db["builds"].create_index(["target", "key"], if_not_exists=True)


def _v3(db: sqlite_utils.Database) -> None:
    """Builds belong to a kernelfile's project: several kernelfiles may share one cache (and a target name)."""
    db["builds"].add_column("project", str, not_null_default="")
    db["builds"].create_index(["project", "target"], if_not_exists=True)


def _v4(db: sqlite_utils.Database) -> None:
    """Compiled PTX and cubins stored compressed (pack_binary); the space is returned by a VACUUM after."""
    for key, ptx, cubin in db.execute(
        "select key, ptx, cubin from compiles where outcome = 'ok'"
    ).fetchall():
        ptx, cubin = pack_binary(*unpack_binary(ptx, cubin))
        db.execute("update compiles set ptx = ?, cubin = ? where key = ?", [ptx, cubin, key])


MIGRATIONS = {1: _v1, 2: _v2, 3: _v3, 4: _v4}
