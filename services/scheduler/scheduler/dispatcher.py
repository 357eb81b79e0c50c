"""Dispatch I/O: the queue of requests waiting for a gateway, Generate calls, their failures,
and the abort fan-out. Decisions come from the pure `dispatch.pick`.

Invariants:
- the queue is served head first and a prompt's queued requests are placed together, so the
  prompt admitted first is generated first (prompt-level FIFO); re-dispatched requests go to the
  head;
- a request is handed to `on_response` at most once, only with a finished (stop/length) response
  and only while its task is current (not cancelled, not closed, the request not superseded);
- a request that failed at the transport level or was aborted by someone else (a pause, a drain)
  is dispatched again — with its partial tokens when the gateway returned them — until
  `max_tries`, then `on_give_up` is called.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

import grpc

from asyncdapo.scheduler.dispatch import DispatchPolicy, pick
from asyncdapo.scheduler.metrics import SchedulerMetrics
from asyncdapo.scheduler.pool import Gateway, GatewayPool
from asyncdapo.scheduler.tasks import PromptTask, Request, request_seed
from asyncdapo.v1 import common_pb2, gateway_pb2

log = logging.getLogger(__name__)

FINISH_ABORT = common_pb2.FINISH_REASON_ABORT


class Dispatcher:
    def __init__(
        self,
        pool: GatewayPool,
        policy: DispatchPolicy,
        metrics: SchedulerMetrics,
        on_response: Callable[[Request, Gateway, gateway_pb2.GenerateResponse], None],
        on_give_up: Callable[[Request, str], None],
        seed_base: int | None = None,
        max_tries: int = 8,
        keep_latencies: int = 1_000_000,
    ) -> None:
        self.pool = pool
        self.policy = policy
        self.metrics = metrics
        self.on_response = on_response
        self.on_give_up = on_give_up
        self.seed_base = seed_base
        self.max_tries = max_tries
        self.pending: deque[Request] = deque()
        self.dispatch_s: list[float] = []  # added dispatch latency samples, for benchmarks
        self.abort_fanout_s: list[float] = []
        self.aborted_tokens = 0
        self.aborted_requests = 0  # ids the gateways confirmed as aborted
        self.abort_requested = 0  # ids we asked them to abort (some may have just finished)
        self.closed = False
        self._keep = keep_latencies
        self._pumping = False
        self._t_capacity = 0.0
        self._calls: set[asyncio.Task[None]] = set()
        self._pools: dict[str, DispatchPolicy] = {}

    def set_min_weight_version(self, version: int) -> None:
        self.policy = replace(self.policy, min_weight_version=version)
        self._pools.clear()

    def _policy(self, pool: str) -> DispatchPolicy:
        if not pool:
            return self.policy
        p = self._pools.get(pool)
        if p is None:
            p = self._pools[pool] = replace(self.policy, pool=pool)
        return p

    def resubmit(self, req: Request) -> None:
        """Dispatch a request again at the head of the queue (a long-tail continuation)."""
        req.tries += 1
        req.t_ready = time.perf_counter()
        req.task.live[req.idx] = req
        self.pending.appendleft(req)
        self.pump()

    def submit(self, reqs: Iterable[Request]) -> None:
        now = time.perf_counter()
        for r in reqs:
            r.t_ready = now
            self.pending.append(r)
        self.pump()

    def pump(self) -> None:
        """Place queued requests on gateways, head first, until the queue is empty or every
        eligible gateway is full."""
        if self._pumping or not self.pending or self.closed:
            return
        self._pumping = True
        try:
            members = self.pool.members
            pending = self.pending
            while pending:
                head = pending[0]
                task = head.task
                if task.cancelled or task.live.get(head.idx) is not head:
                    pending.popleft()
                    continue
                count = 1
                while (
                    count < len(pending)
                    and count < task.n
                    and pending[count].task is task
                    and pending[count].pool == head.pool
                ):
                    count += 1
                decision = pick(members, self._policy(head.pool), count, frozenset(task.gateways))
                if not decision.addresses:
                    break
                for addr in decision.addresses:
                    self._start(pending.popleft(), self.pool.gateways[addr])
                if len(decision.addresses) < count:
                    break
        finally:
            self._pumping = False
        self.metrics.dispatch_queue.set(len(self.pending))

    def _start(self, req: Request, gw: Gateway) -> None:
        task = req.task
        if task.base_msg is None:
            task.base_msg = task.base_request()
        msg = gateway_pb2.GenerateRequest()
        msg.CopyFrom(task.base_msg)
        msg.request_id = req.make_rid()
        if req.max_tokens:
            msg.sampling.max_tokens = req.max_tokens
        seed = request_seed(self.seed_base, task.pid, req.idx)
        if seed is not None:
            msg.sampling.seed = seed
        if req.continuation is not None:
            c = req.continuation
            msg.continuation_token_ids.extend(c.token_ids)
            msg.continuation_logprobs.extend(c.logprobs)
            msg.continuation_versions.extend(c.version_runs)
        call = gw.stub.Generate(msg)
        req.gateway, req.call = gw, call
        gw.calls[req.rid] = call
        gw.in_flight += 1
        task.gateways.add(gw.address)
        lat = time.perf_counter() - max(req.t_ready, self._t_capacity)
        self.metrics.dispatch_latency.observe(lat)
        if len(self.dispatch_s) < self._keep:
            self.dispatch_s.append(lat)
        t = asyncio.ensure_future(self._await_call(req, gw, call))
        self._calls.add(t)
        t.add_done_callback(self._calls.discard)

    async def _await_call(self, req: Request, gw: Gateway, call: Any) -> None:
        resp: gateway_pb2.GenerateResponse | None = None
        err: BaseException | None = None
        try:
            resp = await call
        except asyncio.CancelledError as e:  # we cancelled the call (gateway down, shutdown)
            err = e
        except grpc.aio.AioRpcError as e:
            err = e
        finally:
            gw.calls.pop(req.rid, None)
            gw.in_flight -= 1
            self._t_capacity = time.perf_counter()
        if self.closed:
            return
        self._on_result(req, gw, resp, err)
        self.pump()

    def _on_result(
        self, req: Request, gw: Gateway, resp: gateway_pb2.GenerateResponse | None, err: BaseException | None
    ) -> None:
        task = req.task
        req.gateway = req.call = None
        if task.live.get(req.idx) is not req or task.cancelled or task.closed:
            if resp is not None and resp.finish_reason == FINISH_ABORT:
                self.aborted_tokens += len(resp.token_ids)
                self.metrics.aborted_tokens.inc(len(resp.token_ids))
            return
        if err is not None:
            code = err.code().name if isinstance(err, grpc.aio.AioRpcError) else "CANCELLED"
            self.metrics.gateway_errors.labels(gw.address, code).inc()
            if isinstance(err, grpc.aio.AioRpcError):
                self.pool.report_failure(gw, err)
            self._redispatch(req, "gateway_failure", None)
            return
        assert resp is not None
        if resp.finish_reason == FINISH_ABORT:
            # not our abort (a weight update with pause=abort, a drain, a gateway shutting down):
            # continue elsewhere from the partial tokens
            self._redispatch(req, "aborted_by_gateway", resp)
            return
        del task.live[req.idx]
        self.on_response(req, gw, resp)

    def _redispatch(self, req: Request, why: str, partial: gateway_pb2.GenerateResponse | None) -> None:
        req.tries += 1
        req.continuation = partial
        if req.tries >= self.max_tries:
            self.on_give_up(req, f"request failed {req.tries} times ({why})")
            return
        self.metrics.redispatched.labels(why).inc()
        req.t_ready = time.perf_counter()
        self.pending.appendleft(req)

    def cancel_calls(self, gw: Gateway) -> None:
        """The gateway is down: cancel what is in flight there; each call's handler re-dispatches."""
        for call in list(gw.calls.values()):
            call.cancel()

    async def abort(self, tasks: Iterable[PromptTask]) -> int:
        """Abort the in-flight requests of (already cancelled) tasks on every gateway in parallel;
        queued ones are skipped by `pump`. Returns the ids the gateways confirmed."""
        by_gw: dict[Gateway, list[str]] = {}
        for t in tasks:
            for req in t.live.values():
                if req.gateway is not None:
                    by_gw.setdefault(req.gateway, []).append(req.rid)
        if not by_gw:
            return 0
        t0 = time.perf_counter()
        self.abort_requested += sum(len(r) for r in by_gw.values())

        async def one(gw: Gateway, rids: list[str]) -> int:
            try:
                r = await gw.stub.Abort(
                    gateway_pb2.AbortRequest(request_ids=rids), metadata=gw.auth, timeout=5.0
                )
                return len(r.aborted_ids)
            except grpc.aio.AioRpcError as err:
                log.warning("abort on %s failed: %s", gw.address, err.code().name)
                return 0

        confirmed = sum(await asyncio.gather(*(one(g, r) for g, r in by_gw.items())))
        dt = time.perf_counter() - t0
        self.abort_fanout_s.append(dt)
        self.metrics.abort_fanout.observe(dt)
        self.metrics.aborted_requests.inc(confirmed)
        self.aborted_requests += confirmed
        return confirmed

    def close(self) -> None:
        self.closed = True
        for gw in self.pool.members:
            for call in list(gw.calls.values()):
                call.cancel()
