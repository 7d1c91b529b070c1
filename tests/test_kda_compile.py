"""The KDA kernels compile for sm_90a without spills over the search space."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ptxbuild.problem import Problem

pytestmark = pytest.mark.compile
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def op():
    pytest.importorskip("cuda.bindings", reason="needs the CUDA compiler wheels")
    from ptxbuild.oploader import load_op

    return load_op("kda", ROOT)


@pytest.mark.parametrize(
    "opts",
    [
        {},
        {"gate": "canonical", "initial_state": False, "final_state": False},
        {"gate": "given", "hv": 192, "l2norm": False},
    ],
)
@pytest.mark.parametrize("split,stages,op_dtype", [(1, 2, "f16"), (2, 3, "bf16"), (4, 2, "f16")])
def test_compiles_without_spills(op, opts, split, stages, op_dtype):
    from ptxbuild.compile.compiler import compile_kernel

    pr = Problem.make("kda", "bfloat16", (8192, 96), opts)
    params = dict(split=split, stages=stages, op_dtype=op_dtype, prep_threads=128)
    assert op.check(params, pr) is None
    for stage in op.KERNELS:
        b = compile_kernel(op.render_stage(params, pr, "sm_90a", stage), "sm_90a")
        assert b.spill_bytes == 0 and b.local_bytes == 0, (stage, b.log)
        assert b.registers <= 255
    full = compile_kernel(op.render(params, pr, "sm_90a"), "sm_90a")
    assert ".entry kda_prepare" in full.ptx and ".entry kda_recurrence" in full.ptx


def variant1(op, pr):
    """The default before prep_variant 4 (variant 1 with the compact layout), which the tests below
    that are about the recurrence or variant 1 were written on; as is where x1w does not apply."""
    p = op.default_params(pr)
    return {**p, "prep_variant": 1, "prep_compact": 1} if p["prep_variant"] == 4 else p


def test_default_params_and_checks(op):
    pr = Problem.make("kda", "bfloat16", (8192, 96))
    # two kernels by default: V-split for ~2 blocks per SM (the recurrence is instruction-latency-bound);
    # the persistent x1w prepare (variant 4) where it applies
    assert op.default_params(pr) == {
        "split": 4,
        "stages": 4,
        "op_dtype": "f16",
        "prep_threads": 128,
        "prep_variant": 4,
        "rec_copy": "bulk",
        "o_store": "rows",
    }
    # where x1w does not apply (no L2 norm: it would spill), variant 1 with its compact layout
    assert op.default_params(Problem.make("kda", "bfloat16", (8192, 96), {"l2norm": False})) == {
        **op.default_params(pr),
        "prep_variant": 1,
        "prep_compact": 1,
    }
    # prep_compact is variant 1's layout: the canonical gate (variant 0) goes without it
    assert "prep_compact" not in op.default_params(
        Problem.make("kda", "bfloat16", (8192, 96), {"gate": "canonical"})
    )
    # variant 3 (measured slower, in the space): persistent prepare + the recurrence as its PDL dependent,
    # 2 stages so that both kernels' blocks share an SM
    v3 = {
        **op.default_params(pr),
        "prep_variant": 3,
        "stages": 2,
        "rec_copy": "cp_async",
        "prep_compact": 0,
    }
    assert op.check(v3, pr) is None and op.check({**v3, "rec_copy": "bulk"}, pr) is not None
    assert op.check({**op.default_params(pr), "rec_copy": "bulk"}, pr) is None
    assert op.check({**op.default_params(pr), "rec_copy": "tma"}, pr) is not None
    assert op.check({**op.default_params(pr), "o_store": "tiles"}, pr) is not None
    ovl = op.launches(v3, pr, 132)
    assert list(ovl) == ["kda_prepare_ovl", "kda_recurrence"] and ovl["kda_recurrence"].pdl
    assert ovl["kda_prepare_ovl"].grid == (2 * 132, 1, 1) and not ovl["kda_prepare_ovl"].pdl
    # both fit on one SM together: 2 prepare blocks + the recurrence's ~3 (smem per SM 228 KB, 1 KB per block)
    per_block = lambda L: L.smem_bytes + 1024  # noqa: E731
    assert (
        2 * per_block(ovl["kda_prepare_ovl"]) + 3 * per_block(ovl["kda_recurrence"]) <= 228 * 1024
    )
    assert op.default_params(Problem.make("kda", "bfloat16", (8192, 16)))["split"] == 8
    assert (
        op.default_params(Problem.make("kda", "bfloat16", (8192, 64), {"lengths": (1024,) * 8}))[
            "split"
        ]
        == 1
    )
    canon = Problem.make("kda", "bfloat16", (8192, 96), {"gate": "canonical"})
    assert op.default_params(canon)["prep_variant"] == 0 and op.default_params(canon)["split"] == 4
    # the fused kernel (prep_variant 2, measured slower): at most one block per SM, its own 2-slot ring
    assert (
        op.fused_params(pr)["split"] == 1
        and op.fused_params(Problem.make("kda", "bfloat16", (8192, 64)))["split"] == 2
    )
    assert (
        op.check(op.fused_params(pr), pr) is None
        and op.check({**op.fused_params(pr), "stages": 3}, pr) is not None
    )
    assert (
        op.check(
            {"split": 4, "stages": 2, "op_dtype": "f16", "prep_threads": 128},
            Problem.make("kda", "bfloat16", (64, 4), {"V": 32}),
        )
        is not None
    )
    launch = op.launch(op.default_params(canon), canon, 132)
    assert launch.grid == (384, 1, 1) and launch.block == (64, 1, 1)
    fused = op.launches(op.fused_params(pr), pr, 132)
    assert list(fused) == ["kda_fused"] and fused["kda_fused"].grid == (96, 1, 1)
    assert (
        fused["kda_fused"].block == (256 + 128, 1, 1)
        and fused["kda_fused"].smem_bytes <= 227 * 1024
    )
    assert op.bytes_moved(pr) > 0
    assert len(op.verify_problems(pr)) >= 5


@pytest.mark.parametrize("op_dtype", ["f16", "bf16"])
@pytest.mark.parametrize(
    "opts",
    [
        {},
        {"lengths": (1024,) * 8, "initial_state": False},
        {"hv": 192, "l2norm": False},
        {"gate": "canonical"},
    ],
)
def test_every_prepare_config_compiles_without_spills(opts, op_dtype):
    """kda_prepare's whole SPACE (both variants) on the kernelfile's H = 96 shape and variations."""
    import itertools

    from ptxbuild.compile.compiler import compile_kernel
    from ptxbuild.oploader import load_op

    prep = load_op("kda_prepare", ROOT)
    pr = Problem.make("kda_prepare", "bfloat16", (8192, 96), {**opts, "op_dtype": op_dtype})
    configs = [dict(zip(prep.SPACE, c)) for c in itertools.product(*prep.SPACE.values())]
    valid = [p for p in configs if prep.check(p, pr) is None]
    assert {p["prep_variant"] for p in valid} == ({0} if opts.get("gate") else {0, 1})
    for params in valid:
        b = compile_kernel(prep.render(params, pr, "sm_90a"), "sm_90a")
        assert b.spill_bytes == 0 and b.local_bytes == 0, (params, b.log)
        assert b.registers <= (128 if params["prep_variant"] else 255), params


def test_bundled_op_with_the_fast_prepare(op):
    from ptxbuild.compile.compiler import compile_kernel

    pr = Problem.make("kda", "bfloat16", (8192, 96))
    params = {**op.default_params(pr), "prep_variant": 1}
    assert op.check(params, pr) is None
    assert (
        op.check(params, Problem.make("kda", "bfloat16", (8192, 96), {"gate": "given"})) is not None
    )
    full = compile_kernel(op.render(params, pr, "sm_90a"), "sm_90a")
    assert (
        ".entry kda_prepare" in full.ptx
        and ".entry kda_recurrence" in full.ptx
        and full.spill_bytes == 0
    )


@pytest.mark.parametrize("opts", [{}, {"initial_state": False, "final_state": False}, {"hv": 192}])
@pytest.mark.parametrize("split,op_dtype", [(1, "f16"), (2, "bf16"), (8, "f16")])
def test_the_fused_kernel_compiles_without_spills_and_fits_its_block(op, opts, split, op_dtype):
    """prep_variant 2: one entry, kda_fused; its registers must fit consumers + the 128 producer threads."""
    from ptxbuild.compile.compiler import compile_kernel

    pr = Problem.make("kda", "bfloat16", (8192, 96), opts)
    params = dict(split=split, stages=2, op_dtype=op_dtype, prep_threads=128, prep_variant=2)
    assert op.check(params, pr) is None
    b = compile_kernel(op.render(params, pr, "sm_90a"), "sm_90a")
    assert b.entry == "kda_fused" and ".entry kda_fused" in b.ptx
    assert b.spill_bytes == 0 and b.local_bytes == 0, b.log
    threads = op.launch(params, pr, 132).block[0]
    assert threads == 128 // split // 16 * 32 + 128 and -(-b.registers // 8) * 8 * threads <= 65536


KDA_LOCKS = sorted(
    t
    for t, e in json.loads((ROOT / "kernelfile.lock").read_text())["targets"].items()
    if e["template"] in ("kda", "kda_prepare", "kda_recurrence")
)


@pytest.mark.parametrize("target", KDA_LOCKS)
def test_the_locked_kda_kernels_still_build_from_this_source(target):
    """Every KDA-family lock entry (kda, kda_heads, kda_prepare, kda_recurrence on h200, h100 and
    b200): its configs, rendered from today's sources and compiled with the same wheels, give the
    locked cubins byte for byte, and the main entry's launch is the locked one. So a change that adds
    a variant (prep_variant 4) leaves every locked config as it was measured or compile-checked; the
    locks are stale only because their op files' digests changed. Skipped with another compiler build."""
    from ptxbuild.compile.compiler import compile_kernel, toolchain
    from ptxbuild.oploader import load_op

    lock = json.loads((ROOT / "kernelfile.lock").read_text())["targets"][target]
    if {k: v for k, v in toolchain().__dict__.items() if k in lock["toolchain"]} != lock[
        "toolchain"
    ]:
        pytest.skip(f"the lock was built with {lock['toolchain']}, this machine has {toolchain()}")
    op = load_op(lock["template"], ROOT)
    built: dict = {}
    for d in lock["dispatch"]:
        pr = d["problem"]
        problem = Problem.make(pr["op"], pr["dtype"], pr["shape"], pr["options"])
        assert op.check(d["params"], problem) is None, (d["label"], d["params"])
        k = op.render(d["params"], problem, lock["arch"])
        if (k.source, k.entry) not in built:
            built[(k.source, k.entry)] = compile_kernel(k, lock["arch"]).digest
        assert built[(k.source, k.entry)] == d["binary"], (d["label"], d["params"])
        geom = op.launch(d["params"], problem, lock["gpu"]["sm_count"])
        want = d["launch"]
        assert (list(geom.grid), list(geom.block), geom.smem_bytes) == (
            want["grid"],
            want["block"],
            want["smem_bytes"],
        ), (d["label"], geom, want)


