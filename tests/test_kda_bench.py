"""bench_gpu.verify() runs end to end on the CPU with numpy standing in for cupy and the two
kernels emulated by the workspace encoder / simulator (no GPU: this checks the harness plumbing,
the argument order of stage_args and the verdict logic, not the CUDA code)."""

from __future__ import annotations

import importlib.util  # noqa: E402
import types
from pathlib import Path

import numpy as np
import pytest

_spec = importlib.util.spec_from_file_location(
    "kda_bench_gpu", Path(__file__).resolve().parents[1] / "benchmarks" / "kda_bench_gpu.py"
)
bench_gpu = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_gpu)
ref, wsl = bench_gpu.ref, bench_gpu.wsl


def fake_cupy():
    cp = types.SimpleNamespace(**{n: getattr(np, n) for n in dir(np) if not n.startswith("__")})
    cp.asnumpy = np.asarray
    cp.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(deviceSynchronize=lambda: None))
    return cp


class _Fn:
    """A kernel handle: callable, and takes attributes (max_dynamic_shared_size_bytes) like cupy's."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, *args, **kw):
        return self.fn(*args, **kw)


def two_kernel_params(problem):
    """bench_gpu checks the two kernels stage by stage: the op's default (never the fused kernel)."""
    p = bench_gpu.kda.default_params(problem)
    assert p["prep_variant"] != 2
    return p


class FakeModule:
    """Python stand-ins for kda_prepare / kda_recurrence / kda_fused, taking the same argument lists."""

    def __init__(self, problem, op_dtype, corrupt=False):
        self.problem, self.op_dtype, self.corrupt = problem, op_dtype, corrupt

    def get_function(self, name):
        return _Fn(getattr(self, name))

    def _chunked(self, q, k, v, a, g, b, A_log, dt_bias, cu):
        from ptxbuild.dtypes import to_float

        d = bench_gpu.kda.dims(self.problem)
        case = dict(
            qf=to_float(q, "bfloat16", np),
            kf=to_float(k, "bfloat16", np),
            vf=to_float(v, "bfloat16", np),
            af=to_float(a, "bfloat16", np),
            bf=to_float(b, "bfloat16", np),
            A_log=A_log.astype(np.float64),
            dt_bias=dt_bias.astype(np.float64),
            g=g,
            gate=d["gate"],
            beta=None,
            use_qk_l2norm=d["l2norm"],
            lower_bound=ref.LOWER_BOUND,
            scale=d["K"] ** -0.5,
            cu_seqlens=cu,
            h0=None,
        )
        p = ref.preprocess(case)
        return ref.chunked(
            **{n: p[n] for n in ("q", "k", "v", "g", "beta", "scale", "cu_seqlens", "h0")}
        )

    def kda_prepare(self, grid, block, args, shared_mem=0):
        q, k, v, a, g, b, A_log, dt_bias, cs, cl, ws, scale = args
        cu = np.concatenate([[0], np.cumsum(bench_gpu.kda.dims(self.problem)["lengths"])])
        ch = self._chunked(q, k, v, a, g, b, A_log, dt_bias, cu)
        assert (
            grid[0] == len(cs)
            and np.array_equal(ch.chunk_start, cs)
            and np.array_equal(ch.chunk_len, cl)
        )
        enc = wsl.encode(ch, self.op_dtype).ravel()
        ws[: enc.size] = enc  # ops/kda's buffer has variant 3's flags after the blobs
        self.ch = ch

    def kda_prepare_ovl(self, grid, block, args, shared_mem=0):
        """variant 3's persistent prepare: every (chunk, head) of chunk_order, then its flags set."""
        q, k, v, a, b, A_log, dt_bias, cs, cl, order, ws, flags, ntasks, scale = args
        d = bench_gpu.kda.dims(self.problem)
        assert (
            ntasks == d["NC"] * d["HV"]
            and 0 < grid[0] <= ntasks
            and sorted(order) == list(range(d["NC"]))
        )
        blobs = d["NC"] * d["HV"] * wsl.sizes(d["K"], d["V"])["BLOB"]
        assert (
            flags.size == 4 * ntasks and ws.size == blobs + 4 * ntasks
        )  # the flags are the workspace's tail
        self.kda_prepare(
            (d["NC"], d["HV"], 1),
            (128, 1, 1),
            (q, k, v, a, np.zeros(1, np.float32), b, A_log, dt_bias, cs, cl, ws[:blobs], scale),
        )
        flags.view(np.uint32)[...] = 1

    def kda_prepare_x1w(self, grid, block, args, shared_mem=0):
        """variant 4's persistent prepare (one warp per block, grid <= 7 per SM): every (chunk, head)."""
        q, k, v, a, b, A_log, dt_bias, cs, cl, ws, scale, nc, mask = args
        d = bench_gpu.kda.dims(self.problem)
        assert nc == d["NC"] == len(cs) and 0 < grid[0] <= nc * d["HV"] and block == (32, 1, 1)
        assert mask == 0x7FFFFFFF and isinstance(nc, np.int32) and isinstance(mask, np.int32)
        self.kda_prepare(
            (d["NC"], d["HV"], 1),
            (128, 1, 1),
            (q, k, v, a, np.zeros(1, np.float32), b, A_log, dt_bias, cs, cl, ws, scale),
        )

    def kda_recurrence(self, grid, block, args, shared_mem=0):
        if len(args) == 8:  # variant 3: every flag published before the recurrence reads a blob
            *args, flags = args
            assert (flags.view(np.uint32) == 1).all()
        ws, o, h0, hT, cu, co, order = args
        d = bench_gpu.kda.dims(self.problem)
        assert grid[0] == d["N"] * d["HV"] * (d["V"] // (block[0] // 32 * 16)) and sorted(
            order
        ) == list(range(d["N"]))
        ch = types.SimpleNamespace(
            chunk_start=ref.chunk_layout(cu)[0],
            chunk_len=ref.chunk_layout(cu)[1],
            chunk_offsets=co,
            hT=np.zeros((d["N"], d["HV"], d["V"], d["K"])),
            O=np.zeros((d["T"], d["HV"], d["V"])),
        )
        o64, h64 = wsl.simulate(ws, ch, h0 if d["h0"] else None, cu, self.op_dtype)
        from ptxbuild.dtypes import from_float

        o[...] = from_float(o64.astype(np.float32), "bfloat16", np)
        if d["hT"]:
            hT[...] = h64 * (1.5 if self.corrupt else 1.0)

    def kda_fused(self, grid, block, args, shared_mem=0):
        """prepare + recurrence through a private workspace, from the fused kernel's argument list."""
        q, k, v, a, b, A_log, dt_bias, o, h0, hT, cu, order, scale = args
        d = bench_gpu.kda.dims(self.problem)
        split = grid[0] // (d["N"] * d["HV"])
        assert grid[0] == d["N"] * d["HV"] * split and block[0] == d["V"] // split // 16 * 32 + 128
        cs, cl, co = ref.chunk_layout(cu)
        ws = np.zeros(max(len(cs), 1) * d["HV"] * wsl.sizes(d["K"], d["V"])["BLOB"], np.uint8)
        self.kda_prepare(
            (len(cs), d["HV"], 1),
            (128, 1, 1),
            (q, k, v, a, np.zeros(1, np.float32), b, A_log, dt_bias, cs, cl, ws, scale),
        )
        self.kda_recurrence((grid[0], 1, 1), (block[0] - 128, 1, 1), (ws, o, h0, hT, cu, co, order))


