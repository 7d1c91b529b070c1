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


def fastest_baseline(entry: dict) -> tuple[float, str] | None:
    """(p50_ms, name) of the fastest baseline timed ok beside a dispatch entry, or None."""
    return min([(b["p50_ms"], n) for n, b in (entry.get("baselines") or {}).items()
                if b.get("outcome") == "ok" and b.get("p50_ms")], default=None)


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
        base = fastest_baseline(c)
        if gates.get("min_speedup") is not None and base and base[0] / p50 < gates["min_speedup"]:
            out.append(f"{c['label']}: {base[0] / p50:.3f}x {base[1]} ({base[0] * 1e3:.1f} us) < min_speedup {gates['min_speedup']:g}")
    return out
