"""Dispatch I/O: Generate requests over one `GenerateStream` per gateway, their failures, and the
abort fan-out. Which request goes where, in what order, and what is dropped or re-queued is the
pure `dispatch_queue.DispatchQueue` (which the simulator drives too); the dispatcher is its
transport (`refresh_views`, `start_request`).

Invariants:
- the queue's (dispatch_queue.py): served head first, a prompt's queued requests placed together
  (prompt-level FIFO), re-dispatched requests at the head, stale ones dropped;
- a request is handed to `on_response` at most once, only with a finished (stop/length) response
  and only while its task is current (not cancelled, not closed, the request not superseded);
  the abort reply of a cancelled task's current request goes to `on_aborted` with the tokens the
  response had (pdsr's L_cut counts it as a right-censored length); every reply of a cancelled
  task's current request — its abort reply or a finish that came too late — goes to `on_cut`;
- a request that failed at the transport level or was aborted by someone else (a pause, a drain)
  is dispatched again — with its partial tokens when the gateway returned them — until
  `max_tries`, then `on_give_up` is called; an evaluation request a gateway refused as
  INVALID_ARGUMENT is given up at once (`refused`): its prompt and sampling are the caller's, and
  every gateway serves the same model;
- every message from a gateway (replies, errors) and every lost stream pumps the queue: the
  capacity it freed is used at once;
- `gw.calls` holds exactly the requests in flight on the gateway's live stream (`gw.in_flight`
  is its size); a broken stream empties it and re-dispatches them all, oldest first, after
  the gateway is marked down;
- `placed` maps the id of every request in flight (the union of the gateways' `calls`) to the
  stream it was sent on, whose `gw` is its gateway: the request records (`tasks`) hold no handle
  on either, so the rollout core that holds them does no I/O.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import replace

import grpc

from asyncdapo.contracts.v1 import common_pb2, gateway_pb2
from asyncdapo.services.scheduler.dispatch_queue import DEFAULT_MAX_TRIES, DispatchQueue, is_current
from asyncdapo.services.scheduler.eligible import EligibleIndex
from asyncdapo.services.scheduler.gateway_pool import Gateway, GatewayPool
from asyncdapo.services.scheduler.gateway_stream import GatewayStream
from asyncdapo.services.scheduler.metrics import SchedulerMetrics
from asyncdapo.services.scheduler.policy.dispatch import DispatchPolicy
from asyncdapo.services.scheduler.tasks import Kind, PromptTask, Request, request_seed, version_run_messages

log = logging.getLogger(__name__)

FINISH_ABORT = common_pb2.FINISH_REASON_ABORT
INVALID_ARGUMENT = grpc.StatusCode.INVALID_ARGUMENT.name
ABORT_TIMEOUT_S = 5.0
_CODES = {c.value[0]: c for c in grpc.StatusCode}


class Dispatcher:
    def __init__(
        self,
        pool: GatewayPool,
        policy: DispatchPolicy,
        metrics: SchedulerMetrics,
        on_response: Callable[[Request, Gateway, gateway_pb2.GenerateResponse], None],
        on_give_up: Callable[[Request, str, bool], None],
        on_aborted: Callable[[Request, int], None] | None = None,
        on_cut: Callable[[Request, gateway_pb2.GenerateResponse], None] | None = None,
        seed_base: int | None = None,
        max_tries: int = DEFAULT_MAX_TRIES,
        keep_latencies: int = 1_000_000,
    ) -> None:
        self.pool = pool
        self.policy = policy
        self.metrics = metrics
        self.on_response = on_response
        self.on_give_up = on_give_up
        self.on_aborted = on_aborted
        self.on_cut = on_cut
        self.seed_base = seed_base
        self.dispatch_s: list[float] = []  # added dispatch latency samples, for benchmarks
        self.abort_fanout_s: list[float] = []
        self.aborted_tokens = 0
        self.aborted_requests = 0  # ids the gateways confirmed as aborted
        self.abort_requested = 0  # ids we asked them to abort (some may have just finished)
        self.closed = False
        self._keep = keep_latencies
        self._t_capacity = 0.0
        self._streams: dict[Gateway, GatewayStream] = {}
        # request id -> the stream (and through `stream.gw`, the gateway) it is in flight on
        self.placed: dict[str, GatewayStream] = {}
        # which gateways can take a request now: placing a prompt costs O(n), not O(gateways)
        self.index = EligibleIndex(policy, seed=seed_base)
        pool.on_change = self.index.update
        for gw in pool.members:
            self.index.update(gw)
        self.queue = DispatchQueue(self.index, self, max_tries)

    @property
    def pending(self) -> deque[Request]:
        """The requests waiting for a gateway, head first."""
        return self.queue.pending

    @property
    def max_tries(self) -> int:
        return self.queue.max_tries

    def set_min_weight_version(self, version: int) -> None:
        self.policy = replace(self.policy, min_weight_version=version)
        self.index.set_policy(self.policy)

    def resubmit(self, req: Request) -> None:
        """Dispatch a request again at the head of the queue (a long-tail continuation)."""
        req.t_ready = time.perf_counter()
        self.queue.resubmit(req)
        self.pump()

    def submit(self, reqs: Iterable[Request]) -> None:
        now = time.perf_counter()
        reqs = list(reqs)
        for r in reqs:
            r.t_ready = now
        self.queue.submit(reqs)
        self.pump()

    def pump(self) -> None:
        """Place queued requests on gateways (`DispatchQueue.pump`)."""
        if self.closed:
            return
        self.queue.pump()
        self.metrics.dispatch_queue.set(len(self.queue))

    # ------------------------------------------------------------------ the queue's transport
    def refresh_views(self) -> None:
        """Nothing to do: the index is told of every change as it happens (the pool's reports
        through `Gateway.on_change`, in-flight changes here)."""

    def start_request(self, req: Request, address: str) -> None:
        self._start(req, self.pool.gateways[address])

    def _stream(self, gw: Gateway) -> GatewayStream:
        s = self._streams.get(gw)
        if s is None or s.dead:
            s = self._streams[gw] = GatewayStream(gw, self._on_message, self._on_broken, self._on_sent)
        return s

    def _start(self, req: Request, gw: Gateway) -> None:
        task = req.task
        if task.base_msg is None:
            task.base_msg = task.base_request()
        stream = self._stream(gw)
        msg = stream.add(req)
        msg.CopyFrom(task.base_msg)
        msg.request_id = req.make_rid()
        if req.max_tokens:
            msg.sampling.max_tokens = req.max_tokens
        seed = request_seed(self.seed_base, task.pid, req.idx, task.attempt)
        if seed is not None:
            msg.sampling.seed = seed
        if req.continuation is not None:
            c = req.continuation
            msg.continuation_token_ids.extend(c.token_ids)
            msg.continuation_logprobs.extend(c.logprobs)
            msg.continuation_versions.extend(version_run_messages(c))
        self.placed[req.rid] = stream
        gw.calls[req.rid] = req
        gw.in_flight += 1
        self.index.update(gw)
        # added latency counts from when the request could go somewhere: ready, and a slot free
        if self._t_capacity > req.t_ready:
            req.t_ready = self._t_capacity

    def _on_sent(self, reqs: list[Request]) -> None:
        now = time.perf_counter()
        lats = [now - r.t_ready for r in reqs]
        observe = self.metrics.dispatch_latency.observe
        for lat in lats:
            observe(lat)
        if len(self.dispatch_s) < self._keep:
            self.dispatch_s.extend(lats)

    def _on_message(self, stream: GatewayStream, msg: gateway_pb2.GenerateStreamResponse) -> None:
        gw = stream.gw
        calls = gw.calls
        for resp in msg.responses:
            req = calls.pop(resp.request_id, None)
            if req is None:  # not ours any more (the stream broke and it was re-dispatched)
                continue
            del self.placed[req.rid]
            gw.in_flight -= 1
            self.index.update(gw)
            if not self.closed:
                self._on_result(req, gw, resp, None)
        for e in msg.errors:
            req = calls.pop(e.request_id, None)
            if req is None:
                continue
            del self.placed[req.rid]
            gw.in_flight -= 1
            self.index.update(gw)
            code = _CODES.get(e.code, grpc.StatusCode.UNKNOWN)
            log.warning("gateway %s rejected %s: %s: %s", gw.address, e.request_id, code.name, e.message)
            if self.closed:
                continue
            # as for a unary call: a gateway that answers UNAVAILABLE is presumed down, which
            # re-dispatches the rest of its stream too
            self.pool.report_failure(gw, code, e.message)
            self._on_result(req, gw, None, code.name, e.message)
        self._t_capacity = time.perf_counter()
        self.pump()

    def _on_broken(self, stream: GatewayStream, code: str, details: str) -> None:
        """The stream failed (gateway gone, connection lost, server stopped): mark the gateway
        down and re-dispatch everything that was in flight on it."""
        gw = stream.gw
        if self._streams.get(gw) is stream:
            del self._streams[gw]
        reqs = self._take_calls(gw, stream)
        if self.closed:
            return
        self.pool.presume_down(gw, f"generate stream: {code}: {details}")
        for req in reversed(reqs):  # re-dispatch goes to the head: keep their order
            self._on_result(req, gw, None, code, details)
        self.pump()

    def _take_calls(self, gw: Gateway, stream: GatewayStream) -> list[Request]:
        placed = self.placed
        reqs = [r for r in gw.calls.values() if placed[r.rid] is stream]
        for r in reqs:
            del gw.calls[r.rid]
            del placed[r.rid]
        gw.in_flight -= len(reqs)
        self.index.update(gw)
        self._t_capacity = time.perf_counter()
        return reqs

    def _on_result(
        self,
        req: Request,
        gw: Gateway,
        resp: gateway_pb2.GenerateResponse | None,
        err: str | None,
        detail: str = "",
    ) -> None:
        task = req.task
        if not is_current(req):
            current = task.cancelled and task.live.get(req.idx) is req
            if resp is not None and resp.finish_reason == FINISH_ABORT:
                self.aborted_tokens += len(resp.token_ids)
                self.metrics.aborted_tokens.inc(len(resp.token_ids))
                if self.on_aborted is not None and current:
                    self.on_aborted(req, len(resp.token_ids))
            if resp is not None and current and self.on_cut is not None:
                self.on_cut(req, resp)
            return
        if err is not None:
            self.metrics.gateway_errors.labels(gw.address, err).inc()
            if err == INVALID_ARGUMENT and task.kind is Kind.EVAL:
                self.on_give_up(req, f"{err} from {gw.address}: {detail}", True)
                return
            self._redispatch(req, "gateway_failure", None, f"{err} from {gw.address}: {detail}")
            return
        assert resp is not None
        if resp.finish_reason == FINISH_ABORT:
            # not our abort (a weight update with pause=abort, a drain, a gateway shutting down):
            # continue elsewhere from the partial tokens
            self._redispatch(req, "aborted_by_gateway", resp)
            return
        del task.live[req.idx]
        self.on_response(req, gw, resp)

    def _redispatch(
        self, req: Request, why: str, partial: gateway_pb2.GenerateResponse | None, detail: str = ""
    ) -> None:
        req.t_ready = time.perf_counter()
        if not self.queue.retry(req, partial):
            last = f"; last: {detail}" if detail else ""
            self.on_give_up(req, f"request failed {req.tries} times ({why}{last})", False)
            return
        self.metrics.redispatched.labels(why).inc()

    def cancel_calls(self, gw: Gateway) -> None:
        """The gateway is down: cancel its stream and re-dispatch what was in flight there."""
        stream = self._streams.pop(gw, None)
        if stream is None or stream.dead:
            return
        stream.close()
        reqs = self._take_calls(gw, stream)
        if self.closed:
            return
        for req in reversed(reqs):
            self._on_result(req, gw, None, "CANCELLED", "gateway down")
        self.pump()

    async def abort(self, tasks: Iterable[PromptTask]) -> int:
        """Abort the in-flight requests of (already cancelled) tasks on every gateway in parallel,
        through each gateway's stream (behind the requests it aborts, so none is missed in
        transit); queued ones are skipped by `pump`. Returns the ids the gateways confirmed."""
        by_stream: dict[GatewayStream, list[str]] = {}
        placed = self.placed
        for t in tasks:
            for req in t.live.values():
                stream = placed.get(req.rid)  # queued ones (none, or a stale rid) are not in flight
                if stream is not None:
                    by_stream.setdefault(stream, []).append(req.rid)
        if not by_stream:
            return 0
        t0 = time.perf_counter()
        self.abort_requested += sum(len(r) for r in by_stream.values())
        answers = [stream.abort(rids) for stream, rids in by_stream.items()]
        done, late = await asyncio.wait(answers, timeout=ABORT_TIMEOUT_S)
        for stream, fut in zip(by_stream, answers, strict=True):
            if fut in late:
                log.warning("abort on %s not answered in %.0f s", stream.gw.address, ABORT_TIMEOUT_S)
                fut.cancel()
        confirmed = sum(len(f.result()) for f in done)
        dt = time.perf_counter() - t0
        self.abort_fanout_s.append(dt)
        self.metrics.abort_fanout.observe(dt)
        self.metrics.aborted_requests.inc(confirmed)
        self.aborted_requests += confirmed
        return confirmed

    def close(self) -> None:
        self.closed = True
        for gw, stream in list(self._streams.items()):
            stream.close()
            self._take_calls(gw, stream)
        self._streams.clear()
