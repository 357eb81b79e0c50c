"""The dispatch queue (pure), as both the scheduler's dispatcher and the simulator drive it: head
first, a prompt's requests placed together, stale requests dropped, re-dispatches and retries at
the head, a stop at the first head no gateway takes, views refreshed before each decision."""

from __future__ import annotations

from dataclasses import dataclass, field

from asyncdapo.services.scheduler.dispatch_queue import DispatchQueue, is_current
from asyncdapo.services.scheduler.eligible import EligibleIndex
from asyncdapo.services.scheduler.policy.dispatch import DispatchPolicy
from asyncdapo.services.scheduler.tasks import Kind, PromptTask, Request


@dataclass(eq=False)
class Gw:
    """A gateway's dispatch attributes, mutable (as `gateway_pool.Gateway`'s)."""

    address: str
    up: bool = True
    draining: bool = False
    paused: bool = False
    pool: str = ""
    in_flight: int = 0
    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0
    capacity: int = 0
    weight_version: int = 0


@dataclass
class Transport:
    """Starts requests by counting them in flight. `lazy`: tells the index only when the queue asks
    for fresh views (as the simulator does); else at once (as the dispatcher does)."""

    index: EligibleIndex
    gws: dict[str, Gw]
    lazy: bool = False
    started: list[tuple[str, int, str]] = field(default_factory=list)  # (pid, idx, gateway)
    dirty: list[Gw] = field(default_factory=list)
    refreshes: int = 0
    queue: DispatchQueue | None = None
    pump_from_start: bool = False

    def refresh_views(self) -> None:
        self.refreshes += 1
        for g in self.dirty:
            self.index.update(g)
        self.dirty.clear()

    def start_request(self, req: Request, address: str) -> None:
        g = self.gws[address]
        g.in_flight += 1
        self.started.append((req.task.pid, req.idx, address))
        if self.lazy:
            self.dirty.append(g)
        else:
            self.index.update(g)
        if self.pump_from_start and self.queue is not None:
            self.queue.pump()  # a reply arriving mid-pump must not start a second pump

    def finish(self, address: str) -> None:
        g = self.gws[address]
        g.in_flight -= 1
        self.index.update(g)


def setup(gateways: int, max_in_flight: int, lazy: bool = False) -> tuple[DispatchQueue, Transport]:
    index = EligibleIndex(DispatchPolicy(max_in_flight=max_in_flight), seed=0)
    gws = {f"g{i}": Gw(f"g{i}") for i in range(gateways)}
    for g in gws.values():
        index.update(g)
    transport = Transport(index, gws, lazy=lazy)
    queue = DispatchQueue(index, transport, max_tries=3)
    transport.queue = queue
    return queue, transport


def task(pid: str, n: int) -> PromptTask:
    return PromptTask(Kind.TRAIN, pid, 1, 0, n, [1, 2, 3], "gt")


def test_prompts_are_served_in_order_each_one_spread_by_one_pick() -> None:
    queue, tr = setup(gateways=4, max_in_flight=8)
    a, b = task("a", 4), task("b", 4)
    queue.submit(a.make_requests() + b.make_requests())
    queue.pump()
    assert [(pid, idx) for pid, idx, _ in tr.started] == [("a", i) for i in range(4)] + [
        ("b", i) for i in range(4)
    ]
    # one pick per prompt spreads its n requests over the least loaded gateways
    assert sorted(g for pid, _, g in tr.started if pid == "a") == ["g0", "g1", "g2", "g3"]
    assert {g for _, _, g in tr.started} == set(a.gateways) == set(b.gateways)
    assert not queue.pending


def test_a_full_fleet_stops_the_pump_at_the_head_and_a_freed_slot_serves_the_head_first() -> None:
    queue, tr = setup(gateways=2, max_in_flight=2)
    a, b = task("a", 3), task("b", 2)
    queue.submit(a.make_requests() + b.make_requests())
    queue.pump()
    assert [(p, i) for p, i, _ in tr.started] == [("a", 0), ("a", 1), ("a", 2), ("b", 0)]
    assert [(r.task.pid, r.idx) for r in queue.pending] == [("b", 1)]
    queue.pump()  # nothing freed: nothing moves
    assert len(tr.started) == 4
    tr.finish(tr.started[0][2])
    queue.pump()
    assert tr.started[-1][:2] == ("b", 1) and not queue.pending


def test_cancelled_and_superseded_requests_are_dropped_never_placed() -> None:
    queue, tr = setup(gateways=2, max_in_flight=8)
    a, b, c = task("a", 2), task("b", 2), task("c", 1)
    queue.submit(a.make_requests() + b.make_requests() + c.make_requests())
    a.cancelled = True
    b.live[1] = Request(b, 1, tries=1)  # re-dispatched meanwhile: the queued one is stale
    queue.pump()
    assert [(p, i) for p, i, _ in tr.started] == [("b", 0), ("c", 0)]
    assert not queue.pending


def test_a_reply_counts_only_while_its_request_is_current() -> None:
    t = task("a", 2)
    r0, r1 = t.make_requests()
    assert is_current(r0) and is_current(r1)
    t.live[1] = Request(t, 1, tries=1)
    assert is_current(r0) and not is_current(r1)
    t.closed = True
    assert not is_current(r0)


def test_redispatches_and_retries_go_to_the_head_and_a_request_is_given_up_after_max_tries() -> None:
    queue, tr = setup(gateways=1, max_in_flight=1)
    a, b = task("a", 1), task("b", 1)
    (ra,), (rb,) = a.make_requests(), b.make_requests()
    queue.submit([ra])
    del b.live[0]  # the core took its response; a long-tail continuation brings it back
    queue.resubmit(rb)
    assert rb.tries == 1 and b.live[0] is rb and list(queue.pending) == [rb, ra]
    queue.pump()
    assert tr.started == [("b", 0, "g0")]
    partial = object()  # what the gateway returned of it (any `ResponseView`)
    assert queue.retry(rb, partial)  # type: ignore[arg-type]
    assert rb.tries == 2 and rb.continuation is partial and list(queue.pending) == [rb, ra]
    assert not queue.retry(rb, None)  # its 3rd try: given up, not queued again
    assert rb.tries == 3 and list(queue.pending) == [rb, ra]


def test_views_are_refreshed_before_every_decision_so_a_lazy_transport_never_overfills() -> None:
    queue, tr = setup(gateways=2, max_in_flight=2, lazy=True)
    tasks = [task(f"p{i}", 2) for i in range(4)]
    queue.submit([r for t in tasks for r in t.make_requests()])
    queue.pump()
    assert len(tr.started) == 4 and all(g.in_flight == 2 for g in tr.gws.values())
    assert [(r.task.pid, r.idx) for r in queue.pending] == [("p2", 0), ("p2", 1), ("p3", 0), ("p3", 1)]
    assert tr.refreshes >= 3  # before each of the three picks (the third finds none eligible)


def test_a_pump_called_from_inside_a_start_returns_and_the_outer_pump_goes_on() -> None:
    queue, tr = setup(gateways=2, max_in_flight=4)
    tr.pump_from_start = True
    tasks = [task(f"p{i}", 2) for i in range(3)]
    queue.submit([r for t in tasks for r in t.make_requests()])
    queue.pump()
    assert sorted((p, i) for p, i, _ in tr.started) == [(f"p{k}", i) for k in range(3) for i in range(2)]
    assert not queue.pending
