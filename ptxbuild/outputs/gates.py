"""The kernelfile's success metric and gates, evaluated on a measured build's chosen kernels."""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..records import DispatchEntry

# over the problems' p50 times (the kernelfile's schema admits no other name)
METRICS = {
    "geomean_time": lambda ts: math.exp(sum(math.log(t) for t in ts) / len(ts)),
    "max_time": max,
    "sum_time": sum,
}


def speedups(entry: DispatchEntry) -> list[tuple[float, str, float, float]]:
    """(speed-up, name, baseline p50, winner p50) over each baseline timed ok beside a dispatch entry,
    smallest first. A baseline timed in one window with the winner (winner_p50_ms) is compared with the
    winner's p50 of that window (verification.md timing rule 4), an older one with the winner's own timing."""
    return sorted(
        (b["p50_ms"] / win, n, b["p50_ms"], win)
        for n, b in (entry.baselines or {}).items()
        if b.get("outcome") == "ok" and b.get("p50_ms") and entry.p50_ms
        for win in [b.get("winner_p50_ms") or entry.p50_ms]
    )


def closest_baseline(entry: DispatchEntry) -> tuple[float, str, float, float] | None:
    """speedups' entry for the baseline the winner beats by least; None if none."""
    return next(iter(speedups(entry)), None)


def judge(spec, chosen: Sequence[DispatchEntry], measured: bool) -> dict:
    """The op's declared metric and gates over a build's chosen kernels, as the kernelfile says now (neither is
    part of the build key: a build, a --locked rebuild and a report each judge again). Gates need hardware."""
    timed = [c.p50_ms for c in chosen if c.p50_ms]
    return {
        "metric": {
            "name": spec.metric,
            "value_ms": METRICS[spec.metric](timed) if timed else None,  # None: nothing timed
            "problems": len(timed),
        },
        "gates": {
            "declared": {k: v for k, v in spec.gates.items() if v is not None},
            "failures": failures(spec.gates, chosen) if measured else [],
        },
    }


def misses(spec, chosen: Sequence[DispatchEntry], measured: bool) -> tuple[str, ...]:
    """judge's gate failures alone: what plan, a build, a --locked rebuild and a report say is missed."""
    return tuple(judge(spec, chosen, measured)["gates"]["failures"])


def failures(gates: dict, chosen: Sequence[DispatchEntry]) -> list[str]:
    """One line per (problem, gate) that a timed winner misses (untimed problems, or no baseline: not judged)."""
    out = []
    frac_min, time_max = gates.get("min_bandwidth_fraction"), gates.get("max_time_ms")
    for c in chosen:
        p50 = c.p50_ms
        if not p50:
            continue
        frac = c.floor_ms / p50
        if frac_min is not None and frac < frac_min:
            out.append(
                f"{c.label}: {frac:.1%} of the copy-bandwidth floor < min_bandwidth_fraction {frac_min:g}"
            )
        if time_max is not None and p50 > time_max:
            out.append(f"{c.label}: p50 {p50:.4g} ms > max_time_ms {time_max:g}")
        ms, every = gates.get("min_speedup"), gates.get("speedup_evidence") == "every_round"
        for x, name, base_p50, win_p50 in speedups(c) if ms is not None else []:
            rounds = c.baselines[name].get("round_ratios") or []
            if x < ms and not (
                every and rounds and max(rounds) >= ms
            ):  # every_round: a round that won is a tie
                out.append(
                    f"{c.label}: {x:.{3 if round(x, 3) < ms else 4}f}x {name} ({base_p50 * 1e3:.1f} against "
                    f"{win_p50 * 1e3:.1f} us) < min_speedup {ms:g}"
                    + (f"; rounds {min(rounds):.3f}-{max(rounds):.3f}x" if rounds else "")
                )
                break
    return out
