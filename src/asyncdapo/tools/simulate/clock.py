"""The simulator's virtual clock: an event queue that jumps from one event to the next.

Nothing in the simulator reads the wall clock for a decision. The rollout core reads no clock at
all (core.py); the in-memory store's claim records take `clock_ms` (given `VirtualClock.ms`); the
engines, the verifier, the trainer and the scheduler's own loops (admission, finisher,
housekeeping) schedule their next step here. Events at the same instant run in the order they
were scheduled, so a run is a pure function of its inputs and seed.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any


class VirtualClock:
    __slots__ = ("_heap", "_seq", "events", "now")

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[..., None], Any]] = []
        self._seq = 0
        self.events = 0  # events run so far (a cost figure of the simulation itself)

    def ms(self) -> int:
        return int(self.now * 1000)

    def at(self, t: float, fn: Callable[..., None], arg: Any = None) -> None:
        """Run `fn(arg)` at virtual time `t` (never before now)."""
        self._seq += 1
        heapq.heappush(self._heap, (t if t > self.now else self.now, self._seq, fn, arg))

    def after(self, dt: float, fn: Callable[..., None], arg: Any = None) -> None:
        self.at(self.now + dt, fn, arg)

    def run(self, until: Callable[[], bool], max_time: float = float("inf")) -> bool:
        """Run events in time order until `until()` holds (checked after each event) or the queue
        is empty or virtual time passes `max_time`. Returns whether `until()` held."""
        heap = self._heap
        pop = heapq.heappop
        while heap:
            t, _, fn, arg = pop(heap)
            if t > max_time:
                heapq.heappush(heap, (t, 0, fn, arg))
                return until()
            self.now = t
            self.events += 1
            fn(arg)
            if until():
                return True
        return until()

    def pending(self) -> int:
        return len(self._heap)
