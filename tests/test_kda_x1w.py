"""prep_variant 4 of ops/kda ("x1w", ops/kda/kda_prepare_x1w.cu, moved from lab/kda/kda_s27_prepare.cu):
a persistent one-warp-per-block prepare that writes the same workspace in whole 32-byte sectors.

CPU: what check() refuses and accepts, the default, the launch geometry (a function of the problem
and the SM count only), the argument list, the rendered source. `compile`: no spills at <= 255
registers on kernelfile.toml's [ops.kda] and [ops.kda_heads] problems, and the cubin of the lab's x1w
byte for byte. `gpu`: the op's two kernels with x1w through benchmarks/kda_bench_gpu.verify on
kda.md's case list (the stage-by-stage and end-to-end checks every prepare variant passed)."""

from __future__ import annotations

import importlib.util
import itertools
import tomllib
from pathlib import Path

import numpy as np
import pytest

from ptxbuild.oploader import load_op
from ptxbuild.problem import Kernel, Problem

ROOT = Path(__file__).resolve().parents[1]
op = load_op("kda", ROOT)
host = op.host
X1W = op.X1W


def kernelfile_problems(name: str) -> list[Problem]:
    """The problems of kernelfile.toml's [ops.<name>] (shapes x modes), as the build makes them."""
    spec = tomllib.loads((ROOT / "kernelfile.toml").read_text())["ops"][name]
    return [
        Problem.make("kda", "bfloat16", tuple(shape), {**spec.get("options", {}), **mode})
        for shape, mode in itertools.product(spec["shapes"], spec.get("modes", [{}]))
    ]


KDA = kernelfile_problems("kda")
HEADS = kernelfile_problems("kda_heads")


def test_the_kernelfile_declares_the_problems_this_file_checks():
    assert len(KDA) == 6 and len(HEADS) == 2
    assert {p.shape[1] for p in KDA} == {96, 64} and {p.shape[1] for p in HEADS} == {32, 16}


def small(T=37, H=2, **opts) -> Problem:
    return Problem.make("kda", "bfloat16", (T, H), opts)


def x1w(problem: Problem, **kw) -> dict:
    return {**op.with_prep_variant(op.default_params(problem), X1W), **kw}


# ---------------------------------------------------------------- check() and the default


@pytest.mark.parametrize("pr", KDA + HEADS, ids=lambda p: f"{p.shape}-{p.opts_json}")
def test_x1w_is_the_default_on_every_kernelfile_problem(pr):
    p = op.default_params(pr)
    assert p["prep_variant"] == X1W and "prep_compact" not in p and op.check(p, pr) is None
    # the variant-1 config of the locks stays valid beside it (the build times both)
    assert op.check({**p, "prep_variant": 1, "prep_compact": 1}, pr) is None


@pytest.mark.parametrize(
    "opts,params,why",
    [
        ({"gate": "canonical"}, {}, "safe gate"),
        ({"gate": "given"}, {}, "safe gate"),
        ({"K": 64}, {}, "K = V = 128"),
        ({"V": 64}, {"split": 1}, "K = V = 128"),
        ({"l2norm": False}, {}, "without the L2 norm"),
        ({}, {"prep_threads": 256}, "prep_threads=128"),
        ({}, {"prep_compact": 1}, "prep_compact=1 is a layout of prepare variant 1"),
        ({}, {"prep_variant": 5}, "use one of [0, 1, 2, 3, 4]"),
        ({"hv": 3}, {}, "not a multiple of H"),
    ],
)
def test_check_refuses_what_x1w_cannot_run(opts, params, why):
    pr = small(**opts)
    reason = op.check(x1w(pr, **params), pr)
    assert reason and why in reason, reason


@pytest.mark.parametrize(
    "pr,params",
    [
        (small(), {}),
        (small(T=130, H=4, hv=8, lengths=(97, 33)), {}),  # GVA: two value heads per q/k head
        (small(T=8192, H=96, hv=192), {}),
        (small(T=15, H=4, lengths=(0, 15)), {}),  # an empty segment
        (small(T=307, H=4, lengths=(1,) * 7 + (300,)), {}),  # one-token segments
        (small(T=16, H=1), {}),  # one chunk-head: a grid of one warp
        (small(initial_state=False, final_state=False), {}),
        (small(), {"op_dtype": "bf16"}),
        (small(), {"ksplit": 2}),
        (small(), {"split": 1, "stages": 2, "rec_copy": "cp_async", "o_store": "cols"}),
    ],
)
def test_check_accepts_x1w_where_the_lab_kernel_ran(pr, params):
    assert op.check(x1w(pr, **params), pr) is None


