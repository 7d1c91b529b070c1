"""ops/kda_prepare and ops/kda_recurrence: each KDA stage as a contract-conforming op (no GPU)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ptxbuild.declare.kernelfile import load as load_kernelfile
from ptxbuild.oploader import load_op, source_files
from ptxbuild.problem import Problem

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("kda_prepare", "kda_recurrence")


@pytest.fixture(scope="module", params=STAGES)
def op(request):
    return load_op(request.param, ROOT)


def small(op, T=37, H=2, **opts):
    return Problem.make(op.NAME, "bfloat16", (T, H), opts)


def signature_arity(source: str, entry: str) -> int:
    """Parameters of `entry`'s signature, with its `#if NAME ... #endif` parts kept or dropped as the
    source's own #defines say (kda_recurrence takes a flags pointer under PDL_FLAGS only)."""
    code = re.sub(r"//[^\n]*", "", source)
    defs = dict(re.findall(r"^#define (\w+) (\S+)", code, re.M))
    code = re.sub(
        r"^#if (\w+)\n(.*?)^#endif\n",
        lambda m: m.group(2) if defs.get(m.group(1), "0") != "0" else "",
        code,
        flags=re.M | re.S,
    )
    m = re.search(r'extern "C" __global__ void\b.*?\b' + entry + r"\s*\(([^)]*)\)", code, re.S)
    assert m, f'no extern "C" __global__ {entry}'
    return len([a for a in m.group(1).split(",") if a.strip()])


@pytest.mark.parametrize(
    "opts",
    [
        {},
        {"lengths": (17, 33, 65)},
        {"lengths": (0, 15)},
        {"initial_state": False, "final_state": False, "gate": "canonical"},
        {"hv": 4, "gate": "given"},
    ],
)
def test_inputs_outputs_args_reference(op, opts):
    T = sum(opts.get("lengths") or (37,))
    pr = small(op, T, **opts)
    params = op.default_params(pr)
    assert op.check(params, pr) is None
    ins, outs = op.make_inputs(pr, 3, np), op.make_outputs(pr, np)
    args = op.kernel_args(params, pr, ins, outs)
    src = op.render(params, pr, "sm_90a")
    assert len(args) == signature_arity(src.source, src.entry)
    for name, out in outs.items():  # every output is an argument (the kernel writes it)
        assert any(a is out for a in args), name
    ref = op.reference(pr, ins, np)
    assert set(ref) == set(outs)
    for name, want in ref.items():
        assert want.shape == outs[name].shape
        if op.NAME == "kda_recurrence":
            assert np.all(np.isfinite(want)) and np.abs(want).max() > 0
    d = op.host.dims(pr)
    if op.NAME == "kda_prepare":
        assert outs["ws"].dtype == np.uint32 and outs["ws"].shape[:2] == (d["NC"], d["HV"])
    else:
        assert outs["o"].dtype == np.uint16 and ("hT" in outs) == d["hT"]
        assert ins["ws"].shape[:2] == (d["NC"], d["HV"])


def test_kernelfile_problems_accept_default_params():
    kf = load_kernelfile(ROOT / "kernelfile.toml")
    from ptxbuild.declare.checks import problems_of

    for name in STAGES:
        op = load_op(kf.ops[name].template, ROOT)
        probs = problems_of(kf.ops[name])
        assert len(probs) == 6
        for pr in probs:
            params = op.default_params(pr)
            assert op.check(params, pr) is None, pr.label()
            assert op.bytes_moved(pr) > 0
            for vp in op.verify_problems(pr, params):
                assert op.check(params, vp) is None and op.render(
                    params, vp, "sm_90a"
                ) == op.render(params, pr, "sm_90a")
    assert kf.ops["kda_recurrence"].depends == ("kda_prepare",)
    assert (
        kf.ops["kda_prepare"].options == kf.ops["kda_recurrence"].options
    )  # the workspace interface
    assert kf.ops["kda_prepare"].modes == kf.ops["kda_recurrence"].modes


def test_launch_covers_every_block():
    pre, rec = load_op("kda_prepare", ROOT), load_op("kda_recurrence", ROOT)
    pr = Problem.make("kda_recurrence", "bfloat16", (115, 4), {"lengths": (17, 33, 65), "hv": 8})
    d = rec.host.dims(pr)
    for split in (1, 2, 4):
        L = rec.launch({"split": split, "stages": 2}, pr, 132)
        assert L.grid == (d["N"] * d["HV"] * split, 1, 1) and L.block[0] == 128 // split // 16 * 32
    L = pre.launch({"prep_threads": 256}, pr, 132)
    assert L.grid == (d["NC"], d["HV"], 1) and L.block == (256, 1, 1)


def test_mismatched_lengths_are_rejected_not_raised():
    for name in STAGES:
        op = load_op(name, ROOT)
        pr = Problem.make(
            name, "bfloat16", (512, 4), {"lengths": (300, 300)}
        )  # what fewer_rows makes
        assert "lengths" in op.check(
            op.default_params(Problem.make(name, "bfloat16", (600, 4))), pr
        )


