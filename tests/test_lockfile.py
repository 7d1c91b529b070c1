"""kernelfile.lock: written after a build, stable text, reproduced by --locked, drift and tampering refused."""

import json
import os
import re
import shutil

import pytest
from click.testing import CliRunner

from ptxbuild.build.locked import build_locked
from ptxbuild.build.run import build
from ptxbuild.cli import main
from ptxbuild.declare.graph import Target
from ptxbuild.declare.kernelfile import load
from ptxbuild.outputs.lockfile import (
    LockError,
    entry_digest,
    lock_path,
    read_lock,
    update_lock,
)

from .conftest import make_ctx
from .fakes import FakeCompiler


def _built(proj, compiler=None):
    ctx = make_ctx(proj, compiler)
    results = build(ctx)
    assert all(r.status == "built" for r in results)
    return ctx, results, update_lock(ctx.kf, results)


def _files(proj):
    return {
        p.relative_to(proj).as_posix(): p.read_bytes()
        for p in sorted((proj / "build").rglob("*"))
        if p.is_file()
    }


def _edit_lock(proj, fn, fix_digest=True):
    path = proj / "kernelfile.lock"
    lock = json.loads(path.read_text())
    for name, entry in lock["targets"].items():
        fn(name, entry)
        if fix_digest:
            entry["entry_sha256"] = entry_digest(entry)
    path.write_text(json.dumps(lock, indent=1, sort_keys=True) + "\n")


def test_lock_records_targets_in_stable_text(proj):
    ctx, results, path = _built(proj)
    assert path == proj / "kernelfile.lock"
    text = path.read_text()
    assert text == json.dumps(json.loads(text), indent=1, sort_keys=True) + "\n"
    lock = read_lock(ctx.kf)
    assert sorted(lock["targets"]) == ["scale@b200", "scale@h100"]
    e = lock["targets"]["scale@h100"]
    assert e["kernelfile_digest"] == ctx.kf.digest and e["toolchain"] == {
        "nvrtc": "fake-1",
        "nvjitlink": "fake-1",
    }
    assert set(e["op_files"]) == {"op.py", "scale.cu"} and e["measured_on_hardware"] is False
    for d in e["dispatch"]:
        v = e["variants"][d["binary"]]
        assert v["cubin_sha256"] == d["binary"] and len(v["ptx_sha256"]) == 64
    # rewriting after an up-to-date build changes nothing
    again = build(make_ctx(proj))
    assert [r.status for r in again] == ["up_to_date", "up_to_date"]
    assert (
        update_lock(ctx.kf, again) is None
    )  # nothing written, and said so (the CLI prints no lock line)
    assert path.read_text() == text


def test_locked_rebuild_is_byte_identical_without_search(proj):
    _built(proj)
    before = _files(proj)
    shutil.rmtree(proj / "build")
    compiler = FakeCompiler()
    ctx = make_ctx(proj, compiler)
    results = build_locked(ctx)
    assert [r.status for r in results] == ["built", "built"]
    assert _files(proj) == before  # PTX, cubin and manifest.json, byte for byte
    lock = read_lock(ctx.kf)
    assert len(compiler.calls) == sum(
        len(e["dispatch"]) for e in lock["targets"].values()
    )  # no search


def test_tampered_digest_is_reported_and_nothing_written(proj):
    _built(proj)
    shutil.rmtree(proj / "build")

    def tamper(name, entry):
        if name == "scale@h100":
            d = entry["dispatch"][0]["binary"]
            entry["variants"][d]["ptx_sha256"] = "0" * 64

    _edit_lock(proj, tamper)
    with pytest.raises(
        LockError,
        match=r"scale@h100: variant scale-\w+ .*PTX drift: expected sha256 0{64}, got "
        r"[0-9a-f]{64}; artifacts not written",
    ):
        build_locked(make_ctx(proj))
    assert not (proj / "build").exists()


def test_tampered_cubin_digest_is_reported(proj):
    _built(proj)

    def tamper(name, entry):
        d = entry["dispatch"][0]
        old = d["binary"]
        for e in entry["dispatch"]:
            if e["binary"] == old:
                e["binary"] = "f" * 64
        entry["variants"]["f" * 64] = {**entry["variants"].pop(old), "cubin_sha256": "f" * 64}

    _edit_lock(proj, tamper)
    with pytest.raises(LockError, match=r"cubin drift: expected sha256 f{64}, got [0-9a-f]{64}"):
        build_locked(make_ctx(proj))