def test_the_other_defaults_where_x1w_does_not_apply():
    assert op.default_params(small(gate="canonical"))["prep_variant"] == 0
    assert op.default_params(small(gate="given"))["prep_variant"] == 0
    nol2 = op.default_params(small(l2norm=False))
    assert nol2["prep_variant"] == 1 and nol2["prep_compact"] == 1


def test_the_space_keeps_its_fill_values():
    """A config stored before a parameter existed means the parameter's first value: 4 is appended."""
    assert op.SPACE["prep_variant"] == [0, 1, 2, 3, 4]
    assert {k: v[0] for k, v in op.SPACE.items()}["prep_variant"] == 0


def test_the_stage_ops_and_their_shared_host_code_are_untouched():
    """x1w's host side is in ops/kda/op.py: kda_host.py (in the SOURCES of ops/kda_prepare and
    ops/kda_recurrence, whose locks pin it) does not know variant 4, so ops/kda_prepare refuses it."""
    assert not hasattr(host, "X1W") and "kda_prepare_x1w.cu" not in host.FILES.values()
    prep = load_op("kda_prepare", ROOT)
    pr = Problem.make("kda_prepare", "bfloat16", (37, 2), {"op_dtype": "f16"})
    assert prep.check({"prep_threads": 128, "prep_variant": 1}, pr) is None
    assert prep.check({"prep_threads": 128, "prep_variant": X1W}, pr) is not None
    for name in ("kda_prepare", "kda_recurrence"):
        assert "../kda/kda_prepare_x1w.cu" not in load_op(name, ROOT).SOURCES


# ---------------------------------------------------------------- launch geometry and arguments


@pytest.mark.parametrize("sm_count", [132, 148, 1])
@pytest.mark.parametrize("pr", [KDA[0], KDA[1], HEADS[1], small(), small(T=16, H=1)])
def test_the_launch_is_a_function_of_the_sm_count(pr, sm_count):
    params = op.default_params(pr)
    if params["prep_variant"] != X1W:
        params = x1w(pr)
    geoms = op.launches(params, pr, sm_count)
    assert list(geoms) == ["kda_prepare_x1w", "kda_recurrence"]
    prep = geoms["kda_prepare_x1w"]
    d = op.dims(pr)
    assert prep.grid == (min(d["NC"] * d["HV"], 7 * sm_count), 1, 1)
    assert prep.block == (32, 1, 1) and prep.smem_bytes == op.X1W_SMEM == 29504
    assert prep.persistent and not prep.pdl and tuple(prep.cluster) == (1, 1, 1)
    # the recurrence is variant 1's, launch for launch
    v1 = op.launches({**params, "prep_variant": 1}, pr, sm_count)["kda_recurrence"]
    assert geoms["kda_recurrence"] == v1 and op.launch(params, pr, sm_count) == v1


def test_seven_warps_per_sm_is_what_shared_memory_allows():
    """7 x (29,504 + 1,024 reserved) B fit an H100 / H200 / B200 SM's 233,472 B, 8 do not; 255
    registers x 32 lanes (8,192 per warp after the 256-register granule) would allow 8."""
    per_block = op.X1W_SMEM + 1024
    assert 7 * per_block <= 233472 < 8 * per_block
    assert op.X1W_WARPS_PER_SM == 7 and 65536 // 8192 >= 7


def test_the_argument_list():
    pr = small(T=130, H=4, hv=8, lengths=(97, 33))
    params = x1w(pr)
    ins = op.make_inputs(pr, 1, np)
    outs = op.make_outputs(pr, np)
    args = op.stage_args("kda_prepare_x1w", params, pr, ins, outs)
    names = ("q", "k", "v", "a", "b", "A_log", "dt_bias", "chunk_start", "chunk_len")
    assert all(a is ins[n] for a, n in zip(args, names))
    ws, scale, nc, mask = args[9:]
    assert ws is outs["ws"] and len(args) == 13
    assert isinstance(scale, np.float32) and scale == np.float32(128**-0.5)
    assert isinstance(nc, np.int32) and nc == op.dims(pr)["NC"] == len(ins["chunk_start"])
    assert isinstance(mask, np.int32) and mask == 0x7FFFFFFF
    # the recurrence's arguments are variant 1's
    rec = op.stage_args("kda_recurrence", params, pr, ins, outs)
    assert len(rec) == 7 and rec[0] is outs["ws"]


# ---------------------------------------------------------------- rendering


