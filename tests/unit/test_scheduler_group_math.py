"""Group statistics: the Python reference of the Lua arithmetic, the filter rule, the reward."""

from __future__ import annotations

import random

import numpy as np
import pytest

from asyncdapo.contracts.config import RunConfig
from asyncdapo.contracts.v1 import common_pb2, gateway_pb2
from asyncdapo.services.scheduler.group_records import is_valid, welford
from asyncdapo.services.scheduler.tasks import request_seed, version_range


def test_welford_matches_numpy_population_std() -> None:
    rng = random.Random(1)
    for _ in range(50):
        xs = [rng.uniform(-2, 2) for _ in range(rng.randint(1, 16))]
        mean, std = welford(xs)
        assert mean == pytest.approx(np.mean(xs), abs=1e-12)
        assert std == pytest.approx(np.std(xs), abs=1e-12)


def test_all_equal_groups_have_zero_std_and_are_filtered() -> None:
    for v in (0.0, 1.0, 0.1, 7.3):
        _, std = welford([v] * 8)
        assert std == 0.0 and not is_valid(std, 1e-6)
    _, std = welford([0, 0, 0, 1])
    assert is_valid(std, 1e-6)


def test_reward_is_score_plus_dapo_overlong_penalty() -> None:
    cfg = RunConfig.model_validate(
        {
            "data": {"max_response_length": 100},
            "reward": {"overlong_buffer": {"len": 20, "penalty_factor": 1.0}},
        }
    )
    assert cfg.overlong_penalty(80) == 0.0
    assert cfg.overlong_penalty(90) == pytest.approx(-0.5)
    assert cfg.overlong_penalty(100) == pytest.approx(-1.0)


def test_version_range_and_seed() -> None:
    r = gateway_pb2.GenerateResponse(
        version_runs=[
            common_pb2.VersionRun(version=3, num_tokens=4),
            common_pb2.VersionRun(version=5, num_tokens=2),
        ]
    )
    assert version_range(r, 9) == (3, 5)
    assert version_range(gateway_pb2.GenerateResponse(), 9) == (9, 9)
    assert request_seed(None, "p", 0) is None
    assert request_seed(1, "p", 0) == request_seed(1, "p", 0) != request_seed(1, "p", 1)
    # a requeued attempt draws new samples; the first attempt keeps the seeds it always had
    assert request_seed(1, "p", 0, attempt=1) == request_seed(1, "p", 0)
    assert len({request_seed(1, "p", 0, attempt=a) for a in range(1, 6)}) == 5
