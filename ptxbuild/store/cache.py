"""The SQLite cache: per-step content-keyed results, append-only attempts, builds, lessons."""

from __future__ import annotations

import json
import sqlite3
import time
import zlib
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported at a Cache's first use of it: plan and a no-op build read with sqlite3
    import sqlite_utils

    from ..records import BuildSummary

from ..errors import ToolError, shown
from ..problem import Binary
from .schema import LESSON_COLUMNS, MIGRATIONS, SCHEMA_VERSION, pack_binary, unpack_binary

# a compile row's columns that hold a Binary's field of the same name (besides PTX and cubin)
BINARY_COLUMNS = ("registers", "spill_bytes", "smem_static_bytes", "local_bytes", "log")


class CacheError(ToolError):
    """The cache file cannot be used (damaged, not SQLite, newer, a folder, read-only): one line that
    names it and the way out."""


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
            self._db: sqlite_utils.Database | None = None
            self.conn = sqlite3.connect(str(path), timeout=30, isolation_level=None)
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=NORMAL")
            self.path = path
            self.migrate()
        except sqlite3.DatabaseError as exc:
            if not any(d in str(exc) for d in DAMAGE):
                raise  # e.g. another process creating the same new cache: theirs to finish
            raise cache_error(path, exc) from None

    def close(self) -> None:
        """Close the connection (one per thread: a build spread over GPUs opens one per problem)."""
        self.db.conn.close()

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

    @property
    def db(self) -> sqlite_utils.Database:
        """sqlite-utils over the connection (~0.1 s to import: not for a cache only read by plan)."""
        if self._db is None:
            import sqlite_utils

            self._db = sqlite_utils.Database(self.conn)
        return self._db

    def _rows(self, sql: str, params: Any = ()) -> list[dict]:
        cur = self.conn.execute(sql, params)
        return [dict(zip([d[0] for d in cur.description], r)) for r in cur.fetchall()]

    def version(self) -> int:
        if not self._rows("select name from sqlite_master where type = 'table' and name = 'meta'"):
            return 0
        rows = self._rows("select value from meta where key = 'schema_version'")
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
    def get_compile(self, key: str) -> tuple[Binary | None, str] | None:
        """What put_compile stored under `key`: (the Binary, "") or (None, the compiler's error);
        None where nothing is, or the row is damaged (compile again: put_compile overwrites it)."""
        row = self.get("compiles", key)
        if row is None:
            return None
        if row["outcome"] != "ok":
            return None, row["error"] or ""
        try:
            ptx, cubin = unpack_binary(row["ptx"], row["cubin"])
        except (zlib.error, UnicodeDecodeError):
            return None
        kept = ("arch", "entry", *BINARY_COLUMNS)
        return Binary(
            ptx=ptx, cubin=cubin, compiler=row["toolchain"], **{k: row[k] for k in kept}
        ), ""

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
        }
        if binary:
            ptx, cubin = pack_binary(binary.ptx, binary.cubin)
            row.update(ptx=ptx, cubin=cubin, digest=binary.digest)
            row.update({k: getattr(binary, k) for k in BINARY_COLUMNS})
        self.put("compiles", row)

    # -- verify / measure steps -----------------------------------------------------------------
    def get(self, table: str, key: str) -> dict | None:
        return next(self.db.query(f"select * from {table} where key = ?", [key]), None)

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

    def attempts(
        self, target: str | None = None, run: str | None = None, **where: Any
    ) -> list[dict]:
        """The attempts whose columns hold these values (None: any), in the order they were made."""
        where = {k: v for k, v in {"target": target, "run": run, **where}.items() if v is not None}
        sql = " and ".join(["1 = 1"] + [f"{k} = ?" for k in where])
        return self._rows(f"select * from attempts where {sql} order by id", list(where.values()))

    def run_attempts(self, target: str, run: str) -> list[dict]:
        """The attempts of `target` in `run`, in the order of the (target, problem) index."""
        return self._rows("select * from attempts where target = ? and run = ?", [target, run])

    # -- lessons --------------------------------------------------------------------------------
    def live_lessons(self, op: str, kind: str | None = None, min_confidence: float | None = None):
        """The lessons of `op` not retired (of one kind; at least this confident), in table order."""
        rows = self.db.query("select * from lessons where op = ? and retired = 0", [op])
        return [
            r
            for r in rows
            if kind in (None, r["kind"])
            and (min_confidence is None or r["confidence"] >= min_confidence)
        ]

    def recent_lessons(self, op: str, kind: str, arch: str, limit: int) -> list[dict]:
        """The scope and rule of the newest `limit` live lessons of one kind of `op` on `arch`."""
        sql = (
            "select scope, rule from lessons where op = ? and kind = ? and retired = 0 and "
            "json_extract(scope, '$.arch') = ? order by created desc limit ?"
        )
        return list(self.db.query(sql, [op, kind, arch, limit]))

    def lesson_rows(self, op: str | None, include_retired: bool, order: str) -> list[dict]:
        """The lessons (of one op, if given; retired ones only if asked), ordered by `order`."""
        where = (
            ["1 = 1"] + (["op = ?"] if op else []) + ([] if include_retired else ["retired = 0"])
        )
        sql = f"select * from lessons where {' and '.join(where)} order by {order}"
        return list(self.db.query(sql, [op] if op else []))

    def has_lesson(self, lesson_id: str) -> bool:
        return bool(list(self.db.query("select 1 from lessons where id = ?", [lesson_id])))

    def lesson_count(self) -> int:
        return int(self._rows("select count(*) as n from lessons")[0]["n"])

    def count_lessons(self, ids: list[str], source_like: str) -> int:
        """How many of the lessons `ids` have a source LIKE `source_like`."""
        marks = ", ".join("?" * len(ids))
        sql = f"select count(*) as n from lessons where id in ({marks}) and source like ?"
        return next(self.db.query(sql, [*ids, source_like]))["n"]

    # writes inside transaction() are plain SQL: sqlite-utils before 4.0 commits its own writes
    # (`with conn:`), which would end the transaction early
    def put_lessons(self, rows) -> None:
        """Insert lesson rows; a row whose id is there already sets the columns it gives (an upsert)."""
        for row in rows:
            cols = [c for c in LESSON_COLUMNS if c in row]
            sets = ", ".join(f"{c} = excluded.{c}" for c in cols if c != "id")
            self.db.execute(
                f"insert into lessons ({', '.join(cols)}) values ({', '.join('?' * len(cols))}) "
                f"on conflict(id) do update set {sets}",
                [row[c] for c in cols],
            )

    def update_lesson(self, lesson_id: str, changes: dict) -> None:
        """Set the columns `changes` names of the lesson `lesson_id`."""
        sets = ", ".join(f"{c} = ?" for c in changes)
        self.db.execute(f"update lessons set {sets} where id = ?", [*changes.values(), lesson_id])

    def add_build(
        self, summary: BuildSummary, key: str, status: str, manifest: str, project: str = ""
    ) -> None:
        """Record a build of `summary.target` (its build key, status and manifest path)."""
        self.db["builds"].insert(
            {
                "target": summary.target,
                "key": key,
                "kernelfile": summary.kernelfile,
                "status": status,
                "measured": int(summary.measured),
                "manifest": manifest,
                "project": project,
                "summary": json.dumps(summary.to_json(), sort_keys=True),
                "created": time.time(),
            }
        )

    def last_build(self, target: str, project: str = "") -> dict | None:
        """The latest build of `target` by the kernelfile whose [project] name is `project`. A project with no build of
        its own sees the builds made before schema v3 (project ""), whose kernelfile is unknown: upgrading ptxbuild must
        not make every target "never built". Their build keys still decide whether a target is up to date."""
        for p in dict.fromkeys([project, ""]):
            rows = self._rows(
                "select * from builds where target = ? and project = ? order by id desc limit 1",
                [target, p],
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
