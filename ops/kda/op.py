"""KDA (Kimi Delta Attention) forward: a two-kernel op, prepare (token-parallel) + recurrence.

Problem.shape = (T_total, H); options: lengths (tuple of segment lengths; default one segment),
hv (value heads, GVA; default H), K, V (128), gate ("safe" | "canonical" | "given"),
l2norm, initial_state, final_state. dtype: bfloat16 q, k, v, a, b, o; fp32 A_log, dt_bias, states.

Both kernels live in one source (kda_common.cuh + kda_prepare.cu + kda_recurrence.cu); render()
returns it with entry "kda_recurrence" (the contract's one kernel); KERNELS / render_stage() /
launches() / stage_args() describe the two launches, which run in order on one stream:
  kda_prepare    grid (NC, HV)                  workspace ws [NC, HV, BLOB] (workspace.py)
  kda_recurrence grid (N * HV * split)          o, hT
The ptxbuild verifier/timer launches one kernel today: running this op needs bench_gpu.py.
"""
from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np

from ptxbuild.problem import Kernel, Launch, Problem

_HERE = Path(__file__).resolve().parent


def _load(name: str):
    """A module of this folder under a unique name (kda_<name>): ops may each have a reference.py."""
    modname = f"kda_{name}"
    if modname not in sys.modules:
        spec = importlib.util.spec_from_file_location(modname, _HERE / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[modname] = mod
        spec.loader.exec_module(mod)
    return sys.modules[modname]


ref = _load("reference")
workspace = _load("workspace")

NAME = "kda"
VERSION = "0.1"
SOURCES = ["kda_common.cuh", "kda_prepare.cu", "kda_recurrence.cu", "reference.py", "workspace.py"]
DTYPES = ["bfloat16"]
OPTIONS = {"lengths": None, "hv": None, "K": 128, "V": 128, "gate": "safe", "l2norm": True,
           "initial_state": True, "final_state": True}
SPACE = {"split": [1, 2, 4], "stages": [2, 3, 4], "op_dtype": ["f16", "bf16"], "prep_threads": [128, 256]}
SPILL_BUDGET_BYTES = 0
KERNELS = ("kda_prepare", "kda_recurrence")
CH = 16
GATES = {"safe": 0, "canonical": 1, "given": 2}


# ---------------------------------------------------------------- problem geometry
def dims(problem: Problem) -> dict:
    o = {**OPTIONS, **problem.opts}
    T, H = problem.shape
    lengths = tuple(o["lengths"]) if o["lengths"] else (T,)
    if sum(lengths) != T:
        raise ValueError(f"kda: lengths sum to {sum(lengths)}, shape says T={T}")
    HV = o["hv"] or H
    return dict(T=T, H=H, HV=HV, K=o["K"], V=o["V"], N=len(lengths), lengths=lengths, gate=o["gate"],
                l2norm=bool(o["l2norm"]), h0=bool(o["initial_state"]), hT=bool(o["final_state"]),
                NC=sum(math.ceil(n / CH) for n in lengths))


def default_params(problem: Problem) -> dict:
    """V-split: the smallest of 1, 2, 4 whose blocks (N * HV * split) fill 132 SMs; 2 stages; f16."""
    d = dims(problem)
    split = next((s for s in (1, 2, 4) if d["N"] * d["HV"] * s >= 132 and d["V"] % (16 * s) == 0), 1)
    while d["V"] % (16 * split):
        split //= 2
    return {"split": split, "stages": 2, "op_dtype": "f16", "prep_threads": 128}


def smem_bytes(params: dict, problem: Problem) -> int:
    d = dims(problem)
    sz = workspace.sizes(d["K"], d["V"])
    return params["stages"] * (sz["U"] + (d["V"] // params["split"] // 16) * 32 * 32)


def check(params: dict, problem: Problem) -> str | None:
    d = dims(problem)
    if d["K"] % 16 or not 16 <= d["K"] <= 128:
        return f"K={d['K']}: need a multiple of 16 up to 128 (state registers, prepare smem)"
    if d["V"] % (16 * params["split"]):
        return f"V={d['V']} is not a multiple of 16 * split={params['split']}"
    if d["HV"] % d["H"]:
        return f"hv={d['HV']} is not a multiple of H={d['H']}"
    if d["gate"] not in GATES:
        return f"gate={d['gate']!r}: use one of {sorted(GATES)}"
    if params["stages"] < 2:
        return "stages < 2"
    if smem_bytes(params, problem) > 227 * 1024:
        return f"shared memory {smem_bytes(params, problem)} B > 227 KiB"
    return None


# ---------------------------------------------------------------- rendering and launching
def _defines(params: dict, problem: Problem) -> str:
    d = dims(problem)
    defs = dict(KDIM=d["K"], VDIM=d["V"], CH=CH, H=d["H"], HV=d["HV"], GATE=GATES[d["gate"]],
                L2NORM=int(d["l2norm"]), LOWER_BOUND=f"({ref.LOWER_BOUND}f)", PREP_THREADS=params["prep_threads"],
                OP_BF16=int(params["op_dtype"] == "bf16"), SPLIT=params["split"], STAGES=params["stages"],
                HAS_H0=int(d["h0"]), HAS_HT=int(d["hT"]))
    return "".join(f"#define {k} {v}\n" for k, v in defs.items())


def render_stage(params: dict, problem: Problem, arch: str, stage: str) -> Kernel:
    """One kernel alone (for per-kernel register/spill reports)."""
    files = {"kda_prepare": "kda_prepare.cu", "kda_recurrence": "kda_recurrence.cu"}
    src = _defines(params, problem) + (_HERE / "kda_common.cuh").read_text() + (_HERE / files[stage]).read_text()
    return Kernel(src, stage)


def render(params: dict, problem: Problem, arch: str) -> Kernel:
    src = (_defines(params, problem) + (_HERE / "kda_common.cuh").read_text()
           + (_HERE / "kda_prepare.cu").read_text() + (_HERE / "kda_recurrence.cu").read_text())
    return Kernel(src, "kda_recurrence")


def launches(params: dict, problem: Problem, sm_count: int) -> dict[str, Launch]:
    d = dims(problem)
    return {
        "kda_prepare": Launch((max(d["NC"], 1), d["HV"], 1), (params["prep_threads"], 1, 1), 0),
        "kda_recurrence": Launch((d["N"] * d["HV"] * params["split"], 1, 1),
                                 (d["V"] // params["split"] // 16 * 32, 1, 1), smem_bytes(params, problem)),
    }


def launch(params: dict, problem: Problem, sm_count: int) -> Launch:
    return launches(params, problem, sm_count)["kda_recurrence"]


def bytes_moved(problem: Problem) -> int:
    """q, k, v, a, b read, o written, initial / final fp32 states (the fused-kernel floor)."""
    d = dims(problem)
    tok = d["T"] * (2 * d["H"] * d["K"] * 2 + d["HV"] * (d["V"] * 2 * 2 + d["K"] * 2 + 2))
    state = d["N"] * d["HV"] * d["V"] * d["K"] * 4 * (int(d["h0"]) + int(d["hT"]))
    return tok + state


# ---------------------------------------------------------------- data
def case_for(problem: Problem, seed: int, **kw) -> dict:
    d = dims(problem)
    return ref.make_case(d["lengths"], d["H"], K=d["K"], V=d["V"], seed=seed, gate=d["gate"], HV=d["HV"],
                         use_qk_l2norm=d["l2norm"], initial_state=d["h0"], **kw)


def inputs_from_case(case: dict, xp=np) -> dict:
    cs, cl, co = ref.chunk_layout(case["cu_seqlens"], CH)
    lens = np.diff(case["cu_seqlens"])
    host = dict(q=case["q"], k=case["k"], v=case["v"], a=case["a"], b=case["b"],
                g=np.asarray(case["g"], np.float32) if case.get("g") is not None else np.zeros(1, np.float32),
                A_log=case["A_log"].astype(np.float32), dt_bias=case["dt_bias"].astype(np.float32),
                h0=case["h0"].astype(np.float32) if case["h0"] is not None else np.zeros(1, np.float32),
                cu_seqlens=case["cu_seqlens"].astype(np.int64),
                chunk_start=cs.astype(np.int32), chunk_len=cl.astype(np.int32), chunk_offsets=co.astype(np.int32),
                seq_order=np.argsort(-lens, kind="stable").astype(np.int32))  # longest segments first
    return {k: xp.asarray(np.ascontiguousarray(v)) for k, v in host.items()}


def make_inputs(problem: Problem, seed: int, xp) -> dict:
    return inputs_from_case(case_for(problem, seed), xp)


def make_outputs(problem: Problem, xp) -> dict:
    d = dims(problem)
    return dict(o=xp.zeros((d["T"], d["HV"], d["V"]), xp.uint16),
                hT=xp.zeros((d["N"], d["HV"], d["V"], d["K"]), xp.float32),
                ws=xp.zeros(max(d["NC"], 1) * d["HV"] * workspace.sizes(d["K"], d["V"])["BLOB"], xp.uint8))


def stage_args(stage: str, params: dict, problem: Problem, inputs: dict, outputs: dict) -> list:
    d = dims(problem)
    i, o = inputs, outputs
    if stage == "kda_prepare":
        return [i["q"], i["k"], i["v"], i["a"], i["g"], i["b"], i["A_log"], i["dt_bias"], i["chunk_start"],
                i["chunk_len"], o["ws"], np.float32(d["K"] ** -0.5)]
    return [o["ws"], o["o"], i["h0"], o["hT"], i["cu_seqlens"], i["chunk_offsets"], i["seq_order"]]


def kernel_args(params: dict, problem: Problem, inputs: dict, outputs: dict) -> list:
    return stage_args("kda_recurrence", params, problem, inputs, outputs)


def reference(problem: Problem, inputs: dict, xp) -> dict:
    """float64 recurrent reference from the (bf16 bit-pattern) inputs."""
    from ptxbuild.dtypes import to_float
    d = dims(problem)
    host = {k: (v.get() if hasattr(v, "get") else np.asarray(v)) for k, v in inputs.items()}
    case = dict(qf=to_float(host["q"], "bfloat16", np), kf=to_float(host["k"], "bfloat16", np),
                vf=to_float(host["v"], "bfloat16", np), af=to_float(host["a"], "bfloat16", np),
                bf=to_float(host["b"], "bfloat16", np), A_log=host["A_log"].astype(np.float64),
                dt_bias=host["dt_bias"].astype(np.float64), g=host["g"], gate=d["gate"], beta=None,
                use_qk_l2norm=d["l2norm"], lower_bound=ref.LOWER_BOUND, scale=d["K"] ** -0.5,
                cu_seqlens=host["cu_seqlens"], h0=host["h0"].astype(np.float64) if d["h0"] else None)
    o, hT = ref.reference(case)
    return {"o": xp.asarray(o), "hT": xp.asarray(hT)}


def tolerance(problem: Problem, output: str) -> tuple[float, float]:
    """Elementwise band; the gate that matters is relative RMS <= 5e-3 (kda.md), see bench_gpu.py."""
    return (2e-2, 2e-2) if output == "o" else (1e-2, 1e-2)


def verify_problems(problem: Problem) -> list[Problem]:
    H = problem.shape[1]
    mk = lambda T, **kw: Problem.make(NAME, problem.dtype, (T, H), {**problem.opts, "lengths": None, **kw})
    return [mk(16), mk(17), mk(37), mk(97), mk(24, lengths=(4, 8, 12)), mk(115, lengths=(17, 33, 65)),
            mk(15, lengths=(0, 15)), mk(287, lengths=(0, 31, 96, 160)), mk(64, initial_state=False)]
