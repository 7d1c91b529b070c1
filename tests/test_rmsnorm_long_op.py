"""lab/ops/rmsnorm_long (issue 29 item 4): ops/rmsnorm plus stage="ring" (and interleave, the cluster
split's probe long7; stage="stream" with `stages`, the backward's stage=smem on the forward, probe long9). Pure: the ring's defaults, checks, launch and verification shapes; that every
other config is judged, defaulted and rendered as ops/rmsnorm does; interleave's index map. Compile: the ring's PTX, and the locked rmsnorm@h200 winners compiled
from the lab copy give ops/rmsnorm's PTX and cubin (so moving the ring into ops/rmsnorm changes no
locked binary)."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import tomllib
from pathlib import Path

import numpy as np
import pytest

from ptxbuild.oploader import load_op
from ptxbuild.problem import Problem

ROOT = Path(__file__).resolve().parents[1]
op = load_op("lab/ops/rmsnorm_long", ROOT)
base = load_op("rmsnorm", ROOT)

MATRIX_N = [256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144]
MATRIX_M = {131072: 16384, 262144: 8192}


def prob(dtype="bfloat16", shape=(4, 64), **opts):
    return Problem.make("rmsnorm", dtype, shape, opts)


def matrix():
    for dt in op.DTYPES:
        for mode in ({}, {"residual": True}):
            for n in MATRIX_N:
                yield prob(dt, (MATRIX_M.get(n, 32768), n), **mode)


# the lab's own parameters beside stage="ring" (the ring's two, the cluster split's interleave)
LAB_ONLY = {
    "ring_group": [1, 2, 4, 8],
    "ring_skew": [False, True],
    "interleave": [0, 1, 2, 4, 8, 16, 32, 64],
    "stages": [1, 2, 3, 4, 6, 8],
}


def test_the_lab_op_is_ops_rmsnorm_plus_one_stage_value():
    assert op.NAME == "rmsnorm_long" and base.NAME == "rmsnorm"
    assert {k: v for k, v in op.SPACE.items() if k != "stage" and k not in LAB_ONLY} == {
        k: v for k, v in base.SPACE.items() if k != "stage"
    }
    assert op.SPACE["stage"] == [*base.SPACE["stage"], "ring", "stream"]
    assert {k: op.SPACE[k] for k in LAB_ONLY} == LAB_ONLY  # first values: off, as before


def test_every_other_config_is_checked_defaulted_and_rendered_as_in_ops_rmsnorm():
    """The locked rmsnorm@h200 winners, every config one parameter from each (valid or not), and
    random configs: the same check() verdict; where valid, the same defines, launch and verifier
    shapes. Below N = 65536 the same defaults."""
    lock = json.loads((ROOT / "kernelfile.lock").read_text())
    rng = random.Random(29)
    cases = []
    for e in lock["targets"]["rmsnorm@h200"]["dispatch"]:
        k = e["problem"]
        p = prob(k["dtype"], tuple(k["shape"]), **k.get("options", {}))
        w = base._full(e["params"])
        cases += [(p, w)] + [(p, {**w, n: v}) for n, vs in base.SPACE.items() for v in vs]
        cases += [(p, {n: rng.choice(vs) for n, vs in base.SPACE.items()}) for _ in range(20)]
    valid = 0
    for p, cfg in cases:
        why = base.check(cfg, p)
        if why and "NonPortable" in why:  # ops/rmsnorm refuses 16, the lab op judges it (long8)
            assert "NonPortable" not in (op.check(cfg, p) or ""), (p.label(), cfg)
            continue
        assert op.check(cfg, p) == why, (p.label(), cfg)
        if why is None:
            valid += 1
            a, b = op.render(cfg, p, "sm_90a").source, base.render(cfg, p, "sm_90a").source
            assert a[: a.index("// RMSNorm forward")] == b[: b.index("// RMSNorm forward")]
            assert op.launch(cfg, p, 132) == base.launch(cfg, p, 132)
            assert op.verify_problems(p, cfg) == base.verify_problems(p, cfg)
    assert valid > 500, valid
    for p in matrix():
        if p.shape[1] < 65536:
            want = {**base.default_params(p), **{k: v[0] for k, v in LAB_ONLY.items()}}
            assert op.default_params(p) == want, p.label()


def test_default_is_the_ring_at_n_65536_and_up_where_a_ring_holds_the_part():
    for p in matrix():
        if p.shape[1] < 65536:
            continue
        d = op.default_params(p)
        assert op.check(d, p) is None, p.label()
        fits = not (p.dtype == "float32" and p.opts.get("residual") and p.shape[1] == 262144)
        assert d["stage"] == ("ring" if fits else "smem"), p.label()
        assert d["regime"] == ("block" if d["cluster"] == 1 else "cluster"), p.label()
        if not fits:
            assert {k: v for k, v in d.items() if k not in LAB_ONLY} == base.default_params(p)


RING = {"stage": "ring", "load_hint": "none"}


def test_ring_default_is_the_smallest_cluster_whose_part_and_a_chunk_more_fit_the_ring():
    """N >= 65536: 1024 threads where the held weight fits their registers (else 512), one
    iteration per chunk (16 KB, 32 KB with a residual), 128 KB of row part per CTA (64 KB of x and
    64 KB of residual), as many slots as fit one CTA per SM (<= 2 parts). The H200's best rings
    (run 27c: fp32 256K 8 x 1024, bf16 / fp16 256K 4 x 1024, fp32 128K 4 x 1024) are the defaults."""
    want = {
        ("bfloat16", 65536, False): (1, 1024, 8, 13),
        ("bfloat16", 131072, False): (2, 1024, 8, 13),
        ("bfloat16", 262144, False): (4, 1024, 8, 13),
        ("float16", 262144, False): (4, 1024, 8, 13),
        ("float32", 262144, False): (8, 1024, 8, 13),
        ("float32", 131072, False): (4, 1024, 8, 13),
        ("float32", 65536, False): (2, 1024, 8, 13),
        ("bfloat16", 262144, True): (8, 1024, 4, 6),
        ("float32", 131072, True): (8, 1024, 4, 6),
    }
    for (dt, n, res), (cluster, threads, nch, slots) in want.items():
        p = prob(dt, (MATRIX_M.get(n, 32768), n), **({"residual": True} if res else {}))
        d = op.default_params(p)
        assert (d["stage"], d["cluster"], d["threads"], d["unroll"]) == (
            "ring",
            cluster,
            threads,
            1,
        )
        sb = threads * 16 * (1 + res)
        assert op._ring(d, p) == (nch, slots, sb)
        assert op.launch(d, p, 132).smem_bytes == slots * sb <= op.SMEM_LIMIT_BYTES
    # an fp32 weight (8 words a vector) does not fit 4 x 1024 or 4 x 512: the next cluster, 8 x 1024
    w = prob("bfloat16", (8192, 262144), weight="fp32")
    assert (op.default_params(w)["threads"], op.default_params(w)["cluster"]) == (1024, 8)
    # below 65536 the defaults are what they were
    assert op.default_params(prob("bfloat16", (32768, 32768)))["stage"] == "reg"


def test_ring_check_refuses_what_the_kernel_cannot_do():
    big = prob("bfloat16", (8192, 262144))
    cfg = op._full({"regime": "cluster", "cluster": 8, "threads": 512, **RING})
    assert op.check(cfg, big) is None
    assert "whole chunks" in op.check({**cfg, "threads": 384}, big)  # 4096 vectors % 384 lanes
    assert "whole chunks" in op.check({**cfg, "unroll": 8, "threads": 1024}, big)  # 4 % 8
    assert "leave load_hint" in op.check({**cfg, "load_hint": "nc"}, big)
    # a cluster of 16 (non-portable: ptxbuild.launch sets the attribute): the lab op allows it in
    # every stage, ops/rmsnorm still refuses it
    assert op.check({**cfg, "cluster": 16}, big) is None
    reg16 = {**cfg, "cluster": 16, "stage": "reg", "load_hint": "nc"}
    reg16_base = {k: v for k, v in reg16.items() if k not in LAB_ONLY}
    assert op.check(reg16, big) is None and "NonPortable" in base.check(reg16_base, big)
    assert "leave load_hint" in op.check({**cfg, "weight_load": "early"}, big)
    assert "exact block/cluster" in op.check({**cfg, "exact": False}, big)
    assert "do not hold a row part" in op.check({**cfg, "cluster": 2}, big)  # 256 KB part
    assert "do not hold a row part" in op.check(
        {**cfg, "cluster": 4, "min_blocks": 2}, big
    )  # 128 KB part, 109 KB of slots per CTA
    # the weight part in registers: fp32 weight + bias at 16 vectors per lane do not fit
    fb = prob("float32", (8192, 262144), weight="fp32", bias=True)
    assert "registers" in op.check(cfg, fb)
    w = prob("float16", (8192, 65536), residual=True, rstd=True)
    assert op.check({**cfg, "cluster": 2, "unroll": 2, "min_blocks": 1}, w) is None


def test_ring_renders_only_when_on_and_launches_persistent_workers():
    p = prob("bfloat16", (8192, 262144), residual=True)
    cfg = op._full({"regime": "cluster", "cluster": 8, "threads": 512, **RING})
    src = op.render(cfg, p, "sm_90a").source
    head = src[: src.index("// RMSNorm forward")]
    assert "#define STAGE_RING 1\n" in head and "#define RING_SLOTS 13\n" in head
    old = op.render({**cfg, "stage": "reg", "load_hint": "nc"}, p, "sm_90a").source
    assert "STAGE_RING" not in old[: old.index("// RMSNorm forward")]
    L = op.launch(cfg, p, 132)
    assert (
        L.persistent
        and L.grid == (128, 1, 1)
        and L.cluster == (8, 1, 1)
        and L.smem_bytes == 13 * 16384
    )
    blk = op._full({"regime": "block", "threads": 512, **RING})
    q = prob("bfloat16", (32768, 65536))
    assert op.launch(blk, q, 132).grid == (132, 1, 1) and op.launch(blk, q, 0).grid == (32768, 1, 1)
    assert op.launch(blk, prob("bfloat16", (5, 65536)), 132).grid == (5, 1, 1)
    # the verifier's extra M: every slot filled >= 3 times on up to 160 SMs (13 slots of 8 chunks a
    # part: 6 rows a worker; 27 of 16: 7), some workers one row more
    assert [v.shape[0] for v in op.verify_problems(p, cfg)] == [1, 199, 6 * 160 // 8 + 3]
    assert [v.shape[0] for v in op.verify_problems(q, blk)] == [1, 199, 7 * 160 + 3]
    # parts of 32 KB: the ring holds 27 slots, 6.75 row parts (no longer capped at two)
    small = prob("bfloat16", (16384, 131072))
    assert op._ring(op._full({**cfg, "threads": 512}), small) == (4, 27, 8192)


GROUP = {"regime": "block", "threads": 1024, **RING}


def test_ring_group_and_skew_check_render_and_launch():
    """ring_group: a row over 2/4/8 CTAs of the block regime, summed through the L2; the grid whole
    groups (33 x 4 = 132 SMs, 16 x 8 = 128). ring_skew: two row parts and one chunk more in the ring.
    Both render only when on; every other ring renders as before."""
    big = prob("bfloat16", (8192, 262144))
    g4 = op._full({**GROUP, "ring_group": 4})
    assert op.check(g4, big) is None
    src = op.render(g4, big, "sm_90a").source
    head = src[: src.index("// RMSNorm forward")]
    assert "#define RING_GROUP 4\n" in head and "RING_SKEW" not in head
    assert op._ring(g4, big) == (8, 13, 16384)  # 128 KB parts: 8 chunks of 16 KB, 13 slots
    L = op.launch(g4, big, 132)
    assert L.grid == (132, 1, 1) and L.cluster == (1, 1, 1) and L.smem_bytes == 13 * 16384
    g8 = {**g4, "ring_group": 8, "ring_skew": True}
    assert op.check(g8, big) is None and op.launch(g8, big, 132).grid == (128, 1, 1)
    head = op.render(g8, big, "sm_90a").source
    assert "#define RING_GROUP 8\n#define RING_SKEW 1\n" in head[: head.index("// RMSNorm forward")]
    assert op.launch(g4, prob("bfloat16", (1, 262144)), 132).grid == (4, 1, 1)
    assert op.launch(g4, big, 0).grid == (8192 * 4, 1, 1)
    # the verifier's persistent M counts groups: 6 rows a group (8 chunks, 13 slots) on 160 SMs
    assert [v.shape[0] for v in op.verify_problems(big, g4)] == [1, 199, 6 * 160 // 4 + 3]
    assert [v.shape[0] for v in op.verify_problems(big, g8)] == [1, 199, 11 * 160 // 8 + 3]
    # refusals: groups are the block regime's, both are the ring's, skew needs 2 parts + 1 chunk
    c8 = op._full({"regime": "cluster", "cluster": 8, "threads": 1024, **RING})
    assert "block regime" in op.check({**c8, "ring_group": 2}, big)
    reg = op._full({"regime": "block", "threads": 1024, "load_hint": "nc"})
    q = prob("bfloat16", (32768, 32768))
    assert "only apply to stage=ring" in op.check({**reg, "ring_skew": True}, q)
    assert "only apply to stage=ring" in op.check({**reg, "ring_group": 2}, q)
    assert "two row parts" in op.check({**g4, "ring_skew": True}, big)  # 16 chunks > 13 slots
    assert op.check({**c8, "ring_skew": True}, big) is None  # 64 KB parts: 8 of 13 slots
    assert "a row part" in op.check({**g4, "ring_group": 2}, big)  # 256 KB parts
    assert "ring_group" in op.check({**g4, "ring_group": 3}, big)
    assert "N % 64" in op.check({**g4, "ring_group": 8}, prob("bfloat16", (4, 65528)))
    # off: the same defines as before the parameters existed
    for cfg in (c8, op._full({"regime": "block", "threads": 512, **RING})):
        a = op.render(cfg, big, "sm_90a").source
        assert "RING_GROUP" not in a[: a.index("// RMSNorm forward")]
        assert "RING_SKEW" not in a[: a.index("// RMSNorm forward")]


@pytest.mark.compile
def test_ring_group_and_skew_compile_without_spills():
    """The probe's group / skew candidates (lab/rmsnorm_probe_long3.toml) and the GPU selftest's,
    on sm_90a: no spills; the mailbox's 64-bit strong stores and polls only in groups."""
    compile_kernel = pytest.importorskip("ptxbuild.compile.compiler").compile_kernel
    cases = [
        ("float32", (16384, 131072), {}, {**GROUP, "ring_group": 4}),
        ("float32", (16384, 131072), {}, {**GROUP, "ring_group": 8, "ring_skew": True}),
        ("float32", (8192, 262144), {}, {**GROUP, "ring_group": 8}),
        ("float32", (8192, 262144), {}, {**GROUP, "threads": 512, "ring_group": 8}),
        ("bfloat16", (16384, 131072), {}, {**GROUP, "ring_group": 4, "ring_skew": True}),
        ("bfloat16", (8192, 262144), {}, {**GROUP, "ring_group": 4}),
        ("float16", (8192, 262144), {}, {**GROUP, "ring_group": 8, "ring_skew": True}),
        (
            "bfloat16",
            (8192, 262144),
            {},
            {"regime": "cluster", "cluster": 8, "threads": 1024, **RING, "ring_skew": True},
        ),
        (
            "bfloat16",
            (8192, 262144),
            {"residual": True, "rstd": True},
            {**GROUP, "ring_group": 8},
        ),
        (
            "float32",
            (203, 131072),
            {"weight": "fp32", "bias": True},
            {**GROUP, "ring_group": 8, "ring_skew": True},
        ),
    ]
    for dt, shape, opts, cfg in cases:
        p = prob(dt, shape, **opts)
        assert op.check(cfg, p) is None, (p.label(), cfg)
        b = compile_kernel(op.render(cfg, p, "sm_90a"), "sm_90a")
        assert b.spill_bytes == 0, (p.label(), cfg)
        g = cfg.get("ring_group", 1)
        for mailbox in ("st.relaxed.gpu.global.b64", "ld.relaxed.gpu.global.b64"):
            assert (mailbox in b.ptx) == (g > 1), (p.label(), cfg)