def test_the_rendered_source():
    pr = KDA[0]
    params = op.default_params(pr)
    k = op.render(params, pr, "sm_90a")
    here = ROOT / "ops" / "kda"
    assert k.entry == "kda_recurrence" and host.main_entry(params) == "kda_recurrence"
    assert k.source == host.defines(params, pr) + "".join(
        (here / f).read_text()
        for f in ("kda_common.cuh", "kda_prepare_x1w.cu", "kda_recurrence.cu")
    )
    defs = host.defines(params, pr)
    assert "#define PREP_COMPACT" not in defs and "#define PDL_FLAGS" not in defs
    assert "#define REC_BULK 1" in defs and "#define REC_OROWS 1" in defs
    # the other variants' sources do not contain it (their cubins: test_kda_compile's lock test)
    for pv in (0, 1, 2, 3):
        other = op.render({**params, "prep_variant": pv, "stages": 2}, pr, "sm_90a").source
        assert "kda_prepare_x1w" not in other
    alone = op.render_stage(params, pr, "sm_90a", "kda_prepare_x1w")
    assert alone.entry == "kda_prepare_x1w" and "kda_recurrence(" not in alone.source
    assert "kda_prepare_x1w.cu" in op.SOURCES


# ---------------------------------------------------------------- compiled (NVRTC from the wheels)


def _compile(kernel: Kernel, arch="sm_90a"):
    pytest.importorskip("cuda.bindings", reason="needs the CUDA compiler wheels")
    from ptxbuild.compile.compiler import compile_kernel

    return compile_kernel(kernel, arch)


@pytest.mark.compile
@pytest.mark.parametrize("op_dtype", ["f16", "bf16"])
@pytest.mark.parametrize("pr", KDA + HEADS, ids=lambda p: f"{p.shape}-{p.opts_json}")
def test_x1w_compiles_without_spills_on_the_kernelfile_problems(pr, op_dtype):
    params = {**op.default_params(pr), "op_dtype": op_dtype}
    assert params["prep_variant"] == X1W
    k = op.render(params, pr, "sm_90a")
    prep = _compile(Kernel(k.source, "kda_prepare_x1w"))
    assert prep.spill_bytes == 0 and prep.local_bytes == 0, prep.log
    assert prep.registers <= 255
    rec = _compile(k)
    assert rec.entry == "kda_recurrence" and rec.spill_bytes == 0 and rec.local_bytes == 0
    assert ".entry kda_prepare_x1w" in rec.ptx and ".entry kda_recurrence" in rec.ptx


@pytest.mark.compile
@pytest.mark.parametrize("pr", [KDA[0], small(T=130, H=4, hv=8, lengths=(97, 33))])
def test_x1w_compiles_without_spills_for_blackwell(pr):
    """The b200 targets are compile-only: x1w must fit there too (sm_100a)."""
    b = _compile(Kernel(op.render(x1w(pr), pr, "sm_100a").source, "kda_prepare_x1w"), "sm_100a")
    assert b.spill_bytes == 0 and b.local_bytes == 0 and b.registers <= 255, b.log


LAB = ROOT / "lab" / "kda" / "kda_s27_prepare.cu"


def lab_x1w(params: dict, problem: Problem) -> Kernel:
    """lab/kda/probe_s29.py's x1w source: ops/kda's defines (split 1, stages 2), one warp per block
    bounded for 7, x1p's defines and S27_WSTORE, kda_common.cuh, the lab file."""
    defs = (
        host.defines({**params, "split": 1, "stages": 2}, problem)
        + "#define S27_WPB 1\n#define S27_MINB 7\n"
        + "#define S27_FASTADDR 1\n#define S27_PIPE 2\n#define S27_WSTORE 1\n"
        + "#define S27_WARP_BYTES 29504\n"
    )
    common = (ROOT / "ops" / "kda" / "kda_common.cuh").read_text()
    return Kernel(defs + common + LAB.read_text(), "kda_s27_prepare")


@pytest.mark.compile
@pytest.mark.parametrize("op_dtype", ["f16", "bf16"])
@pytest.mark.parametrize("pr", [KDA[0], KDA[4], small(T=130, H=4, hv=8, lengths=(97, 33))], ids=str)
def test_x1w_is_the_lab_kernel_byte_for_byte(pr, op_dtype):
    """The kernel measured in run 30a (40 verifications, lab/kda/plan-session29.md): the ops file,
    compiled alone with the op's defines, gives the lab's cubin up to the entry name (same length)."""
    if not LAB.is_file() or "S27_WSTORE" not in LAB.read_text():
        pytest.skip("the lab kernel is gone or no longer has x1w")
    params = {**x1w(pr), "op_dtype": op_dtype}
    mine = _compile(op.render_stage(params, pr, "sm_90a", "kda_prepare_x1w"))
    lab = _compile(lab_x1w(params, pr))
    assert lab.spill_bytes == 0 and mine.registers == lab.registers == 255
    assert mine.cubin == lab.cubin.replace(b"kda_s27_prepare", b"kda_prepare_x1w")


