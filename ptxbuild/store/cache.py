"""The SQLite cache: per-step content-keyed results, append-only attempts, builds, lessons."""

from __future__ import annotations

import json
import sqlite3
import time
import zlib
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import sqlite_utils

from ..errors import ToolError
from ..problem import Binary

SCHEMA_VERSION = 4
_ELF = b"\x7fELF"


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
    db["lessons"].create(
        {
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
        },
        pk="id",
        if_not_exists=True,
    )


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


class CacheError(ToolError):
    """The cache file cannot be used (damaged, not SQLite, newer, a folder, read-only): one line that
    names it and the way out."""


def shown(path: Path) -> str:
    """A path as the user would type it: relative to the working folder when under it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def way_out(path: Path) -> str:
    p = shown(path)
    return (
        f"move it aside: mv {p} {p}.bad (the next build starts a new cache from the lock and "
        "cache/lessons.jsonl; `ptxbuild cache check` says what is wrong)"
    )


def cache_error(path: Path, exc: BaseException) -> CacheError:
    """The CacheError of an SQLite (or OS) error raised while using the cache at `path`."""
    text = str(exc)
    if "readonly" in text or "unable to open" in text or isinstance(exc, PermissionError):
        return CacheError(
            f"{shown(path)}: not writable ({text}): the file or its folder is read-only; make both "
            f"writable (chmod u+w), or point [project] cache at a writable path"
        )
    if "locked" in text or "busy" in text:
        return CacheError(
            f"{shown(path)}: busy ({text}): another ptxbuild is using it; wait, or stop it"
        )
    what = "is not an SQLite database" if "not a database" in text else f"is damaged ({text})"
    return CacheError(f"{shown(path)}: {what}; {way_out(path)}")


DAMAGE = ("not a database", "malformed", "readonly", "unable to open", "disk I/O")


def _header_problem(path: Path) -> str | None:
    """What the first 100 bytes say is wrong (not SQLite; shorter than its header says), or None."""
    size = path.stat().st_size
    if size == 0:
        return None  # a new, empty database
    with path.open("rb") as f:
        head = f.read(100)
    if not head.startswith(b"SQLite format 3\0"):
        return "is not an SQLite database"
    page = int.from_bytes(head[16:18], "big")
    pages = int.from_bytes(head[28:32], "big") if head[24:28] == head[92:96] else 0
    wal = path.with_name(path.name + "-wal")
    if pages and not (wal.is_file() and wal.stat().st_size) and size < pages * (page or 65536):
        return f"is damaged: truncated ({size} of {pages * (page or 65536)} bytes)"
    return None


class Cache:
    """One SQLite file (WAL). Every write commits at once, so a kill loses only work in flight."""

    opened: Path | None = None  # the last cache opened (the CLI names it when SQLite fails later)

    def __init__(self, path: str | Path):
        path = Path(path)
        if str(path) != ":memory:":
            if path.is_dir():
                raise CacheError(f"{shown(path)}: is a folder, not a cache file; {way_out(path)}")
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise cache_error(path, exc) from None
            if path.is_file() and (why := _header_problem(path)):
                raise CacheError(f"{shown(path)}: {why}; {way_out(path)}")
            Cache.opened = path
        try:
            self.db = sqlite_utils.Database(
                sqlite3.connect(str(path), timeout=30, isolation_level=None)
            )
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.path = path
            self.migrate()
        except sqlite3.DatabaseError as exc:
            if not any(d in str(exc) for d in DAMAGE):
                raise  # e.g. another process creating the same new cache: theirs to finish
            raise cache_error(path, exc) from None

    @contextmanager
    def transaction(self):
        """All writes inside commit together or not at all (the connection is otherwise autocommit)."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def version(self) -> int:
        if "meta" not in self.db.table_names():
            return 0
        rows = list(self.db.query("select value from meta where key = 'schema_version'"))
        return int(rows[0]["value"]) if rows else 0

    def migrate(self) -> None:
        current = self.version()
        if current > SCHEMA_VERSION:
            raise CacheError(
                f"{shown(self.path)}: cache schema v{current} is newer than this ptxbuild "
                f"(v{SCHEMA_VERSION}); upgrade ptxbuild, or {way_out(self.path)}"
            )
        for v in range(current + 1, SCHEMA_VERSION + 1):
            with self.transaction():  # read again under the write lock: another process may have
                if self.version() < v:  # migrated since (two builds opening one new cache)
                    MIGRATIONS[v](self.db)
                    self.db["meta"].upsert({"key": "schema_version", "value": str(v)}, pk="key")
        if 0 < current < 4 <= SCHEMA_VERSION:
            self.give_pages_back()  # v4 shrank the compiles table in place

    # -- compile step ---------------------------------------------------------------------------
    def get_compile(self, key: str) -> dict | None:
        row = self.get("compiles", key)
        if row is None:
            return None
        try:
            row["ptx"], row["cubin"] = unpack_binary(row["ptx"], row["cubin"])
        except (zlib.error, UnicodeDecodeError):
            return None  # a damaged row: compile again (put_compile overwrites it)
        return row

    def put_compile(
        self,
        key: str,
        arch: str,
        entry: str,
        binary: Binary | None,
        error: str,
        toolchain: str,
        seconds: float,
    ) -> None:
        row = {
            "key": key,
            "arch": arch,
            "entry": entry,
            "outcome": "ok" if binary else "compile_error",
            "error": error,
            "toolchain": toolchain,
            "seconds": seconds,
            "created": time.time(),
        }
        if binary:
            ptx, cubin = pack_binary(binary.ptx, binary.cubin)
            row.update(
                ptx=ptx,
                cubin=cubin,
                digest=binary.digest,
                registers=binary.registers,
                spill_bytes=binary.spill_bytes,
                smem_static_bytes=binary.smem_static_bytes,
                local_bytes=binary.local_bytes,
                log=binary.log,
            )
        self.db["compiles"].upsert(row, pk="key")

    # -- verify / measure steps -----------------------------------------------------------------
    def get(self, table: str, key: str) -> dict | None:
        rows = list(self.db.query(f"select * from {table} where key = ?", [key]))
        return rows[0] if rows else None

    def put(self, table: str, row: dict) -> float:
        """Store `row` (by its key) stamped with the time; returns that time."""
        created = time.time()
        self.db[table].upsert({**row, "created": created}, pk="key")
        return created

    # -- attempts and builds --------------------------------------------------------------------
    def add_attempt(self, **row: Any) -> int:
        row = {
            k: (json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v)
            for k, v in row.items()
        }
        return self.db["attempts"].insert({**row, "created": time.time()}).last_pk

    def attempts(self, target: str | None = None, run: str | None = None) -> list[dict]:
        where = " and ".join(
            ["1 = 1"] + (["target = ?"] if target else []) + (["run = ?"] if run else [])
        )
        return list(
            self.db.query(
                f"select * from attempts where {where} order by id", [v for v in (target, run) if v]
            )
        )

    def recorded_attempts(self, op: str | None = None, gpu: str | None = None):
        """Attempts (of one op, on one GPU, if given) in the order they were made, invalid and
        pruned configs left out: what a replay recording holds."""
        where = (
            ["outcome not in ('invalid', 'pruned')"]
            + (["op = ?"] if op else [])
            + (["gpu = ?"] if gpu else [])
        )
        return self.db.query(
            f"select * from attempts where {' and '.join(where)} order by id",
            [v for v in (op, gpu) if v],
        )

    def recent_lessons(self, op: str, kind: str, arch: str, limit: int) -> list[dict]:
        """The scope and rule of the newest `limit` live lessons of one kind of `op` on `arch`."""
        sql = (
            "select scope, rule from lessons where op = ? and kind = ? and retired = 0 and "
            "json_extract(scope, '$.arch') = ? order by created desc limit ?"
        )
        return list(self.db.query(sql, [op, kind, arch, limit]))

    def put_lessons(self, rows) -> None:
        """Insert or replace lesson rows by id."""
        for row in rows:
            self.db["lessons"].upsert(row, pk="id")

    def add_build(
        self,
        target: str,
        key: str,
        kernelfile: str,
        status: str,
        measured: bool,
        manifest: str,
        summary: dict,
        project: str = "",
    ) -> None:
        self.db["builds"].insert(
            {
                "target": target,
                "key": key,
                "kernelfile": kernelfile,
                "status": status,
                "measured": int(measured),
                "manifest": manifest,
                "project": project,
                "summary": json.dumps(summary, sort_keys=True),
                "created": time.time(),
            }
        )

    def last_build(self, target: str, project: str = "") -> dict | None:
        """The latest build of `target` by the kernelfile whose [project] name is `project`. A project with no build of
        its own sees the builds made before schema v3 (project ""), whose kernelfile is unknown: upgrading ptxbuild must
        not make every target "never built". Their build keys still decide whether a target is up to date."""
        for p in dict.fromkeys([project, ""]):
            rows = list(
                self.db.query(
                    "select * from builds where target = ? and project = ? order by id desc limit 1",
                    [target, p],
                )
            )
            if rows:
                return rows[0]
        return None

    def give_pages_back(self) -> None:
        """VACUUM, if nobody holds the file (busy or out of disk, deleted rows stay deleted; the file stays larger)."""
        with suppress(sqlite3.OperationalError):
            self.db.execute("VACUUM")

    def counts(self) -> dict[str, int]:
        """Rows per table."""
        return {t: self.db[t].count for t in sorted(self.db.table_names())}

    def prune_compiles(self, older_than_s: float) -> int:
        """Drop stored compiles (PTX and cubin: a pure function of source, arch and toolchain, redone on demand) older
        than `older_than_s` seconds and VACUUM; returns how many. Attempts, verdicts, timings, builds, lessons stay."""
        n = self.db.execute(
            "DELETE FROM compiles WHERE created < ?", [time.time() - older_than_s]
        ).rowcount
        self.give_pages_back()
        return n

    def integrity(self) -> str:
        return list(self.db.query("PRAGMA integrity_check"))[0]["integrity_check"]


def check(path: Path) -> str:
    """`ptxbuild cache check`: what the cache holds, or CacheError saying what is wrong and the way out."""
    if not path.exists():
        return "no cache yet (a build makes one)"
    cache = Cache(path)
    try:
        result = cache.integrity()
        rows = sum(cache.counts().values())
    except sqlite3.DatabaseError as exc:
        raise cache_error(path, exc) from None
    if result != "ok":
        raise CacheError(f"{shown(path)}: is damaged ({result.splitlines()[0]}); {way_out(path)}")
    return f"schema v{cache.version()}, {rows} rows, integrity ok"