@pytest.mark.compile
@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_ring_streams_chunks_with_bulk_copies_and_holds_no_row_in_registers(arch):
    """One cp.async.bulk per chunk and operand (prologue + refill), an mbarrier wait per chunk, no
    global load of x (only the weight's, once), and no spills at the defaults of the long rows."""
    compile_kernel = pytest.importorskip("ptxbuild.compile.compiler").compile_kernel
    p = prob("bfloat16", (8192, 262144), residual=True, rstd=True)
    cfg = op._full({"regime": "cluster", "cluster": 8, "threads": 512, **RING})
    b = compile_kernel(op.render(cfg, p, arch), arch)
    assert b.spill_bytes == 0
    # x + residual: the prologue's loop, and one refill after each of pass 2's 8 unrolled chunks
    assert b.ptx.count("cp.async.bulk.shared::cluster.global") == 2 * (1 + 8)
    assert b.ptx.count("mbarrier.try_wait.parity.shared::cta") == 8  # one per chunk of pass 1
    assert b.ptx.count("ld.global.v4") == 8  # the weight part: 8 vectors per lane, loaded once
    assert "ld.global.nc" not in b.ptx
    for dt, n in (
        ("bfloat16", 262144),
        ("float16", 131072),
        ("float32", 262144),
        ("float32", 65536),
    ):
        q = prob(dt, (MATRIX_M.get(n, 32768), n))
        d = op.default_params(q)
        assert compile_kernel(op.render(d, q, arch), arch).spill_bytes == 0, q.label()


