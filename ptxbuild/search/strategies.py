"""Search strategies over an op's parameter space: exhaustive, random, evolutionary (lesson-seeded)."""

from __future__ import annotations

import itertools
import math
import random
import time
from collections.abc import Callable, Iterable, Iterator

Config = dict
Score = float  # lower is better; math.inf for a failed candidate


def iter_space(space: dict[str, list]) -> Iterator[Config]:
    names = sorted(space)
    return (dict(zip(names, values)) for values in itertools.product(*(space[n] for n in names)))


def enumerate_space(space: dict[str, list]) -> list[Config]:
    return list(iter_space(space))


def config_key(cfg: Config) -> tuple:
    return tuple(sorted(cfg.items()))


def _mutate(cfg: Config, space: dict[str, list], rng: random.Random) -> Config:
    """Move one parameter to a neighbouring value (ordered lists) or any other value."""
    name = rng.choice([n for n in sorted(space) if len(space[n]) > 1] or sorted(space))
    values = space[name]
    if cfg.get(name) in values and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in values
    ):
        i = values.index(cfg[name]) + rng.choice((-1, 1))
        return {**cfg, name: values[max(0, min(len(values) - 1, i))]}
    return {**cfg, name: rng.choice(values)}


ENUMERATE_MAX = (
    100_000  # spaces up to this many combinations are enumerated; larger ones are sampled
)


def valid_configs(
    space: dict[str, list], valid: Callable[[Config], str | None]
) -> list[Config] | None:
    """Every valid config, or None when the space is too large to enumerate (rmsnorm's has 2.5 M
    combinations: checking them all cost ~15 s per problem, more than searching it)."""
    if math.prod(len(v) for v in space.values()) > ENUMERATE_MAX:
        return None
    return [c for c in enumerate_space(space) if valid(c) is None]


def random_valid(
    space: dict[str, list],
    valid: Callable[[Config], str | None],
    rng: random.Random,
    draws: int = 200_000,
) -> Config | None:
    """A uniformly random valid config by rejection sampling (None if `draws` draws find none)."""
    names = sorted(space)
    configs = ({n: rng.choice(space[n]) for n in names} for _ in range(draws))
    return next((c for c in configs if valid(c) is None), None)


def _random_distinct(space, valid, rng, repeats: int = 1000) -> Iterator[Config]:
    """Random valid configs, each once; ends when `repeats` draws in a row find none new (a space
    with fewer valid configs than the budget would otherwise be drawn from forever)."""
    seen, miss = set(), 0
    while miss < repeats:
        c = random_valid(space, valid, rng)
        if c is None:
            return
        if config_key(c) in seen:
            miss += 1
            continue
        seen.add(config_key(c))
        miss = 0
        yield c


def run_search(
    space: dict[str, list],
    evaluate: Callable[[list[Config]], list[Score]],
    *,
    strategy: str,
    budget: int,
    seconds: float,
    valid: Callable[[Config], str | None] = lambda c: None,
    seeds: Iterable[Config] = (),
    rng_seed: int = 0,
    batch: int = 4,
) -> list[tuple[Config, Score]]:
    """Evaluate up to `budget` valid configs within `seconds`; returns every (config, score) tried. Seeds (lesson
    predictions, the op's default) are tried first by every strategy. "auto" is exhaustive when the valid configs
    fit the budget, else evolutionary."""
    rng = random.Random(rng_seed)
    start = time.monotonic()
    tried: dict[tuple, Score] = {}
    history: list[tuple[Config, Score]] = []
    all_valid = valid_configs(space, valid)
    if strategy == "auto":
        strategy = (
            "exhaustive" if all_valid is not None and len(all_valid) <= budget else "evolutionary"
        )
    queue: list[Config] = [c for c in seeds if valid(c) is None]
    more: Iterator[Config | None] = iter(())
    if strategy == "exhaustive":
        more = (
            iter(all_valid)
            if all_valid is not None
            else (c for c in iter_space(space) if valid(c) is None)
        )
    elif strategy == "random":
        more = (
            iter(rng.sample(all_valid, len(all_valid)))
            if all_valid is not None
            else _random_distinct(space, valid, rng)
        )
    elif strategy != "evolutionary":
        raise ValueError(f"unknown search strategy {strategy!r}")
    limit = budget if all_valid is None else min(budget, len(all_valid))

    def take(n: int) -> list[Config]:
        out: list[Config] = []
        keys = set(tried)
        while len(out) < n:
            c = queue.pop(0) if queue else next(more, None)
            if c is None:
                break
            if config_key(c) not in keys:
                keys.add(config_key(c))
                out.append(c)
        return out

    stall = 0
    while len(tried) < limit and time.monotonic() - start < seconds:
        n = min(batch, limit - len(tried))
        group = take(n)
        if len(group) < n and strategy == "evolutionary":
            group += _breed(history, space, valid, tried, group, rng, n - len(group), all_valid)
        if not group:
            stall += 1
            if stall > 3:
                break
            continue
        for cfg, score in zip(group, evaluate(group)):
            tried[config_key(cfg)] = score
            history.append((cfg, score))
    return history


def _breed(history, space, valid, tried, pending, rng, n, all_valid) -> list[Config]:
    parents = [
        c for c, _ in sorted((h for h in history if math.isfinite(h[1])), key=lambda h: h[1])[:3]
    ]
    out: list[Config] = []
    seen = set(tried) | {config_key(c) for c in pending}
    for _ in range(50 * n):
        if len(out) >= n:
            break
        if parents and rng.random() < 0.8:
            child = _mutate(rng.choice(parents), space, rng)
        elif all_valid is None:  # a sampled space
            child = random_valid(space, valid, rng, draws=20_000)
        else:
            child = rng.choice(all_valid) if all_valid else None
        if child is None:
            break
        if config_key(child) in seen or valid(child) is not None:
            continue
        seen.add(config_key(child))
        out.append(child)
    return out


def best(history: list[tuple[Config, Score]]) -> tuple[Config, Score] | None:
    return min((h for h in history if math.isfinite(h[1])), key=lambda h: h[1], default=None)


def neighbours(
    cfg: Config,
    space: dict[str, list],
    names: Iterable[str],
    valid: Callable[[Config], str | None],
    tried: Iterable[Config] = (),
) -> list[Config]:
    """The valid, untried configs one parameter away from cfg along `names`: the search's polish step."""
    seen = {config_key(c) for c in tried} | {config_key(cfg)}
    return [
        c
        for n in names
        for c in ({**cfg, n: v} for v in space[n])
        if config_key(c) not in seen and valid(c) is None
    ]
