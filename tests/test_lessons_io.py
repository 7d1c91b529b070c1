"""Lessons JSONL: export -> import round trip with provenance, merging without duplicates, hostile files."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ptxbuild.build.run import build
from ptxbuild.cli import main
from ptxbuild.declare.graph import Target
from ptxbuild.store import lessons_io
from ptxbuild.store.cache import Cache
from ptxbuild.store.lessons_io import LessonsFileError, export_lessons, import_lessons

from .conftest import make_ctx
from .fakes import FakeCompiler, FakeGpu, fake_match


def _dump(cache):
    return [dict(r) for r in cache.db.query("select * from lessons order by id")]


@pytest.fixture
def exported(proj, tmp_path):
    ctx = make_ctx(
        proj, FakeCompiler(error_on="#define VEC 1\n"), gpu=FakeGpu(), gpu_match=fake_match
    )
    build(ctx, [Target("scale", "h100")])
    lines = export_lessons(ctx.cache, project="toy")
    path = tmp_path / "lessons.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return ctx, path, lines


def test_round_trip_keeps_every_lesson_and_its_provenance(exported, tmp_path):
    ctx, path, lines = exported
    assert {json.loads(x)["kind"] for x in lines} == {"best", "fails", "sensitivity"}
    other = Cache(tmp_path / "other.sqlite")
    assert import_lessons(other, path) == {
        "read": len(lines),
        "added": len(lines),
        "already_present": 0,
        "duplicates_in_file": 0,
    }

    def key(rows):
        return [(r["id"], r["kind"], r["scope"], r["rule"], r["confidence"]) for r in rows]

    assert key(_dump(other)) == key(_dump(ctx.cache))
    src = json.loads(_dump(other)[0]["source"])
    assert src["provenance"]["source"] == f"run {ctx.run}" and src["provenance"]["project"] == "toy"
    assert src["imported_from"] == "lessons.jsonl"
    first = json.loads(lines[0])
    assert first["evidence"][0]["attempt"] > 0 and "params" in first["evidence"][0]
    again = export_lessons(other)  # re-export: provenance kept, import noted
    rec = json.loads(again[0])
    assert rec["provenance"]["source"] == f"run {ctx.run}" and rec["provenance"]["history"][
        0
    ].startswith("imported from lessons.jsonl")
    assert [json.loads(x)["id"] for x in again] == [json.loads(x)["id"] for x in lines]
    (tmp_path / "again").mkdir()  # and again, as a GPU machine's fresh cache does:
    (tmp_path / "again/lessons.jsonl").write_text("".join(x + "\n" for x in again))
    third = Cache(tmp_path / "third.sqlite")  # the file comes back unchanged (it changed every
    import_lessons(
        third, tmp_path / "again/lessons.jsonl"
    )  # lesson's history, a 386-line diff per session)
    assert export_lessons(third) == again


def test_near_best_configs_travel_with_a_best_lesson(exported, tmp_path):
    ctx, path, lines = exported
    near = [json.loads(x) for x in lines if json.loads(x)["rule"].get("near")]
    assert near, (
        "the toy build measures configs within 2% of each other: some best lesson has a near set"
    )
    other = Cache(tmp_path / "other.sqlite")
    import_lessons(other, path)
    rules = {r["id"]: json.loads(r["rule"]) for r in _dump(other)}
    assert all(rules[n["id"]]["near"] == n["rule"]["near"] for n in near)


def test_import_merges_without_duplicates(exported, tmp_path):
    ctx, path, lines = exported
    doubled = tmp_path / "doubled.jsonl"
    doubled.write_text("\n".join(lines + lines[:3]) + "\n")
    before = _dump(ctx.cache)
    assert import_lessons(ctx.cache, doubled) == {
        "read": len(lines) + 3,
        "added": 0,
        "already_present": len(lines),
        "duplicates_in_file": 3,
    }
    assert _dump(ctx.cache) == before
    other = Cache(tmp_path / "o.sqlite")
    n = import_lessons(other, doubled)
    assert (
        n["added"] == len(lines)
        and n["duplicates_in_file"] == 3
        and len(_dump(other)) == len(lines)
    )


def _mutate(rec, path, value):
    obj = rec
    for p in path[:-1]:
        obj = obj[p]
    if value is KeyError:
        del obj[path[-1]]
    else:
        obj[path[-1]] = value
    return rec


HOSTILE = {
    "wrong type (string confidence)": (
        ["confidence"],
        "0.9",
        "confidence: Input should be a valid number",
    ),
    "wrong type (shape of strings)": (
        ["scope", "shape"],
        ["64", "1024"],
        "scope.shape.0: Input should be a valid integer",
    ),
    "huge float": (
        ["rule", "p50_ms"],
        1e300,
        "rule.p50_ms: Input should be less than or equal to 1000000",
    ),
    "huge int": (["scope", "shape"], [10**300], "integer 10000000000000000000... is too large"),
    "infinity": (["confidence"], float("inf"), "Infinity is not a number a lesson can hold"),
    "unknown field": (["exec"], "import os", "exec: Extra inputs are not permitted"),
    "unknown nested field": (["rule", "code"], "x", "rule.code: Extra inputs are not permitted"),
    "injection in op": (["op"], "'; DROP TABLE lessons; --", "op: String should match pattern"),
    "injection in a param name": (
        ["rule", "params", "x'); DROP TABLE lessons; --"],
        1,
        "rule.params.",
    ),
    "missing field": (["evidence"], KeyError, "evidence: Field required"),
    "forged id": (["id"], "0" * 16, "does not match the lesson's kind, op, scope and rule"),
    "bad format": (["format"], "pickle", "format: Input should be 'ptxbuild-lesson/1'"),
    "an edit field on a best rule": (
        ["rule", "edit"],
        "unroll the loop",
        "an 'edit' rule has edit and verdict; no other rule has edit fields",
    ),
    "an empty why on a best rule": (
        ["rule", "why"],
        "",
        "an 'edit' rule has edit and verdict; no other rule has edit fields",
    ),
    "too many near-best configs": (
        ["rule", "near"],
        [{"threads": i} for i in range(9)],
        "rule.near: List should have at most 8 items",
    ),
    "code in a near-best config": (
        ["rule", "near"],
        [{"threads": {"__import__": "os"}}],
        "rule.near.0.threads",
    ),
    "an option list too long": (
        ["scope", "options", "lengths"],
        list(range(4097)),
        "scope.options.lengths",
    ),
    "an option list of strings": (
        ["scope", "options", "lengths"],
        ["1", "2"],
        "scope.options.lengths",
    ),
    "an object as an option": (
        ["scope", "options", "lengths"],
        {"__class__": 1},
        "scope.options.lengths",
    ),
}


def test_the_committed_lessons_file_imports_into_a_fresh_cache(tmp_path):
    """cache/lessons.jsonl (what a fresh clone starts from) validates, KDA's varlen scopes included
    (segment lengths are a list option), and a second import adds nothing."""
    root = Path(__file__).resolve().parents[1]
    c = Cache(tmp_path / "fresh.sqlite")
    first = import_lessons(c, root / "cache" / "lessons.jsonl")
    n = len(list(c.db.query("select id from lessons")))
    assert n == len((root / "cache" / "lessons.jsonl").read_text().splitlines()) and n > 0
    assert any(
        json.loads(r["scope"]).get("options", {}).get("lengths")
        for r in c.db.query("select scope from lessons")
    )
    import_lessons(c, root / "cache" / "lessons.jsonl")
    assert len(list(c.db.query("select id from lessons"))) == n, first


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_record_is_rejected_with_one_line_and_nothing_changes(exported, tmp_path, case):
    ctx, path, lines = exported
    where, value, message = HOSTILE[case]
    best = next(json.loads(x) for x in lines if json.loads(x)["kind"] == "best")
    bad = json.dumps(_mutate(best, where, value))
    f = tmp_path / "bad.jsonl"
    f.write_text(
        "\n".join([lines[0], bad, lines[-1]]) + "\n"
    )  # valid lines around it are not imported either
    other = Cache(tmp_path / "o.sqlite")
    import_lessons(other, path)
    before = _dump(other)
    with pytest.raises(LessonsFileError) as exc:
        import_lessons(other, f)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith("bad.jsonl:2: ") and message in msg, msg
    assert _dump(other) == before


@pytest.mark.parametrize(
    "content,message",
    [
        (b"not json\n", "bad.jsonl:1: not valid JSON"),
        (b"[1, 2]\n", "bad.jsonl:1: a lesson must be a JSON object, got list"),
        (b"[" * 100_000 + b"\n", "bad.jsonl:1: line is over the 65536-byte limit"),
        (b'{"a": ' * 5000 + b"1" + b"}" * 5000 + b"\n", "bad.jsonl:1: JSON nested too deeply"),
        (b"\xff\xfe\n", "bad.jsonl: not UTF-8 text"),
    ],
)
def test_malformed_files_are_rejected(tmp_path, content, message):
    f = tmp_path / "bad.jsonl"
    f.write_bytes(content)
    cache = Cache(tmp_path / "c.sqlite")
    with pytest.raises(LessonsFileError, match="^" + message.replace("[", r"\[")):
        import_lessons(cache, f)
    assert _dump(cache) == []


def test_an_oversized_file_is_rejected_before_it_is_read(tmp_path, monkeypatch):
    monkeypatch.setattr(lessons_io, "MAX_FILE_BYTES", 100)
    f = tmp_path / "big.jsonl"
    f.write_text("{}\n" * 50)
    with pytest.raises(
        LessonsFileError, match=r"^big.jsonl: file is 150 bytes, over the 100-byte limit"
    ):
        import_lessons(Cache(tmp_path / "c.sqlite"), f)


def test_injection_strings_in_free_text_are_stored_inertly(exported, tmp_path):
    ctx, path, lines = exported
    rec = json.loads(lines[0])
    rec["provenance"]["source"] = "'; DROP TABLE lessons; --"
    f = tmp_path / "inj.jsonl"
    f.write_text(json.dumps(rec) + "\n")
    other = Cache(tmp_path / "o.sqlite")
    assert import_lessons(other, f)["added"] == 1
    (row,) = _dump(other)
    assert json.loads(row["source"])["provenance"]["source"] == "'; DROP TABLE lessons; --"
    assert "lessons" in other.db.table_names()


def test_cli_show_export_import(exported, tmp_path):
    ctx, path, lines = exported
    proj = ctx.kf.root
    runner = CliRunner()
    r = runner.invoke(
        main, ["-f", str(proj / "kernelfile.toml"), "lessons", "scale", "--gpu", "h100"]
    )
    assert r.exit_code == 0, r.output
    head, *rows = r.output.splitlines()
    assert head.split() == ["id", "op", "kind", "scope", "rule", "confidence", "evidence", "source"]
    assert any("h100 float32 64x1024" in x and "threads=256 vec=4 -> 10.0 us" in x for x in rows)
    assert any("sm_90a float32 all shapes" in x and "vec=1 -> compile_error" in x for x in rows)
    r = runner.invoke(main, ["-f", str(proj / "kernelfile.toml"), "lessons", "export", "-"])
    assert r.exit_code == 0 and r.output.splitlines() == [
        json.loads(json.dumps(x)) for x in r.output.splitlines()
    ]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"format": "ptxbuild-lesson/1", "evil": 1}\n')
    r = runner.invoke(main, ["-f", str(proj / "kernelfile.toml"), "lessons", "import", str(bad)])
    assert r.exit_code == 2
    assert r.output.startswith("error: bad.jsonl:1: ") and r.output.rstrip().endswith(
        "; nothing imported"
    )
    assert len(r.output.strip().splitlines()) == 1
    r = runner.invoke(main, ["-f", str(proj / "kernelfile.toml"), "lessons", "import", str(path)])
    assert r.exit_code == 0
    assert (
        r.output
        == f"{path}: {len(lines)} lesson(s) read, 0 added, {len(lines)} already present, 0 duplicate(s) in the file\n"
    )
    r = runner.invoke(main, ["-f", str(proj / "kernelfile.toml"), "lessons", "--gpu", "h300"])
    assert r.exit_code == 2 and "unknown GPU" in r.output


def test_a_failure_part_way_through_an_import_writes_nothing(exported, tmp_path, monkeypatch):
    _, exported, _ = exported
    cache = Cache(tmp_path / "fresh.sqlite")
    calls = []
    real = cache.db.execute

    def failing(sql, *a):
        if sql.startswith("insert into lessons"):
            calls.append(sql)
            if len(calls) == 2:
                raise RuntimeError("disk full")
        return real(sql, *a)

    monkeypatch.setattr(cache.db, "execute", failing)
    with pytest.raises(RuntimeError, match="disk full"):
        import_lessons(cache, exported)
    monkeypatch.undo()
    assert len(calls) == 2 and cache.db["lessons"].count == 0


def test_a_fresh_cache_starts_from_the_checked_in_lessons(exported, proj):
    _, exported, _ = exported
    (proj / "cache").mkdir(exist_ok=True)
    (proj / "cache/lessons.jsonl").write_bytes(exported.read_bytes())
    n = len(exported.read_text().splitlines())
    assert lessons_io.import_shared(
        Cache(proj / "cache/fresh.sqlite"), proj / "cache/lessons.jsonl"
    ) == {
        "read": n,
        "added": n,
        "already_present": 0,
        "duplicates_in_file": 0,
        "from": str(proj / "cache/lessons.jsonl"),
    }
    # a cache that already has lessons is left alone
    assert (
        lessons_io.import_shared(Cache(proj / "cache/fresh.sqlite"), proj / "cache/lessons.jsonl")
        is None
    )


def test_a_fresh_cache_without_a_lessons_file_starts_from_the_shipped_ones(proj):
    """A model repository's first build: no cache/lessons.jsonl of its own, so the lessons ptxbuild
    ships (in a checkout: this repository's cache/lessons.jsonl) are imported, marked as shipped."""
    shipped, origin = lessons_io.shipped_lessons()
    repo_file = Path(__file__).resolve().parents[1] / "cache" / "lessons.jsonl"
    assert shipped.read_bytes() == repo_file.read_bytes()
    assert origin.startswith("ptxbuild ") and origin.endswith("(shipped with ptxbuild)")
    cache = Cache(proj / "cache/fresh.sqlite")
    # the repo has no lessons file; its kernelfile uses no shipped op: nothing is imported
    assert lessons_io.import_shared(cache, proj / "cache/lessons.jsonl") is None
    counts = lessons_io.import_shared(cache, proj / "cache/lessons.jsonl", shipped=True)
    assert counts["from"] == origin
    assert counts["read"] == len(shipped.read_text().splitlines()) > 0
    assert counts["added"] == cache.db["lessons"].count > 0
    ids = [r["id"] for r in cache.db.query("select id from lessons limit 5")]
    assert lessons_io.shipped_among(cache, ids + ids[:2] + ["not-a-lesson"]) == 5
    other = Cache(proj / "cache/other.sqlite")
    import_lessons(other, shipped)  # the same file imported by hand is not "shipped"
    assert lessons_io.shipped_among(other, ids) == 0
