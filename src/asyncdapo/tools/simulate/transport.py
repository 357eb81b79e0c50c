"""A simulated gateway, and the way a dispatched request travels to its engine.

`Gw` is what the simulator's dispatcher knows of a gateway, with its engine. `DispatchTransport`
delays a dispatched request by `ClusterProfile.dispatch_s` (gRPC, the gateway, vLLM's frontend and
engine IPC); with `dispatch_per_request_s` > 0 the requests dispatched to one gateway at one
instant are a burst that reaches the engine together, once the gateway's frontend took in all of
them (after its earlier bursts): the real gateway's loop takes a burst's RPCs before its engine
schedules the first (the 2026-11-27 step logs: a version's first step on a gateway comes ~1.3-1.7 ms
per request of its burst after the dispatch, the rest of the burst within ~40 ms after it).

Invariant: a request is in `transit` from its dispatch until it reaches its engine or is recalled
(aborted on its way), never on an engine while in transit.
"""

from __future__ import annotations

from dataclasses import dataclass

from asyncdapo.tools.simulate.clock import VirtualClock
from asyncdapo.tools.simulate.engine_model import Engine, Seq


@dataclass(eq=False)
class Gw:
    """One simulated gateway: its engine and what the dispatcher knows of it."""

    address: str
    engine: Engine
    pool: str
    in_flight: int = 0
    paused: bool = False
    resuming: bool = False  # a weight update's reload is scheduled
    version: int = 0
    frontend_free: float = 0.0  # when its frontend is done with the bursts dispatched so far
    burst: list[Seq] | None = None  # requests dispatched to it at this instant, not yet sent


class DispatchTransport:
    def __init__(self, clock: VirtualClock, dispatch_s: float, per_request_s: float) -> None:
        self.clock = clock
        self.dispatch_s = dispatch_s
        self.per_request_s = per_request_s
        self.transit: set[int] = set()  # id(seq) of the requests on their way
        # when a list: (gateway, virtual time) of every request as it reaches its engine
        self.arrivals: list[tuple[str, float]] | None = None

    def send(self, g: Gw, seq: Seq) -> None:
        """`seq` was dispatched to `g` now: on its engine at once, or once it arrived."""
        if self.per_request_s > 0:
            self.transit.add(id(seq))
            if g.burst is None:
                g.burst = []
                self.clock.after(0.0, self._send_burst, g)  # after this instant's other dispatches
            g.burst.append(seq)
        elif self.dispatch_s > 0:
            self.transit.add(id(seq))
            self.clock.after(self.dispatch_s, self._arrive, (g, seq))
        else:
            self._submit(g, seq)

    def in_transit(self, seq: Seq) -> bool:
        return id(seq) in self.transit

    def recall(self, seq: Seq) -> bool:
        """Stop `seq` on its way (an abort caught it): whether it was still in transit."""
        if id(seq) not in self.transit:
            return False
        self.transit.discard(id(seq))
        return True

    def _send_burst(self, g: Gw) -> None:
        burst, g.burst = g.burst or [], None
        done = max(self.clock.now, g.frontend_free) + self.per_request_s * len(burst)
        g.frontend_free = done
        self.clock.at(done + self.dispatch_s, self._arrive_burst, (g, burst))

    def _arrive_burst(self, sent: tuple[Gw, list[Seq]]) -> None:
        g, burst = sent
        for seq in burst:
            self._arrive((g, seq))

    def _arrive(self, placed: tuple[Gw, Seq]) -> None:
        """A dispatched request reaches its engine (unless it was recalled on the way)."""
        g, seq = placed
        if self.recall(seq):
            self._submit(g, seq)

    def _submit(self, g: Gw, seq: Seq) -> None:
        if self.arrivals is not None:
            self.arrivals.append((g.address, self.clock.now))
        g.engine.submit(seq)
