"""The factory's rounds (issue 31): proposers get a task, answer with candidate sources, and each
candidate goes through the build's own Evaluator (compile -> resources -> verify -> time -> cache),
its result sent back as feedback and kept as an `edit` lesson (what edit helped, hurt or failed, and
why). The protocol's messages are in ptxbuild/search/proposer.schema.json and README.md."""

from __future__ import annotations

import inspect
import json
from collections import Counter
from contextlib import closing

from ..problem import SOURCE_PARAM, Problem, op_params, params_text
from ..search.proposals import (
    MAX_CANDIDATES,
    EditError,
    ProposalError,
    Proposer,
    apply_edits,
    candidate_errors,
    source_digest,
)
from ..search.strategies import best, config_key
from ..store import lessons
from . import beside
from .context import Context
from .deep import explain_log

ATTEMPTS_IN_TASK = 24  # the most recent attempts of the problem a task carries
LESSONS_IN_TASK = 24


def proposers_of(ctx: Context, search: dict) -> tuple[list[str], int]:
    """The proposer commands and rounds of a target: the run's (ptxbuild try) or the kernelfile's."""
    return list(ctx.proposers or search.get("proposers") or ()), ctx.rounds or search.get(
        "rounds", 1
    )


def task(ctx: Context, ev, problem: Problem, hist: list, rnd: int, rounds: int, cmd: str) -> dict:
    """What a proposer is told: the op, the problem, the GPU, the reference's source, the template
    (its SPACE, default and rendered source), the incumbent with its time and % of floor, recent
    attempts with their evidence, the edit lessons, the budget."""
    op, arch, inc, hw = ev.op, ev.gpu.arch, best(hist), bool(ev.hw)
    default = op.default_params(problem)
    floor = op.bytes_moved(problem) / ((ctx.gpu.copy_tbps if hw else ev.gpu.dram_tbps) * 1e9)
    try:
        ref = inspect.getsource(getattr(op, "module", op).reference)  # the module form's own
    except (OSError, TypeError, AttributeError):
        ref = ""
    kern = op.render(default, problem, arch)
    keep = ("params", "outcome", "detail", "p50_ms")
    return dict(
        round=rnd,
        rounds=rounds,
        proposer=cmd,
        op=op.NAME,
        target=str(ev.t),
        reference=ref,
        problem={**problem.key(), "label": problem.label()},
        gpu=dict(name=ev.gpu.name, arch=arch, sm_count=ev.gpu.sm_count, measured=hw),
        template=dict(space=op.SPACE, default_params=default, entry=kern.entry, source=kern.source),
        incumbent=inc
        and dict(
            params=inc[0],
            source=op.render(inc[0], problem, arch).source,
            p50_ms=inc[1] if hw else None,
            fraction_of_floor=floor / inc[1] if hw and inc[1] else None,
        ),
        floor_ms=floor,
        bytes_moved=op.bytes_moved(problem),
        attempts=[
            {k: r.get(k) for k in keep} for r in list(ev.results.values())[-ATTEMPTS_IN_TASK:]
        ],
        lessons=edit_lessons(ctx.cache, op.NAME, arch),
        budget={"candidates": MAX_CANDIDATES, "rounds_left": rounds - rnd},
    )


def edit_lessons(cache, op_name: str, arch: str, limit: int = LESSONS_IN_TASK) -> list[dict]:
    """The newest `edit` lessons of the op on this architecture, as a task carries them."""
    rows = cache.recent_lessons(op_name, "edit", arch, limit)
    return [{"scope": json.loads(r["scope"]), **json.loads(r["rule"])} for r in rows]


