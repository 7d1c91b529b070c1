"""Reproducibility reports of a target's last build: Markdown + JSON under reports/<op>@<gpu>/."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import replace
from pathlib import Path

from ..problem import Problem, params_text
from ..records import BuildSummary, DispatchEntry, Manifest, Variant, dispatch_of, plain
from .environment import environment, utc_time
from .gates import closest_baseline, failures, judge, misses
from .manifest import read_manifest

EVERY_ROUND = {
    "min_speedup": 1.0,
    "speedup_evidence": "every_round",
}  # the gate that judges it, one logic


def _hm(ts: float | None) -> str:
    return time.strftime("%m-%d %H:%M", time.gmtime(ts)) if ts else "-"


def _timed_at(data: dict) -> list[float]:
    """When the winners' and baselines' timings were taken (where recorded; a cached timing keeps its original time)."""
    return [
        t
        for d in data["dispatch"]
        for t in [d.timed_at] + [b.get("timed_at") for b in (d.baselines or {}).values()]
        if t
    ]


def collect(kf, cache, target) -> dict | None:
    build = cache.last_build(str(target), kf.project)
    if build is None:
        return None
    summary = BuildSummary.from_json(json.loads(build["summary"]))
    # the build's artifacts stay on the machine that built them; the cache carries their dispatch table.
    # A manifest file at that path may come from another build (another machine's or an earlier
    # one), so the build's own copy wins; the file serves only builds recorded before it was kept.
    manifest = summary.report_manifest or (
        read_manifest(m).to_json() if (m := kf.root / build["manifest"]).is_file() else {}
    )
    attempts = cache.attempts(str(target), summary.run)
    by_outcome = Counter(a["outcome"] for a in attempts)
    rejected = Counter(
        (a["outcome"], (a["detail"] or "").split("\n")[0][:100])
        for a in attempts
        if a["outcome"] != "ok"
    )
    return {
        "target": str(target),
        "status": build["status"],
        "built_at": build["created"],
        "summary": summary,
        "environment": summary.environment or environment(kf.root),
        "dispatch": dispatch_of(manifest),
        "variants": {k: Variant.from_json(v) for k, v in manifest.get("variants", {}).items()},
        "candidates_by_outcome": dict(sorted(by_outcome.items())),
        "attempts": len(attempts),
        # in problem order, ties by text: the same for a build spread over GPUs, whichever finished first
        "timed": timed_candidates(attempts, [d.get("label") for d in manifest.get("dispatch", [])]),
        "rejected": [
            {"outcome": o, "detail": d, "count": n}
            for (o, d), n in sorted(rejected.items(), key=lambda kv: (-kv[1], kv[0]))[:15]
        ],
    }


TIMED_PER_PROBLEM = 6


def timed_candidates(attempts, order: list | None = None) -> list[dict]:
    """Per problem, the fastest TIMED_PER_PROBLEM verified and timed configs of the run (the losers are
    evidence too: what was tried, and by how much it lost), and how many more there were; problems
    in `order` (labels) first, in that order, then as they were first attempted."""
    by_problem: dict[str, dict[str, dict]] = {}
    for a in attempts:
        if a["outcome"] != "ok" or not a.get("p50_ms"):
            continue
        k = json.loads(a["problem"])
        label = Problem.make(k["op"], k["dtype"], k["shape"], k.get("options")).label()
        by_problem.setdefault(label, {}).setdefault(
            a["params"], {"params": json.loads(a["params"]), "p50_ms": a["p50_ms"]}
        )
    at = {label: i for i, label in enumerate(order or [])}
    out = []
    for label, rows in sorted(by_problem.items(), key=lambda kv: at.get(kv[0], len(at))):
        rs = sorted(rows.values(), key=lambda r: r["p50_ms"])
        out.append(
            {
                "label": label,
                "best": rs[:TIMED_PER_PROBLEM],
                "more": max(0, len(rs) - TIMED_PER_PROBLEM),
            }
        )
    return out


def _section(heading: str, *body: str) -> list[str]:
    """A Markdown section's lines: its heading between blank lines, then `body`."""
    return ["", heading, "", *body]