@pytest.mark.parametrize(
    "opts", [{}, {"lengths": (1024,) * 8, "initial_state": False}, {"hv": 192}]
)
@pytest.mark.parametrize("split,stages", [(1, 4), (4, 4), (8, 5)])
def test_the_bulk_copy_and_row_store_recurrence_compiles(op, opts, split, stages):
    """rec_copy="bulk" (two cp.async.bulk per stage on an mbarrier, one issuing thread) and
    o_store="rows" (bf16 pairs): no spills, the instructions they stand for are in the PTX, and the
    per-thread cp.async loop is gone."""
    from ptxbuild.compile.compiler import compile_kernel

    pr = Problem.make("kda", "bfloat16", (8192, 96), opts)
    params = {**variant1(op, pr), "split": split, "stages": stages}
    assert (
        params["rec_copy"] == "bulk"
        and params["o_store"] == "rows"
        and op.check(params, pr) is None
    )
    b = compile_kernel(op.render(params, pr, "sm_90a"), "sm_90a")
    assert b.entry == "kda_recurrence" and b.spill_bytes == 0 and b.local_bytes == 0, b.log
    rec = b.ptx[b.ptx.index(".entry kda_recurrence") :]
    # two per fill: the unrolled prologue's STAGES - 1 fills and the loop's one
    assert (
        rec.count("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes") == 2 * stages
    )
    assert "mbarrier.try_wait.parity" in rec and "cp.async.cg.shared.global" not in rec
    assert "cvt.rn.bf16x2.f32" in rec and "st.global.u32" in rec
    cols = compile_kernel(
        op.render({**params, "rec_copy": "cp_async", "o_store": "cols"}, pr, "sm_90a"), "sm_90a"
    )
    old = cols.ptx[cols.ptx.index(".entry kda_recurrence") :]
    assert (
        "cp.async.bulk" not in old and "cp.async.cg.shared.global" in old and "st.global.u16" in old
    )