def test_hand_edited_entry_is_refused(proj):
    _built(proj)
    _edit_lock(proj, lambda n, e: e["dispatch"][0].update(p50_ms=0.001), fix_digest=False)
    with pytest.raises(LockError, match="entry was edited"):
        build_locked(make_ctx(proj))


@pytest.mark.parametrize("drift", ["kernelfile", "op", "toolchain", "missing"])
def test_drift_fails_loudly(proj, drift):
    _built(proj)
    ctx = make_ctx(proj)
    if drift == "kernelfile":
        kf = proj / "kernelfile.toml"
        kf.write_text(kf.read_text().replace("budget = 6", "budget = 7"))
        ctx = make_ctx(proj)
        match = r"\[ops.scale\] in kernelfile.toml changed since the lock"
    elif drift == "op":
        cu = proj / "ops" / "scale" / "scale.cu"
        cu.write_text(cu.read_text() + "\n// edited\n")
        match = r"op drift: scale/scale.cu locked sha256 \w+, now \w+; the op.s sources changed .* run `ptxbuild build scale@h100`"
    elif drift == "toolchain":
        from .fakes import FakeToolchain

        ctx.toolchain = FakeToolchain("fake-2")
        match = "toolchain drift"
    else:
        _edit_lock(proj, lambda n, e: None)
        lock = json.loads((proj / "kernelfile.lock").read_text())
        del lock["targets"]["scale@b200"]
        (proj / "kernelfile.lock").write_text(json.dumps(lock))
        match = "scale@b200 is not in kernelfile.lock"
    with pytest.raises(LockError, match=match):
        build_locked(ctx)


def test_missing_or_broken_lock(proj):
    kf = load(proj / "kernelfile.toml")
    with pytest.raises(LockError, match="does not exist; run `ptxbuild build` once"):
        read_lock(kf)
    lock_path(kf).write_text("{not json")
    with pytest.raises(LockError, match="not valid JSON"):
        read_lock(kf)


def test_lock_drops_undeclared_targets(proj):
    ctx, _, path = _built(proj)
    kf = proj / "kernelfile.toml"
    kf.write_text(
        kf.read_text().replace("[gpus.b200]\n", "").replace("[gpus.h100]", "[gpus.h100]\n")
    )
    ctx = make_ctx(proj)
    update_lock(ctx.kf, build(ctx))
    assert sorted(read_lock(ctx.kf)["targets"]) == ["scale@h100"]


