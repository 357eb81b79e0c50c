"""What recording a scored response into its group says and takes: the answer's status, the group's
progress, the response's score; and the group statistics the Lua scripts compute (`welford`, the
reference their arithmetic is tested against) and judge (`is_valid`). Pure, apart from
`group_state` (Redis, Lua) because the in-memory store and the rollout core build them per
response."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum


class RecordStatus(StrEnum):
    OK = "ok"
    COMPLETE = "complete"  # this response completed the group
    DUP = "dup"  # already counted (a retry); state unchanged
    STALE = "stale"  # not the current attempt, or the attempt already has an outcome
    FENCED = "fenced"  # another scheduler owns the run now; nothing was written


@dataclass(frozen=True, slots=True)
class GroupProgress:
    status: RecordStatus
    done: int = 0
    n: int = 0
    metric_mean: float = 0.0
    metric_std: float = 0.0
    reward_mean: float = 0.0
    reward_std: float = 0.0
    min_version: int = 0
    max_version: int = 0

    @property
    def complete(self) -> bool:
        return self.n > 0 and self.done >= self.n


@dataclass(slots=True)
class ResponseScore:
    """One judged response to count into its group. Read-only by convention, `__init__` written
    out: one per response (see tests/unit/test_record_inits.py)."""

    pid: str
    attempt: int
    idx: int
    metric: float  # the filter metric (acc or score)
    reward: float
    min_version: int
    max_version: int
    length: int = 0  # response tokens (the generated_tokens counter)

    def __init__(
        self,
        pid: str,
        attempt: int,
        idx: int,
        metric: float,
        reward: float,
        min_version: int,
        max_version: int,
        length: int = 0,
    ) -> None:
        self.pid = pid
        self.attempt = attempt
        self.idx = idx
        self.metric = metric
        self.reward = reward
        self.min_version = min_version
        self.max_version = max_version
        self.length = length


def welford(values: Sequence[float]) -> tuple[float, float]:
    """Mean and population std (ddof 0, as numpy and verl's DAPO filter) — the Lua reference."""
    mean = m2 = 0.0
    for i, x in enumerate(values, 1):
        d = x - mean
        mean += d / i
        m2 += d * (x - mean)
    return mean, math.sqrt(max(m2 / max(len(values), 1), 0.0))


def is_valid(metric_std: float, eps: float) -> bool:
    """DAPO dynamic sampling: a group carries signal only when its metric varies."""
    return metric_std > eps
