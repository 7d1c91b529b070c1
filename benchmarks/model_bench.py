"""ptxbuild's kernels inside models no one here wrote, stock and ptxbuild in one process (issue 28, 5).

(a) A Llama-style decoder from a transformers LlamaConfig (random bf16 weights; default 8 layers,
    hidden 4096, intermediate 14336, 32 heads, 8 kv heads, sdpa attention) whose RMSNorms become
    ptxbuild's through one call, `ptxbuild.patch_rmsnorm(model, target="rmsnorm@h200")`: prefill
    (1 x 8192 and 8 x 1024 tokens, no cache) and decode (batch 1, 8, 64, one token on a static KV
    cache holding 1024 tokens) step times in eager, CUDA-graph and torch.compile modes.
(b) flash-linear-attention's KimiDeltaAttention layer with its chunked path (`chunk_kda`) routed to
    ptxbuild's KDA drop-in, prefill on the six kda.md scenarios (skipped, with the reason, when fla
    or the drop-in is missing).
(c) A training step (forward + backward + SGD) of the decoder, only where the patched RMSNorm has a
    backward (otherwise a skipped row says why).

Every time is a median over CUDA-event timings of one step each, stock and ptxbuild alternating
call by call. Rows run in this order (eager, CUDA graph, KDA, torch.compile, training) until the
time budget (--budget-s) is spent; the rest are written as skipped. The report is rewritten after
every row, so a run stopped part-way still leaves what it measured.

    ptxbuild build --locked --no-gpu rmsnorm@h200 kda@h200; python benchmarks/model_bench.py --quick

writes reports/model/report.json {"environment", "rows": [{"model", "phase", "mode", "shape",
"stock_ms", "ptxbuild_ms", ...}]} and report.md (a row where ptxbuild is slower says why, if known).
`--tiny --device cpu --fake-kernel` runs the same logic on a CPU (eager rows only) for tests.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import inspect
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

KDA_SCENARIOS = [  # kda.md: H in {96, 64} x {one 8192-token sequence, six mixed lengths, 8 x 1024}
    (h, name, lengths)  # H96 and H64 side by side; the one-sequence rows first (--quick: those)
    for name, lengths in (
        ("T8192", [8192]),
        ("8x1024", [1024] * 8),
        ("mixed6", [1300, 547, 2048, 963, 271, 3063]),
    )
    for h in (96, 64)
]
NOISE = 0.02  # a ratio within 2% whose p20-p80 ranges overlap is called a tie, not a loss


# ----------------------------------------------------------------------------- report (pure)
def row(model, phase, mode, shape, stock=None, ptx=None, **extra) -> dict:
    """One report row; `stock` / `ptx` are timing summaries {"p50", "p20", "p80"} in ms or None."""
    r = {
        "model": model,
        "phase": phase,
        "mode": mode,
        "shape": list(shape),
        "stock_ms": None if stock is None else round(stock["p50"], 4),
        "ptxbuild_ms": None if ptx is None else round(ptx["p50"], 4),
    }
    if stock is not None and ptx is not None:
        r["stock_p20_p80_ms"] = [round(stock["p20"], 4), round(stock["p80"], 4)]
        r["ptxbuild_p20_p80_ms"] = [round(ptx["p20"], 4), round(ptx["p80"], 4)]
        r["speedup"] = round(stock["p50"] / ptx["p50"], 4) if ptx["p50"] > 0 else None
    r.update({k: v for k, v in extra.items() if v is not None})
    return r


def summary(times_ms: list[float]) -> dict:
    s = sorted(times_ms)

    def q(p):
        return s[min(len(s) - 1, max(0, round(p * (len(s) - 1))))]

    return {"p50": statistics.median(s), "p20": q(0.2), "p80": q(0.8), "n": len(s)}


def measured(r: dict) -> bool:
    return r.get("stock_ms") is not None and r.get("ptxbuild_ms") is not None


def slower(r: dict) -> bool:
    return measured(r) and r["ptxbuild_ms"] > r["stock_ms"]


def why_slower(r: dict) -> str:
    """What is known about a row where ptxbuild is slower."""
    reasons = []
    lo_s, hi_s = r.get("stock_p20_p80_ms", [None, None])
    lo_p, hi_p = r.get("ptxbuild_p20_p80_ms", [None, None])
    ratio = r["ptxbuild_ms"] / r["stock_ms"]
    if lo_s is not None and ratio <= 1 + NOISE and lo_p <= hi_s and lo_s <= hi_p:
        reasons.append(
            f"within timing noise: {ratio:.3f}x with overlapping p20-p80 ranges "
            f"({lo_p}-{hi_p} against {lo_s}-{hi_s} ms)"
        )
    if r.get("why"):
        reasons.append(r["why"])
    if r["mode"] == "eager" and r.get("norm_host_us"):
        h = r["norm_host_us"]
        reasons.append(
            f"host time per RMSNorm call: ptxbuild {h['ptxbuild']:.1f} us, stock {h['stock']:.1f} us "
            f"x {r.get('norms', '?')} norms per step; an eager step shorter than its launches is "
            "host-bound (issue 28, item 1: the launch path)"
        )
    if r["mode"] == "compile":
        reasons.append(
            "likely: inductor fuses the residual add, the cast and torch's norm into one Triton "
            "kernel, while ptxbuild's custom op is opaque to it, so the add before each norm stays a "
            "kernel of its own (ptxbuild's residual mode would take it; patch_rmsnorm uses the plain "
            "one); so patch_rmsnorm (compiled='stock', the default) leaves compiled regions to "
            "torch's norm: both models run the same compiled decoder layers, only the final norm "
            "(eager) differs, and a row is a tie up to that norm and timing noise"
        )
    return "; ".join(reasons) or "not known"


def render_md(env: dict, rows: list[dict]) -> str:
    gpu = env.get("gpu", {}).get("name", "no GPU")
    lines = [
        "# ptxbuild inside models (issue 28, item 5)",
        "",
        f"{gpu}; torch {env.get('packages', {}).get('torch', '?')}, transformers "
        f"{env.get('packages', {}).get('transformers', '?')}; git {env.get('git_revision', '?')}; "
        f"{env.get('command', '')}",
        "",
        "Times are medians of CUDA-event timings of one step each (ms), stock and ptxbuild "
        "alternating; speed-up = stock / ptxbuild.",
        "",
        "| model | phase | mode | shape | stock ms | ptxbuild ms | speed-up | note |",
        "|---|---|---|---|---:|---:|---:|---|",
    ]

    def ms(v):
        return "-" if v is None else f"{v:.3f}"

    for r in rows:
        note = r.get("skipped") or r.get("error") or r.get("note") or ""
        if r.get("norm_backward"):
            calls = r.get("backward_kernel_calls")
            note += f" norm backward: {r['norm_backward']}" + (
                f" ({calls} kernel calls per step)" if calls is not None else ""
            )
        if r.get("measured_in"):
            note += f" (measured in an earlier run: git {r['measured_in'].get('git_revision')})"
        sp = f"{r['speedup']:.3f}x" if r.get("speedup") else "-"
        shape = "x".join(map(str, r["shape"])) + (f" {r['scenario']}" if r.get("scenario") else "")
        lines.append(
            f"| {r['model']} | {r['phase']} | {r['mode']} | {shape} | "
            f"{ms(r['stock_ms'])} | {ms(r['ptxbuild_ms'])} | {sp} | {note.replace('|', '/')} |"
        )
    slow = [r for r in rows if slower(r)]
    lines += ["", "## Rows where ptxbuild is slower", ""]
    lines += [
        f"- {r['model']} {r['phase']} {r['mode']} {'x'.join(map(str, r['shape']))}: "
        f"{r['ptxbuild_ms']:.3f} against {r['stock_ms']:.3f} ms — {why_slower(r)}"
        for r in slow
    ] or ["none"]
    skipped = [r for r in rows if r.get("skipped") or r.get("error")]
    if skipped:
        lines += ["", "## Rows not measured", ""]
        lines += [
            f"- {r['model']} {r['phase']} {r['mode']} {'x'.join(map(str, r['shape']))}: "
            f"{r.get('skipped') or r.get('error')}"
            for r in skipped
        ]
    return "\n".join(lines) + "\n"


def row_key(r: dict) -> tuple:
    """What a row measures: two rows with the same key are the same measurement, taken twice."""
    return (r["model"], r["phase"], r["mode"], tuple(r["shape"]), r.get("scenario"))


def earlier_rows(out: Path) -> list[dict]:
    """The measured rows of the report already in `out` (--merge), each tagged with the run that
    measured it (`measured_in`: that report's git revision, command and GPU), or [] without one."""
    path = out / "report.json"
    if not path.is_file():
        return []
    old = json.loads(path.read_text())
    env = old.get("environment", {})
    run = {
        "git_revision": env.get("git_revision"),
        "command": env.get("command"),
        "gpu": env.get("gpu", {}).get("name"),
    }
    return [
        r | {"measured_in": r.get("measured_in", run)} for r in old.get("rows", []) if measured(r)
    ]


def merged(kept: list[dict], rows: list[dict]) -> list[dict]:
    """The rows of `kept` (an earlier run's, in their order), each replaced by this run's
    measurement of it where this run measured it, then this run's rows `kept` does not hold."""
    now = {row_key(r): r for r in rows}
    out = [now.pop(row_key(r)) if measured(now.get(row_key(r), {})) else r for r in kept]
    held = {row_key(r) for r in kept}
    return out + [r for k, r in now.items() if k not in held]


def write_report(out: Path, env: dict, rows: list[dict]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(
        json.dumps({"environment": env, "rows": rows}, indent=1, default=str) + "\n"
    )
    (out / "report.md").write_text(render_md(env, rows))


def environment(args) -> dict:
    try:
        from ptxbuild.outputs.environment import environment as env_of
    except ImportError:
        from ptxbuild.report import environment as env_of
    env = env_of(ROOT)
    env["command"] = "python benchmarks/model_bench.py " + " ".join(sys.argv[1:])
    versions = env.setdefault("packages", {})
    for name in ("torch", "transformers", "triton", "fla"):
        with contextlib.suppress(Exception):
            versions[name] = __import__(name).__version__
    with contextlib.suppress(Exception):
        import torch

        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            env["gpu"] = {
                "name": p.name,
                "sm_count": p.multi_processor_count,
                "memory_gib": round(p.total_memory / 2**30, 1),
                "cuda": torch.version.cuda,
            }
    return env


# ----------------------------------------------------------------------------- timing
class Clock:
    """Times one call: CUDA events on the current stream on a GPU, perf_counter on a CPU."""

    def __init__(self, device: str):
        import torch

        self.torch, self.cuda = torch, device.startswith("cuda")

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def once(self, fn) -> float:
        if not self.cuda:
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e3
        a, b = (self.torch.cuda.Event(enable_timing=True) for _ in range(2))
        a.record()
        fn()
        b.record()
        b.synchronize()
        return a.elapsed_time(b)

    def pair(self, fa, fb, reps: int, warmup: int) -> tuple[dict, dict]:
        """Medians of fa and fb, alternating call by call after `warmup` calls of each."""
        for _ in range(warmup):
            fa()
            fb()
        self.sync()
        ta, tb = [], []
        for i in range(reps):
            first, second = (fa, fb) if i % 2 == 0 else (fb, fa)
            t1, t2 = self.once(first), self.once(second)
            ta.append(t1 if i % 2 == 0 else t2)
            tb.append(t2 if i % 2 == 0 else t1)
        return summary(ta), summary(tb)

    def host_us(self, fn, calls: int = 200) -> float:
        """Median host time of one call (no synchronisation inside the loop), in microseconds."""
        for _ in range(10):
            fn()
        self.sync()
        ts = []
        for _ in range(calls):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e6)
        self.sync()
        return statistics.median(ts)


# ----------------------------------------------------------------------------- the Llama decoder
def llama_config(args):
    from transformers import LlamaConfig

    if args.tiny:
        dims = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, vocab_size=256)  # fmt: skip
    else:
        dims = dict(hidden_size=4096, intermediate_size=args.intermediate, num_hidden_layers=args.layers,
                    num_attention_heads=32, num_key_value_heads=8, vocab_size=32000)  # fmt: skip
    return LlamaConfig(**dims, max_position_embeddings=16384, rms_norm_eps=args.eps)