def _ms(v) -> str:
    return "-" if v is None or v != v else f"{v * 1000:.1f}"  # NaN: a baseline never timed


def _baseline_outcome(b: dict) -> str:
    """A baseline's outcome; one not ok with the first line of its detail (why it was not timed)."""
    why = (b.get("detail") or "").split("\n")[0].replace("|", "/")
    return b["outcome"] if b["outcome"] == "ok" or not why else f"{b['outcome']}: {why}"


def table_rows(data: dict) -> list[list[str]]:
    rows = []
    for d in data["dispatch"]:
        if d.params is None:
            rows.append([d.label, "NO VALID CANDIDATE", "-", "-", "-", ""])
            continue
        base = closest_baseline(d)
        frac = f"{d.floor_ms / d.p50_ms * 100:.0f}%" if d.p50_ms else "-"
        rows.append(
            [
                d.label,
                _ms(d.p50_ms),
                frac,
                _ms(base and base[2]),
                f"{base[0]:.2f}x" if base else "-",
                params_text(d.params),
            ]
        )
    return rows


HEAD = [
    "problem",
    "p50 (us)",
    "% of floor",
    "closest baseline (us)",
    "speed-up",
    "config",
]  # closest: the least speed-up


def _timings(s: BuildSummary) -> str:
    """Which of a build's timings were taken by that build (the report's `timings` line)."""
    since = s.timed_since if s.remeasure_resumed else None
    when = " in this run"
    if since:
        kept = "a rerun after an interruption keeps what the interrupted run timed"
        when = f" since {utc_time(since)} ({kept})"
    only = s.remeasured_only or []
    if s.remeasured and only:
        return (
            f"candidates and baselines of the problems matching {', '.join(f'`{o}`' for o in only)} "
            f"timed again{when} (`--remeasure-only`); the others come from the cache"
        )
    if s.remeasured:
        return f"every candidate and baseline timed{when} (`--remeasure`)"
    return (
        "timings of configs and baselines already measured on this GPU come from the "
        "cache (same GPU fingerprint and protocol); `--remeasure` times all again"
    )


