"""The timing protocol as pure logic over a timer: warm-up, sample counts, interleaving, re-measure, floor."""

from __future__ import annotations

import math
from collections.abc import Callable

from ..keys import PROTOCOL_VERSION  # noqa: F401  (the one version, in the keys it names)
from ..outcome import Outcome

SUSPICIOUS_BELOW = 0.97  # p50 under this fraction of the roofline floor is never a win
REMEASURE_MARGIN = 0.10  # a candidate beating the incumbent by more than this is re-timed alone
ROUNDS = 10  # a candidate and its incumbent alternate over this many rounds

Timer = Callable[[str, int], list]  # timer(name, n) -> n consecutive timed calls of `name`, in ms


def quantile(samples, q: float) -> float:
    """Linear-interpolated quantile (numpy's default method), pure Python."""
    s = sorted(samples)
    if not s:
        return float("nan")
    pos = q * (len(s) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def quantiles(samples) -> tuple[float, float, float]:
    """(p20, p50, p80)."""
    return quantile(samples, 0.2), quantile(samples, 0.5), quantile(samples, 0.8)


def floor_ms(bytes_moved: int, copy_tbps: float) -> float:
    """The time a perfect memory-bound kernel needs at the measured copy bandwidth."""
    return bytes_moved / (copy_tbps * 1e12) * 1e3 if copy_tbps > 0 else 0.0


def judge(p50_ms: float, floor: float) -> Outcome:
    return Outcome.SUSPICIOUS if floor > 0 and p50_ms < SUSPICIOUS_BELOW * floor else Outcome.OK


def sample_count(est_ms: float, budget_ms: float, lo: int = 10, hi: int = 1000) -> int:
    return int(min(hi, max(lo, budget_ms / max(est_ms, 1e-6))))


def warm_up(timer: Timer, name: str, warmup_ms: float, max_calls: int = 2000) -> float:
    """Run `name` in doubling batches until `warmup_ms` of kernel time has passed; returns the
    median of the second half (a per-call estimate once clocks and caches have settled)."""
    t: list = []
    while sum(t) < warmup_ms and len(t) < max_calls:
        t += timer(name, max(1, len(t)))
    return quantile(t[len(t) // 2 :], 0.5)


def run(
    timer: Timer,
    incumbent: bool = False,
    warmup_ms: float = 30.0,
    budget_ms: float = 200.0,
    guard: bool = True,
) -> dict:
    """Time "candidate" (and "incumbent" in the same window, alternating which goes first each round).
    With `guard`, a candidate faster than the incumbent by more than REMEASURE_MARGIN is re-timed alone
    and the slower of the two timings kept (a baseline beside the winner is not guarded: the rule
    would favour the winner). Returns {"candidate": samples, "incumbent": samples|None, "remeasured"}."""
    names = ["candidate", "incumbent"] if incumbent else ["candidate"]
    est = {n: warm_up(timer, n, warmup_ms) for n in names}
    count = {n: sample_count(est[n], budget_ms / len(names)) for n in names}
    k = ROUNDS if incumbent else 1
    samples: dict = {n: [] for n in names}
    for r in range(k):
        for n in names if r % 2 == 0 else names[::-1]:
            samples[n] += timer(n, math.ceil(count[n] / k))
    out = {
        "candidate": samples["candidate"],
        "incumbent": samples.get("incumbent"),
        "remeasured": False,
    }
    if incumbent and guard:
        p50_c, p50_i = quantile(samples["candidate"], 0.5), quantile(samples["incumbent"], 0.5)
        if p50_c < (1 - REMEASURE_MARGIN) * p50_i:
            alone = timer("candidate", count["candidate"])
            out["remeasured"] = True
            if quantile(alone, 0.5) > p50_c:
                out["candidate"] = alone
    return out


def round_ratios(samples, incumbent_samples, rounds: int) -> list[float]:
    """p50 of `samples` / p50 of the incumbent's, round by round, for a run() that alternated them
    over `rounds` rounds of equal size (each list is `rounds` chunks in order); [] otherwise."""
    n, m = len(samples), len(incumbent_samples or ())
    if rounds < 2 or not n or not m or n % rounds or m % rounds:
        return []
    a, b = n // rounds, m // rounds
    return [
        quantile(samples[i * a : (i + 1) * a], 0.5)
        / quantile(incumbent_samples[i * b : (i + 1) * b], 0.5)
        for i in range(rounds)
    ]


def summarize(samples, floor: float, incumbent_samples=None, rounds: int = 0) -> dict:
    """MeasureResult fields from samples: quantiles, count, floor, fraction of floor, outcome; with
    `rounds` (an alternating run, not re-measured), the ratio to the incumbent round by round."""
    p20, p50, p80 = quantiles(samples)
    return {
        "outcome": judge(p50, floor).value,
        "p50_ms": p50,
        "p20_ms": p20,
        "p80_ms": p80,
        "samples": len(samples),
        "floor_ms": floor,
        "fraction_of_floor": floor / p50 if p50 > 0 else 0.0,
        "incumbent_p50_ms": quantile(incumbent_samples, 0.5) if incumbent_samples else None,
        "round_ratios": round_ratios(samples, incumbent_samples, rounds),
        "detail": f"p50 {p50:.4g} ms is under {SUSPICIOUS_BELOW:g} x the floor {floor:.4g} ms"
        if judge(p50, floor) is Outcome.SUSPICIOUS
        else "",
    }