def build_llama(args, config):
    import torch
    from transformers import AutoModel

    torch.manual_seed(0)
    with torch.device(args.device):
        model = AutoModel.from_config(config, attn_implementation="sdpa")
    return model.to(dtype=torch.bfloat16 if not args.fp32 else torch.float32).eval()


def fake_kernel(eps: float):
    """A stand-in for the built kernel on a CPU (tests): torch's rms_norm on the rows."""
    import torch

    calls = {"n": 0}

    def fn(x2d, w):
        calls["n"] += 1
        return torch.nn.functional.rms_norm(x2d, (x2d.shape[-1],), w, eps)

    fn.calls = calls
    return fn


def static_cache(config, batch: int, max_len: int, device, dtype):
    """A transformers StaticCache, whatever this version's constructor asks for."""
    from transformers import StaticCache

    params = inspect.signature(StaticCache.__init__).parameters
    kw = {"config": config, "max_cache_len": max_len}
    for name, val in (
        ("max_batch_size", batch),
        ("batch_size", batch),
        ("device", device),
        ("dtype", dtype),
    ):
        if name in params:
            kw[name] = val
    return StaticCache(**kw)


class Steps:
    """The step function of one (model, phase, shape): prefill without a cache, or decode of one
    token at position `ctx` on a static cache of ctx + 1 tokens."""

    def __init__(self, model, config, phase: str, shape, ctx: int, device: str):
        import torch

        self.torch, self.model = torch, model
        b, t = shape
        g = torch.Generator(device="cpu").manual_seed(1)
        self.ids = torch.randint(0, config.vocab_size, (b, t), generator=g).to(device)
        self.kw, self.cache, self.ctx = {"use_cache": False}, None, ctx
        if phase == "decode":
            dtype = next(model.parameters()).dtype
            self.cache = static_cache(config, b, ctx + 1, device, dtype)
            params = inspect.signature(type(model).forward).parameters
            self.kw = {
                "use_cache": True,
                ("cache" if "cache" in params else "past_key_values"): self.cache,
            }
            if "cache_position" in params:  # transformers 4: the position is an argument
                self.kw["cache_position"] = torch.tensor([ctx], device=device)

    def rewind(self) -> None:
        """transformers 5's StaticCache counts the tokens it has seen (a tensor, in place): set it back
        to `ctx` so that every timed step writes the same slot, as one decode step would."""
        for layer in getattr(self.cache, "layers", ()):
            c = getattr(layer, "cumulative_length", None)
            if isinstance(c, self.torch.Tensor):
                c.fill_(self.ctx)
            elif isinstance(c, int):
                layer.cumulative_length = self.ctx

    def __call__(self, model=None):
        with self.torch.inference_mode():
            self.rewind()
            return (model or self.model)(input_ids=self.ids, **self.kw).last_hidden_state


