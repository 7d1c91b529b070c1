"""Where the short bf16 rows lose ~1 us to a plain copy: a fixed cost per launch, or a slower stream?

    python3 benchmarks/short_row_overhead.py [--report reports/rmsnorm@h200/report.json] [--rotate]
        [--flush fill|memset|read] [--kinds copy1,winner,...] [--batch 32] [--settle-us U] [--idle-us U]
        [--ns 256,512] [--ms 8192,32768] [--out FILE]

At N = 256 / 512 / 1K / 2K the built RMSNorm runs 0.8-1.3 us slower than `copy1` (one 16-byte load
and store per thread) moving the same bytes (lab/bf16/copy-floor.md): about the same microsecond
at every N. This script times, for each N, the report's winner for 32768 x N (an exact variant: it
serves any M) and copy1 at several M (a 256 MiB L2 flush before each call, CUDA events, median of
--reps; the call synchronized after each, unlike the build), and fits time = fixed + per_row * M by
least squares. Equal slopes and a larger
intercept mean a fixed cost (launch, the first round trip, the drain); a larger slope means the
kernel streams more slowly. Two variants of the winner separate causes:
  copy1         a plain copy of the same bytes (x and, with --residual, the residual in; y and h out)
  no-weight     the same config with weight = none (no weight loads at all)
  min_blocks=2  the winner with min_blocks raised to 2 where the config allows it
  torch_compile the op's torch.compile baseline (ops/rmsnorm/baselines.py), as the build times it
  triton_ptx    that baseline's Triton kernel from its PTX (--triton-ptx N=FILE), launched by cupy with
                one warp per CTA (M = 32768 only), assembled for the PTX's own .target
  triton_ptx+E  the same PTX edited first, to bisect what its speed comes from (E, '+'-joined):
                plainw (weight loads without its L1/L2 evict_last hints), cs (stores st.global.cs,
                as our store_cs=true), noreq (no .reqntid), nc (x / residual loads ld.global.nc, as our
                load_hint=nc)
  winner+NAME=V the winner compiled with -DNAME=V (e.g. winner+FAST_FRONT=1: an
                experimental path of rmsnorm.cu that op.py does not select yet)
  winner:K=V    the winner with search parameter K set to V (e.g. winner:store_cs=false; may be
                combined with +NAME=V after it)
--rotate: each call takes the next of ceil(2 x L2 / set) + 1 input/output sets, as the build's timing
does (ptxbuild/gpu/runs.py, verification.md's timing rule 2); without it every call reuses one set
(the L2 is flushed either way). The difference is what the rotation itself costs a kernel.
--flush: how the L2 is flushed before each call (256 MiB either way): `fill` cupy's fill(0) kernel (the
other benchmark scripts), `memset` cudaMemsetAsync with a byte that changes every call (what the build
does, ptxbuild/gpu/runs.py), `read` a sum over the buffer (evicts the L2 and leaves no dirty lines).
--batch: calls enqueued before the host waits (default 1: synchronized after each call; the build
enqueued 32 behind a gate up to protocol 2). --cold: the host waits for each flush too, then
enqueues the call (protocol 3, nvbench's cold measurement); add --gate, as the build does, or the
host's launch time counts. --settle-us / --idle-us: a spin kernel of that many microseconds (no memory
traffic) after each flush / before each flush, to tell the flush's own tail from the previous call's.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "ops" / "rmsnorm"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from copy_floor import SRC as COPY_SRC  # noqa: E402  (copy1: one 16-byte load and store per thread)
from event_timing import event_times_us, quantile  # noqa: E402

from ptxbuild.problem import Problem  # noqa: E402

NS = [256, 512, 1024, 2048]
# kind triton_ptx+E: edits of Triton's PTX (each must match something)
PTX_EDITS = {
    "plainw": lambda p: re.sub(
        r"ld\.global\.L1::evict_last\.L2::cache_hint\.(v4\.b32 \{[^}]*\}, \[ %rd\d+ \+ 0 \]), %rd\d+;",
        r"ld.global.\1;",
        p,
    ),
    "cs": lambda p: p.replace("st.global.v4.b32", "st.global.cs.v4.b32"),
    "noreq": lambda p: re.sub(r"^\.reqntid \d+\s*$", "", p, flags=re.M),
    "nc": lambda p: p.replace("ld.global.v4.b32", "ld.global.nc.v4.b32"),
}
MS = [8192, 16384, 32768, 65536, 131072]


def fit(ms: list[int], ts: list[float]) -> tuple[float, float]:
    """Least-squares (intercept us, slope us per 1K rows)."""
    n = len(ms)
    mx, my = sum(ms) / n, sum(ts) / n
    sxx = sum((m - mx) ** 2 for m in ms)
    b = sum((m - mx) * (t - my) for m, t in zip(ms, ts)) / sxx
    return my - b * mx, b * 1024


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--report", type=Path, default=ROOT / "reports/rmsnorm@h200/report.json")
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--out", type=Path, help="also write the table here (markdown)")
    ap.add_argument(
        "--rotate", action="store_true", help="rotate input/output sets as the build does"
    )
    ap.add_argument("--kinds", default="copy1,winner,no-weight,min_blocks=2")
    ap.add_argument("--flush", choices=["fill", "memset", "read"], default="fill")
    ap.add_argument("--batch", type=int, default=1, help="calls enqueued before the host waits")
    ap.add_argument(
        "--cold",
        action="store_true",
        help="wait for each flush before enqueueing the call (the build's protocol 3)",
    )
    ap.add_argument(
        "--triton-ptx",
        action="append",
        default=[],
        metavar="N=FILE",
        help="kind triton_ptx: the PTX torch.compile's Triton generated for 32768 x N, timed "
        "through this script's launcher (repeat for several N)",
    )
    ap.add_argument(
        "--gate",
        action="store_true",
        help="hold the stream behind ptxbuild's gate while each call is enqueued (as the build)",
    )
    ap.add_argument("--settle-us", type=float, default=0.0, help="spin this long after each flush")
    ap.add_argument("--idle-us", type=float, default=0.0, help="spin this long before each flush")
    ap.add_argument(
        "--fixed-out",
        action="store_true",
        help="with --rotate: rotate the inputs only; every call writes one output set (as a "
        "torch baseline does: its caching allocator hands back the same block)",
    )
    ap.add_argument(
        "--dtype", default="bfloat16", help="rows of this dtype (winner / torch_compile kinds)"
    )
    ap.add_argument(
        "--residual",
        action="store_true",
        help="the fused-residual rows (winner / torch_compile kinds)",
    )
    ap.add_argument("--ns", default=",".join(map(str, NS)))
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    a = ap.parse_args(argv)
    mode = {"residual": True} if a.residual else {}
    ns, ms = [int(v) for v in a.ns.split(",")], [int(v) for v in a.ms.split(",")]

    if "torch_compile" in a.kinds:
        import torch  # noqa: F401  first: imported after a Triton cubin was loaded, torch 2.11 failed to
        #               start once (a mangled op schema at import; run 18a)
    import cupy as cp
    from event_timing import spinner
    from selftest_gpu import arch_of

    from ptxbuild.compile.compiler import compile_kernel
    from ptxbuild.gpu import device
    from ptxbuild.oploader import load_op

    op = load_op("rmsnorm", ROOT)
    arch = arch_of(cp)
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    copy1 = cp.RawModule(code=COPY_SRC).get_function("copy1")
    buf = cp.zeros(256 << 20, dtype=cp.uint8)
    count = {"n": 0}

    def memset():
        count["n"] += 1
        cp.cuda.runtime.memsetAsync(
            buf.data.ptr, count["n"] & 0xFF, buf.nbytes, cp.cuda.get_current_stream().ptr
        )

    flush = {
        "fill": buf,
        "memset": memset,
        "read": lambda: buf.view(cp.uint32).sum(dtype=cp.uint32),
    }[a.flush]
    l2 = cp.cuda.Device().attributes["L2CacheSize"]
    settle, idle = spinner(cp, a.settle_us), spinner(cp, a.idle_us)
    from ptxbuild.gpu.gate import Gate

    gate = Gate(cp) if a.gate else None

    def sets_for(nbytes: int) -> int:
        return (-(-2 * l2 // nbytes) + 1) if a.rotate else 1

    def rotating(fns: list):
        state = {"i": 0}

        def call():
            fns[state["i"] % len(fns)]()
            state["i"] += 1

        return call

    winners = {
        tuple(d["problem"]["shape"]): d["params"]
        for d in json.loads(a.report.read_text())["dispatch"]
        if d["problem"]["dtype"] == a.dtype
        and (d["problem"].get("options") or {}) == mode
        and d.get("params")
    }

    def ours(n: int, opts: dict, extra: dict, defines: tuple = ()):
        params = op._full({**winners[(32768, n)], **extra})
        problem = Problem.make("rmsnorm", a.dtype, (32768, n), {**mode, **opts})
        if op.check(params, problem):
            return None
        b = compile_kernel(op.render(params, problem, arch).with_defines(*defines), arch)
        kern = device.load(b.entry, b.cubin, b.ptx)

        def run_at(m: int):
            pm = problem.with_shape((m, n))
            geom, stream = op.launch(params, pm, sms), cp.cuda.get_current_stream()
            fns, out0 = [], op.make_outputs(pm, cp)
            for k in range(sets_for(op.bytes_moved(pm))):
                inputs, outputs = (
                    op.make_inputs(pm, k, cp),
                    (out0 if a.fixed_out else op.make_outputs(pm, cp)),
                )
                args = op.kernel_args(params, pm, inputs, outputs)
                fns.append(lambda args=args: device.launch(kern, geom, args, stream))
            return rotating(fns)

        return run_at

    def torch_at(n: int):
        fn = op.baselines(Problem.make("rmsnorm", a.dtype, (32768, n), mode))["torch_compile"]

        def run_at(m: int):
            pm = Problem.make("rmsnorm", a.dtype, (m, n), mode)
            sets = [op.make_inputs(pm, k, cp) for k in range(sets_for(op.bytes_moved(pm)))]
            for s in sets:  # compiled and traced before timing, as the build primes each set
                fn(s)
            return rotating([lambda s=s: fn(s) for s in sets])

        return run_at

    def triton_at(n: int, edits: tuple = ()):
        """torch.compile's own kernel (from its PTX: x, weight, y, xnumel, rnumel, two scratch
        pointers; with --residual x, residual, weight, residual_out, y; M and N are baked in)
        launched by cupy: tells its code from torch's launch path."""
        import numpy as np

        from ptxbuild.compile.compiler import ptx_to_cubin

        files = dict(v.split("=", 1) for v in a.triton_ptx)
        if str(n) not in files:
            return None
        ptx = Path(files[str(n)]).read_text()
        for e in edits:
            before = ptx
            ptx = PTX_EDITS[e](ptx)
            if ptx == before:
                raise SystemExit(
                    f"kind triton_ptx+{e}: the edit matched nothing in {files[str(n)]}"
                )
        target = re.search(r"^\.target (\w+)", ptx, re.M).group(1)  # Triton writes sm_90a
        entry = re.search(r"\.entry (\w+)\(", ptx).group(1)
        cta = re.search(r"mov\.u32\s+(%r\d+), %ctaid\.x;", ptx).group(
            1
        )  # elements per CTA: ctaid << k
        per_cta = 1 << int(re.search(rf"shl\.b32\s+%r\d+, {re.escape(cta)}, (\d+);", ptx).group(1))
        if per_cta % n:  # the shift is rows per CTA, not elements: the grid would be wrong
            raise SystemExit(
                f"kind triton_ptx: cannot tell the rows per CTA from {files[str(n)]} (ctaid << {per_cta})"
            )
        kern = device.load(entry, ptx_to_cubin(ptx, target if target.startswith(arch) else arch)[0])

        def run_at(m: int):
            if m != 32768:
                raise SystemExit(
                    "kind triton_ptx: torch.compile built its kernel for M = 32768 only; pass --ms 32768"
                )
            pm = Problem.make("rmsnorm", a.dtype, (m, n), mode)
            fns = []
            for k in range(sets_for(op.bytes_moved(pm))):
                x, y = op.make_inputs(pm, k, cp), op.make_outputs(pm, cp)
                ptrs = (
                    (x["x"], x["residual"], x["weight"], y["residual_out"], y["y"])
                    if a.residual
                    else (x["x"], x["weight"], y["y"])
                )
                args = (*ptrs, np.uint32(m), np.uint32(n), np.uint64(0), np.uint64(0))
                fns.append(lambda args=args: kern((m * n // per_cta,), (32,), args))
            return rotating(fns)

        return run_at

    def copy_at(n: int):
        def run_at(m: int):
            nv = (
                m * n * (4 if a.dtype == "float32" else 2) * (2 if a.residual else 1) // 16
            )  # x (+ residual) in, y (+ h) out
            grid = (nv + 255) // 256
            fns, dst0 = [], cp.empty(nv * 4, dtype=cp.uint32)
            for _ in range(sets_for(2 * nv * 16)):
                src, dst = (
                    cp.ones(nv * 4, dtype=cp.uint32),
                    (dst0 if a.fixed_out else cp.empty(nv * 4, dtype=cp.uint32)),
                )
                fns.append(
                    lambda src=src, dst=dst: copy1((grid,), (256,), (src, dst, cp.int64(nv)))
                )
            return rotating(fns)

        return run_at

    what = f"{a.dtype}{' residual' if a.residual else ''}"
    lines = [
        f"# Short {what} rows: fixed cost or slower stream? (NVIDIA H200)",
        "",
        f"- reproduce: `python3 benchmarks/short_row_overhead.py --report {a.report.relative_to(ROOT) if a.report.is_absolute() else a.report}"
        f"{' --rotate' if a.rotate else ''}{' --fixed-out' if a.fixed_out else ''} --flush {a.flush} --kinds {a.kinds} --batch {a.batch}"
        f" --settle-us {a.settle_us:g} --idle-us {a.idle_us:g}{' --cold' if a.cold else ''}{' --gate' if a.gate else ''}"
        f"{'' if a.dtype == 'bfloat16' else ' --dtype ' + a.dtype}{' --residual' if a.residual else ''} --ns {a.ns} --ms {a.ms}"
        + "".join(f" --triton-ptx {v}" for v in a.triton_ptx)
        + "`",
        f"- each kernel at M = {', '.join(map(str, ms))}; a 256 MiB L2 flush (`--flush {a.flush}`) before each call; "
        f"CUDA events; median of {a.reps}",
        f"- pacing: {'the flush waited for, then the call alone (cold)' if a.cold else 'synchronized after every call' if a.batch == 1 else f'{a.batch} calls enqueued, then a wait'}"
        f"; spin {a.idle_us:g} us before / {a.settle_us:g} us after each flush"
        + ("; each call enqueued behind a gate (ptxbuild/gpu/gate.py)" if a.gate else ""),
        "- input/output sets: "
        + (
            "rotated, ceil(2 x L2 / set) + 1 of them, as the build times"
            if a.rotate
            else "one, reused by every call (the L2 flushed before each)"
        )
        + ("; one output set written by every call" if a.fixed_out else ""),
        "- fit: time = fixed + per_1K_rows x M / 1024 (least squares over the M)",
        "",
        "| N | kernel | "
        + " | ".join(f"M={m} (us)" for m in ms)
        + " | fixed (us) | per 1K rows (us) |",
        "|---|---|" + "---:|" * (len(ms) + 2),
    ]
    for n in ns:
        make = {
            "copy1": lambda: copy_at(n),
            "winner": lambda: ours(n, {}, {}),
            "no-weight": lambda: ours(n, {"weight": "none"}, {}),
            "min_blocks=2": lambda: ours(n, {}, {"min_blocks": 2}),
            "torch_compile": lambda: torch_at(n),
            "triton_ptx": lambda: triton_at(n),
        }
        for k in a.kinds.split(","):  # winner[:K=V...][+NAME=V...]; triton_ptx+EDIT+...
            base, *defs = k.split("+")
            if base.startswith("winner:"):
                extra = {
                    kk: json.loads(v) if v in ("true", "false") or v.isdigit() else v
                    for kk, v in (kv.split("=", 1) for kv in base.split(":")[1:])
                }
                make[k] = lambda extra=extra, defs=tuple(defs): ours(n, {}, extra, defs)
            elif base == "winner" and defs:
                make[k] = lambda defs=tuple(defs): ours(n, {}, {}, defs)
            elif base == "triton_ptx" and defs:
                make[k] = lambda defs=tuple(defs): triton_at(n, defs)
        kinds = [(k, make[k]()) for k in a.kinds.split(",")]
        for name, run_at in kinds:
            if run_at is None:
                continue
            ts = []
            for m in ms:
                fn = run_at(m)
                ts.append(
                    quantile(
                        event_times_us(cp, fn, flush, a.reps, a.batch, settle, idle, a.cold, gate),
                        0.5,
                    )
                )
                cp.get_default_memory_pool().free_all_blocks()
            c0, c1 = fit(ms, ts) if len(ms) > 1 else (float("nan"), float("nan"))
            row = (
                f"| {n} | {name} | "
                + " | ".join(f"{t:.1f}" for t in ts)
                + f" | {c0:.2f} | {c1:.3f} |"
            )
            print(row, flush=True)
            lines.append(row)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