def materialize(ev, problem: Problem, c, meta: dict, inc=None) -> tuple[dict | None, str]:
    """A reply's candidate as a config naming its stored source, or (None, why it is not one)."""
    if why := candidate_errors(c):
        return None, why
    op = ev.op
    # over the incumbent's template parameters (what its source was rendered for), else the default
    params = {**(inc[0] if inc else op.default_params(problem)), **c.get("params", {})}
    params = op_params({**params, SOURCE_PARAM: None})
    if "source" in c:
        text = c["source"]
    else:
        base_cfg = inc[0] if inc and c.get("base", "incumbent") == "incumbent" else params
        try:
            text = apply_edits(op.render(base_cfg, problem, ev.gpu.arch).source, c["edits"])
        except EditError as exc:
            return None, str(exc)
    lineage = {
        **meta,
        "problem": problem.label(),
        "arch": ev.gpu.arch,  # and the template's text it replaces (WithSources.check)
        "template": source_digest(op.render(params, problem, ev.gpu.arch).source),
        "params": params,
        "rationale": c.get("rationale", "")[:2000],
        "edit": c.get("edit", "")[:200],
        "parent": c.get("parent") or meta.get("parent"),
    }
    return {**params, SOURCE_PARAM: op.store.put(text, lineage)}, ""


def propose(ctx: Context, ev, problem: Problem, hist: list, search: dict) -> list:
    """Every proposer's rounds for one problem; the (config, score) of each candidate built."""
    cmds, rounds = proposers_of(ctx, search)
    added: list = []
    ev.proposed = getattr(ev, "proposed", {})
    for cmd in cmds:
        try:  # a proposer that breaks the protocol ends its rounds, not the build
            with closing(Proposer(cmd, ctx.kf.root)) as p:
                for rnd in range(rounds):
                    _round(ctx, ev, problem, hist + added, rnd, rounds, cmd, p, added)
        except ProposalError as exc:
            ctx.report("note", message=f"{ev.t} {problem.label()}: {exc}")
    return added


def _round(ctx, ev, problem, hist, rnd, rounds, cmd, p, added) -> None:
    cands = p.ask(task(ctx, ev, problem, hist, rnd, rounds, cmd))
    inc = best(hist)
    parent = inc and (inc[0].get(SOURCE_PARAM) or "template " + json.dumps(inc[0], sort_keys=True))
    meta = {"proposer": cmd, "round": rnd, "parent": parent}
    results, cfgs = [], []
    for i, c in enumerate(cands):
        cfg, why = (
            (None, f"over the budget of {MAX_CANDIDATES} a reply")
            if i >= MAX_CANDIDATES
            else materialize(ev, problem, c, meta, inc)
        )
        results.append({"index": i, "outcome": "rejected", "detail": why} if cfg is None else cfg)
        if cfg is not None and cfg not in cfgs:
            cfgs.append(cfg)
    scores = dict(zip(map(config_key, cfgs), ev(cfgs))) if cfgs else {}
    added += [(cfg, scores[config_key(cfg)]) for cfg in cfgs]
    out = []
    for i, r in enumerate(results):
        c = cands[i] if isinstance(cands[i], dict) else {}
        if r.get("outcome") == "rejected":
            out.append(r)
            _lesson(ctx, ev, problem, None, c, "failed", {"outcome": "rejected", **r}, None)
            continue
        row = ev.results[config_key(r)]
        p50 = row.get("p50_ms") if row["outcome"] == "ok" else None
        ratio = p50 / inc[1] if p50 and inc and ev.hw and inc[1] > 0 else None
        good = row["outcome"] == "ok"
        verdict = (
            "failed" if not good else "built" if ratio is None else ("hurt", "helped")[ratio < 1]
        )
        ev.proposed[config_key(r)] = {"proposer": cmd, "round": rnd, "outcome": row["outcome"]}
        res = {k: row[k] for k in ("params", "outcome", "detail")}
        res.update(index=i, digest=r[SOURCE_PARAM], p50_ms=p50, verdict=verdict, vs_incumbent=ratio)
        out.append(res)
        _lesson(ctx, ev, problem, r, c, verdict, row, ratio)
    p.tell({"round": rnd, "results": out})