def test_new_options_absent_render_the_measured_sources(op):
    """Configs recorded before rec_copy / o_store existed (the lock, lessons) render exactly as
    before: the defines appear only when asked for."""
    pr = Problem.make("kda", "bfloat16", (8192, 96))
    old = {"split": 4, "stages": 3, "op_dtype": "f16", "prep_threads": 128, "prep_variant": 1}
    src = op.render(old, pr, "sm_90a").source
    assert src == op.render({**old, "rec_copy": "cp_async", "o_store": "cols"}, pr, "sm_90a").source
    assert (
        "#define REC_BULK" not in src
        and "#define REC_OROWS" not in src
        and "#define PDL_FLAGS" not in src
    )
    new = op.render({**old, "rec_copy": "bulk", "o_store": "rows"}, pr, "sm_90a").source
    assert "#define REC_BULK 1" in new and "#define REC_OROWS 1" in new


def test_the_overlapped_prepare_compiles_and_publishes_its_flags(op):
    """prep_variant 3: kda_prepare_ovl clears its flags and triggers the dependent launch before any
    task, release-stores one flag per task; the recurrence acquires before each stage copy."""
    from ptxbuild.compile.compiler import compile_kernel
    from ptxbuild.problem import Kernel

    pr = Problem.make("kda", "bfloat16", (8192, 96))
    params = {
        **op.default_params(pr),
        "prep_variant": 3,
        "stages": 2,
        "rec_copy": "cp_async",
        "prep_compact": 0,
    }
    k = op.render(params, pr, "sm_90a")
    prep = compile_kernel(Kernel(k.source, "kda_prepare_ovl"), "sm_90a")
    assert prep.spill_bytes == 0 and prep.registers <= 128, prep.log
    body = prep.ptx[prep.ptx.index(".entry kda_prepare_ovl") :]
    assert body.index("griddepcontrol.launch_dependents") < body.index("cp.async.cg.shared.global")
    assert "st.release.gpu.global.u32" in body
    rec = compile_kernel(k, "sm_90a")
    assert (
        rec.spill_bytes == 0
        and "ld.acquire.gpu.global.u32" in rec.ptx[rec.ptx.index(".entry kda_recurrence") :]
    )