def graph_of(torch, step):
    """A CUDA graph of one step (warmed up on a side stream, as torch's docs do); returns replay."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.inference_mode(), torch.cuda.graph(g):
        step()
    return g.replay, g


def max_rel_diff(a, b) -> float:
    a, b = a.float(), b.float()
    return float((a - b).abs().max() / a.abs().max().clamp_min(1e-30))


def norm_host_us(clock, stock_model, ptx_model, n: int, device: str, dtype) -> dict:
    """Host time of one RMSNorm call on a decode-sized input: the model's own module against ptxbuild's."""
    import torch

    norm_s = next(m for m in stock_model.modules() if type(m).__name__.endswith("RMSNorm"))
    norm_p = next(m for m in ptx_model.modules() if type(m).__name__ == "PtxbuildRMSNorm")
    x = torch.randn(1, 1, n, device=device, dtype=dtype)
    with torch.inference_mode():
        return {
            "stock": round(clock.host_us(lambda: norm_s(x)), 2),
            "ptxbuild": round(clock.host_us(lambda: norm_p(x)), 2),
        }


class Budget:
    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


class Llama:
    """(a) and (c): the stock decoder and its ptxbuild twin (same weights), built once."""

    def __init__(self, args, clock, emit):
        import ptxbuild

        self.args, self.clock, self.emit = args, clock, emit
        self.config = config = llama_config(args)
        self.name = (
            f"llama{'-tiny' if args.tiny else ''}-{config.num_hidden_layers}L-"
            f"h{config.hidden_size}-i{config.intermediate_size}"
        )
        self.stock = build_llama(args, config)
        self.ptx = copy.deepcopy(self.stock)
        kernel = fake_kernel(args.eps) if args.fake_kernel else None
        self.norms = ptxbuild.patch_rmsnorm(self.ptx, target=args.target, kernel=kernel)
        self.compiled = False  # the decoder layers are compiled in place by the first compile row
        self.host = None
        with contextlib.suppress(Exception):
            self.host = norm_host_us(
                clock, self.stock, self.ptx, config.hidden_size, args.device, self.stock.dtype
            )
            emit(None, diagnostics={"rmsnorm_host_us_per_call": self.host})

    def rows(self, modes, budget) -> None:
        import torch

        args = self.args
        shapes = [("prefill", s) for s in args.prefill] + [("decode", s) for s in args.decode]
        for mode in modes:
            for phase, shape in shapes:
                if mode == "compile" and args.quick and (phase, shape) not in args.quick_compile:
                    continue
                extra = {"kv_cache": args.ctx if phase == "decode" else None, "norms": self.norms}
                need = {"eager": 5, "cudagraph": 10, "compile": args.compile_s}[mode]
                if budget.left() < need:
                    self.emit(row(self.name, phase, mode, shape, **extra,
                                  skipped=f"time budget spent ({budget.left():.0f} s left, ~{need:.0f} s needed)"))  # fmt: skip
                    continue
                try:
                    r = self.row(phase, mode, shape, extra)
                    if mode == "eager" and self.host:
                        r["norm_host_us"] = self.host
                    self.emit(r)
                except Exception as exc:  # a failed mode is a row that says why, not a lost run
                    self.emit(row(self.name, phase, mode, shape, **extra, error=_err(exc)))
                finally:
                    if self.clock.cuda:
                        torch.cuda.empty_cache()

    def row(self, phase, mode, shape, extra) -> dict:
        import torch

        args, config = self.args, self.config
        s_step = Steps(self.stock, config, phase, shape, args.ctx, args.device)
        p_step = Steps(self.ptx, config, phase, shape, args.ctx, args.device)
        p_step.ids = s_step.ids  # the same tokens
        note = None
        if mode == "eager":
            fa, fb = s_step, p_step
            extra["max_rel_diff"] = round(max_rel_diff(s_step(), p_step()), 5)
        elif mode == "cudagraph":
            fa, _ga = graph_of(torch, s_step)
            fb, _gb = graph_of(torch, p_step)
        else:
            # regional compilation (torch's recipe for a stack of identical blocks): every decoder
            # layer compiled in place, the one compiled code shared by the layers of a model; the
            # embedding and the final norm stay eager. Inside the layers the patched norms run
            # torch's own (patch_rmsnorm's compiled="stock"), so inductor fuses them as in stock
            if not self.compiled:
                for m in (self.stock, self.ptx):
                    for layer in m.layers:
                        layer.compile(dynamic=False)
                self.compiled = True
            stance = getattr(torch.compiler, "set_stance", None)
            with stance("force_eager") if stance else contextlib.nullcontext():
                s_step()  # caches allocated eagerly (transformers 5 does it at their first use)
                p_step()
            t0 = time.monotonic()
            s_step()
            t1 = time.monotonic()
            p_step()
            t2 = time.monotonic()
            fa, fb = s_step, p_step
            note = (
                f"decoder layers compiled (first call {t1 - t0:.0f} s stock, {t2 - t1:.0f} s "
                "ptxbuild); in them both run torch's norm (the patch leaves compiled regions to the "
                "stock path: inductor fuses it with the residual add), the final norm outside runs "
                "ptxbuild's kernel"
            )
        # prefill steps are long and noisy (p20-p80 ~4% at 5 calls): more of them. A compile row
        # is a near tie by construction (the same compiled layers; only the final norm, eager,
        # differs: ~0.2 ms of a 54 ms prefill step at 1 x 8192, where one step's p20-p80 spans
        # ~2 ms), so it gets the most: the median of 100 calls resolves ~0.2 ms there
        reps = args.reps if phase == "decode" else max(10, args.reps // 2)
        reps = args.compile_reps if mode == "compile" else reps
        a, b = self.clock.pair(fa, fb, reps=reps, warmup=3)
        return row(self.name, phase, mode, shape, a, b, note=note, **extra)

    def train(self, budget) -> None:
        self.emit(
            train_row(self.args, self.clock, self.config, self.stock, self.ptx, self.name, budget)
        )


def train_row(args, clock, config, stock, ptx, model_name, budget):
    """(c): one training step (forward + backward + SGD) of the whole decoder on (1, train_tokens):
    the patched model's norms run ptxbuild's forward and, in backward, the built rmsnorm_bwd target
    where one covers the call (else torch's closed form: the row says which)."""
    import torch

    shape = (1, args.train_tokens)
    norm = next(m for m in ptx.modules() if type(m).__name__ == "PtxbuildRMSNorm")
    bwds = getattr(norm.fn, "bwd", None)
    info = {"norm_backward": ", ".join(k.target for k in bwds) if bwds else
            "torch closed form" if bwds is not None else "autograd of the given callable"}  # fmt: skip
    base = row(model_name, "train", "eager", shape, **info)
    if budget.left() < 30:
        return base | {"skipped": f"time budget spent ({budget.left():.0f} s left)"}
    try:
        g = torch.Generator(device="cpu").manual_seed(2)
        ids = torch.randint(0, config.vocab_size, shape, generator=g).to(args.device)

        def step(model, opt):
            def run():
                model.zero_grad(set_to_none=True)
                h = model(input_ids=ids, use_cache=False).last_hidden_state
                h.float().square().mean().backward()
                if opt is not None:
                    opt.step()

            return run

        stock.train(), ptx.train()
        step(stock, None)()  # one step without the update: the gradients compared
        before = sum(k.calls for k in bwds or [])
        step(ptx, None)()
        ran = sum(k.calls for k in bwds or []) - before
        diff = max(
            max_rel_diff(a.grad, b.grad)
            for (na, a), (nb, b) in zip(stock.named_parameters(), ptx.named_parameters())
            if "norm" in na
        )
        fa = step(stock, torch.optim.SGD(stock.parameters(), lr=1e-6))
        fb = step(ptx, torch.optim.SGD(ptx.parameters(), lr=1e-6))
        a, b = clock.pair(fa, fb, reps=max(5, args.reps // 4), warmup=2)
        return row(model_name, "train", "eager", shape, a, b, **info,
                   norm_grad_max_rel_diff=round(diff, 5), backward_kernel_calls=ran)  # fmt: skip
    except Exception as exc:
        return base | {"error": _err(exc)}
    finally:
        for m in (stock, ptx):
            m.eval()
            m.zero_grad(set_to_none=True)


# ----------------------------------------------------------------------------- (b) KDA
def kda_dropin(target: str):
    """ptxbuild's drop-in for fla's chunk_kda on the built `target` (issue 28, item 2), with no
    fallback (a call the build does not cover raises, rather than timing fla against itself), or
    (None, why)."""
    try:
        from ptxbuild.runtime.fla import chunk_kda_from
    except ImportError as exc:
        return None, f"ptxbuild has no drop-in for fla's chunk_kda here ({_err(exc)})"
    import ptxbuild

    try:
        return chunk_kda_from(ptxbuild.load(target)), None
    except Exception as exc:
        return None, f"cannot load {target}: {_err(exc)}"


def kda_rows(args, clock, budget, emit, scenarios=KDA_SCENARIOS):
    import torch

    shape_of = lambda h, lengths: [1, sum(lengths), h]  # noqa: E731
    # fla's own Triton kernels as stock, as ops/kda/baselines.py times them (not FlashKDA's)
    os.environ.setdefault("FLA_FLASH_KDA", "0")
    try:
        import fla.layers.kda as fla_kda
    except Exception as exc:
        for h, name, lengths in scenarios:
            emit(row("fla-kda", "prefill", "eager", shape_of(h, lengths), scenario=name,
                     skipped=f"flash-linear-attention's KDA layer is not importable ({_err(exc)})"))  # fmt: skip
        return
    dropin, why = kda_dropin(args.kda_target)
    for h, name, lengths in scenarios:
        base = dict(scenario=name, hidden_size=args.kda_hidden)
        shape = shape_of(h, lengths)
        if dropin is None:
            emit(row("fla-kda", "prefill", "eager", shape, **base, skipped=why))
            continue
        if budget.left() < 30:
            emit(row("fla-kda", "prefill", "eager", shape, **base, skipped="time budget spent"))
            continue
        try:
            torch.manual_seed(3)
            layer = fla_kda.KimiDeltaAttention(
                hidden_size=args.kda_hidden, head_dim=128, num_heads=h, mode="chunk",
                safe_gate=True, lower_bound=-5.0, layer_idx=0,
            ).to(device=args.device, dtype=torch.bfloat16).eval()  # fmt: skip
            for p in ("A_log", "dt_bias"):  # the gate's parameters stay float32, as fla keeps them
                getattr(layer, p).data = getattr(layer, p).data.float()
            x = torch.randn(
                1, sum(lengths), args.kda_hidden, device=args.device, dtype=torch.bfloat16
            )
            kw = {}
            if len(lengths) > 1:
                cu = [0]
                for n in lengths:
                    cu.append(cu[-1] + n)
                kw["cu_seqlens"] = torch.tensor(cu, device=args.device, dtype=torch.int32)

            stock_fn = fla_kda.chunk_kda

            def run(fn):
                def call():
                    fla_kda.chunk_kda = fn
                    try:
                        with torch.inference_mode():
                            return layer(x, **kw)[0]
                    finally:
                        fla_kda.chunk_kda = stock_fn

                return call

            fa, fb = run(stock_fn), run(dropin)
            diff = round(max_rel_diff(fa(), fb()), 5)
            a, b = clock.pair(fa, fb, reps=max(5, args.reps // 4), warmup=3)
            emit(row("fla-kda", "prefill", "eager", shape, a, b, **base, max_rel_diff=diff))
        except Exception as exc:
            emit(row("fla-kda", "prefill", "eager", shape, **base, error=_err(exc)))
        finally:
            torch.cuda.empty_cache()


def _err(exc: BaseException) -> str:
    tb = traceback.extract_tb(exc.__traceback__)
    where = f" at {Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else ""
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}{where}"


# ----------------------------------------------------------------------------- main
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="rmsnorm@h200", help="the built RMSNorm target")
    ap.add_argument("--out", default=str(ROOT / "reports" / "model"))
    ap.add_argument("--quick", action="store_true", help="fewer repetitions, fewer compiled shapes")
    ap.add_argument(
        "--reps", type=int, default=None, help="timed calls per decode row (prefill: /4)"
    )
    ap.add_argument("--budget-s", type=float, default=None, help="stop starting rows after this")
    ap.add_argument("--compile-s", type=float, default=60, help="time a compile row may need")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--intermediate", type=int, default=14336, help="11008 (Llama 2) or 14336")
    ap.add_argument("--ctx", type=int, default=1024, help="tokens in the KV cache at decode")
    ap.add_argument("--eps", type=float, default=1e-6)
    ap.add_argument("--kda-target", default="kda@h200", help="the built KDA target")
    ap.add_argument("--kda-hidden", type=int, default=2048, help="the KDA layer's model width")
    ap.add_argument("--train-tokens", type=int, default=4096)
    ap.add_argument("--modes", default="eager,cudagraph,kda,compile,train",
                    help="comma-separated subset of eager,cudagraph,kda,compile,train")  # fmt: skip
    ap.add_argument("--kda-scenarios", default="T8192,8x1024,mixed6",
                    help="comma-separated subset of the KDA scenarios (each at H96 and H64)")  # fmt: skip
    ap.add_argument("--compile-reps", type=int, default=100,
                    help="timed calls per compile row (a near tie: see Llama.row)")  # fmt: skip
    ap.add_argument(
        "--merge",
        action="store_true",
        help="keep the rows of the report already in --out that this run does not measure "
        "(each says which run measured it): a report made over several shorter runs",
    )
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="a tiny config (tests)")
    ap.add_argument("--fp32", action="store_true", help="float32 weights (CPU tests)")
    ap.add_argument(
        "--fake-kernel", action="store_true", help="torch's rms_norm as the kernel (tests)"
    )
    args = ap.parse_args(argv)
    args.modes = set(args.modes.split(","))
    args.kda_scenarios = set(args.kda_scenarios.split(","))
    unknown = args.kda_scenarios - {name for _, name, _ in KDA_SCENARIOS}
    if unknown:
        ap.error(
            f"--kda-scenarios: unknown {sorted(unknown)}; the scenarios are T8192,8x1024,mixed6"
        )
    args.reps = args.reps or (20 if args.quick else 100)
    args.budget_s = args.budget_s or (200 if args.quick else 1800)
    args.prefill = [(1, 8192), (8, 1024)] if not args.tiny else [(1, 16), (2, 8)]
    args.decode = [(1, 1), (8, 1), (64, 1)]
    args.ctx = args.ctx if not args.tiny else 8
    args.train_tokens = args.train_tokens if not args.tiny else 16
    args.quick_compile = {("prefill", (1, 8192)), ("decode", (8, 1))}
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("model_bench: no CUDA GPU visible; run it on a GPU machine (or --device cpu --tiny)")
        return 3
    clock, budget, out = Clock(args.device), Budget(args.budget_s), Path(args.out)
    env, rows = environment(args), []
    kept = earlier_rows(out) if args.merge else []
    torch._dynamo.config.cache_size_limit = 64
    with contextlib.suppress(AttributeError):
        torch._dynamo.config.recompile_limit = 64

    t0 = time.monotonic()

    def emit(r, diagnostics=None):
        if diagnostics:
            env.setdefault("diagnostics", {}).update(diagnostics)
        if r is not None:
            r.setdefault("done_at_s", round(time.monotonic() - t0, 1))  # where the time went
            rows.append(r)
            sp = f" {r['speedup']:.3f}x" if r.get("speedup") else ""
            print(f"{r['model']} {r['phase']} {r['mode']} {r['shape']}: stock {r['stock_ms']} ms, "
                  f"ptxbuild {r['ptxbuild_ms']} ms{sp} {r.get('skipped') or r.get('error') or ''}", flush=True)  # fmt: skip
        write_report(out, env, merged(kept, rows))

    llama = None
    if args.modes & {"eager", "cudagraph", "compile", "train"}:
        try:
            llama = Llama(args, clock, emit)
        except Exception as exc:
            emit(row("llama", "setup", "-", [], error=_err(exc)))
    gpu_modes = ["cudagraph"] if clock.cuda else []
    if llama:
        llama.rows([m for m in ["eager", *gpu_modes] if m in args.modes], budget)
    if llama and "train" in args.modes:
        llama.train(budget)
    kda = "kda" in args.modes and clock.cuda
    chosen = [s for s in KDA_SCENARIOS if s[1] in args.kda_scenarios]
    first = [s for s in chosen if s[1] == "T8192"] if args.quick else chosen
    if kda:
        kda_rows(args, clock, budget, emit, first)
    if llama and clock.cuda and "compile" in args.modes:
        llama.rows(["compile"], budget)  # last: the decoder layers are compiled in place
    if kda and args.quick:
        kda_rows(args, clock, budget, emit, [s for s in chosen if s not in first])
    env["wall_s"] = round(time.monotonic() - t0, 1)
    rows = merged(kept, rows)
    write_report(out, env, rows)
    print(f"model_bench: {len(rows)} rows in {env['wall_s']} s -> {out}/report.json, report.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
