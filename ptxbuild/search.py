"""Search strategies over an op's parameter space: exhaustive, random, evolutionary (lesson-seeded)."""
from __future__ import annotations

import itertools
import math
import random
import time
from typing import Callable, Iterable

Config = dict
Score = float  # lower is better; math.inf for a failed candidate


def enumerate_space(space: dict[str, list]) -> list[Config]:
    names = sorted(space)
    return [dict(zip(names, values)) for values in itertools.product(*(space[n] for n in names))]


def _key(cfg: Config) -> tuple:
    return tuple(sorted(cfg.items()))


def _mutate(cfg: Config, space: dict[str, list], rng: random.Random) -> Config:
    """Move one parameter to a neighbouring value (ordered lists) or any other value."""
    name = rng.choice([n for n in sorted(space) if len(space[n]) > 1] or sorted(space))
    values = space[name]
    out = dict(cfg)
    if cfg.get(name) in values and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        i = values.index(cfg[name]) + rng.choice((-1, 1))
        out[name] = values[max(0, min(len(values) - 1, i))]
    else:
        out[name] = rng.choice(values)
    return out


def run_search(space: dict[str, list], evaluate: Callable[[list[Config]], list[Score]], *, strategy: str,
               budget: int, seconds: float, valid: Callable[[Config], str | None] = lambda c: None,
               seeds: Iterable[Config] = (), rng_seed: int = 0, batch: int = 4) -> list[tuple[Config, Score]]:
    """Evaluate up to `budget` valid configs within `seconds`; returns every (config, score) tried.

    Seeds (lesson predictions, the op's default) are tried first by every strategy.
    """
    rng = random.Random(rng_seed)
    start = time.monotonic()
    tried: dict[tuple, Score] = {}
    history: list[tuple[Config, Score]] = []
    all_valid = [c for c in enumerate_space(space) if valid(c) is None]
    if strategy == "auto":
        strategy = "exhaustive" if len(all_valid) <= budget else "evolutionary"
    queue: list[Config] = [c for c in seeds if valid(c) is None]
    if strategy == "exhaustive":
        queue += all_valid
    elif strategy == "random":
        queue += rng.sample(all_valid, len(all_valid))
    elif strategy != "evolutionary":
        raise ValueError(f"unknown search strategy {strategy!r}")

    def take(n: int) -> list[Config]:
        out: list[Config] = []
        while queue and len(out) < n:
            c = queue.pop(0)
            if _key(c) not in tried and all(_key(c) != _key(o) for o in out):
                out.append(c)
        return out

    stall = 0
    while len(tried) < min(budget, len(all_valid)) and time.monotonic() - start < seconds:
        n = min(batch, budget - len(tried))
        group = take(n)
        if len(group) < n and strategy == "evolutionary":
            group += _breed(history, space, valid, tried, group, rng, n - len(group), all_valid)
        if not group:
            stall += 1
            if stall > 3:
                break
            continue
        for cfg, score in zip(group, evaluate(group)):
            tried[_key(cfg)] = score
            history.append((cfg, score))
    return history


def _breed(history, space, valid, tried, pending, rng, n, all_valid) -> list[Config]:
    ok = sorted((h for h in history if math.isfinite(h[1])), key=lambda h: h[1])
    parents = [c for c, _ in ok[:3]]
    out: list[Config] = []
    seen = set(tried) | {_key(c) for c in pending}
    for _ in range(50 * n):
        if len(out) >= n:
            break
        if parents and rng.random() < 0.8:
            child = _mutate(rng.choice(parents), space, rng)
        else:
            child = rng.choice(all_valid) if all_valid else None
        if child is None:
            break
        if _key(child) in seen or valid(child) is not None:
            continue
        seen.add(_key(child))
        out.append(child)
    return out


def best(history: list[tuple[Config, Score]]) -> tuple[Config, Score] | None:
    ok = [h for h in history if math.isfinite(h[1])]
    return min(ok, key=lambda h: h[1]) if ok else None