def markdown(data: dict) -> str:
    s: BuildSummary = data["summary"]
    when_all = _timed_at(data)
    rows = table_rows(data)
    env = data["environment"]
    lines = [
        f"# {data['target']}",
        "",
        f"- status: **{data['status']}**; "
        + (
            "measured on hardware"
            if s.measured
            else "**not measured on hardware** (compiled and resource-checked only)"
        ),
        f"- problems built: {s.problems_done or '?'}"
        + (" (**interrupted**: rerun to finish)" if data["status"] == "interrupted" else ""),
        f"- reproduce: `{s.command}`",
        f"- kernelfile digest: `{s.kernelfile[:16]}`; architecture: `{s.arch}`; run `{s.run}`",
        "- toolchain: " + ", ".join(f"{k} {v}" for k, v in s.toolchain.items()),
        f"- environment: Python {env['python']} on {env['platform']}; git `{env['git_revision'] or 'n/a'}`"
        + (f"; ptxbuild code `{env['ptxbuild_code']}`" if env.get("ptxbuild_code") else ""),
        "- packages: " + ", ".join(f"{k} {v}" for k, v in env["packages"].items()),
    ]
    if hw := s.hardware:
        lines.append("- GPU: " + ", ".join(f"{k}={v}" for k, v in hw.items()))
        lines.append(
            f"- measured copy bandwidth: {s.copy_tbps:.3f} TB/s (floor = bytes moved / this)"
        )
        lines.append("- timings: " + _timings(s))
        lines.append(
            f"- timing protocol: version {s.protocol or '1 (recorded before reports named it)'} "
            "(`PROTOCOL_VERSION`; 2+: calls behind a gate, no host time; 3+: each call alone, as nvbench's cold)"
        )
        if s.memcheck:
            lines.append(f"- {s.memcheck}")
        if when_all:
            lines.append(
                f"- timed between {utc_time(min(when_all))} and {utc_time(max(when_all))} "
                "(the winners and baselines below; each row says when)"
            )
    m, g = s.metric or {}, s.gates or {}
    if m.get("value_ms") is not None:
        lines.append(
            f"- metric: {m['name']} = {m['value_ms'] * 1000:.1f} us over {m['problems']} timed problem(s)"
        )
    if g.get("declared"):
        verdict = (
            "not judged (not measured on hardware)"
            if not s.measured
            else f"**{len(g['failures'])} missed**"
            if g["failures"]
            else "all met"
        )
        lines.append(
            "- gates: " + ", ".join(f"{k} = {v}" for k, v in g["declared"].items()) + f": {verdict}"
        )
        lines += [f"  - {f}" for f in g["failures"]]
    timed = bool(when_all)
    head = HEAD + (["timed (UTC)"] if timed else [])
    lines += _section("## Results", "| " + " | ".join(head) + " |", "|" + "---|" * len(head))
    lines += [
        "| " + " | ".join(r + ([_hm(d.timed_at)] if timed else [])) + " |"
        for d, r in zip(data["dispatch"], rows)
    ]
    bouts = [
        (d.label, b) for d in data["dispatch"] for b in d.playoff or [] if b.get("leader_p50_ms")
    ]
    if bouts:
        gap = max(abs(b["p50_ms"] / b["leader_p50_ms"] - 1) for _, b in bouts)
        lines += [
            "",
            f"Playoff: in {len({lbl for lbl, _ in bouts})} problems the fastest config met the next ones within 2% "
            f"of it, each in one window, alternating ({len(bouts)} bouts, largest difference there {gap:.1%}); "
            f"a challenger won in {len({lbl for lbl, b in bouts if b['won']})} (`playoff` in report.json).",
        ]
    lines += proposed_section(data["dispatch"])
    base_rows = [(d.label, n, b) for d in data["dispatch"] for n, b in (d.baselines or {}).items()]
    if base_rows:
        one_run = s.remeasured and not s.remeasure_resumed and not s.remeasured_only
        lines += _section(
            f"## Baselines (same GPU{', same run' if one_run else ''}, same protocol)",
            "Where the winner was timed in the baseline's window (alternating, verification.md timing rule 4), "
            "its p50 there is given beside the baseline's, and the speed-up compares the two.",
            "",
            "| problem | baseline | outcome | p50 (us) | winner, same window (us) | p20-p80 (us) | samples |"
            + (" timed (UTC) |" if timed else ""),
            "|---|---|---|---:|---:|---:|---:|" + ("---|" if timed else ""),
        )
        lines += [
            f"| {lbl} | {n} | {_baseline_outcome(b)} | {_ms(b['p50_ms'])} | {_ms(b.get('winner_p50_ms'))} | "
            f"{_ms(b['p20_ms'])}-{_ms(b['p80_ms'])} | {b['samples']} |"
            + (f" {_hm(b.get('timed_at'))} |" if timed else "")
            for lbl, n, b in base_rows
        ]
    # judged on the timings, not on the table's rounded speed-up (0.996x would show as 1.00x)
    losses = [
        (d.label, b, d.baselines[b[1]].get("round_ratios"))
        for d in data["dispatch"]
        if (b := closest_baseline(d)) and b[0] < 1
    ]
    if losses:
        lines += _section(f"## Rows where it loses to a baseline ({len(losses)} of {len(rows)})")
        if any(rr for _, _, rr in losses):
            lines += [
                f"{len(failures(EVERY_ROUND, data['dispatch']))} of them lose in every round of a baseline's window, "
                'or were timed apart from it (`speedup_evidence = "every_round"` judges them so; each round: '
                "the baseline's p50 / the winner's); the others win at least one.",
                "",
            ]
        lines += [
            f"- {lbl}: {r:.3f}x {n} ({_ms(b)} against {_ms(p)} us)"
            + (f"; rounds {min(rr):.3f}-{max(rr):.3f}x" if rr else "")
            for lbl, (r, n, b, p), rr in losses
        ]
    lines += _section(
        "## Candidates",
        f"{data['attempts']} attempts this run: "
        + ", ".join(f"{k} {v}" for k, v in data["candidates_by_outcome"].items()),
    )
    if data["rejected"]:
        lines += ["", "| outcome | count | first line of evidence |", "|---|---:|---|"]
        lines += [
            f"| {r['outcome']} | {r['count']} | {r['detail'].replace('|', '/')} |"
            for r in data["rejected"]
        ]
    if data.get("timed"):
        lines += _section(
            "## Timed candidates (this run, fastest first)",
            "| problem | p50 (us) | vs fastest | config |",
            "|---|---:|---:|---|",
        )
        for t in data["timed"]:
            top = t["best"][0]["p50_ms"]
            lines += [
                f"| {t['label']} | {_ms(r['p50_ms'])} | {r['p50_ms'] / top:.2f}x | "
                f"{params_text(r['params'])} |"
                for r in t["best"]
            ]
            if t["more"]:
                lines.append(f"| {t['label']} | ... | | {t['more']} more |")
    lines += _section(
        "## Variants", "| entry | registers | spills | PTX ISA | files |", "|---|---:|---:|---|---|"
    )
    lines += [
        f"| {v.entry} | {v.registers} | {v.spill_bytes} | {v.ptx_isa} | {v.ptx}, {v.cubin} |"
        for v in data["variants"].values()
    ]
    lines += lessons_section(s, data)
    return "\n".join(lines) + "\n"


