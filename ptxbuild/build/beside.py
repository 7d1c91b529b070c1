"""What runs beside a search's winner: the playoff of near-ties, memcheck, the op's baselines."""

from __future__ import annotations

import json
import math

from .. import keys
from ..gpu import memcheck
from ..outcome import Outcome
from ..problem import Binary, Problem, digest
from ..search.strategies import best, config_key
from .context import Context, must_time

# baseline outcomes that say the run failed, not the baseline: not cached
RETRY_BASELINE = {
    o.value
    for o in (
        Outcome.LAUNCH_ERROR,
        Outcome.TIMEOUT,
        Outcome.WORKER_CRASH,
        Outcome.ILLEGAL_ADDRESS,
        Outcome.RESOURCE,
    )
}


def playoff(ev, hist: list, size: int = 4, within: float = 0.02):
    """The search's fastest config against the next ones (up to `size` in all) within `within` of
    it, each challenger timed in one window with the leader, alternating (verification.md timing
    rule 4): timed apart, near-ties are ordered by noise, and the fastest of many noisy timings is
    biased low. A challenger lower in the window leads, its p50 there its score. Bouts: ev.bouts."""
    ranked, ev.bouts = (
        sorted((h for h in hist if math.isfinite(h[1])), key=lambda h: h[1]),
        [],
    )

    def kernel(c):  # what a bout runs: the binary and every launch of the op
        launch = ev.op.launches if ev.op.multi_kernel else ev.op.launch
        return ev.binaries[config_key(c)].digest, repr(launch(c, ev.problem, ev.gpu.sm_count))

    if not ranked:
        return None
    lead, met = ranked[0], {kernel(ranked[0][0])}
    for cfg, score in ranked[1:]:
        if len(ev.bouts) >= size - 1 or score > ranked[0][1] * (1 + within):
            break
        if kernel(cfg) in met:
            continue  # the same kernel and launch as one already met: nothing to learn
        met.add(kernel(cfg))
        row = bout(ev, cfg, lead[0])
        lead_p50 = json.loads(row["detail"])["leader_p50_ms"]
        won = row["outcome"] == "ok" and lead_p50 is not None and row["p50_ms"] < lead_p50
        ev.bouts.append(
            {"params": cfg, "p50_ms": row["p50_ms"], "leader_p50_ms": lead_p50, "won": won}
        )
        lead = (cfg, row["p50_ms"]) if won else lead
    return lead


def bout(ev, cfg: dict, lead: dict, tag: str = "playoff") -> dict:
    """`cfg` timed in one window with `lead`, alternating (its p50_ms; the leader's in the detail's
    leader_p50_ms): a playoff bout, or (build/factory.py) a proposed winner beside the best
    template config. Cached by both binaries, GPU, problem, configs and protocol; a run the harness
    failed is not cached (timed again next build)."""
    b, lb = ev.binaries[config_key(cfg)], ev.binaries[config_key(lead)]
    key = digest(
        tag, b.digest, lb.digest, ev.hw, ev.problem.key(), cfg, lead, keys.PROTOCOL_VERSION
    )
    row = ev.ctx.cache.get("measurements", key)
    if must_time(ev.ctx, key, row, ev.problem) or row["outcome"] in RETRY_BASELINE:
        ev.ctx.timed.add(key)
        r = ev.ctx.gpu.measure(str(ev.op.FOLDER), cfg, ev.problem, b, incumbent=(lead, lb))
        row = {
            "key": key,
            "binary": tag,
            "fingerprint": json.dumps(ev.hw, sort_keys=True),
            "problem": json.dumps(ev.problem.key()),
            "outcome": r.outcome.value,
            "p50_ms": r.p50_ms if r.outcome is Outcome.OK else None,
            "detail": json.dumps({"leader_p50_ms": r.incumbent_p50_ms}),
        }
        if row["outcome"] not in RETRY_BASELINE:
            ev.ctx.cache.put("measurements", row)
    return row


