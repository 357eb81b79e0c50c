"""The queue of requests waiting for a gateway and its pump: which request goes to which gateway,
in what order, and what is dropped or goes back to the head. Pure: no asyncio, gRPC, Redis or
clock — the scheduler's `Dispatcher` (gRPC streams) and the simulator (modelled engines on a
virtual clock) drive the same `DispatchQueue`, each through its `DispatchTransport`.

Invariants:
- the queue is served head first, and a prompt's consecutive queued requests (same task, same
  pool, at most n) are placed by one `dispatch.pick` over the eligible index's candidates, so the
  prompt admitted first is generated first (prompt-level FIFO);
- a request whose task was cancelled, or that was superseded (its task's `live` holds another
  request for its index), is dropped when it reaches the head: it is never placed, not even
  within its prompt's batch;
- a re-dispatched request (a long-tail continuation, a retry) goes to the head;
- a pump stops at the first head that no gateway takes (none eligible for its pool: O(1) at
  saturation) and the head stays; the next `pump` (a reply, a load report, a resume) goes on;
- the transport refreshes the index's views before each decision, so a decision sees every
  placement made before it;
- `pump` is not re-entrant: a transport that calls back into it mid-pump gets an immediate return
  (the running pump goes on with the queue as changed).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Protocol

from asyncdapo.services.scheduler.eligible import EligibleIndex
from asyncdapo.services.scheduler.policy.dispatch import pick
from asyncdapo.services.scheduler.tasks import Request, ResponseView

DEFAULT_MAX_TRIES = 8  # dispatches of one request before it is given up


class DispatchTransport(Protocol):
    """What the queue needs of whoever talks to the gateways."""

    def refresh_views(self) -> None:
        """Bring the eligible index up to date before the queue reads it (the dispatcher keeps it
        current on every change; the simulator refreshes the gateways that changed since)."""
        ...

    def start_request(self, req: Request, address: str) -> None:
        """Send `req` to the gateway at `address`; from now on that gateway's in-flight count, and
        so the eligible index once refreshed, includes it."""
        ...


def is_current(req: Request) -> bool:
    """Whether a reply to `req` still counts: its task is neither cancelled nor closed and `req` is
    the task's live request for its index (not superseded by a re-dispatch)."""
    task = req.task
    return not task.cancelled and not task.closed and task.live.get(req.idx) is req


class DispatchQueue:
    def __init__(
        self, index: EligibleIndex, transport: DispatchTransport, max_tries: int = DEFAULT_MAX_TRIES
    ) -> None:
        self.index = index
        self.transport = transport
        self.max_tries = max_tries
        self.pending: deque[Request] = deque()
        self._pumping = False

    def __len__(self) -> int:
        return len(self.pending)

    def submit(self, reqs: Iterable[Request]) -> None:
        """New requests, at the tail."""
        self.pending.extend(reqs)

    def resubmit(self, req: Request) -> None:
        """The core re-dispatches `req` (a long-tail continuation): a new try, live again, at the
        head."""
        req.tries += 1
        req.task.live[req.idx] = req
        self.pending.appendleft(req)

    def retry(self, req: Request, partial: ResponseView | None) -> bool:
        """`req` failed at the transport or was aborted by someone else (a pause, a drain): a new
        try continuing from `partial` (its tokens so far, when the gateway returned them), at the
        head — unless this was its `max_tries`-th try: then False, and the caller gives it up."""
        req.tries += 1
        req.continuation = partial
        if req.tries >= self.max_tries:
            return False
        self.pending.appendleft(req)
        return True

    def pump(self) -> None:
        """Place queued requests on gateways, head first, until the queue is empty or the head's
        pool has no gateway to take it."""
        if self._pumping or not self.pending:
            return
        self._pumping = True
        try:
            pending = self.pending
            index = self.index
            transport = self.transport
            while pending:
                head = pending[0]
                task = head.task
                if task.cancelled or task.live.get(head.idx) is not head:
                    pending.popleft()
                    continue
                # the head's consecutive requests of its task and pool, up to a stale one (left
                # for the next round, which drops it)
                live = task.live
                count = 1
                while count < len(pending) and count < task.n:
                    nxt = pending[count]
                    if nxt.task is not task or nxt.pool != head.pool or live.get(nxt.idx) is not nxt:
                        break
                    count += 1
                transport.refresh_views()
                if not index.count(head.pool):
                    break  # every gateway of its pool is full, down, paused or behind
                gateways = task.gateways
                candidates = index.candidates(head.pool, gateways)
                placed = pick(candidates, index.policy_for(head.pool), count, frozenset(gateways)).addresses
                if not placed:
                    break
                for address in placed:
                    req = pending.popleft()
                    gateways.add(address)
                    transport.start_request(req, address)
                if len(placed) < count:
                    break
        finally:
            self._pumping = False
