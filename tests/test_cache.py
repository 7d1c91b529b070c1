"""The SQLite cache: schema migrations, and a kill -9 mid-build loses nothing that finished."""
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from ptxbuild.cache import SCHEMA_VERSION, Cache

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

    from ptxbuild.cache import MIGRATIONS
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

    from ptxbuild.cache import MIGRATIONS
    db = sqlite_utils.Database(sqlite3.connect(tmp_path / "c.sqlite"))
    MIGRATIONS[1](db)
    MIGRATIONS[2](db)
    db["meta"].insert({"key": "schema_version", "value": "2"})
    db["builds"].insert({"target": "a@b", "key": "k1", "kernelfile": "d", "status": "ok", "measured": 1,
                         "manifest": "m", "summary": "{}", "created": 1.0})
    db.conn.commit()
    db.conn.close()
    c = Cache(tmp_path / "c.sqlite")
    assert c.version() == SCHEMA_VERSION == 3
    old = c.last_build("a@b", "")
    assert old["key"] == "k1" and old["project"] == "" and old["status"] == "ok"
    assert c.last_build("a@b", "proj")["key"] == "k1"           # a project's first look: the pre-v3 build
    c.add_build("a@b", "k2", "d", "ok", True, "m", {}, "proj")
    assert c.last_build("a@b", "proj")["key"] == "k2" and c.last_build("a@b", "")["key"] == "k1"
    assert Cache(tmp_path / "c.sqlite").version() == 3           # reopening migrates nothing again
    assert ["project", "target"] in [i.columns for i in c.db["builds"].indexes]


SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    from tests.fakes import FakeCompiler
    from tests.conftest import make_ctx
    from ptxbuild.build import build
    from pathlib import Path
    comp = FakeCompiler(delay_s=float(sys.argv[2]))
    build(make_ctx(Path(sys.argv[1]), comp))
    print(len(comp.calls))
""")


def test_kill_9_mid_build_then_rerun(proj):
    script = proj / "run_build.py"
    script.write_text(SCRIPT.format(root=str(ROOT)))
    shape_lines = "shapes = [" + ", ".join(f"[4, {32 * i}]" for i in range(1, 9)) + "]"
    kf = proj / "kernelfile.toml"
    kf.write_text(kf.read_text().replace("shapes = [[64, 1024], [7, 100]]", shape_lines)
                  .replace("budget = 6", "budget = 6, strategy = 'exhaustive'"))
    p = subprocess.Popen([sys.executable, str(script), str(proj), "0.3"], stdout=subprocess.PIPE)
    db = proj / "cache/ptxbuild.sqlite"
    deadline = time.time() + 60
    while time.time() < deadline:
        time.sleep(0.2)
        if db.exists() and Cache(db).db["compiles"].count >= 3:
            break
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    cache = Cache(db)
    assert cache.integrity() == "ok"
    done = {r["key"] for r in cache.db["compiles"].rows}
    assert len(done) >= 3
    assert cache.db["builds"].count == 0 or cache.last_build("scale@h100", "toy")["status"] == "ok"
    out = subprocess.run([sys.executable, str(script), str(proj), "0"], capture_output=True, text=True, check=True)
    recompiled = int(out.stdout.strip())
    total = Cache(db).db["compiles"].count
    assert recompiled == total - len(done)   # nothing that finished was compiled again
    assert Cache(db).integrity() == "ok"
    assert {b["target"] for b in Cache(db).db["builds"].rows} == {"scale@h100", "scale@b200"}