def baselines(ctx: Context, op, problem: Problem, hw: dict, winner: tuple[dict, Binary]) -> dict:
    """Reference implementations timed on this GPU, each in one window with the winner (its p50 there:
    winner_p50_ms); cached like a measurement (same GPU, problem, protocol, winner)."""
    key = digest(
        "baselines",
        hw,
        problem.key(),
        op.VERSION,
        op.BASELINES_VERSION,
        keys.PROTOCOL_VERSION,
        "beside",
        "rounds",
        winner[0],
        winner[1].digest,
    )
    row = ctx.cache.get("measurements", key)
    cached = None if must_time(ctx, key, row, problem) else json.loads(row["detail"])
    ctx.timed.add(key)
    # caches written before the harness's failures stopped being cached hold them: measure again
    if cached is not None and not any(v["outcome"] in RETRY_BASELINE for v in cached.values()):
        return {n: {**v, "timed_at": row.get("created")} for n, v in cached.items()}
    ctx.report(
        "baselines_start", problem=problem
    )  # third-party code may compile or autotune for minutes
    out = {}
    for name, r in ctx.gpu.baselines(
        str(op.FOLDER), problem, winner=winner, budget_ms=200.0
    ).items():
        out[name] = {
            "outcome": r.outcome.value,
            **{k: getattr(r, k) for k in ("p50_ms", "p20_ms", "p80_ms", "samples", "detail")},
            "winner_p50_ms": r.incumbent_p50_ms,
            "round_ratios": list(r.round_ratios),
        }
    if any(v["outcome"] in RETRY_BASELINE for v in out.values()):
        return out  # the harness failed (out of memory, a crash, a hang): measure again next build
    created = ctx.cache.put(
        "measurements",
        {
            "key": key,
            "binary": "baselines",
            "fingerprint": json.dumps(hw, sort_keys=True),
            "problem": json.dumps(problem.key()),
            "outcome": "ok",
            "detail": json.dumps(out),
        },
    )
    return {n: {**v, "timed_at": created} for n, v in out.items()}


MEMCHECK_TRIES = 3  # configs of one problem checked under memcheck before it has no valid candidate


def memchecked(ctx: Context, ev, op, problem: Problem, hist: list, winner: tuple):
    """(the winner, or the next-fastest config in `hist` when memcheck reports an error in it, each
    failure recorded as the outcome `memcheck`; None when MEMCHECK_TRIES failed; and a note of what
    memcheck said). One call on at most memcheck.ROWS rows; cached in the verdicts table by binary,
    that problem, config and memcheck.VERSION; a run that could not happen is a note, never cached."""
    run, failed = getattr(ctx.gpu, "memcheck", None), set()
    for _ in range(MEMCHECK_TRIES):
        cfg = winner[0]
        binary = ev.binaries[config_key(cfg)]
        small = memcheck.small_problem(op, problem, cfg, binary.arch)
        key = digest("memcheck", binary.digest, small.key(), cfg, memcheck.VERSION)
        row = ctx.cache.get("verdicts", key)
        if row is None:
            if run is None:
                return winner, "memcheck: not run (this GPU session cannot)"
            outcome, detail = run(str(op.FOLDER), cfg, small, binary)
            if outcome is None:
                return winner, detail
            row = {
                "key": key,
                "binary": binary.digest,
                "suite": f"memcheck-{memcheck.VERSION}",
                "problem": json.dumps(small.key()),
                "outcome": outcome.value,
                "detail": detail,
                "cases": 1,
            }
            ctx.cache.put("verdicts", row)
        if row["outcome"] == Outcome.OK.value:
            return winner, f"memcheck: clean ({small.label()})"
        ev._record(cfg, Outcome(row["outcome"]), row["detail"], binary=binary.digest)
        failed.add(config_key(cfg))
        winner = best([h for h in hist if config_key(h[0]) not in failed])
        if winner is None:
            break
    return None, f"memcheck: {len(failed)} config(s) rejected, no other candidate"


def memcheck_summary(notes: list[str]) -> str | None:
    """One line for the report: how many winners memcheck found clean, or why it did not run."""
    if not notes:
        return None
    clean = sum(n.startswith("memcheck: clean") for n in notes)
    others = sorted({n for n in notes if not n.startswith("memcheck: clean")})
    if not clean and len(others) == 1:
        return others[0]
    return "; ".join([f"memcheck: {clean} of {len(notes)} winners clean"] + others)
