"""A simulated gateway, and the way a dispatched request travels to its engine: the scheduler's
own dispatch queue (`services.scheduler.dispatch_queue`) places requests through `SimTransport`.

`Gw` is what the simulator's dispatcher knows of a gateway, with its engine. `SimTransport` is the
queue's transport: it keeps each gateway's `GatewayView` in the eligible index (a snapshot,
refreshed before the queue's next decision for the gateways that changed since), starts a placed
request as a `Seq` for its engine, and delays it by `ClusterProfile.dispatch_s` (gRPC, the gateway,
vLLM's frontend and engine IPC); with `dispatch_per_request_s` > 0 the requests dispatched to one
gateway at one instant are a burst that reaches the engine together, once the gateway's frontend
took in all of them (after its earlier bursts): the real gateway's loop takes a burst's RPCs before
its engine schedules the first (the 2026-11-27 step logs: a version's first step on a gateway comes
~1.3-1.7 ms per request of its burst after the dispatch, the rest of the burst within ~40 ms after
it).

Invariants: a request is in `transit` from its dispatch until it reaches its engine or is recalled
(aborted on its way), never on an engine while in transit; `placed` holds exactly the requests a
gateway's `in_flight` counts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from asyncdapo.services.scheduler.eligible import EligibleIndex
from asyncdapo.services.scheduler.policy.dispatch import GatewayView
from asyncdapo.services.scheduler.tasks import Request
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


class SimTransport:
    """`dispatch_queue.DispatchTransport` for simulated gateways (see the module docstring)."""

    def __init__(
        self,
        clock: VirtualClock,
        gws: list[Gw],
        index: EligibleIndex,
        natural: Callable[[Request], int],
        cap: int,
        dispatch_s: float,
        per_request_s: float,
    ) -> None:
        self.clock = clock
        self.gws = gws
        self.by_address = {g.address: g for g in gws}
        self.index = index
        self.natural = natural  # a request's natural length (the workload's; the core never reads it)
        self.cap = cap  # max_response_length
        self.dispatch_s = dispatch_s
        self.per_request_s = per_request_s
        # id(request) -> where it runs, its Seq and its natural length
        self.placed: dict[int, tuple[Gw, Seq, int]] = {}
        self.transit: set[int] = set()  # id(seq) of the requests on their way
        # when a list: (gateway, virtual time) of every request as it reaches its engine
        self.arrivals: list[tuple[str, float]] | None = None
        # an ordered set (a dict): which gateway's view is refreshed first decides the eligible
        # index's order, hence the seeded sample of gateways; a set of objects hashed by address
        # made that order, and the run, differ between processes
        self._dirty: dict[Gw, None] = {}
        self.refresh_all()

    # ------------------------------------------------------------------ views
    def changed(self, g: Gw) -> None:
        """The dispatcher's view of `g` changed: refreshed before the queue's next decision (views
        are read only there)."""
        self._dirty[g] = None

    def refresh_views(self) -> None:
        if self._dirty:
            for g in self._dirty:
                self._update_view(g)
            self._dirty.clear()

    def refresh_all(self) -> None:
        """Every gateway's view now (a new policy rebuilt the index)."""
        self._dirty.clear()
        for g in self.gws:
            self._update_view(g)

    def _update_view(self, g: Gw) -> None:
        self.index.update(
            GatewayView(
                address=g.address,
                paused=g.paused,
                pool=g.pool,
                in_flight=g.in_flight,
                kv_cache_usage=g.engine.kv_usage(),
                weight_version=g.version,
            )
        )

    # ------------------------------------------------------------------ requests
    def start_request(self, req: Request, address: str) -> None:
        """The queue placed `req` on `address`: its engine runs it to its natural length or its
        max_tokens, from its continuation's tokens when it continues one."""
        g = self.by_address[address]
        natural = self.natural(req)
        limit = req.max_tokens or self.cap
        cont = req.continuation
        gen = len(cont.token_ids) if cont is not None else 0
        runs = [[r.version, r.num_tokens] for r in cont.version_runs] if cont is not None else None
        seq = Seq(req, len(req.task.prompt_token_ids), gen, min(natural, limit), runs)
        self.placed[id(req)] = (g, seq, natural)
        g.in_flight += 1
        self._dirty[g] = None
        self.send(g, seq)

    def release(self, req: Request) -> tuple[Gw, Seq, int] | None:
        """`req` left its gateway (replied, aborted): no longer in flight there. None when it was
        not placed (released before)."""
        placed = self.placed.pop(id(req), None)
        if placed is not None:
            g = placed[0]
            g.in_flight -= 1
            self._dirty[g] = None
        return placed

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
