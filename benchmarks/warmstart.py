"""Warm starts, measured offline: evaluations and seconds to reach within 2% of the best recorded config,
cold (random search from the op default, averaged over several seeds) vs warm (lessons from other
shapes / another GPU of the same architecture / other GPUs / a lessons file first, failure rules pruning).

    python benchmarks/warmstart.py RECORDING [--op rmsnorm] [--gpu h200] [--seeds 16] [--lessons FILE.jsonl]

RECORDING is a replay recording (`ptxbuild record OUT`) or a ptxbuild SQLite cache. Writes
lab/warmstart/warmstart.md and warmstart.json (or --out DIR) and prints the Markdown.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import replay  # noqa: E402  (benchmarks/replay.py)

from ptxbuild.problem import Problem  # noqa: E402
from ptxbuild.store import lessons  # noqa: E402
from ptxbuild.store.lessons_io import parse_lessons  # noqa: E402

BAR = 0.25  # warm must reach within 2% in at most this fraction of cold's evaluations (median over shapes)


def _mean(runs, attr):
    vals = [
        getattr(r, attr)
        if getattr(r, attr) is not None
        else (r.total if attr == "evaluations" else None)
        for r in runs
    ]
    vals = [v for v in vals if v is not None]
    return round(statistics.mean(vals), 3) if vals else None


def sources(rec, op, gpu, arch, problem, lesson_files):
    """(name, keep(row)) of each warm source for one target problem; empty sources are skipped."""
    pk = json.dumps(problem, sort_keys=True)
    out = [
        (
            "other shapes, same GPU",
            lambda r: r["gpu"] == gpu and json.dumps(r["problem"], sort_keys=True) != pk,
        ),
        ("same architecture, other GPU", lambda r: r["gpu"] != gpu and r["arch"] == arch),
    ]
    for g in sorted({r["gpu"] for r in rec.rows if r["op"] == op} - {gpu}):
        out.append((f"{g} targets", lambda r, g=g: r["gpu"] == g))
    out.append(
        (
            "everything but this problem",
            lambda r: not (r["gpu"] == gpu and json.dumps(r["problem"], sort_keys=True) == pk),
        )
    )
    for f in lesson_files:
        out.append((f"lessons file {Path(f).name}", lambda r: False))
    return out


def measure(rec, op, gpu, n_seeds, lesson_files, strategy, use_default=True, min_candidates=0):
    lesson_rows = {}
    for f in lesson_files:
        lesson_rows[Path(f).name] = [
            {
                "id": x.id,
                "op": x.op,
                "kind": x.kind,
                "scope": json.dumps(x.scope_dict(), sort_keys=True),
                "rule": json.dumps(x.rule_dict(), sort_keys=True),
                "evidence": "[]",
                "confidence": x.confidence,
                "source": f"file {Path(f).name}",
                "retired": int(x.retired),
                "created": x.created,
            }
            for x in parse_lessons(Path(f).read_bytes(), Path(f).name)
            if x.op == op
        ]
    rows = []
    for g, arch, problem in rec.problems(op, gpu):
        rp = replay.Replayer(rec, op, g, problem)
        if len(rp.table) < min_candidates:
            continue  # the build's own few tries, picked by lessons: not a sample a cold search can be judged on
        default = replay.default_of(rec, op, problem) if use_default else None
        base = [default] if default else []
        cold = [
            replay.replay_search(rec, op, g, problem, strategy=strategy, seeds=base, rng_seed=s)
            for s in range(n_seeds)
        ]
        rand = (
            cold
            if strategy == "random"
            else [
                replay.replay_search(rec, op, g, problem, strategy="random", seeds=base, rng_seed=s)
                for s in range(n_seeds)
            ]
        )
        row = {
            "problem": problem,
            "label": Problem.make(
                op, problem["dtype"], tuple(problem["shape"]), problem.get("options") or {}
            ).label(),
            "best_ms": rp.best_ms(),
            "candidates": len(rp.table),
            "cold": {
                "evaluations": _mean(cold, "evaluations"),
                "seconds": _mean(cold, "seconds"),
                "never": sum(r.evaluations is None for r in cold),
            },
            "cold_random": {
                "evaluations": _mean(rand, "evaluations"),
                "seconds": _mean(rand, "seconds"),
            },
            "warm": {},
        }
        seen_sets = set()
        for name, keep in sources(rec, op, g, arch, problem, lesson_files):
            extra = (
                lesson_rows.get(name.removeprefix("lessons file "), [])
                if name.startswith("lessons file")
                else []
            )
            kept = frozenset(i for i, r in enumerate(rec.rows) if r["op"] == op and keep(r))
            if not kept and not extra:
                continue
            if not extra and kept in seen_sets:
                continue
            seen_sets.add(kept)
            cache = replay.lessons_cache(rec, op, keep, extra)
            seeds, used, rules = replay.warm_start(cache, rec, op, g, problem)
            warm = [
                replay.replay_search(
                    rec,
                    op,
                    g,
                    problem,
                    strategy=strategy,
                    seeds=lessons.order_seeds(seeds, used, default),
                    rules=rules,
                    rng_seed=s,
                )
                for s in range(n_seeds)
            ]
            row["warm"][name] = {
                "evaluations": _mean(warm, "evaluations"),
                "seconds": _mean(warm, "seconds"),
                "never": sum(r.evaluations is None for r in warm),
                "unrecorded_seeds": sum(
                    1 for s in seeds if json.dumps(s, sort_keys=True) not in rp.table
                ),
                "seeds_from": [
                    {
                        "lesson": u["lesson"],
                        "level": u["level"],
                        "distance": u["distance"],
                        "role": u.get("role", "winner"),
                        "params": u["params"],
                    }
                    for u in used
                ],
                "rules_used": sorted(set().union(*(r.rules_used for r in warm))),
            }
        rows.append(row)
    return rows


def summarize(rows):
    names = sorted(
        {n for r in rows for n in r["warm"]},
        key=lambda n: [x for r in rows for x in r["warm"]].index(n),
    )
    cold = statistics.median(r["cold"]["evaluations"] for r in rows)
    cold_s = statistics.median(r["cold"]["seconds"] or 0 for r in rows)
    out = {
        "cold": {"median_evaluations": cold, "median_seconds": cold_s},
        "cold_random": {
            "median_evaluations": statistics.median(r["cold_random"]["evaluations"] for r in rows),
            "median_seconds": statistics.median(r["cold_random"]["seconds"] or 0 for r in rows),
        },
        "warm": {},
    }
    for n in names:
        have = [r for r in rows if n in r["warm"]]
        ev = statistics.median(r["warm"][n]["evaluations"] for r in have)
        # the ratio over the same shapes the source covers
        c = statistics.median(r["cold"]["evaluations"] for r in have)
        out["warm"][n] = {
            "shapes": len(have),
            "median_evaluations": ev,
            "median_seconds": statistics.median(r["warm"][n]["seconds"] or 0 for r in have),
            "median_cold_evaluations": c,
            "fraction_of_cold": round(ev / c, 3) if c else None,
            "fraction_interval_90": interval(
                [(r["warm"][n]["evaluations"], r["cold"]["evaluations"]) for r in have]
            ),
            "meets_bar": bool(c) and ev / c <= BAR,
        }
    return out


def interval(pairs, resamples: int = 2000, seed: int = 0) -> list[float]:
    """5th and 95th percentile of median(warm) / median(cold) over shapes resampled with replacement:
    how much the verdict depends on which shapes happen to be in the recording."""
    rng = random.Random(seed)
    ratios = []
    for _ in range(resamples):
        pick = [rng.choice(pairs) for _ in pairs]
        cold = statistics.median(c for _, c in pick)
        ratios.append(statistics.median(w for w, _ in pick) / cold if cold else math.inf)
    ratios.sort()
    return [
        round(ratios[int(0.05 * (resamples - 1))], 3),
        round(ratios[int(0.95 * (resamples - 1))], 3),
    ]


def markdown(meta, rows, summary):
    names = list(summary["warm"])
    lines = [f"# Warm starts vs cold search: {meta['op']}@{meta['gpu']}", ""]
    if meta["synthetic"]:
        lines += [
            "**SYNTHETIC recording** (generated by `benchmarks/synthetic_recording.py`, not measured on a GPU): "
            "this output checks the script, it is not evidence about real kernels.",
            "",
        ]
    lines += [
        f"- recording: `{meta['recording']}` ({meta['rows']} recorded configs)",
        f"- reproduce: `{meta['command']}`",
        f"- cold: `{meta['strategy']}` search (the build's strategy) over the recorded candidates, op default "
        f"first when the recording has it, mean over {meta['seeds']} random seeds; cold random: the same with "
        f"random order; warm: lesson seeds of this exact scope, then the default, then up to 4 nearer-scope lesson seeds, failure rules "
        f"prune, then the same `{meta['strategy']}` search (same random seeds)",
        *(
            [
                f"- **benchmark shapes: those with at least {meta['min_candidates']} recorded configs** (the sweep's "
                "random sample plus every build's tries); elsewhere the recording holds only the ~10 configs a "
                "build tried, picked by lessons, so a cold search over them is not cold"
            ]
            if meta.get("min_candidates")
            else []
        ),
        *(
            [
                "- **without the op default**: cold and warm both start with no hand-written config; this measures "
                "lessons against no prior at all"
            ]
            if meta.get("without_default")
            else []
        ),
        "- target: the first config within 2% of the best recorded p50 of that problem on this GPU; "
        "a config the recording lacks counts as an evaluation that failed",
        f"- bar: median warm evaluations <= {BAR:.0%} of median cold evaluations",
        "",
        "## Summary (median over shapes)",
        "",
        "| start | shapes | evaluations to 2% | seconds to 2% | fraction of cold | 90% interval (shapes resampled) | bar |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    c = summary["cold"]
    lines.append(
        f"| cold | {len(rows)} | {c['median_evaluations']:.1f} | {c['median_seconds']:.2f} | 100% | | |"
    )
    c = summary["cold_random"]
    lines.append(
        f"| cold random (reference) | {len(rows)} | {c['median_evaluations']:.1f} | {c['median_seconds']:.2f} | "
        f"{c['median_evaluations'] / summary['cold']['median_evaluations']:.0%} | | |"
    )
    for n, w in summary["warm"].items():
        lines.append(
            f"| warm: {n} | {w['shapes']} | {w['median_evaluations']:.1f} | {w['median_seconds']:.2f} | "
            f"{w['fraction_of_cold']:.0%} | {w['fraction_interval_90'][0]:.0%}-{w['fraction_interval_90'][1]:.0%} | "
            f"{'PASS' if w['meets_bar'] else 'FAIL'} |"
        )
    lines += [
        "",
        "## Per shape (evaluations to 2%, mean over seeds; seconds in parentheses)",
        "",
        "| problem | best p50 (us) | candidates | cold | " + " | ".join(names) + " |",
        "|---|---:|---:|---:|" + "---:|" * len(names),
    ]
    for r in rows:
        cells = []
        for n in names:
            w = r["warm"].get(n)
            cells.append(
                "-"
                if w is None
                else f"{w['evaluations']:.1f} ({w['seconds'] or 0:.2f})"
                + (f" [{w['never']} never]" if w["never"] else "")
            )
        lines.append(
            f"| {r['label']} | {r['best_ms'] * 1000:.1f} | {r['candidates']} | "
            f"{r['cold']['evaluations']:.1f} ({r['cold']['seconds'] or 0:.2f}) | "
            + " | ".join(cells)
            + " |"
        )
    lines += ["", "## Lessons used (first shape)", ""]
    if rows:
        for n, w in rows[0]["warm"].items():
            seeds = "; ".join(
                f"{s['role']} of `{s['lesson']}` ({s['level']}, distance {s['distance']})"
                for s in w["seeds_from"]
            )
            lines.append(
                f"- {n}: seeds {seeds or 'none'}; failure rules that pruned: "
                f"{', '.join('`' + x + '`' for x in w['rules_used']) or 'none'}"
            )
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recording")
    ap.add_argument("--op", default=None, help="default: rmsnorm if recorded, else the only op")
    ap.add_argument(
        "--gpu", default=None, help="default: h200 if recorded, else the GPU with most problems"
    )
    ap.add_argument("--seeds", type=int, default=16, help="random seeds averaged for every search")
    ap.add_argument(
        "--strategy",
        default="evolutionary",
        choices=["evolutionary", "random"],
        help="the search both cold and warm runs use",
    )
    ap.add_argument(
        "--lessons",
        action="append",
        default=[],
        help="a lessons JSONL file as one more warm source",
    )
    ap.add_argument("--out", default="lab/warmstart", help="output folder")
    ap.add_argument(
        "--without-default",
        action="store_true",
        help="neither cold nor warm starts from the op's hand-written default config: measures what "
        "lessons add over no prior at all (the default is itself prior knowledge)",
    )
    ap.add_argument(
        "--min-candidates",
        type=int,
        default=0,
        help="benchmark only problems with at least this many recorded configs (a sample of the space)",
    )
    a = ap.parse_args(argv)
    rec = replay.load_recording(a.recording)
    ops = sorted({r["op"] for r in rec.rows})
    op = a.op or ("rmsnorm" if "rmsnorm" in ops else (ops[0] if len(ops) == 1 else None))
    if op not in ops:
        sys.exit(f"error: --op {a.op or '?'}: recorded ops are {', '.join(ops) or 'none'}")
    gpus = {}
    for g, _, _ in rec.problems(op):
        gpus[g] = gpus.get(g, 0) + 1
    gpu = a.gpu or ("h200" if "h200" in gpus else max(gpus, key=gpus.get, default=None))
    if gpu not in gpus:
        sys.exit(
            f"error: --gpu {a.gpu or '?'}: GPUs with measured {op} data are {', '.join(sorted(gpus)) or 'none'}"
        )
    t0 = time.time()
    rows = measure(
        rec,
        op,
        gpu,
        a.seeds,
        a.lessons,
        a.strategy,
        use_default=not a.without_default,
        min_candidates=a.min_candidates,
    )
    if not rows:
        sys.exit(
            f"error: no {op}@{gpu} problem has {a.min_candidates} or more recorded configs (--min-candidates)"
        )
    summary = summarize(rows)
    meta = {
        "recording": a.recording,
        "op": op,
        "gpu": gpu,
        "seeds": a.seeds,
        "strategy": a.strategy,
        "rows": len(rec.rows),
        "without_default": a.without_default,
        "min_candidates": a.min_candidates,
        "synthetic": bool(rec.header.get("synthetic")),
        "bar": BAR,
        "seconds": round(time.time() - t0, 2),
        "command": "python benchmarks/warmstart.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    md = markdown(meta, rows, summary)
    (out / "warmstart.md").write_text(md)
    (out / "warmstart.json").write_text(
        json.dumps({"meta": meta, "summary": summary, "shapes": rows}, indent=1, sort_keys=True)
        + "\n"
    )
    print(md, end="")
    return summary


if __name__ == "__main__":
    main()