def proposed_section(dispatch: Sequence[DispatchEntry]) -> list[str]:
    """Per problem a proposer ran on (issue 31): each proposer's attempts by outcome, the winner
    (template or proposed, with its lineage) and a proposed winner's p50 in one window with the best
    template config (`factory` in report.json)."""
    rows = [(d.label, d.factory) for d in dispatch if d.factory]
    if not rows:
        return []
    out = _section(
        "## Proposed sources",
        "| problem | proposers: attempts by outcome | winner | "
        "same window: winner / best template (us) | speed-up |",
        "|---|---|---|---:|---:|",
    )
    for label, f in rows:
        who = "; ".join(
            f"`{c}`: " + ", ".join(f"{k} {n}" for k, n in sorted(o.items()))
            for c, o in f["proposers"].items()
        )
        lin, w = f.get("lineage") or {}, f.get("same_window") or {}
        won = (
            f"proposed `{lin.get('digest')}` (round {lin.get('round')}: {lin.get('edit')})"
            if lin
            else "template"
        )
        sp = f"{w['speedup']:.2f}x" if w.get("speedup") else "-"
        out.append(
            f"| {label} | {who} | {won} | {_ms(w.get('winner_p50_ms'))} / "
            f"{_ms(w.get('template_p50_ms'))} | {sp} |"
        )
    return out


def lessons_section(s: BuildSummary, data: dict) -> list[str]:
    """Which lessons the build used (seeds, failure rules that pruned) and which it produced."""
    used = list({u["lesson"]: u for u in s.lessons_used}.values())
    produced = s.lessons_produced or []
    lines = _section(
        "## Lessons",
        f"- used: {len(used)}; produced: {len(produced)}; candidates pruned by "
        f"failure rules: {data['candidates_by_outcome'].get('pruned', 0)}",
    )
    if n := s.lessons_shipped:
        lines.append(
            f"- shipped with ptxbuild: {n} of the {len(used)} used (its packaged lessons, imported "
            "into this new cache: the build starts from ptxbuild's own evidence)"
        )
    for u in used[:12]:
        sc = u["scope"]
        if u.get("kind") == "fails":
            p = params_text(u["rule"]["params"])
            lines.append(
                f"  - failure rule `{u['lesson']}`: {p} gives {u['rule']['outcome']} on {sc.get('arch')} "
                f"{sc.get('dtype')} (confidence {u['confidence']:.2f}): covered configs are not compiled"
            )
        else:
            lines.append(
                f"  - seed `{u['lesson']}` ({u.get('level', '')}, distance {u['distance']}; best on "
                f"{sc.get('gpu')} {sc.get('dtype')} {sc.get('shape')}): {u['params']}"
            )
    kinds = Counter(
        p["kind"] + (" weakened/retired" if p.get("weakened") else "") for p in produced
    )
    if kinds:
        lines.append("- produced: " + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())))
    picked = [d for d in data["dispatch"] if d.source in ("lesson", "default") and d.params]
    if picked and not s.measured:
        lines += _section(
            "### Config choice without hardware",
            "Not measured here: each problem takes the first config, nearest lesson first, that compiles "
            "within this GPU's limits (else the op's default).",
            "",
        )
        for d in picked:
            u = d.lesson
            why = (
                "no lesson applied; the op's documented default"
                if not u
                else (
                    f"lesson `{u['lesson']}`: "
                    + ("within 2% of the best" if u.get("role") == "near-best" else "best")
                    + f" on {u['scope'].get('gpu')} ({u['scope'].get('arch')}) for "
                    f"{u['scope'].get('dtype')} {u['scope'].get('shape')}, nearest scope ({u.get('level', '?')}, "
                    f"distance {u['distance']})"
                )
            )
            lines.append(f"- {d.label}: {params_text(d.params)} — {why}")
    return lines