@pytest.mark.parametrize("opts", [{}, {"hv": 192, "l2norm": False}])
def test_the_compact_prepare_fits_six_blocks_per_sm(op, opts):
    """prep_compact=1 lays Km over the k and a rows: static smem and registers let 6 blocks of 128
    threads share an H100/H200 SM (228 KB, 1 KB reserved per block; 64K registers, 8-register
    allocation granules); the default layout stays at 5. Only prepare variant 1 has it."""
    from ptxbuild.compile.compiler import compile_kernel
    from ptxbuild.problem import Kernel

    pr = Problem.make("kda", "bfloat16", (8192, 96), opts)
    base = variant1(op, pr)

    def prep(**kw):
        return compile_kernel(
            Kernel(op.render({**base, **kw}, pr, "sm_90a").source, "kda_prepare"), "sm_90a"
        )

    wide, compact = prep(prep_compact=0), prep(prep_compact=1)

    def blocks(b):
        return min(
            (228 * 1024) // (b.smem_static_bytes + 1024), 65536 // (128 * -(-b.registers // 8) * 8)
        )  # noqa: E731

    assert (blocks(wide), blocks(compact)) == (5, 6)
    assert compact.spill_bytes == 0 and compact.local_bytes == 0, compact.log
    assert op.check({**base, "prep_compact": 1, "prep_variant": 0}, pr) is not None