@pytest.mark.compile
def test_without_the_l2_norm_x1w_spills_which_is_why_check_refuses_it():
    """ptxas 13.0 spills 56 B at 255 registers with L2NORM 0 (the lab saw the same): the op's spill
    budget is 0, so prepare_variant_error refuses l2norm=False. If this stops spilling, lift that."""
    pr = small(T=200, H=4, l2norm=False)
    b = _compile(op.render_stage(x1w(pr), pr, "sm_90a", "kda_prepare_x1w"))
    assert b.spill_bytes > 0 and op.check(x1w(pr), pr) is not None


# ---------------------------------------------------------------- on the GPU (the case list)


def _bench():
    spec = importlib.util.spec_from_file_location(
        "kda_bench_gpu_x1w", ROOT / "benchmarks" / "kda_bench_gpu.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _gpu():
    cp = pytest.importorskip("cupy", reason="needs cupy and an NVIDIA GPU")
    from ptxbuild.gpu import gpu_available

    if not gpu_available():
        pytest.skip("needs an NVIDIA GPU")
    return cp


BENCH = _bench()
CASES = BENCH.small_cases(quick=False)  # kda.md's case list, as kda_bench_gpu.py runs it
SCENARIOS = [(H, lens) for H in (96, 64) for lens in ((8192,), BENCH.MIXED, (1024,) * 8)]


def _verify(cp, lens, H, kw, params_of, seed, sm_count=132, stages=True):
    b = BENCH
    problem, ckw = b.problem_of(lens, H, kw)
    params = params_of(problem)
    if why := op.check(params, problem):
        pytest.skip(f"x1w does not take this case: {why}")
    built = b.Built(cp, params, problem)
    built.launch = op.launches(params, problem, sm_count)  # Built assumes 132 SMs
    case = op.case_for(problem, seed, **ckw)
    res = b.verify(cp, built, case, stages=stages, label=f"x1w {lens[:6]} H={H} {kw} sm={sm_count}")
    print(b.fmt(res))
    assert res["ok"], b.fmt(res)


@pytest.mark.gpu
@pytest.mark.parametrize("i", range(len(CASES)), ids=lambda i: str(CASES[i])[:60])
def test_x1w_passes_the_case_list_stage_by_stage(i):
    """Each case: the workspace decoded against the chunked reference, field by field; the
    recurrence on a CPU-encoded workspace; the whole forward against the float64 recurrence
    (relative RMS <= 5e-3); deterministic; inputs untouched. The cases x1w refuses are skipped."""
    cp = _gpu()
    lens, H, kw = CASES[i]
    _verify(cp, lens, H, kw, lambda pr: x1w(pr), seed=i)


@pytest.mark.gpu
@pytest.mark.parametrize("i", [i for i, c in enumerate(CASES) if sum(c[0]) <= 1000])
def test_x1w_on_seven_warps_loops_over_many_chunk_heads(i):
    """The same cases with the grid of a one-SM GPU (7 warps): every warp takes many chunk-heads,
    so the loop, the buffer hand-over and the cp.async group counts are exercised (lab: x1w5)."""
    cp = _gpu()
    lens, H, kw = CASES[i]
    _verify(cp, lens, H, kw, lambda pr: x1w(pr), seed=50 + i, sm_count=1)


@pytest.mark.gpu
@pytest.mark.parametrize("i", [0, 2, 6, 7, 20, 22])
def test_x1w_with_bf16_operands(i):
    """op_dtype bf16 is in the space: never run in the lab, so verified here (stage gate 8e-3)."""
    cp = _gpu()
    lens, H, kw = CASES[i]
    _verify(cp, lens, H, kw, lambda pr: x1w(pr, op_dtype="bf16"), seed=100 + i)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "j", range(len(SCENARIOS)), ids=lambda j: f"H{SCENARIOS[j][0]}-{len(SCENARIOS[j][1])}seg"
)
def test_x1w_default_on_the_six_scenarios_end_to_end(j):
    """kda.md's six scenarios with the op's default config (x1w), end to end."""
    cp = _gpu()
    H, lens = SCENARIOS[j]
    _verify(cp, lens, H, {}, op.default_params, seed=200 + j, stages=False)
