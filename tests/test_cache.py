"""The SQLite cache: schema migrations, a kill -9 mid-build loses nothing that finished, and all
SQL behind its named queries."""

import ast
import os
import re
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from ptxbuild.records import BuildSummary
from ptxbuild.store.cache import LESSON_COLUMNS, SCHEMA_VERSION, Cache

ROOT = Path(__file__).resolve().parents[1]


def test_new_cache_is_at_the_current_schema_and_reopens(tmp_path):
    c = Cache(tmp_path / "c.sqlite")
    assert c.version() == SCHEMA_VERSION
    c.add_attempt(run="r", target="a@b", outcome="ok", params={"x": 1})
    c2 = Cache(tmp_path / "c.sqlite")
    assert [a["params"] for a in c2.attempts("a@b")] == ['{"x": 1}']
    assert c2.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_migrates_a_v1_database_without_dropping_rows(tmp_path):
    import sqlite3

    import sqlite_utils

    from ptxbuild.store.cache import MIGRATIONS

    db = sqlite_utils.Database(sqlite3.connect(tmp_path / "c.sqlite"))
    MIGRATIONS[1](db)
    db["meta"].insert({"key": "schema_version", "value": "1"})
    db["attempts"].insert({"run": "old", "target": "a@b", "outcome": "ok"})
    db.conn.commit()
    db.conn.close()
    c = Cache(tmp_path / "c.sqlite")
    assert c.version() == SCHEMA_VERSION
    assert [a["run"] for a in c.attempts("a@b")] == ["old"]
    assert "idx_attempts_target_problem" in [i.name for i in c.db["attempts"].indexes]


def test_migrates_a_v2_cache_with_builds_to_v3(tmp_path):
    """v3 adds builds.project: a v2 cache's builds survive the upgrade (project ""), and builds of
    named projects go beside them."""
    import sqlite3

    import sqlite_utils

    from ptxbuild.store.cache import MIGRATIONS

    db = sqlite_utils.Database(sqlite3.connect(tmp_path / "c.sqlite"))
    MIGRATIONS[1](db)
    MIGRATIONS[2](db)
    db["meta"].insert({"key": "schema_version", "value": "2"})
    db["builds"].insert(
        {
            "target": "a@b",
            "key": "k1",
            "kernelfile": "d",
            "status": "ok",
            "measured": 1,
            "manifest": "m",
            "summary": "{}",
            "created": 1.0,
        }
    )
    db.conn.commit()
    db.conn.close()
    c = Cache(tmp_path / "c.sqlite")
    assert c.version() == SCHEMA_VERSION
    old = c.last_build("a@b", "")
    assert old["key"] == "k1" and old["project"] == "" and old["status"] == "ok"
    assert c.last_build("a@b", "proj")["key"] == "k1"  # a project's first look: the pre-v3 build
    summary = BuildSummary(
        "a@b", "sm_90a", "never built", True, None, "d", {}, "r", {}, "", None, []
    )
    c.add_build(summary, "k2", "ok", "m", "proj")
    assert c.last_build("a@b", "proj")["kernelfile"] == "d"
    assert c.last_build("a@b", "proj")["key"] == "k2" and c.last_build("a@b", "")["key"] == "k1"
    assert (
        Cache(tmp_path / "c.sqlite").version() == SCHEMA_VERSION
    )  # reopening migrates nothing again
    assert ["project", "target"] in [i.columns for i in c.db["builds"].indexes]


def _v3_cache_with_a_compile(path, ptx: str, cubin: bytes):
    import sqlite3

    import sqlite_utils

    from ptxbuild.store.cache import MIGRATIONS

    db = sqlite_utils.Database(sqlite3.connect(path))
    for v in (1, 2, 3):
        MIGRATIONS[v](db)
    db["meta"].insert({"key": "schema_version", "value": "3"})
    db["compiles"].insert(
        {
            "key": "k",
            "arch": "sm_90a",
            "entry": "e",
            "outcome": "ok",
            "error": "",
            "ptx": ptx,
            "cubin": cubin,
            "digest": "d",
            "registers": 32,
            "spill_bytes": 0,
        }
    )
    db["compiles"].insert(
        {
            "key": "bad",
            "arch": "sm_90a",
            "entry": "e",
            "outcome": "compile_error",
            "error": "nvrtc: boom",
            "ptx": None,
            "cubin": None,
        }
    )
    db.conn.commit()
    db.conn.close()