@pytest.mark.compile
def test_locked_winners_compile_to_the_same_binaries_from_the_lab_copy():
    """Every third locked rmsnorm@h200 winner (all 66 were checked when the ring was written)."""
    compile_kernel = pytest.importorskip("ptxbuild.compile.compiler").compile_kernel
    lock = json.loads((ROOT / "kernelfile.lock").read_text())
    entries = lock["targets"]["rmsnorm@h200"]["dispatch"][::3]
    assert len(entries) == 22
    for e in entries:
        k = e["problem"]
        p = Problem.make("rmsnorm", k["dtype"], tuple(k["shape"]), k.get("options", {}))
        a = compile_kernel(op.render(e["params"], p, "sm_90a"), "sm_90a")
        assert a.digest == e["binary"], e["label"]
        b = compile_kernel(base.render(e["params"], p, "sm_90a"), "sm_90a")
        assert a.ptx == b.ptx, e["label"]


# ------------------------------------------------------------------ interleave (lab/rmsnorm_probe_long7.toml)
REGC = {"regime": "cluster", "stage": "reg", "cluster": 8, "threads": 512, "load_hint": "nc"}
IL_COL = (
    "return (i64)i * (G * CLUSTER * VEC) + (i64)(u + (u & ~(u32)(INTERLEAVE - 1)) * (CLUSTER - 1)"
    " + rank * INTERLEAVE) * VEC;"
)