@pytest.mark.parametrize(
    "lens,H,kw",
    [
        ([37], 2, {}),
        ([0, 31, 20], 2, {"gate": "canonical"}),
        ([40], 2, {"HV": 4, "initial_state": False}),
    ],
)
def test_verify_end_to_end_with_emulated_kernels(monkeypatch, lens, H, kw):
    cp = fake_cupy()
    problem, ckw = bench_gpu.problem_of(lens, H, kw)
    params = two_kernel_params(problem)
    monkeypatch.setattr(
        bench_gpu,
        "load_module",
        lambda cp, kernel, params, problem: (FakeModule(problem, params["op_dtype"]), "fake"),
    )
    from ptxbuild.gpu import device  # variant 3's recurrence is a programmatic dependent launch

    monkeypatch.setattr(
        device,
        "launch",
        lambda fn, geom, args, stream: fn(tuple(geom.grid), tuple(geom.block), tuple(args)),
    )
    monkeypatch.setattr(cp.cuda, "get_current_stream", lambda: None, raising=False)
    bench_gpu._MODULES.clear()
    built = bench_gpu.Built(cp, params, problem)
    case = bench_gpu.kda.case_for(problem, 1, **ckw)
    res = bench_gpu.verify(cp, built, case, stages=True, label="t")
    assert res["ok"], bench_gpu.fmt(res)
    assert (
        res["o_rms"] < 3e-3 and res["ws_W"] < 1e-3 and res["deterministic"] and res["inputs_kept"]
    )


