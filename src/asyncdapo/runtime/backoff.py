"""Capped exponential backoff: the one policy behind every retry loop (and every poll interval that
grows while there is nothing to do).

A `Backoff` is a frozen value: wait number `attempt` (0 for the first wait) is
`min(max_s, first_s * factor**attempt)`, then spread by its `Jitter`. Each caller names its policy
as a module constant (`REDIS_OUTAGE_BACKOFF = Backoff(0.1, 2.0)`), so its numbers are read in one
place. `delay(attempt)` is pure apart from the jitter's random draw (pass `rng` to make it
reproducible); `Backoff.delays()` is the small stateful helper a loop keeps: `next()` gives the
wait and counts it, `reset()` starts over after a success.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum


class Jitter(StrEnum):
    """How a wait of `d` seconds (already capped) is spread, so that many clients that failed
    together do not all retry at the same instant."""

    NONE = "none"  # exactly d
    FULL = "full"  # uniform in [0, d] (the widest spread; the mean is d/2)
    EQUAL = "equal"  # uniform in [d/2, d] (never much sooner than d)
    SPREAD = "spread"  # uniform in [d/2, 3d/2] (d on average, so may exceed max_s by half)


@dataclass(frozen=True, slots=True)
class Backoff:
    """`first_s` before the first retry, times `factor` per further retry, at most `max_s`, then
    jittered."""

    first_s: float
    max_s: float
    factor: float = 2.0
    jitter: Jitter = Jitter.NONE

    def __post_init__(self) -> None:
        if not 0 < self.first_s <= self.max_s:
            raise ValueError(
                f"Backoff needs 0 < first_s <= max_s; got first_s={self.first_s}, max_s={self.max_s}"
            )
        if self.factor < 1:
            raise ValueError(f"Backoff needs factor >= 1 (a wait never shrinks); got {self.factor}")

    def capped(self, attempt: int) -> float:
        """Wait number `attempt` (0-based) before jitter."""
        if attempt < 0:
            raise ValueError(f"attempt must be >= 0, got {attempt}")
        try:
            raw = self.first_s * self.factor**attempt
        except OverflowError:  # a float power past 1e308: long since capped
            raw = math.inf
        return min(self.max_s, raw)

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Wait number `attempt` (0-based), jittered with `rng` (default: the `random` module)."""
        d = self.capped(attempt)
        if self.jitter is Jitter.NONE:
            return d
        u = rng.random() if rng is not None else random.random()
        if self.jitter is Jitter.FULL:
            return d * u
        if self.jitter is Jitter.EQUAL:
            return d * (0.5 + u / 2)
        return d * (0.5 + u)  # SPREAD

    def delays(self, rng: random.Random | None = None) -> Delays:
        """A fresh counter of waits following this policy."""
        return Delays(self, rng)


class Delays(Iterator[float]):
    """The waits of one retry loop: `next()` is the wait before the next attempt (the first call
    gives `delay(0)`), `reset()` after a success. Also an endless iterator."""

    __slots__ = ("attempt", "policy", "rng")

    def __init__(self, policy: Backoff, rng: random.Random | None = None) -> None:
        self.policy = policy
        self.rng = rng
        self.attempt = 0  # waits handed out since the last reset

    def next(self) -> float:
        d = self.policy.delay(self.attempt, self.rng)
        self.attempt += 1
        return d

    def reset(self) -> None:
        self.attempt = 0

    def __next__(self) -> float:
        return self.next()
