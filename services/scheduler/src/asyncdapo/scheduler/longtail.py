"""The long-tail policy `pdsr`, pure: the window, the cap, the capped test.

Design (cap and migrate; the seed P-DSR's probe-then-rest serialised every group behind its probe,
1.2–1.8× plain async under s = 0 by a model): all n responses of a prompt start at once on the fast
pool, with max_tokens capped at cap_factor · L_cut; a response that reaches the cap is not finished
— it continues on the heavy pool from its partial tokens, uncapped. L_cut is the
(1 − offload_fraction) quantile of a sliding window of recent final response lengths, so about
offload_fraction of the responses (the long tail) end on the heavy pool, and the fast pool's
lengths — its KV use and batch sizes — are bounded by the cap. The group is recorded and filtered
like any other.

Until `min_probes` lengths were seen there is no L_cut: nothing is capped.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from enum import StrEnum

FAST = "fast"
HEAVY = "heavy"


class LongTailAction(StrEnum):
    CAP_CONTINUE = "cap_continue"  # a fast response hit the cap and continues on the heavy pool


@dataclass(frozen=True, slots=True)
class Route:
    pool: str
    max_tokens: int  # for the prompt's non-probe responses
    offloaded: bool


class ProbeWindow:
    def __init__(self, size: int = 512, min_probes: int = 8) -> None:
        self.lengths: deque[int] = deque(maxlen=size)
        self.min_probes = min_probes

    def add(self, length: int) -> None:
        self.lengths.append(length)

    def l_cut(self, offload_fraction: float) -> float | None:
        """The (1 − offload_fraction) quantile of recent probe lengths (nearest rank)."""
        if len(self.lengths) < self.min_probes:
            return None
        xs = sorted(self.lengths)
        rank = max(0, math.ceil((1.0 - offload_fraction) * len(xs)) - 1)
        return float(xs[rank])


def route(probe_len: int, l_cut: float | None, cap_factor: float, max_tokens: int) -> Route:
    if l_cut is None:
        return Route(FAST, max_tokens, False)
    if probe_len > l_cut:
        return Route(HEAVY, max_tokens, True)
    return Route(FAST, min(max_tokens, max(1, math.ceil(cap_factor * l_cut))), False)


def capped(length: int, cap: int, max_tokens: int) -> bool:
    """A fast-pool response stopped by the cap, not by EOS or the run's own max_tokens."""
    return cap < max_tokens and length >= cap
