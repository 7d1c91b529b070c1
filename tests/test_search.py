"""Search strategies on a synthetic score: coverage, determinism, seeds first, budgets."""

import math
from pathlib import Path

import pytest

from ptxbuild.search.strategies import best, enumerate_space, run_search

SPACE = {"a": [1, 2, 4, 8, 16, 32], "b": [32, 64, 96, 128, 256, 512], "c": ["x", "y"]}


def score(cfg):
    return abs(math.log2(cfg["a"]) - 3) + abs(cfg["b"] - 96) / 32 + (cfg["c"] == "y") + 1.0


def evaluate(group):
    return [score(c) for c in group]


def valid(cfg):
    return "a*b too large" if cfg["a"] * cfg["b"] > 4096 else None


def test_exhaustive_tries_every_valid_config_once():
    hist = run_search(SPACE, evaluate, strategy="exhaustive", budget=1000, seconds=10, valid=valid)
    n_valid = sum(valid(c) is None for c in enumerate_space(SPACE))
    assert len(hist) == n_valid == 66
    assert len({tuple(sorted(c.items())) for c, _ in hist}) == n_valid
    assert best(hist) == ({"a": 8, "b": 96, "c": "x"}, 1.0)


def test_random_is_deterministic_per_seed_and_respects_budget():
    h1 = run_search(
        SPACE, evaluate, strategy="random", budget=10, seconds=10, valid=valid, rng_seed=3
    )
    h2 = run_search(
        SPACE, evaluate, strategy="random", budget=10, seconds=10, valid=valid, rng_seed=3
    )
    assert [c for c, _ in h1] == [c for c, _ in h2] and len(h1) == 10
    assert all(valid(c) is None for c, _ in h1)


def test_seeds_go_first_and_evolutionary_finds_the_optimum_from_a_near_seed():
    seed = {"a": 4, "b": 128, "c": "x"}
    hist = run_search(
        SPACE, evaluate, strategy="evolutionary", budget=16, seconds=10, valid=valid, seeds=[seed]
    )
    assert hist[0][0] == seed
    assert best(hist)[1] == 1.0


def test_failed_configs_score_infinite_and_never_win():
    def ev(group):
        return [math.inf if c["c"] == "x" else score(c) for c in group]

    hist = run_search(SPACE, ev, strategy="exhaustive", budget=1000, seconds=10, valid=valid)
    assert best(hist) == ({"a": 8, "b": 96, "c": "y"}, 2.0)


BIG = {
    f"p{i}": list(range(8)) for i in range(7)
}  # 8^7 = 2.1 M combinations: sampled, not enumerated


def big_valid(c):
    return (
        None if c["p0"] == 0 and c["p1"] in (1, 2) and c["p2"] % 4 == 0 else "no"
    )  # 1 in 128 is valid


@pytest.mark.parametrize("strategy", ["random", "evolutionary", "exhaustive", "auto"])
def test_spaces_too_large_to_enumerate_are_searched_without_enumerating(strategy, monkeypatch):
    import ptxbuild.search.strategies as search

    assert search.valid_configs(BIG, big_valid) is None
    monkeypatch.setattr(
        search, "enumerate_space", lambda space: pytest.fail("enumerated a 2 M space")
    )
    hist = run_search(
        BIG,
        lambda g: [float(sum(c.values())) for c in g],
        strategy=strategy,
        budget=20,
        seconds=30,
        valid=big_valid,
        rng_seed=1,
    )
    keys = [tuple(sorted(c.items())) for c, _ in hist]
    assert len(hist) == 20 and len(set(keys)) == 20  # budget met, nothing evaluated twice
    assert all(big_valid(c) is None for c, _ in hist)


def test_random_valid_is_uniform_over_valid_configs():
    import random

    from ptxbuild.search.strategies import random_valid

    rng = random.Random(0)
    draws = [random_valid(BIG, big_valid, rng) for _ in range(400)]
    assert all(big_valid(c) is None for c in draws)
    assert {c["p1"] for c in draws} == {1, 2} and {c["p2"] for c in draws} == {0, 4}
    assert 150 < sum(c["p1"] == 1 for c in draws) < 250


def test_rmsnorm_space_is_sampled_not_enumerated(monkeypatch):
    """The rmsnorm space (2.5 M combinations) is not checked config by config before a search
    (that cost ~15 s per problem on the H200 builds); a random search still finds valid configs."""
    import ptxbuild.search.strategies as search
    from ptxbuild.oploader import load_op
    from ptxbuild.problem import Problem

    op = load_op("rmsnorm", Path(__file__).resolve().parents[1])
    p = Problem.make("rmsnorm", "bfloat16", (32768, 4096), {})
    monkeypatch.setattr(
        search, "enumerate_space", lambda space: pytest.fail("enumerated the rmsnorm space")
    )
    hist = run_search(
        op.SPACE,
        lambda g: [1.0] * len(g),
        strategy="random",
        budget=24,
        seconds=60,
        valid=lambda c: op.check(c, p),
        rng_seed=7,
    )
    assert len(hist) == 24 and all(op.check(c, p) is None for c, _ in hist)
    assert len({c["regime"] for c, _ in hist}) >= 2  # the sample spans regimes


def test_random_search_of_a_large_space_ends_when_its_few_valid_configs_are_tried():
    """Fewer valid configs than the budget in a sampled space: once each is tried, every draw repeats
    one; the search must end (with each valid config tried once), not draw forever."""
    import signal

    space = {"a": list(range(1000)), "b": list(range(200))}  # 200k combinations: sampled
    few = lambda c: None if c["a"] < 4 and c["b"] < 25 else "no"  # 100 valid, 1 in 2000  # noqa: E731

    def stop(*_):
        raise TimeoutError("random search did not end")

    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(20)
    try:
        hist = run_search(
            space,
            lambda g: [1.0] * len(g),
            strategy="random",
            budget=150,
            seconds=600,
            valid=few,
            rng_seed=2,
        )
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    keys = [tuple(sorted(c.items())) for c, _ in hist]
    assert len(keys) == len(set(keys)) and len(keys) >= 95 and all(few(c) is None for c, _ in hist)


def test_neighbours_move_one_declared_parameter_and_skip_tried_and_invalid_configs():
    from ptxbuild.search.strategies import neighbours

    cfg = {"a": 16, "b": 256, "c": "x"}
    tried = [cfg, {"a": 16, "b": 256, "c": "y"}]
    got = neighbours(cfg, SPACE, ["c", "a"], valid, tried)
    # c's other value was tried; a = 32 makes a*b = 8192 > 4096 (invalid); b is not declared
    assert got == [{"a": v, "b": 256, "c": "x"} for v in (1, 2, 4, 8)]
    assert neighbours(cfg, SPACE, [], valid, tried) == []