def test_verify_catches_a_wrong_state(monkeypatch):
    cp = fake_cupy()
    problem, ckw = bench_gpu.problem_of([37], 2, {})
    params = two_kernel_params(problem)
    monkeypatch.setattr(
        bench_gpu,
        "load_module",
        lambda cp, kernel, params, problem: (
            FakeModule(problem, params["op_dtype"], corrupt=True),
            "fake",
        ),
    )
    from ptxbuild.gpu import device

    monkeypatch.setattr(
        device,
        "launch",
        lambda fn, geom, args, stream: fn(tuple(geom.grid), tuple(geom.block), tuple(args)),
    )
    monkeypatch.setattr(cp.cuda, "get_current_stream", lambda: None, raising=False)
    bench_gpu._MODULES.clear()
    res = bench_gpu.verify(
        cp, bench_gpu.Built(cp, params, problem), bench_gpu.kda.case_for(problem, 1), True, "t"
    )
    assert not res["ok"] and res["hT_rms"] > 0.1


@pytest.mark.parametrize("variant", [1, 2, 3, 4])
@pytest.mark.parametrize("corrupt,outcome", [(False, "ok"), (True, "wrong_result")])
def test_the_gpu_worker_verifies_the_two_kernel_op(monkeypatch, corrupt, outcome, variant):
    """runs.Gpu.verify on ops/kda: both entries launched in order with the op's geometry and
    arguments (emulated), ws scratch (not checked), o and hT judged by compare() (relative RMS),
    the adversarial shapes included (final_state off: hT_unused passed and left alone)."""
    import contextlib

    from ptxbuild import coverage
    from ptxbuild.gpu import runs
    from ptxbuild.problem import Problem

    op = bench_gpu.kda
    seen = {}

    def stage_args(stage, params, problem, inputs, outputs, orig=op.stage_args):
        seen["problem"] = problem
        return orig(stage, params, problem, inputs, outputs)

    monkeypatch.setattr(op, "stage_args", stage_args)
    monkeypatch.setattr(runs, "load_op", lambda folder, root: op)
    monkeypatch.setattr(runs.device, "load", lambda entry, cubin, ptx="": entry)
    launched = []

    def launch(kern, geom, args, stream):
        launched.append(kern + ("+pdl" if geom.pdl else ""))
        fake = FakeModule(seen["problem"], "f16", corrupt=corrupt)
        getattr(fake, kern)(tuple(geom.grid), tuple(geom.block), args)

    monkeypatch.setattr(runs.device, "launch", launch)
    g = object.__new__(runs.Gpu)
    g.cp, g._pool, g._pool_key, g.kernels = np, [], None, {}
    g.stream, g.sync, g.release = contextlib.nullcontext(), lambda: None, lambda: None
    g.fingerprint = types.SimpleNamespace(sm_count=132)
    problem = Problem.make("kda", "bfloat16", (37, 2), {})
    params = (
        op.fused_params(problem)
        if variant == 2
        else op.with_prep_variant(two_kernel_params(problem), variant)
    )
    if variant == 3:
        params.update(stages=2, rec_copy="cp_async")
    assert op.check(params, problem) is None
    res = g.verify(
        "ops/kda",
        ".",
        params,
        problem,
        {"entry": "kda_recurrence", "digest": "d", "cubin": b""},
        seeds=[1],
    )
    assert res["outcome"] == outcome, res
    assert (
        launched[:2]
        == {
            1: ["kda_prepare", "kda_recurrence"],
            2: ["kda_fused", "kda_fused"],
            3: ["kda_prepare_ovl", "kda_recurrence+pdl"],
            4: ["kda_prepare_x1w", "kda_recurrence"],
        }[variant]
    )
    if corrupt:
        assert "output hT: relative RMS" in res["detail"]
    else:
        assert res["cases"] == 1 + len(coverage.adversarial(op, problem, params)) and res[
            "tolerances"
        ]["o"] == [0.0, 5e-3]
        # without a final state the kernels get hT_unused and must leave it alone (its own binary)
        off = Problem.make("kda", "bfloat16", (37, 2), {"final_state": False})
        res = g.verify(
            "ops/kda",
            ".",
            params,
            off,
            {"entry": "kda_recurrence", "digest": "e", "cubin": b""},
            seeds=[2],
        )
        assert res["outcome"] == "ok" and "hT" not in res["tolerances"], res
