"""The kernelfile's success metric and gates, evaluated on a measured build's chosen kernels."""
from __future__ import annotations

import math


def metric_ms(name: str, times_ms: list[float]) -> float | None:
    """geomean_time / max_time / sum_time over the problems' p50 times; None when nothing was timed."""
    if not times_ms:
        return None
    if name == "geomean_time":
        return math.exp(sum(math.log(t) for t in times_ms) / len(times_ms))
    if name == "max_time":
        return max(times_ms)
    if name == "sum_time":
        return sum(times_ms)
    raise ValueError(f"unknown metric {name!r}")


def closest_baseline(entry: dict) -> tuple[float, str, float, float] | None:
    """(speed-up, name, baseline p50, winner p50) against the baseline the winner beats by least, of
    those timed ok beside a dispatch entry; None if none. A baseline timed in one window with the
    winner (winner_p50_ms) is compared with the winner's p50 of that window (verification.md timing
    rule 4), an older one with the winner's own timing."""
    return min([(b["p50_ms"] / (b.get("winner_p50_ms") or entry["p50_ms"]), n, b["p50_ms"],
                 b.get("winner_p50_ms") or entry["p50_ms"])
                for n, b in (entry.get("baselines") or {}).items()
                if b.get("outcome") == "ok" and b.get("p50_ms") and entry.get("p50_ms")], default=None)


def failures(gates: dict, chosen: list[dict]) -> list[str]:
    """One line per (problem, gate) that a timed winner misses (untimed problems, or no baseline: not judged)."""
    out = []
    frac_min, time_max = gates.get("min_bandwidth_fraction"), gates.get("max_time_ms")
    for c in chosen:
        p50 = c.get("p50_ms")
        if not p50:
            continue
        frac = c["floor_ms"] / p50
        if frac_min is not None and frac < frac_min:
            out.append(f"{c['label']}: {frac:.1%} of the copy-bandwidth floor < min_bandwidth_fraction {frac_min:g}")
        if time_max is not None and p50 > time_max:
            out.append(f"{c['label']}: p50 {p50:.4g} ms > max_time_ms {time_max:g}")
        base, ms = closest_baseline(c), gates.get("min_speedup")
        rounds = (c["baselines"][base[1]].get("round_ratios") or []) if base else []
        tie = gates.get("speedup_evidence") == "every_round" and rounds and max(rounds) >= (ms or 0)   # a round says no
        if ms is not None and base and base[0] < ms and not tie:
            out.append(f"{c['label']}: {base[0]:.3f}x {base[1]} ({base[2] * 1e3:.1f} us) < min_speedup {ms:g}"
                       + (f"; rounds {min(rounds):.3f}-{max(rounds):.3f}x" if rounds else ""))
    return out
