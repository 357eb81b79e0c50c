"""The long-tail policy `pdsr`, pure: the window, the cap, the capped test.

Design (cap and migrate; the seed P-DSR's probe-then-rest serialised every group behind its probe,
1.2–1.8× plain async under s = 0 by a model): all n responses of a prompt start at once on the fast
pool, with max_tokens capped at cap_factor · L_cut; a response that reaches the cap is not finished
— it continues on the heavy pool from its partial tokens, uncapped. L_cut is the
(1 − offload_fraction) quantile of a sliding window of recent response lengths, so about
offload_fraction of the responses (the long tail) end on the heavy pool, and the fast pool's
lengths — its KV use and batch sizes — are bounded by the cap. The group is recorded and filtered
like any other. The window also holds right-censored lengths (responses stopped before a final
length: "≥ k tokens") and L_cut is a Kaplan–Meier quantile (`ProbeWindow`), so that the long
responses early stop aborts are not missing from it.

Until `min_probes` final lengths were seen there is no L_cut: nothing is capped.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from itertools import chain

FAST = "fast"
HEAVY = "heavy"


class LongTailAction(StrEnum):
    CAP_CONTINUE = "cap_continue"  # a fast response hit the cap and continues on the heavy pool
    CAP_GROUP = "cap_group"  # the first of a group's responses to hit the cap (a group circuit-break)
    FINAL = "final"  # a response of a pdsr run reached its final length (capped or not)


@dataclass(frozen=True, slots=True)
class Route:
    pool: str
    max_tokens: int  # for the prompt's non-probe responses
    offloaded: bool


class ProbeWindow:
    """A sliding window of recent response lengths, final or right-censored, and L_cut from it.

    Why censoring: a window of final lengths alone sees only the responses that finished. Early in
    a run only the short ones have, and early stop aborts the responses still running — the long
    ones — so such a window is biased low (survivorship), and so is L_cut: more responses reach
    the cap than `offload_fraction` (the circuit-break rate overshoots).

    Invariant: every observation is a true lower bound of one response's final length, and each
    response is in the window at most once — its final length (`add`, an event), or the tokens it
    is known to have generated when it stopped without one (`add_censored`: "length ≥ k", e.g. a
    capped response aborted while continuing on the heavy pool is ≥ its cap), or, while it still
    runs past the cap, the tokens it carried there (`running`, kept apart from the sliding window
    and replaced by one of the former when it ends). L_cut is the (1 − offload_fraction) quantile
    of the Kaplan–Meier (product-limit) estimate of the length distribution over the window and
    `running`; with no censored observation it is exactly the nearest-rank quantile of the final
    lengths. When the estimate
    never falls to offload_fraction (too many responses censored above the last final length)
    the quantile lies beyond the data and the largest observation, a lower bound, is returned.
    Until `min_probes` final lengths are in the window there is no L_cut.
    """

    def __init__(self, size: int = 512, min_probes: int = 8) -> None:
        self.obs: deque[tuple[int, bool]] = deque(maxlen=size)  # (length, final)
        self.min_probes = min_probes
        self.finals = 0  # final lengths in the window
        # responses continuing past the cap, by key: right-censored at the tokens they carried
        self.running: dict[Hashable, int] = {}
        self._cut: dict[float, float | None] = {}  # l_cut per offload_fraction, until the next change

    @property
    def lengths(self) -> list[int]:
        """The final lengths in the window, oldest first."""
        return [x for x, final in self.obs if final]

    def add(self, length: int, key: Hashable = None) -> None:
        """A response's final length (`key`: its entry in `running`, if it ran past the cap)."""
        self.running.pop(key, None)
        self._push(length, True)

    def add_censored(self, length: int, key: Hashable = None) -> None:
        """A response stopped without a final length after `length` tokens: its length is ≥ that.
        A zero lower bound says nothing (Kaplan–Meier drops it before any event) and is not kept,
        so that it does not push a real observation out of the window."""
        self.running.pop(key, None)
        if length > 0:
            self._push(length, False)
        self._cut.clear()

    def continuing(self, key: Hashable, length: int) -> None:
        """Response `key` reached the cap after `length` tokens and runs on: ≥ `length` until it ends
        (`add` or `add_censored` with the same key)."""
        self.running[key] = length
        self._cut.clear()

    def forget_running(self) -> None:
        """The responses still running are no longer this process's (the run was handed over)."""
        self.running.clear()
        self._cut.clear()

    def _push(self, length: int, final: bool) -> None:
        if len(self.obs) == self.obs.maxlen and self.obs[0][1]:
            self.finals -= 1
        self.obs.append((length, final))
        self.finals += final
        self._cut.clear()

    def l_cut(self, offload_fraction: float) -> float | None:
        """The (1 − offload_fraction) quantile of the window's Kaplan–Meier length distribution
        (None while fewer than `min_probes` final lengths were seen)."""
        if self.finals < self.min_probes:
            return None
        cut = self._cut.get(offload_fraction, -1.0)
        if cut == -1.0:
            running = ((x, False) for x in self.running.values())
            cut = self._cut[offload_fraction] = km_quantile(chain(self.obs, running), 1.0 - offload_fraction)
        return cut


def km_quantile(obs: Iterable[tuple[int, bool]], q: float) -> float | None:
    """The smallest length t whose Kaplan–Meier distribution F(t) = 1 − S(t) reaches q, over
    (length, final) observations; a censored one is at risk at its own length (ties: events
    first). When F never reaches q, the largest observation (a lower bound of the quantile);
    None without observations."""
    # each observation as one int, 2·length + censored, so that the sort compares ints (no key
    # function, no tuples: this runs after every new observation in a pdsr run) and orders a
    # tie's events before its censored ones
    xs = sorted([2 * t + (not final) for t, final in obs])
    if not xs:
        return None
    n = len(xs)
    at_risk, surv, i = n, 1.0, 0
    target = 1.0 - q + 1e-9  # S(t) ≤ 1 − q, with room for the product's rounding
    while i < n:
        t, d, j = xs[i] >> 1, 0, i
        while j < n and xs[j] >> 1 == t:
            d += not xs[j] & 1
            j += 1
        if d:
            surv *= 1.0 - d / at_risk
            if surv <= target:
                return float(t)
        at_risk -= j - i
        i = j
    return float(xs[-1] >> 1)


def route(probe_len: int, l_cut: float | None, cap_factor: float, max_tokens: int) -> Route:
    if l_cut is None:
        return Route(FAST, max_tokens, False)
    if probe_len > l_cut:
        return Route(HEAVY, max_tokens, True)
    return Route(FAST, min(max_tokens, max(1, math.ceil(cap_factor * l_cut))), False)


def capped(length: int, cap: int, max_tokens: int) -> bool:
    """A fast-pool response stopped by the cap, not by EOS or the run's own max_tokens."""
    return cap < max_tokens and length >= cap
