"""Search strategies on a synthetic score: coverage, determinism, seeds first, budgets."""
import math

from ptxbuild.search import best, enumerate_space, run_search

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
    h1 = run_search(SPACE, evaluate, strategy="random", budget=10, seconds=10, valid=valid, rng_seed=3)
    h2 = run_search(SPACE, evaluate, strategy="random", budget=10, seconds=10, valid=valid, rng_seed=3)
    assert [c for c, _ in h1] == [c for c, _ in h2] and len(h1) == 10
    assert all(valid(c) is None for c, _ in h1)


def test_seeds_go_first_and_evolutionary_finds_the_optimum_from_a_near_seed():
    seed = {"a": 4, "b": 128, "c": "x"}
    hist = run_search(SPACE, evaluate, strategy="evolutionary", budget=16, seconds=10, valid=valid, seeds=[seed])
    assert hist[0][0] == seed
    assert best(hist)[1] == 1.0


def test_failed_configs_score_infinite_and_never_win():
    def ev(group):
        return [math.inf if c["c"] == "x" else score(c) for c in group]
    hist = run_search(SPACE, ev, strategy="exhaustive", budget=1000, seconds=10, valid=valid)
    assert best(hist) == ({"a": 8, "b": 96, "c": "y"}, 2.0)