def test_v4_compresses_binaries_of_an_older_cache_and_reads_them_back_unchanged(tmp_path):
    """v4 stores PTX and cubins zlib-compressed: a v3 cache's rows migrate, read back byte for byte,
    and the file shrinks (VACUUM); failed compiles keep their error."""
    ptx = "//\n.version 9.0\n.target sm_90a\n" + "\tadd.f32 %f1, %f2, %f3;\n" * 20000
    cubin = b"\x7fELF" + bytes(range(256)) * 400
    _v3_cache_with_a_compile(tmp_path / "c.sqlite", ptx, cubin)
    before = (tmp_path / "c.sqlite").stat().st_size
    c = Cache(tmp_path / "c.sqlite")
    assert c.version() == SCHEMA_VERSION >= 4
    binary, error = c.get_compile("k")
    assert binary.ptx == ptx and binary.cubin == cubin and binary.registers == 32 and error == ""
    assert c.get_compile("bad") == (None, "nvrtc: boom")
    stored_ptx, stored_cubin = c.db.execute(
        "select ptx, cubin from compiles where key = 'k'"
    ).fetchone()
    assert isinstance(stored_ptx, bytes) and len(stored_ptx) < len(ptx) // 10
    assert not stored_cubin.startswith(b"\x7fELF") and len(stored_cubin) < len(cubin)
    c.db.conn.close()
    assert (tmp_path / "c.sqlite").stat().st_size < before // 4


def test_new_compiles_are_stored_compressed_and_round_trip(tmp_path):
    from ptxbuild.problem import Binary

    c = Cache(tmp_path / "c.sqlite")
    b = Binary(
        arch="sm_90a",
        entry="e",
        ptx=".version 9.0\n" * 500,
        cubin=b"\x7fELF" + b"\0" * 5000,
        registers=40,
        spill_bytes=0,
        smem_static_bytes=0,
        local_bytes=0,
        log="",
    )
    c.put_compile("k", "sm_90a", "e", b, "", "nvrtc 13.0", 0.1)
    got, _ = Cache(tmp_path / "c.sqlite").get_compile("k")
    assert got == Binary(**{**b.__dict__, "compiler": "nvrtc 13.0"})  # what it took, and by whom
    assert len(c.db.execute("select cubin from compiles").fetchone()[0]) < 200


def test_prune_drops_only_old_compiles_and_keeps_the_evidence(tmp_path):
    from ptxbuild.problem import Binary

    c = Cache(tmp_path / "c.sqlite")
    b = Binary(
        arch="sm_90a",
        entry="e",
        ptx=".version 9.0\n" * 500,
        cubin=b"\x7fELF" + b"\0" * 5000,
        registers=40,
        spill_bytes=0,
        smem_static_bytes=0,
        local_bytes=0,
        log="",
    )
    c.put_compile("old", "sm_90a", "e", b, "", "nvrtc 13.0", 0.1)
    c.put_compile("new", "sm_90a", "e", b, "", "nvrtc 13.0", 0.1)
    c.db.execute("UPDATE compiles SET created = ? WHERE key = 'old'", [time.time() - 10 * 86400])
    c.put("measurements", {"key": "m", "binary": "d", "p50_ms": 1.0})
    c.add_attempt(run="r", target="t", outcome="ok", p50_ms=1.0)
    before = c.counts()
    assert c.prune_compiles(7 * 86400) == 1
    after = Cache(tmp_path / "c.sqlite")
    assert after.get_compile("old") is None and after.get_compile("new")[0].ptx == b.ptx
    assert {**before, "compiles": 1} == after.counts()
    assert c.prune_compiles(0) == 1 and after.counts()["compiles"] == 0


def test_a_damaged_compile_row_reads_as_absent_and_is_compiled_again(tmp_path):
    from ptxbuild.problem import Binary

    c = Cache(tmp_path / "c.sqlite")
    b = Binary(
        arch="sm_90a",
        entry="e",
        ptx=".version 9.0\n",
        cubin=b"\x7fELF" + b"\0" * 64,
        registers=40,
        spill_bytes=0,
        smem_static_bytes=0,
        local_bytes=0,
        log="",
    )
    c.put_compile("k", "sm_90a", "e", b, "", "nvrtc 13.0", 0.1)
    c.db.execute("update compiles set ptx = ? where key = 'k'", [b"\x78\x9cnot zlib"])
    assert c.get_compile("k") is None
    c.put_compile("k", "sm_90a", "e", b, "", "nvrtc 13.0", 0.1)
    assert c.get_compile("k")[0].ptx == b.ptx


SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    from tests.fakes import FakeCompiler
    from tests.conftest import make_ctx
    from ptxbuild.build.run import build
    from pathlib import Path
    comp = FakeCompiler(delay_s=float(sys.argv[2]))
    build(make_ctx(Path(sys.argv[1]), comp))
    print(len(comp.calls))