def _lesson(ctx, ev, problem, cfg, c, verdict, row, ratio) -> None:
    """An `edit` lesson: which edit (its label, else its rationale), on which op, arch, dtype and
    shape, helped / hurt / failed, by how much, and the first line of the evidence."""
    scope = lessons._scope(ev.t.gpu, ev.gpu.arch, {**problem.key(), "options": problem.opts_json})
    rule = {
        "params": {k: v for k, v in (cfg or {}).items() if k != SOURCE_PARAM},
        "edit": _line(c.get("edit") or c.get("rationale") or "") or "(unnamed edit)",
        "verdict": verdict,
        "result": row["outcome"],
        "why": _line(row["detail"] or ""),
        **({"source": cfg[SOURCE_PARAM]} if cfg else {}),
        **({"ratio": round(ratio, 4)} if ratio is not None else {}),
    }
    evidence = [row["id"]] if "id" in row else []  # the attempt (none: rejected before one)
    conf = 1.0 if ev.hw else 0.5
    row = lessons._row(ev.op.NAME, "edit", scope, rule, evidence, conf, f"run {ctx.run}")
    ctx.cache.put_lessons([row])  # and the build's lessons_produced (target.py) name it
    ev.edits = [*getattr(ev, "edits", []), dict(lesson=row["id"], kind="edit", scope=scope, **rule)]


def rejected(ev, limit: int = 4) -> list[str]:
    """Why a problem has no valid candidate: the evidence of up to `limit` rejected configs with
    different evidence, compile errors first (at template lines: deep.explain_log), then the rest."""
    out, seen = [], set()
    for r in sorted(ev.results.values(), key=lambda r: r["outcome"] != "compile_error"):
        if len(seen) >= limit or (r["outcome"], r["detail"][:200]) in seen:
            continue
        seen.add((r["outcome"], r["detail"][:200]))
        cfg = r["params"]
        out.append(f"{params_text(cfg)}: {r['outcome']}")
        src = r["outcome"] == "compile_error" and ev.op.render(cfg, ev.problem, ev.gpu.arch).source
        lines = (
            explain_log(ev.op, src, r["detail"], ev.ctx.kf.root, 4)
            if src
            else r["detail"].splitlines()[:3]
        )
        out += ["  " + ln for ln in lines]
    return out


def _line(text: str) -> str:
    """The first non-blank line of `text` as a lesson keeps it (printable, at most 300)."""
    first = next((ln for ln in text.splitlines() if ln.strip()), "")
    return "".join(ch if ch.isprintable() else " " for ch in first).strip()[:300]


def beside_template(ctx: Context, ev, problem: Problem, hist: list, winner) -> dict:
    """What the factory did for one problem: each proposer's attempts by outcome, the winner's
    lineage and, when a proposed source won on a GPU, it timed in one window with the best template
    config (alternating, as a playoff bout), both p50s from that window."""
    counts: dict = {}
    for info in getattr(ev, "proposed", {}).values():
        counts.setdefault(info["proposer"], Counter())[info["outcome"]] += 1
    out: dict = {"proposers": counts}
    tmpl = best([h for h in hist if SOURCE_PARAM not in h[0]])
    if tmpl:
        out["template_best"] = {"params": tmpl[0], "p50_ms": tmpl[1] if ev.hw else None}
    if winner is None or SOURCE_PARAM not in winner[0]:
        out["winner"] = "template"
        return out
    out["winner"] = "proposed"
    out["lineage"] = ev.op.store.meta(winner[0][SOURCE_PARAM])
    if not (ev.hw and tmpl):
        return out
    row = beside.bout(ev, winner[0], tmpl[0], "beside-template")
    t50 = json.loads(row["detail"]).get("leader_p50_ms")
    out["same_window"] = {
        "outcome": row["outcome"],
        "winner_p50_ms": row["p50_ms"],
        "template_p50_ms": t50,
        "speedup": t50 / row["p50_ms"] if t50 and row["p50_ms"] else None,
    }
    return out