def test_prepare_compare_catches_a_wrong_field_and_samples_large_problems():
    op = load_op("kda_prepare", ROOT)
    pr = small(op, 115, 2, lengths=(17, 33, 65))
    ins = op.make_inputs(pr, 1, np)
    want = op.reference(pr, ins, np)["ws"]
    assert op.compare(pr, "ws", want.copy(), want, np)[0]
    bad = want.copy()
    bad[4, 1, 1000:1100] ^= 0x00400040  # flip bits in fragments of one chunk, one head
    ok, detail = op.compare(pr, "ws", bad, want, np)
    assert not ok and "W=" in detail
    nan = want.copy()
    nan[0, 0, 5] = 0xFFFF7FFF
    assert not op.compare(pr, "ws", nan, want, np)[0]
    big = Problem.make("kda_prepare", "bfloat16", (1300, 1), {"lengths": (1200, 100)})
    ids = op.reference_chunks(big, op.make_inputs(big, 2, np))
    assert len(ids) == op.MAX_REF_CHUNKS and {0, 74, 75, 81} <= set(ids.tolist())


def test_recurrence_on_the_cpu_workspace_passes_and_compare_fails_a_bad_head():
    op = load_op("kda_recurrence", ROOT)
    from ptxbuild.dtypes import from_float

    pr = small(op, 115, 2, lengths=(17, 33, 65))
    ins = op.make_inputs(pr, 5, np)
    want = op.reference(pr, ins, np)
    # what the kernel computes from this workspace (operands rounded as the kernel rounds them)
    case = op.host.case_from_inputs(pr, ins)
    p = op.ref.preprocess(case)
    ch = op.ref.chunked(
        p["q"], p["k"], p["v"], p["g"], p["beta"], p["scale"], p["cu_seqlens"], p["h0"]
    )
    o, hT = op.workspace.simulate(
        ins["ws"].view(np.uint8), ch, case["h0"], case["cu_seqlens"], "f16"
    )
    o_bits = from_float(o.astype(np.float32), "bfloat16", np)
    assert op.compare(pr, "o", o_bits, want["o"], np)[0]
    assert op.compare(pr, "hT", hT.astype(np.float32), want["hT"], np)[0]
    o_bad = o.copy()
    o_bad[:, 1] *= 1.05
    assert not op.compare(
        pr, "o", from_float(o_bad.astype(np.float32), "bfloat16", np), want["o"], np
    )[0]


def test_build_key_follows_the_shared_sources(tmp_path):
    for sub in ("kda", "kda_prepare", "kda_recurrence"):
        shutil.copytree(
            ROOT / "ops" / sub, tmp_path / "ops" / sub, ignore=shutil.ignore_patterns("__pycache__")
        )
    from ptxbuild.oploader import file_digests as _file_digests

    for name, shared in (
        ("kda_prepare", "kda_prepare.cu"),
        ("kda_recurrence", "kda_recurrence.cu"),
    ):
        op = load_op(str(tmp_path / "ops" / name), tmp_path)
        files = {p.resolve() for p in source_files(op)}
        assert {
            (tmp_path / "ops/kda" / f).resolve() for f in ("kda_common.cuh", shared, "kda_host.py")
        } <= files
        before = _file_digests(op)
        assert len(before) == len(source_files(op))  # no two sources share a name
        with open(tmp_path / "ops/kda" / shared, "a") as f:
            f.write("\n// changed\n")
        assert _file_digests(op) != before


