"""Coverage (issue 27 item 3): a build records in manifest.json the shapes each dispatch entry's
config is verified on (not in the lock), and the runtime never dispatches a kernel to a shape outside
that class: it answers as for an unbuilt shape (LoaderError, or the reference with allow_fallback),
with one warning naming the shape and what to do. CPU only: the toy op and fake compiler."""

import json
import warnings

import pytest

from ptxbuild import coverage
from ptxbuild.build.run import build
from ptxbuild.gpu import runs
from ptxbuild.outputs.lockfile import update_lock
from ptxbuild.problem import Problem
from ptxbuild.runtime import LoaderError, load
from tests import fake_softmax

from .conftest import make_ctx
from .test_runtime import BAKED


@pytest.fixture
def built(proj):
    with open(proj / "ops" / "scale" / "op.py", "a") as f:
        f.write(BAKED)  # N compiled in, M free (as rmsnorm's exact variants)
    ctx = make_ctx(proj)
    results = build(ctx)
    assert all(r.status == "built" for r in results)
    update_lock(ctx.kf, results)
    return proj


def manifest(proj, target="scale@h100"):
    return json.loads((proj / "build" / target / "manifest.json").read_text())


def test_the_manifest_records_each_entrys_verified_shapes_and_the_lock_does_not(built):
    m = manifest(built)
    rec = m["coverage"]
    assert rec["suite"] == runs.SUITE_VERSION and len(rec["shapes"]) == len(m["dispatch"])
    by_label = dict(zip((d["label"] for d in m["dispatch"]), rec["shapes"]))
    # the built shape, and the toy op's adversarial rows (1 and 3); no size class: N is baked in
    assert by_label["float32[64x1024]"] == [[1, 1024], [3, 1024], [64, 1024]]
    lock = (built / "kernelfile.lock").read_text()
    assert "coverage" not in lock and "verified" not in lock


def test_the_record_is_the_plan_the_worker_runs(monkeypatch):
    """coverage.record for a dispatch entry = the shapes GPU verify() reports for the same config."""
    o = fake_softmax.op()
    p = Problem.make("planted_softmax", "bfloat16", (256, 4096))
    params = {"BAD": "none", "THREADS": 128}
    entry = {"problem": json.loads(json.dumps(p.key())), "params": params, "label": p.label()}
    rec = coverage.record(o, [entry, {"params": None}], "sm_90a")
    planned = coverage.verified_shapes([(q, None) for q in coverage.plan_problems(o, p, params)])
    assert rec["shapes"][0] == [list(s) for s in planned] and rec["shapes"][1] is None
    # ... the shapes the worker's verify() ran and returned (its GPU faked in numpy)
    g, _ = fake_softmax.gpu(monkeypatch, "none")
    r = g.verify("x", ".", params, p, fake_softmax.binary("none"), seeds=[1, 2, 3])
    assert r["outcome"] == "ok" and r["shapes"] == rec["shapes"][0]
    assert [64, 32768] in rec["shapes"][0]  # 8N: what the bf16 accumulator fails


def test_the_runtime_serves_the_verified_class_and_refuses_past_it(built):
    k = load(built / "build" / "scale@h100")
    assert k.select(Problem.make("scale", "float32", (5, 1024))).label == "float32[64x1024]"
    assert k.select(Problem.make("scale", "float32", (64, 1024))).label == "float32[64x1024]"
    with pytest.warns(RuntimeWarning) as seen:
        # the same binary would run it (M is free), but it was verified on at most 64 rows
        assert k.select(Problem.make("scale", "float32", (65, 1024))) is None
    (w,) = seen
    msg = str(w.message)
    assert "float32[65x1024] is outside the shapes the kernel built for float32[64x1024]" in msg
    assert "declare the shape in kernelfile.toml and rebuild" in msg
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per shape
        assert k.select(Problem.make("scale", "float32", (65, 1024))) is None


def test_outside_the_class_is_answered_as_an_unbuilt_shape(built):
    torch = pytest.importorskip("torch", reason="torch is not installed (CPU torch is enough)")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: this checks the no-GPU paths")
    k = load(built / "build" / "scale@h100")
    with pytest.warns(RuntimeWarning, match="outside the shapes"):
        with pytest.raises(LoaderError, match=r"no built variant covers float32\[100x1024\]"):
            k(torch.randn(100, 1024))
    k = load(built / "build" / "scale@h100", allow_fallback=True)
    with pytest.warns(RuntimeWarning) as seen:
        y = k(torch.randn(100, 1024, dtype=torch.bfloat16))
    assert y.shape == (100, 1024)
    assert any("running scale's reference" in str(w.message) for w in seen)


def test_a_manifest_without_a_record_serves_its_built_shapes_class_only(built):
    path = built / "build" / "scale@h100" / "manifest.json"
    m = json.loads(path.read_text())
    del m["coverage"]  # written before there was one
    path.write_text(json.dumps(m))
    k = load(built / "build" / "scale@h100")
    assert k.select(Problem.make("scale", "float32", (64, 1024))) is not None
    assert k.select(Problem.make("scale", "float32", (7, 1024))) is not None
    with pytest.warns(RuntimeWarning, match=r"float32\[65x1024\] is outside the shapes") as seen:
        assert k.select(Problem.make("scale", "float32", (65, 1024))) is None
    assert "`ptxbuild build --locked scale@h100` records what it verified" in str(seen[0].message)
