"""Datasets mixed for a valid rate from measured per-problem pass rates (`asyncdapo.tools.data.pass_rates`):
the valid probability is the Beta-posterior expectation it claims, the mix hits the target from its
strata, shrinks when the low stratum runs out, and refuses what it cannot reach."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from asyncdapo.contracts.verl_format import DatasetError
from asyncdapo.tools.data.longtail import dataset_by_pass_rates, problem_index, problems
from asyncdapo.tools.data.pass_rates import PassRate, load_pass_rates, mix_for


def _numeric_valid(k: int, m: int, n: int, steps: int = 200_000) -> float:
    """1 - E[p^n] - E[(1-p)^n] under Beta(k + 1/2, m - k + 1/2), by the midpoint rule."""
    a, b = k + 0.5, m - k + 0.5
    num = den = 0.0
    for i in range(steps):
        p = (i + 0.5) / steps
        w = p ** (a - 1) * (1 - p) ** (b - 1)
        den += w
        num += w * (1 - p**n - (1 - p) ** n)
    return num / den


@pytest.mark.parametrize(("k", "m"), [(0, 32), (1, 32), (16, 32), (31, 32), (4, 8)])
def test_valid_probability_is_the_posterior_expectation(k: int, m: int) -> None:
    assert PassRate(k, m).valid_probability(8) == pytest.approx(_numeric_valid(k, m, 8), abs=2e-3)


def test_valid_probability_orders_problems_as_expected() -> None:
    n = 8
    # never solved in 32 is not "never valid": the posterior leaves a chance, smaller with more evidence
    assert 0.0 < PassRate(0, 64).valid_probability(n) < PassRate(0, 32).valid_probability(n) < 0.3
    assert PassRate(16, 32).valid_probability(n) > 0.95
    assert PassRate(3, 32).valid_probability(n) == pytest.approx(PassRate(29, 32).valid_probability(n))
    with pytest.raises(ValueError, match="n >= 2"):
        PassRate(1, 2).valid_probability(1)
    with pytest.raises(ValueError, match="right <= total"):
        PassRate(5, 4)


def _rates(low: int, high: int, seed: int = 0) -> list[PassRate]:
    rng = random.Random(seed)
    out = [PassRate(rng.choice([0, 0, 1, 32]), 32) for _ in range(low)]
    out += [PassRate(rng.randint(8, 24), 32) for _ in range(high)]
    rng.shuffle(out)
    return out


@pytest.mark.parametrize("target", [0.3, 0.5, 0.7])
def test_mix_hits_the_target_from_its_strata(target: float) -> None:
    rates = _rates(100, 100)
    mix = mix_for(target, rates, 8, max_size=60, seed=3)
    assert len(mix.indices) == len(set(mix.indices)) == 60
    assert mix.expected_valid_rate == pytest.approx(target, abs=0.03)
    assert mix.low == sum(rates[i].valid_probability(8) < 0.5 for i in mix.indices)
    assert mix_for(target, rates, 8, max_size=60, seed=3) == mix  # seeded


def test_mix_shrinks_when_the_low_stratum_runs_out_and_refuses_the_unreachable() -> None:
    rates = _rates(20, 180)
    mix = mix_for(0.3, rates, 8, max_size=112)
    assert len(mix.indices) < 112 and mix.low <= 20  # every low problem it has, the rest high
    assert mix.expected_valid_rate == pytest.approx(0.3, abs=0.05)
    with pytest.raises(DatasetError, match="out of reach"):
        mix_for(0.99, rates, 8)
    with pytest.raises(DatasetError, match="one stratum"):
        mix_for(0.5, [PassRate(16, 32)] * 10, 8)


def test_load_pass_rates_checks_the_trace(tmp_path: Path) -> None:
    good = tmp_path / "t.jsonl"
    good.write_text("".join(json.dumps({"lengths": [5, 6], "acc": [1, 0]}) + "\n" for _ in range(3)))
    assert load_pass_rates(good, 3) == [PassRate(1, 2)] * 3
    with pytest.raises(DatasetError, match="has 3 lines; the workload has 200"):
        load_pass_rates(good, 200)
    (tmp_path / "bad.jsonl").write_text(json.dumps({"acc": [2]}) + "\n")
    with pytest.raises(DatasetError, match="0 or 1"):
        load_pass_rates(tmp_path / "bad.jsonl", 1)


def test_the_long_tail_dataset_by_pass_rates_keeps_its_problems() -> None:
    every = problems()
    assert [problem_index(e) for e in every] == list(range(len(every)))
    rates = [PassRate(0 if e.extra_info["difficulty"] == "hard" else 16, 32) for e in every]
    rows, mix = dataset_by_pass_rates(0.5, rates, 8, max_size=80)
    assert [problem_index(e) for e in rows] == mix.indices
    assert [e.index for e in rows] == list(range(len(rows)))
    assert all(e.extra_info["valid_rate_target"] == 0.5 for e in rows)
    hard = sum(e.extra_info["difficulty"] == "hard" for e in rows)
    assert hard == mix.low and 0.4 < hard / len(rows) < 0.6