@pytest.mark.compile  # `ptxbuild plan` asks the real compiler for its version
def test_plan_lists_prepare_first():
    out = subprocess.run(
        [sys.executable, "-m", "ptxbuild.cli", "plan", "kda_recurrence@h200"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stdout.splitlines() if "kda_" in ln]
    assert "kda_prepare@h200" in lines[0] and "kda_recurrence@h200" in lines[1]


# ---------------------------------------------------------------- compiler
@pytest.mark.compile
@pytest.mark.parametrize("name", STAGES)
def test_default_config_compiles_without_spills(name):
    pytest.importorskip("cuda.bindings", reason="needs the CUDA compiler wheels")
    from ptxbuild.compile.compiler import compile_kernel

    op = load_op(name, ROOT)
    pr = Problem.make(name, "bfloat16", (8192, 96))
    b = compile_kernel(op.render(op.default_params(pr), pr, "sm_90a"), "sm_90a")
    assert b.spill_bytes == 0 and b.local_bytes == 0, b.log
    assert f".entry {name}" in b.ptx


@pytest.mark.compile
def test_compile_only_build_in_a_copy(tmp_path):
    pytest.importorskip("cuda.bindings", reason="needs the CUDA compiler wheels")
    for sub in ("kda", "kda_prepare", "kda_recurrence"):
        shutil.copytree(
            ROOT / "ops" / sub, tmp_path / "ops" / sub, ignore=shutil.ignore_patterns("__pycache__")
        )
    text = (ROOT / "kernelfile.toml").read_text()
    (tmp_path / "kernelfile.toml").write_text(
        text[: text.index("[ops.rmsnorm]")] + text[text.index("[ops.kda_prepare]") :]
    )
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "ptxbuild.cli",
            "build",
            "kda_recurrence@h100",
            "--no-gpu",
            "-j",
            "1",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    for t in ("kda_prepare@h100", "kda_recurrence@h100"):
        assert (tmp_path / "build" / t / "manifest.json").is_file()


def test_judge_uses_an_ops_compare_hook():
    from ptxbuild.gpu import check
    from ptxbuild.outcome import Outcome

    x = np.zeros(4, np.float32)
    out, ref = {"y": np.ones(4, np.float32)}, {"y": np.zeros(4)}

    def tol(_):
        return (0.0, 0.0)

    assert (
        check.judge("float32", {"x": x}, {"x": x.copy()}, out, ref, tol, np)[0]
        is Outcome.WRONG_RESULT
    )
    assert (
        check.judge(
            "float32",
            {"x": x},
            {"x": x.copy()},
            out,
            ref,
            tol,
            np,
            custom=lambda n, g, w: (True, ""),
        )[0]
        is Outcome.OK
    )
    res = check.judge(
        "float32",
        {"x": x},
        {"x": x.copy()},
        out,
        ref,
        tol,
        np,
        custom=lambda n, g, w: (False, "rms 1"),
    )
    assert res[0] is Outcome.WRONG_RESULT and "rms 1" in res[1]
    # None: the elementwise band judges
    assert (
        check.judge(
            "float32",
            {"x": x},
            {"x": x.copy()},
            out,
            ref,
            lambda _: (1.0, 0.0),
            np,
            custom=lambda n, g, w: None,
        )[0]
        is Outcome.OK
    )


BATCHED_CASES = [
    ((37, 2), {}),
    ((115, 2), {"lengths": (17, 33, 65)}),
    ((64, 2), {"lengths": (15, 0, 49)}),
    ((287, 2), {"lengths": (0, 31, 96, 160), "op_dtype": "bf16"}),
    ((50, 2), {"hv": 4}),
]


@pytest.mark.parametrize("shape,opts", BATCHED_CASES)
def test_batched_workspace_is_the_per_chunk_workspace_byte_for_byte(shape, opts):
    """kda_recurrence's inputs come from workspace_batched (many chunks per step, numpy or cupy); on the
    CPU it must encode exactly what the per-chunk float64 path (ref.chunked) encodes, short chunks,
    empty segments and GVA included, whatever the batch size."""
    op = load_op("kda_recurrence", ROOT)
    pr = small(op, *shape, **opts)
    pre = op.ref.preprocess(op.host.case_for(pr, 5))
    want = op.host.workspace_all(pre, op.op_dtype(pr))
    for batch in (1, 7, None):
        got = op.batched.workspace_all(pre, op.op_dtype(pr), op.ref, op.workspace, np, batch)
        assert got.shape == want.shape and np.array_equal(got, want), (
            f"batch {batch}: {(got != want).sum()} bytes differ"
        )
    ws = op.make_inputs(pr, 5, np)["ws"]
    assert np.array_equal(ws.view(np.uint8).reshape(want.shape), want)
    for pieces in (1, 3):  # the recurrence's inputs: encoded in pieces on threads
        assert np.array_equal(
            op.workspace_of(op.host.case_for(pr, 5), op.op_dtype(pr), np, pieces), want
        )
    ids = np.array(
        [0, len(want) - 1, len(want) // 2]
    )  # kda_prepare's reference: a subset of chunks
    got = op.batched.workspace_chunks(pre, ids, op.op_dtype(pr), op.ref, op.workspace, np, 2)
    assert np.array_equal(got, op.host.workspace_chunks(pre, ids, op.op_dtype(pr)))


@pytest.mark.gpu
@pytest.mark.parametrize("shape,opts", [((1024, 4), {"lengths": (300, 7, 717)}), ((2048, 16), {})])
def test_batched_workspace_on_the_gpu_matches_the_cpu(shape, opts):
    """The same workspace computed by cupy (how the worker's make_inputs runs): float64 rounding may differ
    in the last bits, so the decoded fields agree to half an op_dtype ulp and nearly every byte is equal."""
    cp = pytest.importorskip("cupy", reason="needs cupy and an NVIDIA GPU")
    from ptxbuild.gpu import gpu_available

    if not gpu_available():
        pytest.skip("needs an NVIDIA GPU")
    op = load_op("kda_recurrence", ROOT)
    pr = small(op, *shape, **opts)
    pre = op.ref.preprocess(op.host.case_for(pr, 3))
    d = op.host.dims(pr)
    cpu = op.batched.workspace_all(pre, "f16", op.ref, op.workspace, np)
    gpu = op.batched.workspace_all(pre, "f16", op.ref, op.workspace, cp)
    assert gpu.shape == cpu.shape and (gpu == cpu).mean() > 0.99
    a, b = (op.workspace.decode(w, d["NC"], d["HV"], d["K"], d["V"], "f16") for w in (cpu, gpu))
    for name in a:
        scale = np.abs(a[name]).max() or 1.0
        assert np.abs(a[name] - b[name]).max() <= scale * 2.0**-10, name