@pytest.mark.parametrize(
    "opts", [{}, {"lengths": (1024,) * 8, "initial_state": False}, {"final_state": False}]
)
@pytest.mark.parametrize("split", [1, 4, 8])
def test_the_ksplit_recurrence_compiles_with_half_the_mma_per_warp(op, opts, split):
    """ksplit=2: two warps per 16 state rows, each with half the channels: the chunk step issues 25
    mma.sync instead of 50 per warp, the pair syncs on its own named barrier (bar.sync 1 + pair, 64
    threads), twice the threads per block, the exchange buffers counted in the dynamic smem; only
    with bulk copies and O rows."""
    from ptxbuild.compile.compiler import compile_kernel

    pr = Problem.make("kda", "bfloat16", (8192, 96), opts)
    base = {**variant1(op, pr), "split": split, "stages": 3}
    ks = {**base, "ksplit": 2}
    assert op.check(ks, pr) is None
    b = compile_kernel(op.render(ks, pr, "sm_90a"), "sm_90a")
    assert b.spill_bytes == 0 and b.local_bytes == 0 and b.registers <= 128, b.log
    rec = b.ptx[b.ptx.index(".entry kda_recurrence") :]
    one = compile_kernel(op.render(base, pr, "sm_90a"), "sm_90a")
    assert (
        rec.count("mma.sync") == 25
        and one.ptx[one.ptx.index(".entry kda_recurrence") :].count("mma.sync") == 50
    )
    import re

    assert re.search(r"bar\.sync\s+%r\d+, 64;", rec)  # the pair's named barrier (id in a register)
    L1, L2 = (
        op.launches(base, pr, 132)["kda_recurrence"],
        op.launches(ks, pr, 132)["kda_recurrence"],
    )
    assert L2.block[0] == 2 * L1.block[0] and L2.grid == L1.grid
    assert L2.smem_bytes - L1.smem_bytes == (128 // split // 16) * 3072
    for bad in ({"rec_copy": "cp_async"}, {"o_store": "cols"}, {"ksplit": 4}):
        assert op.check({**ks, **bad}, pr) is not None
    # halves of whole 16-channel k-steps only, and named barriers 1..15 for the pairs
    v0 = {
        **ks,
        "prep_variant": 0,
        "prep_compact": 0,
    }  # variant 1 (and its compact layout): K = V = 128 only
    assert op.check(v0, Problem.make("kda", "bfloat16", (64, 4), {"K": 64})) is None
    assert "K % 32" in op.check(v0, Problem.make("kda", "bfloat16", (64, 4), {"K": 48}))
    assert "row groups" in op.check(
        {**v0, "split": 1}, Problem.make("kda", "bfloat16", (64, 4), {"V": 256})
    )
    assert (
        op.check({**v0, "split": 2}, Problem.make("kda", "bfloat16", (64, 4), {"V": 256})) is None
    )
