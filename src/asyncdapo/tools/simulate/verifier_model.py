"""SIMULATOR: the verifier as the scheduler's `ScoreBatcher` meets it — a pool of workers, a full
batch sent at once, a partial one after `LINGER_S`, each call taking the profile's fixed cost plus
its per-item cost (slowed by other users' load on a CPU profile). What a score is, and what the
core does with it, stays in the driver."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asyncdapo.services.scheduler.core import ScoreResponse
from asyncdapo.tools.simulate.clock import VirtualClock
from asyncdapo.tools.simulate.profile import VerifierProfile

LINGER_S = 0.002  # ScoreBatcher's linger_s


class VerifierModel:
    def __init__(
        self,
        clock: VirtualClock,
        profile: VerifierProfile,
        batch: int,
        workers: int,
        slow: float,
        on_scored: Callable[[list[ScoreResponse]], None],
    ) -> None:
        self.clock = clock
        self.profile = profile
        self.batch = batch
        self.free = workers
        self.slow = slow  # other users' runnable threads slow every call (1: none)
        self.on_scored = on_scored
        self.queue: list[ScoreResponse] = []
        self._linger = False

    def send_soon(self) -> None:
        """A full batch goes at once, a partial one after `LINGER_S`."""
        if not self.queue:
            return
        if len(self.queue) >= self.batch:
            self._send()
        elif not self._linger:
            self._linger = True
            self.clock.after(LINGER_S, self._send)

    def _send(self, _: Any = None) -> None:
        self._linger = False
        size, v = self.batch, self.profile
        while self.queue and self.free:
            batch, self.queue = self.queue[:size], self.queue[size:]
            self.free -= 1
            self.clock.after((v.call_s + v.per_item_s * len(batch)) * self.slow, self._done, batch)

    def _done(self, jobs: list[ScoreResponse]) -> None:
        self.free += 1
        self.on_scored(jobs)
        self.send_soon()
