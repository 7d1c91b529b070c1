"""The pipeline's records read every file ptxbuild has written and give back its JSON unchanged."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest

from ptxbuild.records import UNSET, BuildSummary, DispatchEntry, Manifest, Variant, dispatch_of

ROOT = Path(__file__).resolve().parents[1]


def committed(suffix: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [ROOT / f for f in out.stdout.split() if f.endswith(suffix)]


def _dumps(data) -> str:
    return json.dumps(data, indent=1, sort_keys=True, default=str)


def test_the_golden_manifests_round_trip_byte_for_byte():
    goldens = sorted((ROOT / "tests/golden").glob("*.manifest.json.golden"))
    assert len(goldens) == 2
    for path in goldens:  # normalised there: the wall-clock times read as a number here
        text = path.read_text().replace("<wall-clock>", "1700000000.5")
        m = Manifest.from_json(json.loads(text))
        assert isinstance(m.dispatch[0], DispatchEntry) and isinstance(
            next(iter(m.variants.values())), Variant
        )
        assert json.dumps(m.to_json(), indent=1, sort_keys=True) == text.rstrip("\n")


def test_every_committed_lock_s_dispatch_table_round_trips():
    entries = [e for p in committed(".lock") for e in json.loads(p.read_text())["targets"].values()]
    assert len(entries) > 10
    for e in entries:
        table = dispatch_of(e)
        assert [d.to_json() for d in table] == e["dispatch"]
        assert all(d.binary and d.extra == {} for d in table)


def test_every_committed_report_s_summary_dispatch_and_variants_round_trip():
    reports = [json.loads(p.read_text()) for p in committed("report.json")]
    reports = [r for r in reports if "summary" in r]
    assert len(reports) > 20
    for r in reports:
        s = BuildSummary.from_json(r["summary"])
        assert _dumps(s.to_json()) == _dumps(r["summary"]) and s.extra == {}
        assert [d.to_json() for d in dispatch_of(r)] == r["dispatch"]
        assert {k: Variant.from_json(v).to_json() for k, v in r["variants"].items()} == r[
            "variants"
        ]
    # older summaries lack keys added since: they read as UNSET and stay out
    old = [BuildSummary.from_json(r["summary"]) for r in reports]
    assert any(s.protocol is UNSET for s in old) and any(s.protocol for s in old)


def test_unset_keys_stay_out_nulls_stay_in_and_unknown_keys_are_kept():
    failed = DispatchEntry(problem={"op": "x"}, label="x", params=None)
    assert failed.to_json() == {"problem": {"op": "x"}, "label": "x", "params": None}
    assert not failed.binary and failed.binary is UNSET and repr(UNSET) == "UNSET"
    data = {"problem": {}, "label": "y", "params": {}, "lesson": None, "from_the_future": [1]}
    entry = DispatchEntry.from_json(data)
    assert entry.lesson is None and entry.extra == {"from_the_future": [1]}
    assert entry.to_json() == data
    with pytest.raises(dataclasses.FrozenInstanceError):
        entry.label = "z"  # type: ignore[misc]


def test_a_live_binary_rides_along_but_is_not_json():
    from ptxbuild.problem import Binary

    b = Binary("sm_90a", "k", ".version 8.8", b"\x7fELF", 32, 0, 0, 0)
    e = DispatchEntry(problem={}, label="p", params={}, binary=b.digest, compiled=b)
    assert e.compiled is b and "compiled" not in e.to_json()
    assert e == dataclasses.replace(e, compiled=None)  # not part of what an entry is


def test_a_build_reads_each_manifest_once_and_never_the_one_it_just_wrote(proj, monkeypatch):
    """One manifest reader, once per target per command: a build writes build/<target>/ and locks
    it from the manifest it holds; an up-to-date build reads each manifest once (plan's judge) and
    locks from that; plan alone reads each once too."""
    from ptxbuild.build.plan import plan
    from ptxbuild.build.run import build_and_lock
    from ptxbuild.declare.graph import all_targets

    from .conftest import make_ctx

    reads: list[str] = []
    real = Path.read_bytes, Path.read_text

    def counted(i):
        def read(self, *a, **k):
            if self.name == "manifest.json":
                reads.append(self.parent.name)
            return real[i](self, *a, **k)

        return read

    monkeypatch.setattr(Path, "read_bytes", counted(0))
    monkeypatch.setattr(Path, "read_text", counted(1))
    ctx = make_ctx(proj)
    targets = sorted(str(t) for t in all_targets(ctx.kf))
    done = build_and_lock(ctx)
    assert sorted(str(r.target) for r in done.results if r.status == "built") == targets
    assert reads == [] and done.lock is not None  # written, locked, reported: none read back
    again = build_and_lock(make_ctx(proj))
    assert {r.status for r in again.results} == {"up_to_date"} and again.lock is None
    assert sorted(reads) == targets  # each once, by plan's judge
    reads.clear()
    assert all(fresh for _, fresh, _ in plan(make_ctx(proj), None))
    assert sorted(reads) == targets