def write_report(kf, cache, target, keep_newer: bool = False) -> Path | None:
    """The report of the cache's last build of `target`; None if never built, or (keep_newer: a re-render)
    if the report there comes from a later build that this cache lacks (its cache stayed where it ran)."""
    data = collect(kf, cache, target)
    if data is None:
        return None
    s: BuildSummary = data["summary"]
    if target.op in kf.ops:  # the kernelfile's metric and gates as they are now
        data["summary"] = s = replace(s, **judge(kf.ops[target.op], data["dispatch"], s.measured))
    out = kf.reports_dir / str(target)
    # a compile-only build keeps a GPU-measured build's report
    with suppress(OSError, ValueError, KeyError, TypeError):
        old = read_report(out / "report.json")
        if not s.measured and old["summary"].measured:
            out = out / "compile-only"
        elif keep_newer and old["built_at"] > data["built_at"] and old["summary"].run != s.run:
            return None
        elif not (s.measured or old["summary"].measured) and _verdict(old) == _verdict(data):
            return (
                out / "report.md"
            )  # a compile-only rebuild of the same kernels: the committed report stands
    return _save(out, data)


def read_report(path: Path) -> dict:
    """A report.json, its summary, dispatch table and variants as records."""
    data = json.loads(path.read_text())
    variants = {k: Variant.from_json(v) for k, v in data["variants"].items()}
    summary = BuildSummary.from_json(data["summary"])
    return {**data, "summary": summary, "dispatch": dispatch_of(data), "variants": variants}


def _save(out: Path, data: dict) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(plain(data), indent=1, sort_keys=True, default=str)
    (out / "report.json").write_text(text + "\n")
    (out / "report.md").write_text(markdown(data))
    return out / "report.md"


def _verdict(data: dict) -> tuple:
    """What a report says of its kernels: environment, times and the last float bits of the metric aside."""
    s = data["summary"]
    return (
        data["status"],
        [d.binary for d in data["dispatch"]],
        s.gates,
        (s.metric or {}).get("name"),
    )


def rejudge(kf, target, built: Manifest | None = None, rerender: bool = False) -> tuple[str, ...]:
    """Judge by the kernelfile's metric and gates as they are now: the report under reports/ by its own numbers
    (rewritten if its verdict moved, or `rerender`), and `built` (a manifest): its misses."""
    spec, path = kf.ops[target.op], kf.reports_dir / str(target) / "report.json"
    with suppress(OSError, ValueError, KeyError, TypeError):
        data = read_report(path)
        s = data["summary"]
        new = {**data, "summary": replace(s, **judge(spec, data["dispatch"], s.measured))}
        if rerender or _verdict(data) != _verdict(new):
            _save(path.parent, new)
    return misses(spec, built.dispatch, built.measured_on_hardware) if built else ()


def rerender(kf, cache, targets):
    """`ptxbuild report`: each target's report judged again by the kernelfile's gates, then written
    from the cache's last build; yields (target, data, path): data None where this cache has no build
    of it (a committed report is rendered again from its report.json), path None where the report
    there comes from a later build than this cache's last one (it is left as it is)."""
    for t in targets:
        data = collect(kf, cache, t)
        rejudge(kf, t, rerender=data is None)  # by this kernelfile's gates, whatever comes next
        yield t, data, None if data is None else write_report(kf, cache, t, keep_newer=True)