@pytest.mark.compile
def test_cli_locked_reproduces_real_ptx_and_cubin(proj):
    cwd = os.getcwd()
    os.chdir(proj)
    try:
        first = CliRunner().invoke(main, ["build", "--no-gpu", "-j", "1"])
        assert first.exit_code == 0, first.output
        before = _files(proj)
        lock_text = (proj / "kernelfile.lock").read_text()
        shutil.rmtree(proj / "build")
        again = CliRunner().invoke(main, ["build", "--locked", "--no-gpu"])
        assert again.exit_code == 0, again.output
        assert "scale@h100: built (locked: " in again.stdout
        assert _files(proj) == before  # nvrtc + nvJitLink are deterministic
        assert (proj / "kernelfile.lock").read_text() == lock_text
        _edit_lock(
            proj, lambda n, e: e["variants"][e["dispatch"][0]["binary"]].update(ptx_sha256="1" * 64)
        )
        shutil.rmtree(proj / "build")
        bad = CliRunner().invoke(main, ["build", "--locked", "--no-gpu"])
    finally:
        os.chdir(cwd)
    assert bad.exit_code == 1
    err = [ln for ln in bad.stderr.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and "PTX drift: expected sha256 " + "1" * 64 in err[0]
    assert not (proj / "build").exists()


@pytest.mark.compile
def test_compiler_is_deterministic(proj):
    from ptxbuild.compile.compiler import compile_kernel
    from ptxbuild.oploader import load_op
    from ptxbuild.problem import Problem

    op = load_op("scale", proj)
    problem = Problem.make("scale", "bfloat16", (64, 1024))
    kernel = op.render({"threads": 256, "vec": 4}, problem, "sm_90a")
    a, b = compile_kernel(kernel, "sm_90a"), compile_kernel(kernel, "sm_90a")
    assert a.ptx == b.ptx and a.cubin == b.cubin


def test_editing_another_ops_section_leaves_a_lock_entry_valid(proj):
    """A lock entry depends on its own op's declaration, not on the whole kernelfile: a model repo
    adding an op does not have to re-verify every other one on its GPU."""
    from ptxbuild.declare.graph import Target

    _built(proj)
    kf = proj / "kernelfile.toml"
    kf.write_text(
        kf.read_text()
        + '\n[ops.other]\ntemplate = "scale"\ndtypes = ["float32"]\nshapes = [[8, 64]]\n'
    )
    res = build_locked(make_ctx(proj), [Target("scale", "h100"), Target("scale", "b200")])
    assert [str(r.target) for r in res] == ["scale@h100", "scale@b200"] and all(
        r.status == "built" for r in res
    )
    kf.write_text(kf.read_text().replace("budget = 6", "budget = 5"))
    with pytest.raises(LockError, match=r"\[ops.scale\] in kernelfile.toml changed"):
        build_locked(make_ctx(proj), [Target("scale", "h100")])


def test_kernelfiles_sharing_a_folder_keep_separate_locks(proj):
    """benchmarks/ holds three kernelfiles: each lock is named after its kernelfile, so building one
    never overwrites another's (they all wrote benchmarks/kernelfile.lock before)."""
    other = proj / "small.toml"
    other.write_text((proj / "kernelfile.toml").read_text())
    a, b = load(proj / "kernelfile.toml"), load(other)
    assert lock_path(a) == proj / "kernelfile.lock" and lock_path(b) == proj / "small.lock"


class _CommentBlind(FakeCompiler):
    """A compiler whose binary ignores // comments and blank lines, as NVRTC's PTX does."""

    def __call__(self, kernel, arch):
        import re
        from dataclasses import replace

        return super().__call__(
            replace(kernel, source=re.sub(r"\s+", " ", re.sub(r"//[^\n]*", "", kernel.source))),
            arch,
        )


def test_relock_accepts_a_kernel_source_edit_that_leaves_every_locked_binary_identical(proj):
    """A comment in the kernel source changes the op's digest, not a kernel: `relock` recompiles
    every locked config, finds the same PTX, cubin and launch, and updates only the op file
    digests; --locked then builds again."""
    from ptxbuild.build.locked import relock

    _built(proj, _CommentBlind())
    before = json.loads((proj / "kernelfile.lock").read_text())["targets"]
    cu = proj / "ops" / "scale" / "scale.cu"
    cu.write_text(cu.read_text() + "\n// a comment\n")
    with pytest.raises(LockError, match="op drift: scale/scale.cu.*ptxbuild relock scale@h100"):
        build_locked(make_ctx(proj, _CommentBlind()))
    done = relock(make_ctx(proj, _CommentBlind()))
    assert sorted(t for t, _ in done) == ["scale@b200", "scale@h100"]
    assert all(w.endswith("variant(s) reproduce after edits to scale.cu") for _, w in done)
    after = json.loads((proj / "kernelfile.lock").read_text())["targets"]
    for name, e in after.items():
        assert e["op_files"]["scale.cu"] != before[name]["op_files"]["scale.cu"]
        assert e["op_files"]["op.py"] == before[name]["op_files"]["op.py"]
        assert {k: v for k, v in e.items() if k not in ("op_files", "entry_sha256")} == {
            k: v for k, v in before[name].items() if k not in ("op_files", "entry_sha256")
        }
        assert e["entry_sha256"] == entry_digest(e)
    assert all(r.status == "built" for r in build_locked(make_ctx(proj, _CommentBlind())))
    assert [w for _, w in relock(make_ctx(proj, _CommentBlind()))] == ["unchanged", "unchanged"]


def test_relock_refuses_any_edit_to_the_ops_python(proj):
    """op.py computes kernel arguments, launches and outputs at run time: swapping two arguments
    leaves every binary identical, so a recompile cannot vouch for a host-code edit."""
    from ptxbuild.build.locked import relock

    _built(proj)
    text = (proj / "kernelfile.lock").read_text()
    opf = proj / "ops" / "scale" / "op.py"
    opf.write_text(opf.read_text() + "\n# a comment\n")
    with pytest.raises(
        LockError, match="op.py changed since the lock: host code decides kernel arguments"
    ):
        relock(make_ctx(proj))
    with pytest.raises(
        LockError, match=r"op drift: scale/op.py .*host code changed: check out"
    ) as err:
        build_locked(make_ctx(proj))
    assert "relock" not in str(err.value)
    assert (proj / "kernelfile.lock").read_text() == text


@pytest.mark.parametrize("edit", ["kernel", "version"])
def test_relock_refuses_an_edit_that_changes_a_kernel_or_the_version_and_leaves_the_lock(
    proj, edit
):
    from ptxbuild.build.locked import relock

    _built(proj)
    text = (proj / "kernelfile.lock").read_text()
    if edit == "kernel":
        cu = proj / "ops" / "scale" / "scale.cu"
        cu.write_text(cu.read_text() + "\n__device__ int edited_kernel_source;\n")
        match = "PTX drift|cubin drift"
    else:
        opf = proj / "ops" / "scale" / "op.py"
        opf.write_text(opf.read_text().replace('VERSION = "1"', 'VERSION = "2"'))
        import sys  # ops load once per process (as in the CLI): forget the loaded one

        for name in [m for m in sys.modules if m.startswith("ptxbuild_ops_scale_")]:
            del sys.modules[name]
        match = "VERSION locked 1, now 2"
    with pytest.raises(LockError, match=match):
        relock(make_ctx(proj))
    assert (proj / "kernelfile.lock").read_text() == text


def test_relock_records_a_configs_own_ptx_when_its_cubin_reproduces(proj):
    """A lock written before the per-config fix could pin the PTX of another config with the same
    cubin: --locked refuses it; relock keeps the cubin (what was verified and timed) and records the
    config's own PTX; a cubin that differs is still refused."""
    from ptxbuild.build.locked import relock

    _built(proj)
    first = {}

    def wrong_ptx(name, entry):
        first[name] = next(iter(entry["variants"]))
        entry["variants"][first[name]]["ptx_sha256"] = "0" * 64

    _edit_lock(proj, wrong_ptx)
    with pytest.raises(LockError, match="PTX drift"):
        build_locked(make_ctx(proj))
    users = {
        t: sum(d["binary"] == first[t] for d in e["dispatch"])  # configs of that cubin
        for t, e in read_lock(load(proj / "kernelfile.toml"))["targets"].items()
    }
    done = dict(relock(make_ctx(proj)))
    assert (
        done
        == {
            t: f"2 variant(s) reproduce after {users[t]} PTX recorded anew (same cubin)"
            for t in ("scale@b200", "scale@h100")
        }
        and min(users.values()) >= 1
    )
    lock = read_lock(load(proj / "kernelfile.toml"))
    assert all(
        len(lock["targets"][t]["variants"][v]["ptx_sha256"]) == 64
        and lock["targets"][t]["variants"][v]["ptx_sha256"] != "0" * 64
        for t, v in first.items()
    )
    assert all(r.status == "built" for r in build_locked(make_ctx(proj)))
    _edit_lock(proj, lambda n, e: [v.update(cubin_sha256="1" * 64) for v in e["variants"].values()])
    with pytest.raises(LockError, match="cubin drift"):
        relock(make_ctx(proj))


def test_two_problems_whose_configs_share_a_cubin_each_lock_their_own_ptx(proj):
    """Problem 7x100 prefers vec 2, 64x1024 vec 4; both compile to one cubin with two PTX: the lock's
    variant holds the first's PTX, the second's entry its own digest, and --locked reproduces both;
    relock changes nothing."""
    from ptxbuild.build.locked import relock

    from .fakes import FakeGpu, fake_match

    class Gpu(FakeGpu):
        def measure(self, op_folder, params, problem, binary, incumbent=None):
            r = super().measure(op_folder, params, problem, binary, incumbent)
            return (
                r
                if problem.shape[1] != 100 or params["vec"] != 4
                else r.__class__(**{**r.__dict__, "p50_ms": 1.0})
            )

    kf = proj / "kernelfile.toml"
    kf.write_text(
        kf.read_text().replace('dtypes = ["float32", "bfloat16"]', 'dtypes = ["float32"]')
    )
    ctx = make_ctx(proj, _SharedCubin(), gpu=Gpu(), gpu_match=fake_match)
    update_lock(ctx.kf, build(ctx, [Target("scale", "h100")]))
    entry = read_lock(ctx.kf)["targets"]["scale@h100"]
    assert (
        sorted(d["params"]["vec"] for d in entry["dispatch"]) == [2, 4]
        and len(entry["variants"]) == 1
    )
    assert sum("ptx_sha256" in d for d in entry["dispatch"]) == 1
    shutil.rmtree(proj / "build")
    assert [
        r.status for r in build_locked(make_ctx(proj, _SharedCubin()), [Target("scale", "h100")])
    ] == ["built"]
    assert dict(relock(make_ctx(proj, _SharedCubin()), [Target("scale", "h100")])) == {
        "scale@h100": "unchanged"
    }


@pytest.mark.compile  # the real compiler: the CLI builds without the fakes
def test_relock_cli_names_the_targets_and_exits_nonzero_on_drift(proj):
    _built(proj)
    cu = proj / "ops" / "scale" / "scale.cu"
    cu.write_text(cu.read_text() + "\n__device__ int edited_kernel_source;\n")
    r = CliRunner().invoke(main, ["-f", str(proj / "kernelfile.toml"), "relock", "scale@h100"])
    assert r.exit_code != 0 and "scale@h100" in r.output and "drift" in r.output


def test_a_compile_only_build_does_not_replace_a_measured_lock_entry_or_report(proj):
    """A kernelfile edit makes the target stale everywhere; rebuilding it on a machine without its GPU
    must not downgrade the lock's measured entry to an unmeasured one (it stays, and drifts, until
    a build on the GPU)."""
    from ptxbuild.declare.graph import Target

    from .fakes import FakeGpu, fake_match

    ctx = make_ctx(proj, gpu=FakeGpu(), gpu_match=fake_match)
    update_lock(ctx.kf, build(ctx, [Target("scale", "h100")]))
    measured = read_lock(ctx.kf)["targets"]["scale@h100"]
    assert measured["measured_on_hardware"] is True
    kf = proj / "kernelfile.toml"
    kf.write_text(kf.read_text().replace("search = { budget = 6 }", "search = { budget = 5 }"))
    ctx, notes = make_ctx(proj), []
    results = build(ctx, [Target("scale", "h100"), Target("scale", "b200")])
    assert [r.status for r in results] == ["built", "built"] and not any(
        r.measured for r in results
    )
    update_lock(ctx.kf, results, note=notes.append)
    lock = read_lock(ctx.kf)["targets"]
    assert lock["scale@h100"] == measured
    assert lock["scale@b200"]["kernelfile_digest"] == ctx.kf.digest != measured["kernelfile_digest"]
    assert notes == [
        "scale@h100 keeps its entry measured on NVIDIA H100 80GB HBM3: this build was compile-only "
        "(build/ holds its kernels: `ptxbuild build --locked` puts the locked ones back)"
    ]
    # and its report stays the measured one; the compile-only build's goes beside it
    report = proj / "reports/scale@h100"
    assert json.loads((report / "report.json").read_text())["summary"]["measured"] is True
    assert (
        json.loads((report / "compile-only/report.json").read_text())["summary"]["measured"]
        is False
    )
    assert not (proj / "reports/scale@b200/compile-only").exists()


class _SharedCubin(FakeCompiler):
    """Every vec compiles to the same cubin (as min_blocks values that do not bind compile to the same
    SASS), while each config's PTX differs."""

    def __call__(self, kernel, arch):
        b = super().__call__(
            kernel.__class__(re.sub(r"#define VEC \d+", "", kernel.source), kernel.entry), arch
        )
        return b.__class__(**{**b.__dict__, "ptx": b.ptx + "\n// " + kernel.source.split("\n")[0]})


def test_configs_sharing_a_cubin_lock_the_winners_own_ptx(proj):
    from .fakes import FakeGpu, fake_match

    kf = (
        proj / "kernelfile.toml"
    )  # the polish step compiles vec = 1, 2 after the winner (threads 256, vec 4)
    kf.write_text(
        kf.read_text().replace(
            "search = { budget = 6 }",
            'search = { budget = 1, candidates = [{ threads = 256, vec = 4 }], polish = ["vec"] }',
        )
    )
    ctx = make_ctx(proj, _SharedCubin(), gpu=FakeGpu(), gpu_match=fake_match)
    results = build(ctx, [Target("scale", "h100")])
    update_lock(ctx.kf, results)
    entry = read_lock(ctx.kf)["targets"]["scale@h100"]
    assert len({d["binary"] for d in entry["dispatch"]}) == 2 and all(
        d["params"]["vec"] == 4 for d in entry["dispatch"]
    )
    shutil.rmtree(proj / "build")
    assert [
        r.status for r in build_locked(make_ctx(proj, _SharedCubin()), [Target("scale", "h100")])
    ] == ["built"]
    ptxs = [p.read_text() for p in (proj / "build/scale@h100").glob("*.ptx")]
    assert len(ptxs) == 2 and all(p.endswith("// #define VEC 4") for p in ptxs)


def test_a_target_missing_from_the_lock_fails_before_any_target_compiles(proj):
    """`ptxbuild build --locked` over the whole kernelfile used to compile every earlier target (22 s in
    this repository) before it named the one the lock lacks."""
    ctx, results, _ = _built(proj)
    last = [r.target for r in results][-1]
    _edit_lock(proj, lambda n, e: None)
    lock = json.loads((proj / "kernelfile.lock").read_text())
    del lock["targets"][str(last)]
    (proj / "kernelfile.lock").write_text(json.dumps(lock, indent=1, sort_keys=True) + "\n")
    shutil.rmtree(proj / "build")
    comp = FakeCompiler()
    with pytest.raises(LockError, match=f"{re.escape(str(last))} is not in kernelfile.lock"):
        build_locked(make_ctx(proj, comp))
    assert comp.calls == [] and not (proj / "build").exists()


def test_a_rebuild_of_the_same_kernels_leaves_the_lock_entry_as_it_is(proj):
    """The README's first command on a fresh clone rewrote every entry it rebuilt (this machine's wheel
    versions, which lesson a config was traced to) and left the checkout dirty; a change to what the
    entry pins (here an op source) still rewrites it."""
    _built(proj)
    _edit_lock(
        proj, lambda n, e: e["wheels"].update({"cuda-bindings": "0.0 (another machine)"})
    )  # not the compiler
    _edit_lock(
        proj, lambda n, e: [d.update(floor_ms=d["floor_ms"] * 1.006) for d in e["dispatch"]]
    )  # another session's
    before = (proj / "kernelfile.lock").read_text()  # copy bandwidth (4.226 / 4.250 TB/s)
    ctx = make_ctx(proj, force=True)
    update_lock(ctx.kf, build(ctx))
    assert (proj / "kernelfile.lock").read_text() == before
    kf = proj / "kernelfile.toml"  # a comment: the whole file's digest moves, the op's does not
    kf.write_text("# model kernels\n" + kf.read_text())
    ctx = make_ctx(proj, force=True)
    update_lock(ctx.kf, build(ctx))
    assert (proj / "kernelfile.lock").read_text() == before
    (proj / "ops/scale/scale.cu").write_text(
        (proj / "ops/scale/scale.cu").read_text() + "\n// v2\n"
    )
    ctx = make_ctx(proj)
    update_lock(ctx.kf, build(ctx))
    assert all(
        e["wheels"]["cuda-bindings"] != "0.0 (another machine)"
        for e in read_lock(ctx.kf)["targets"].values()
    )


def test_plan_says_when_build_holds_other_kernels_than_the_lock_pins(proj, monkeypatch):
    """A fresh clone (no cache) built without the GPU: the measured lock entry stays, but build/ holds the
    op's default kernels, and `plan` called that up to date while `ptxbuild.load` would run them."""
    from ptxbuild import cli
    from ptxbuild.declare.graph import Target

    from .fakes import FakeGpu, fake_match

    h100 = [Target("scale", "h100")]
    ctx = make_ctx(proj, gpu=FakeGpu(), gpu_match=fake_match)
    update_lock(ctx.kf, build(ctx, h100))
    for f in (proj / "cache").glob("*.sqlite*"):
        f.unlink()
    shutil.rmtree(proj / "build")  # a fresh clone: no cache and no build/ either
    ctx = make_ctx(proj)
    update_lock(ctx.kf, build(ctx, h100))
    assert read_lock(ctx.kf)["targets"]["scale@h100"]["measured_on_hardware"] is True
    monkeypatch.setattr(cli.shell, "_context", lambda kf, *a, **k: make_ctx(proj))
    monkeypatch.chdir(proj)
    plan = lambda: CliRunner().invoke(main, ["plan", "scale@h100"]).output  # noqa: E731
    assert (
        plan()
        == "build      scale@h100  (build/ holds other kernels than the lock pins; run: ptxbuild build --locked)\n"
    )
    explained = (
        CliRunner().invoke(main, ["build", "--explain", "scale@h100"]).output
    )  # the same judgement
    assert (
        "scale@h100: stale (build/ holds other kernels than the lock pins; run: ptxbuild build --locked)"
        in explained
    )
    build_locked(make_ctx(proj), h100)
    assert plan() == "up-to-date scale@h100  (up to date)\n"


def test_a_new_compiler_wheel_or_a_hand_edited_entry_is_rewritten_even_with_the_same_kernels(
    proj, monkeypatch
):
    """Kept entries are only those whose pins did not move: a patch release of NVRTC (same cubins) must
    still be recorded, or `--locked` on the machine that just rebuilt reports toolchain drift; and an
    entry edited by hand is replaced by the rebuild its error message recommends."""
    import ptxbuild.outputs.lockfile as lf

    _built(proj)
    real = lf.installed_version
    monkeypatch.setattr(
        lf, "installed_version", lambda n: "13.0.99" if n == "nvidia-cuda-nvrtc" else real(n)
    )
    ctx = make_ctx(proj, force=True)
    update_lock(ctx.kf, build(ctx))
    assert {e["wheels"]["nvidia-cuda-nvrtc"] for e in read_lock(ctx.kf)["targets"].values()} == {
        "13.0.99"
    }
    build_locked(make_ctx(proj))  # no toolchain drift
    _edit_lock(proj, lambda n, e: e["wheels"].update({"cuda-bindings": "edited"}), fix_digest=False)
    with pytest.raises(LockError, match="edited"):
        build_locked(make_ctx(proj))
    ctx = make_ctx(proj, force=True)
    update_lock(ctx.kf, build(ctx))
    build_locked(make_ctx(proj))  # the rebuild replaced the edited entries


def test_what_build_locked_wrote_is_up_to_date_while_the_lock_holds(proj):
    """`build --locked` records no cache build, so on a fresh clone `plan` said "never built" after it and a
    plain `build` searched again. build/ holding what a valid lock entry pins is up to date; an input the
    lock pins changing, or the target's GPU appearing for a compile-only entry, makes it stale again."""
    from ptxbuild.build.plan import plan

    from .fakes import FakeGpu, fake_match

    h100 = [Target("scale", "h100")]
    _built(proj)
    for f in (proj / "cache").glob("*.sqlite*"):
        f.unlink()
    shutil.rmtree(proj / "build")
    build_locked(make_ctx(proj), h100)
    compiler = FakeCompiler()
    ctx = make_ctx(proj, compiler)
    assert plan(ctx, h100) == [(h100[0], True, "up to date (built from the lock)")]
    (res,) = build(ctx, h100)
    assert res.status == "up_to_date" and compiler.calls == []
    assert (
        plan(make_ctx(proj, gpu=FakeGpu(), gpu_match=fake_match), h100)[0][1] is False
    )  # an H100 is here now
    tpl = proj / "ops/scale/scale.cu"
    tpl.write_text(tpl.read_text() + "\n// edited\n")
    assert plan(make_ctx(proj), h100)[0][1] is False


def test_a_damaged_lock_raises_a_new_error_each_read(tmp_path):
    """The parsed lock is memoised per content, its error too: each read raises an error of its
    own, so one caller's traceback and context never reach the next caller's."""
    from types import SimpleNamespace

    from ptxbuild.outputs.lockfile import LockUnreadable

    (tmp_path / "kernelfile.lock").write_text("{not json")
    kf = SimpleNamespace(path=tmp_path / "kernelfile.toml")
    errors = []
    for _ in range(2):
        with pytest.raises(LockUnreadable, match="kernelfile.lock") as got:
            read_lock(kf)
        errors.append(got.value)
    assert errors[0] is not errors[1] and errors[0].args == errors[1].args
    assert errors[1].__traceback__.tb_next.tb_next is None  # raised in read_lock, nothing older