def il_cols(n: int, vec: int, cluster: int, threads: int, g: int) -> np.ndarray:
    """The column (element offset in the row) each CTA x iteration x lane of the reg stage loads and
    stores at interleave g, -1 where the lane idles: its loop (v = i x G + t for i < VPT, kept where
    (i + 1) x G <= NV or v < NV), then rmsnorm.cu's il_col (IL_COL) in numpy. Shape (cluster, VPT, G)."""
    part = n // cluster
    nv = part // vec
    rank = np.arange(cluster)[:, None, None]
    i = np.arange(-(-nv // threads))[None, :, None]
    t = np.arange(threads)[None, None, :]
    lo, v = rank * part, i * threads + t
    col = (
        i * (threads * cluster * vec) + (t + (t & ~(g - 1)) * (cluster - 1) + lo // part * g) * vec
    )
    return np.where(((i + 1) * threads <= nv) | (v < nv), col, -1)


def test_interleave_deals_every_vector_of_the_row_to_one_lane_exactly_once():
    """Every (N, cluster, threads, grain) that check() accepts: the CTAs' lanes cover each vector of
    the row exactly once, chunk k of CTA r being the row's chunk k x cluster + r. Among them lane tails
    (N / (cluster x threads x VEC) not whole); the shapes whose chunks would not tile a CTA's part, or
    whose threads are no whole number of chunks, are refused."""
    accepted = tails = refused = 0
    for dt, vec in (("float32", 4), ("bfloat16", 8)):
        for n in (8192, 24576, 32000, 98304, 131072, 262144):
            for c in (2, 4, 8):
                for threads in (96, 256, 384, 512, 640, 1024):
                    for g in (1, 2, 4, 8, 16, 32, 64):
                        cfg = op._full({**REGC, "cluster": c, "threads": threads, "interleave": g})
                        why = op.check(cfg, prob(dt, (4, n)))
                        nv = n // c // vec
                        if n % (c * vec) == 0 and (nv % g or threads % g):
                            assert "whole chunks" in why, (dt, n, c, threads, g, why)
                            refused += 1
                        if why is not None:
                            continue
                        cols = il_cols(n, vec, c, threads, g)
                        got = np.sort(cols[cols >= 0])
                        assert np.array_equal(got, np.arange(0, n, vec)), (dt, n, c, threads, g)
                        v = np.arange(cols.shape[1])[:, None] * threads + np.arange(threads)
                        for r in range(c):
                            want = ((v // g * c + r) * g + v % g) * vec
                            keep = cols[r] >= 0
                            assert np.array_equal(cols[r][keep], want[keep]), (dt, n, c, threads, g)
                        accepted += 1
                        tails += nv % threads != 0
    assert accepted > 900 and tails > 400 and refused > 100, (accepted, tails, refused)
    assert (
        IL_COL in (ROOT / "lab/ops/rmsnorm_long/rmsnorm.cu").read_text()
    )  # the map mirrored above


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs a host C++ compiler")
def test_interleave_il_col_of_rmsnorm_cu_compiled_on_the_host_gives_the_same_map(tmp_path):
    """rmsnorm.cu's il_col itself (cut out of the file, built for the host) against il_cols."""
    src = (ROOT / "lab/ops/rmsnorm_long/rmsnorm.cu").read_text()
    start = src.index("__device__ __forceinline__ i64 il_col")
    body = src[start : src.index("\n}\n", start) + 3]
    for vec, n, c, threads, g in (
        (4, 131072, 8, 640, 1),
        (8, 98304, 8, 1024, 64),
        (4, 65536, 2, 384, 4),
    ):
        defs = f"#define VEC {vec}\n#define NC {n}\n#define CLUSTER {c}\n#define G {threads}\n"
        prog = tmp_path / "il.cpp"
        prog.write_text(
            "#include <cstdio>\ntypedef unsigned int u32;\ntypedef long long i64;\n"
            f"#define __device__\n#define __forceinline__ inline\n{defs}#define INTERLEAVE {g}\n{body}"
            "int main() {\n  const int NV = NC / CLUSTER / VEC, VPT = (NV + G - 1) / G;\n"
            "  for (int r = 0; r < CLUSTER; ++r) for (int i = 0; i < VPT; ++i) for (int t = 0; t < G; ++t)\n"
            '    printf("%lld\\n", (i + 1) * G <= NV || i * G + t < NV ? il_col((i64)r * (NC / CLUSTER), i, t) : -1LL);\n'
            "}\n"
        )
        subprocess.run(["g++", "-O1", "-o", tmp_path / "il", prog], check=True)
        out = subprocess.run([tmp_path / "il"], capture_output=True, text=True, check=True).stdout
        assert np.array_equal(
            np.array(out.split(), dtype=np.int64), il_cols(n, vec, c, threads, g).ravel()
        )


def test_interleave_renders_only_when_on_and_is_refused_where_not_built():
    big = prob("float32", (16384, 131072))
    cfg = op._full({**REGC, "min_blocks": 2})

    def head(c):
        s = op.render(c, big, "sm_90a").source
        return s[: s.index("// RMSNorm forward")]

    assert "INTERLEAVE" not in head(cfg)
    on = {**cfg, "interleave": 8}
    assert op.check(on, big) is None and head(on) == head(cfg) + "#define INTERLEAVE 8\n"
    assert op.launch(on, big, 132) == op.launch(cfg, big, 132)
    assert op.verify_problems(big, on) == op.verify_problems(big, cfg)
    # only the cluster regime's exact register rows are built
    moot = "interleave only applies to exact register-resident cluster-regime"
    for other in (
        {"regime": "block", "cluster": 1},
        {"stage": "smem", "unroll": 4},
        {"stage": "chunk", "unroll": 2},
        {"stage": "bulk", "unroll": 4},
        {"stage": "pipe"},
        {"stage": "ring", "load_hint": "none"},
        {"exact": False, "unroll": 2},
        {"regime": "warp", "cluster": 1, "threads": 256},
    ):
        assert moot in op.check({**on, **other}, big), other
    # whole chunks: 1000 vectors a CTA % 16, 96 threads % 64; not a power of two; not a bool
    assert "whole chunks" in op.check(
        {**on, "cluster": 4, "interleave": 16}, prob("bfloat16", (4, 32000))
    )
    assert "whole chunks" in op.check({**on, "threads": 96, "interleave": 64}, big)
    assert "is not one of" in op.check({**on, "interleave": 3}, big)
    assert "is not one of" in op.check({**on, "interleave": True}, big)


def _probe(name):
    """(section, problem, candidate merged over the op's default) of lab/<name>."""
    kf = tomllib.loads((ROOT / "lab" / name).read_text())
    for sec, spec in kf["ops"].items():
        assert spec["template"] == "ops/rmsnorm_long"
        for dt in spec["dtypes"]:
            for shape in spec["shapes"]:
                p = prob(dt, tuple(shape))
                assert spec["search"]["budget"] == len(spec["search"]["candidates"])
                for c in spec["search"]["candidates"]:
                    yield sec, p, {**op.default_params(p), **c}


@pytest.mark.compile
def test_interleave_probe_candidates_compile_like_the_locked_winner_and_selftest_cases_too():
    """Probe long7's controls (interleave 0) are the locked rmsnorm@h200 winners, binary for binary;
    every grain compiles without spills at the control's registers and with its loads and stores.
    The GPU selftest's interleave cases compile without spills."""
    from .test_rmsnorm_ring_gpu import IL_CASES

    compile_kernel = pytest.importorskip("ptxbuild.compile.compiler").compile_kernel
    lock = json.loads((ROOT / "kernelfile.lock").read_text())
    locked = {e["label"]: e for e in lock["targets"]["rmsnorm@h200"]["dispatch"]}
    control: dict = {}
    for _, p, cfg in _probe("rmsnorm_probe_long7.toml"):
        assert op.check(cfg, p) is None, (p.label(), cfg)
        b = compile_kernel(op.render(cfg, p, "sm_90a"), "sm_90a")
        assert b.spill_bytes == 0, (p.label(), cfg)
        shape = (b.registers, b.ptx.count("ld.global"), b.ptx.count("st.global"))
        if cfg["interleave"] == 0:
            e = locked[p.label()]
            assert cfg == op._full(e["params"]) and b.digest == e["binary"], p.label()
            control[p.label()] = shape
        assert shape == control[p.label()], (p.label(), cfg["interleave"], shape)
    assert len(control) == 4
    for dt, shape, opts, params in IL_CASES:
        p = prob(dt, shape, **opts)
        cfg = op._full(params)
        assert op.check(cfg, p) is None, (p.label(), params)
        assert compile_kernel(op.render(cfg, p, "sm_90a"), "sm_90a").spill_bytes == 0, p.label()


@pytest.mark.compile
def test_contiguous_cluster_register_rows_compile_as_in_ops_rmsnorm():
    """interleave = 0 changes no binary: cluster-regime register and pipe rows (residual, rstd, fp32
    weight + bias, no weight, the early weight; 2/4/8 CTAs) give ops/rmsnorm's PTX from the lab copy
    (466 such configs and every locked winner were compared when interleave was written)."""
    compile_kernel = pytest.importorskip("ptxbuild.compile.compiler").compile_kernel
    rng = random.Random(7)
    cases = []
    for dt in op.DTYPES:
        for n in (65536, 131072, 262144):
            for opts in ({}, {"residual": True, "rstd": True}, {"weight": "fp32", "bias": True}):
                for c in (2, 4, 8):
                    for t, wl, st in (
                        (512, "late", "reg"),
                        (1024, "early", "reg"),
                        (512, "late", "pipe"),
                    ):
                        cfg = {**REGC, "cluster": c, "threads": t, "weight_load": wl, "stage": st}
                        p = prob(dt, (8192, n), **opts)
                        if base.check(cfg, p) is None:
                            cases.append((p, cfg))
    cases = rng.sample(cases, 16) + [
        (prob("float32", (8, 65536), weight="none"), {**REGC, "cluster": 2})
    ]
    for p, cfg in cases:
        assert op.check(cfg, p) is None, (p.label(), cfg)
        a = compile_kernel(op.render(cfg, p, "sm_90a"), "sm_90a")
        assert a.ptx == compile_kernel(base.render(cfg, p, "sm_90a"), "sm_90a").ptx, (
            p.label(),
            cfg,
        )


# ------------------------------------------------------------------ stream (lab/rmsnorm_probe_long9.toml)
STREAM = {"regime": "cluster", "stage": "stream", "threads": 512, "load_hint": "none"}


def test_stream_check_refuses_what_the_kernel_cannot_do():
    """stage=stream: exact block / cluster rows; bulk copies and a held weight (load_hint, weight_load,
    unroll left alone); `stages` only here; the ring of stages x streams x part bytes (as the
    backward's _smem_bytes) and the CTAs of an SM within its shared memory; <= 16 vectors per lane;
    the register model; N % (VEC x cluster)."""
    big = prob("float32", (16384, 131072))
    cfg = op._full({**STREAM, "cluster": 16, "stages": 3})
    assert op.check(cfg, big) is None
    assert op._stream_bytes(cfg, big) == 3 * 8192 * 4
    assert op.check({**cfg, "cluster": 8}, big) is None  # 3 x 64 KB
    assert "do not fit an SM" in op.check({**cfg, "cluster": 8, "stages": 4}, big)  # 4 x 64 KB
    assert "do not fit an SM" in op.check({**cfg, "min_blocks": 3}, big)  # 3 x 98 KB
    assert op.check({**cfg, "min_blocks": 2}, big) is None  # 2 x (96 + 2) KB
    res = prob("float32", (16384, 131072), residual=True)
    assert op._stream_bytes(cfg, res) == 2 * op._stream_bytes(cfg, big)
    assert "do not fit" in op.check({**cfg, "cluster": 8}, res)  # 3 x 2 x 64 KB
    assert "leave load_hint" in op.check({**cfg, "load_hint": "nc"}, big)
    assert "leave load_hint" in op.check({**cfg, "weight_load": "early"}, big)
    assert "leave unroll" in op.check({**cfg, "unroll": 2}, big)
    assert "exact block/cluster" in op.check({**cfg, "exact": False}, big)
    warp = {**cfg, "regime": "warp", "cluster": 1, "threads": 256}
    assert "exact block/cluster" in op.check(warp, prob("bfloat16", (64, 1024)))
    assert "stages only applies to stage=stream" in op.check(
        {**cfg, "stage": "reg", "load_hint": "nc"}, big
    )
    assert "stages only applies" in op.check({**cfg, "stage": "ring"}, big)
    assert "is not one of" in op.check({**cfg, "stages": 5}, big)
    assert "vectors per lane > 16" in op.check(
        {**cfg, "cluster": 2, "threads": 256, "stages": 1}, prob("float32", (8, 65536))
    )  # 32 vectors a lane
    assert "N % 64" in op.check(cfg, prob("float32", (8, 131056)))
    # the held fp32 weight and bias at 16 vectors per lane: ~148 registers > 128
    fb = prob("float32", (8192, 262144), weight="fp32", bias=True)
    assert "registers" in op.check({**cfg, "cluster": 8, "stages": 1}, fb)
    # the other interleave / ring / fast_front / w_el / bulk_reg knobs stay refused here
    for other in ({"interleave": 8}, {"ring_skew": True}, {"w_el": True}, {"bulk_reg": 2}):
        assert op.check({**cfg, **other}, big) is not None, other
    # the block regime (a block per row part: the whole row)
    blk = op._full({**STREAM, "regime": "block", "cluster": 1, "stages": 3})
    assert op.check(blk, prob("bfloat16", (531, 32768))) is None
    assert "do not fit" in op.check(blk, prob("bfloat16", (8, 65536)))


def test_stream_renders_only_when_on_and_launches_persistent_workers():
    big = prob("bfloat16", (8192, 262144), residual=True)
    cfg = op._full({**STREAM, "cluster": 16, "stages": 2})
    assert op.check(cfg, big) is None
    src = op.render(cfg, big, "sm_90a").source
    head = src[: src.index("// RMSNorm forward")]
    assert head.endswith("#define ENTRY rmsnorm_fwd\n#define STAGE_STREAM 1\n#define NSTAGE 2\n")
    for k in ("STAGE_SMEM", "STAGE_PIPE", "STAGE_CHUNK", "STAGE_BULK"):
        assert f"#define {k} 0\n" in head
    for other in (
        {"stage": "reg", "load_hint": "nc", "stages": 1},
        {"stage": "ring", "stages": 1, "cluster": 8},
    ):
        o = op.render({**cfg, **other}, big, "sm_90a").source
        assert (
            "STAGE_STREAM" not in o[: o.index("// RMSNorm forward")]
            and "NSTAGE" not in o[: o.index("// RMSNorm forward")]
        )
    # persistent, as ops/rmsnorm_bwd's _grid: SMs x min_blocks CTAs, whole clusters, <= M row groups
    L = op.launch(cfg, big, 132)
    assert L.persistent and L.grid == (128, 1, 1) and L.cluster == (16, 1, 1)
    assert L.smem_bytes == 2 * 2 * 16384 * 2 and L.block == (512, 1, 1)
    assert op.launch({**cfg, "cluster": 8}, big, 132).grid == (128, 1, 1)
    assert op.launch(cfg, prob("bfloat16", (3, 262144)), 132).grid == (48, 1, 1)
    assert op.launch(cfg, big, 0).grid == (128, 1, 1)  # no SM count: 132 assumed
    assert op.launch(cfg, big, 148).grid == (144, 1, 1)
    blk = op._full({**STREAM, "regime": "block", "cluster": 1, "stages": 3, "min_blocks": 2})
    q = prob("bfloat16", (1031, 16384))
    Lb = op.launch(blk, q, 132)
    assert Lb.grid == (264, 1, 1) and Lb.cluster == (1, 1, 1) and not Lb.persistent
    assert op.launch(blk, prob("bfloat16", (5, 16384)), 132).grid == (5, 1, 1)
    # the verifier's extra M: (2 x stages + 1) rows a worker on 160 SMs (both parities of every
    # buffer's mbarriers, both row-sum slot sets), some workers one row more
    assert [v.shape[0] for v in op.verify_problems(big, cfg)] == [1, 199, 5 * 10 + 3]
    assert [v.shape[0] for v in op.verify_problems(q, blk)] == [1, 199, 7 * 320 + 3]
    # bytes moved and the reference are the op's (the stage changes neither)
    assert op.bytes_moved(big) == base.bytes_moved(big)


def test_stream_probe_long9_rows_and_controls():
    """The probe's five rows; each row's first candidate is its locked rmsnorm@h200 winner; every
    candidate passes check()."""
    lock = json.loads((ROOT / "kernelfile.lock").read_text())
    locked = {
        e["label"]: op._full(e["params"]) for e in lock["targets"]["rmsnorm@h200"]["dispatch"]
    }
    seen: dict = {}
    for _, p, cfg in _probe("rmsnorm_probe_long9.toml"):
        assert op.check(cfg, p) is None, (p.label(), cfg)
        seen.setdefault(p.label(), []).append(cfg)
    assert sorted(seen) == sorted(
        [
            "float32[16384x131072]",
            "float32[8192x262144]",
            "bfloat16[8192x262144]",
            "float16[8192x262144]",
            "float32[32768x65536]",
        ]
    )
    for label, cfgs in seen.items():
        assert cfgs[0] == locked[label], label
        streams = [c for c in cfgs if c["stage"] == "stream"]
        assert 2 <= len(streams) <= 3 and all(c["threads"] == 512 for c in streams), label
        assert all(c["cluster"] in (8, 16) and c["stages"] in (2, 3) for c in streams), label
    assert sum(len(c) for c in seen.values()) == 19


@pytest.mark.compile
def test_stream_probe_and_selftest_configs_compile_without_spills():
    """Probe long9's candidates (its controls: the locked binaries) and the GPU selftest's stream
    cases, sm_90a: no spills; the PTX of a stream kernel: one bulk copy per stream and buffer in the
    prologue and one per refill, the row part read twice from shared memory, the weight loaded once,
    no global load of x."""
    from .test_rmsnorm_ring_gpu import ST_CASES

    compile_kernel = pytest.importorskip("ptxbuild.compile.compiler").compile_kernel
    lock = json.loads((ROOT / "kernelfile.lock").read_text())
    locked = {e["label"]: e for e in lock["targets"]["rmsnorm@h200"]["dispatch"]}
    for _, p, cfg in _probe("rmsnorm_probe_long9.toml"):
        b = compile_kernel(op.render(cfg, p, "sm_90a"), "sm_90a")
        assert b.spill_bytes == 0, (p.label(), cfg)
        if cfg == op._full(locked[p.label()]["params"]):
            assert b.digest == locked[p.label()]["binary"], p.label()
    for dt, shape, opts, params in ST_CASES:
        p = prob(dt, shape, **opts)
        cfg = op._full(params)
        assert op.check(cfg, p) is None, (p.label(), params)
        assert compile_kernel(op.render(cfg, p, "sm_90a"), "sm_90a").spill_bytes == 0, p.label()
    p = prob("bfloat16", (8192, 262144), residual=True, rstd=True)
    b = compile_kernel(
        op.render({**op._full(STREAM), "cluster": 16, "stages": 2}, p, "sm_90a"), "sm_90a"
    )
    vpt = 262144 // 16 // 8 // 512
    assert b.ptx.count("cp.async.bulk.shared::cluster.global") == 2 * (1 + 1)  # x, residual
    assert b.ptx.count("ld.shared.v4") == 2 * 2 * vpt  # x and residual, in both passes
    assert b.ptx.count("ld.global") == vpt  # the weight part, once
    assert b.ptx.count("st.global.v4") == 2 * vpt  # residual_out and y
    assert b.ptx.count("mbarrier.try_wait.parity.shared::cta") == 2  # full, empty