""")


def compiles_so_far(db: Path) -> int:
    """Rows in the child's compiles table, read-only: Cache(db) here would migrate a cache the child
    is still creating (this process then ran the schema's migrations beside the child's: the race
    that made the test flaky under load), and any state of a cache being created counts as 0."""
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)
        try:
            return con.execute("SELECT count(*) FROM compiles").fetchone()[0]
        finally:
            con.close()
    except sqlite3.Error:  # not there yet, no table yet, locked: not yet
        return 0


def test_kill_9_mid_build_then_rerun(proj):
    script = proj / "run_build.py"
    script.write_text(SCRIPT.format(root=str(ROOT)))
    shape_lines = "shapes = [" + ", ".join(f"[4, {32 * i}]" for i in range(1, 9)) + "]"
    kf = proj / "kernelfile.toml"
    kf.write_text(
        kf.read_text()
        .replace("shapes = [[64, 1024], [7, 100]]", shape_lines)
        .replace("budget = 6", "budget = 6, strategy = 'exhaustive'")
    )
    p = subprocess.Popen([sys.executable, str(script), str(proj), "0.3"], stdout=subprocess.PIPE)
    db = proj / "cache/ptxbuild.sqlite"
    deadline = time.time() + 120
    while time.time() < deadline and compiles_so_far(db) < 3:
        time.sleep(0.2)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    cache = Cache(db)
    assert cache.integrity() == "ok"
    done = {r["key"] for r in cache.db["compiles"].rows}
    assert len(done) >= 3
    assert cache.db["builds"].count == 0 or cache.last_build("scale@h100", "toy")["status"] == "ok"
    out = subprocess.run(
        [sys.executable, str(script), str(proj), "0"], capture_output=True, text=True, check=True
    )
    recompiled = int(out.stdout.strip())
    total = Cache(db).db["compiles"].count
    assert recompiled == total - len(done)  # nothing that finished was compiled again
    assert Cache(db).integrity() == "ok"
    assert {b["target"] for b in Cache(db).db["builds"].rows} == {"scale@h100", "scale@b200"}


# --- all SQL behind the store's named queries (issue 26 item 5) ---------------------------------

PKG = ROOT / "ptxbuild"
# the connection's one owner (Cache, its named queries) and the versioned tables it migrates
SQL_HOMES = {"store/cache.py", "store/schema.py"}
_SQL = re.compile(
    r"^\s*(select\b.*\bfrom\b|insert\s+(or\s+\w+\s+)?into\b|update\s+\w+\s+set\b|delete\s+from\b|"
    r"(create|drop)\s+(table|index|view|trigger)\b|alter\s+table\b|pragma\s+\w+|"
    r"(begin|commit|rollback|vacuum|savepoint|release)(\s+\w+)*\s*;?\s*$)",
    re.IGNORECASE | re.DOTALL,
)


def sql_strings(source: str) -> list[tuple[int, str]]:
    """(line, text) of each string literal (an f-string's literal parts joined) that is an SQL
    statement, and each attribute access `.db` (the connection) in `source`."""
    found, tree = [], ast.parse(source)
    parts = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    for node in ast.walk(tree):
        if id(node) in parts:
            continue
        if isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else "x" for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
        elif isinstance(node, ast.Attribute) and node.attr == "db":
            text = ".db"
        else:
            continue
        if text == ".db" or _SQL.match(text):
            found.append((node.lineno, text[:60]))
    return sorted(found)


def test_the_sql_detector_finds_statements_and_the_connection_not_prose():
    src = (
        'a = "select * from lessons where id = ?"\n'
        'b = f"delete from {t} where created < ?"\n'
        'c = "BEGIN IMMEDIATE"\n'
        "d = cache.db.query(x)\n"
        'e = "Drop compiled PTX and cubin stored more than DAYS ago."\n'
        'f = "Select the targets to build"\n'
        'g = "update the lock\'s op digests"\n'
    )
    assert [line for line, _ in sql_strings(src)] == [1, 2, 3, 4]


def test_no_sql_and_no_connection_outside_the_store_s_named_queries():
    """Every SQL statement, and every use of the connection, lives in store/cache.py (named query
    methods, transaction()) or store/schema.py (the migrations): lessons, learn, lessons_io, the
    CLI and the build call the cache's methods."""
    bad = [
        f"{p.relative_to(PKG).as_posix()}:{line}: {text!r}"
        for p in sorted(PKG.rglob("*.py"))
        if p.relative_to(PKG).as_posix() not in SQL_HOMES
        for line, text in sql_strings(p.read_text())
    ]
    assert not bad, "SQL outside the store's named queries:\n" + "\n".join(bad)
    homes = "".join((PKG / h).read_text() for h in SQL_HOMES)
    assert len(sql_strings(homes)) > 10  # the detector sees the store's own queries


def test_transaction_commits_together_or_rolls_back_on_the_autocommit_connection(tmp_path):
    c = Cache(tmp_path / "c.sqlite")
    row = dict(zip(LESSON_COLUMNS, ["a", "op", "best", "{}", "{}", "[]", 1.0, "", 0, 0.0]))
    try:
        with c.transaction():
            c.put_lessons([row])
            c.update_lesson("a", {"confidence": 0.5})
            assert c.db.conn.in_transaction
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    assert not c.db.conn.in_transaction and c.lesson_count() == 0
    with c.transaction():
        c.put_lessons([row])
        c.put_lessons([{**row, "id": "b"}])
        c.update_lesson("a", {"confidence": 0.5})
    again = Cache(tmp_path / "c.sqlite")
    assert [(r["id"], r["confidence"]) for r in again.live_lessons("op")] == [
        ("a", 0.5),
        ("b", 1.0),
    ]
    assert again.has_lesson("b") and not again.has_lesson("c")
