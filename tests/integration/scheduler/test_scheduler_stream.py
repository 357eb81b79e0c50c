"""The dispatcher's GenerateStream transport against in-process sim gateways (real gRPC): batching,
per-request errors, a stream broken mid-flight, cancel on gateway down, abort fan-out."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from scheduler_harness import sim_gateways, wait_for

from asyncdapo.contracts.v1 import common_pb2, gateway_pb2
from asyncdapo.services.scheduler.dispatcher import Dispatcher
from asyncdapo.services.scheduler.gateway_pool import Gateway, GatewayPool, GatewaySpec
from asyncdapo.services.scheduler.metrics import SchedulerMetrics
from asyncdapo.services.scheduler.policy.dispatch import DispatchPolicy
from asyncdapo.services.scheduler.tasks import Kind, PromptTask, Request


@dataclass
class Sink:
    responses: list[tuple[Request, str, gateway_pb2.GenerateResponse]] = field(default_factory=list)
    given_up: list[tuple[Request, str]] = field(default_factory=list)
    refused: list[bool] = field(default_factory=list)  # per give-up: refused at once (no retry)

    def on_response(self, req: Request, gw: Gateway, resp: gateway_pb2.GenerateResponse) -> None:
        self.responses.append((req, gw.address, resp))

    def on_give_up(self, req: Request, detail: str, refused: bool) -> None:
        self.given_up.append((req, detail))
        self.refused.append(refused)


@contextlib.asynccontextmanager
async def dispatcher(addresses: Sequence[str], max_tries: int = 8) -> AsyncIterator[tuple[Dispatcher, Sink]]:
    pool = GatewayPool(GatewaySpec(static=tuple(addresses)), watch_interval_ms=50)
    sink = Sink()
    d = Dispatcher(
        pool, DispatchPolicy(max_in_flight=1 << 16), SchedulerMetrics(), sink.on_response, sink.on_give_up,
        max_tries=max_tries,
    )  # fmt: skip
    pool.on_down = d.cancel_calls
    pool.on_load = lambda gw: d.pump()
    await pool.start()
    await pool.wait_up(len(addresses), 10)
    try:
        yield d, sink
    finally:
        d.close()
        await pool.close()


def tasks(
    count: int, n: int, max_tokens: int, prompt: Sequence[int] = (1, 2, 3), kind: Kind = Kind.TRAIN
) -> list[PromptTask]:
    sampling = common_pb2.SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return [PromptTask(kind, f"p{i}", 1, i, n, list(prompt), "gt", sampling=sampling) for i in range(count)]


def requests(ts: Sequence[PromptTask]) -> list[Request]:
    return [r for t in ts for r in t.make_requests()]


async def test_every_request_is_answered_once_over_one_stream_per_gateway() -> None:
    async with sim_gateways(2) as gws, dispatcher([g.address for g in gws]) as (d, sink):
        ts = tasks(12, 4, 6)
        d.submit(requests(ts))
        await wait_for(lambda: len(sink.responses) == 48, 10, "all responses")
        await asyncio.sleep(0.05)
        assert len(sink.responses) == 48  # no duplicate delivery
        assert {(r.task.pid, r.idx) for r, _, _ in sink.responses} == {
            (t.pid, i) for t in ts for i in range(4)
        }
        assert all(len(resp.token_ids) == 6 for _, _, resp in sink.responses)
        assert all(not t.live for t in ts)
        assert len(d._streams) == 2  # one long-lived stream per gateway, reused by every request
        assert all(gw.in_flight == 0 and not gw.calls for gw in d.pool.members)
        assert len(d.dispatch_s) == 48


async def test_a_rejected_request_is_retried_then_given_up_with_the_gateways_reason() -> None:
    async with sim_gateways(1) as gws, dispatcher([gws[0].address], max_tries=3) as (d, sink):
        bad = tasks(1, 2, 0)  # max_tokens 0: INVALID_ARGUMENT on every try
        good = tasks(1, 2, 4, prompt=(5, 6))
        good[0].pid = "good"
        d.submit(requests(bad) + requests(good))
        await wait_for(lambda: len(sink.given_up) == 2 and len(sink.responses) == 2, 10, "give-ups")
        assert sink.refused == [False, False]  # a training request is the run's: retried first
        for req, detail in sink.given_up:
            assert req.task is bad[0] and req.tries == 3
            assert "INVALID_ARGUMENT" in detail and "sampling.max_tokens" in detail, detail
        # a per-request error leaves the stream and the gateway in service
        assert d.pool.members[0].up and len(d._streams) == 1
        errors = d.metrics.registry.get_sample_value(
            "asyncdapo_scheduler_gateway_errors_total",
            {"gateway": gws[0].address, "code": "INVALID_ARGUMENT"},
        )
        assert errors == 6


async def test_an_evaluation_request_refused_as_invalid_is_given_up_at_once() -> None:
    """An evaluation's prompt and sampling are its caller's, and every gateway serves the same
    model: a refusal is the answer, not a fault to retry elsewhere."""
    async with sim_gateways(2) as gws, dispatcher([g.address for g in gws], max_tries=8) as (d, sink):
        bad = tasks(1, 2, 4, prompt=(5, 10**6), kind=Kind.EVAL)  # past the sim vocabulary
        d.submit(requests(bad))
        await wait_for(lambda: len(sink.given_up) == 2, 10, "give-ups")
        assert sink.refused == [True, True]
        assert all("outside the vocabulary" in detail for _, detail in sink.given_up)
        errors = sum(
            d.metrics.registry.get_sample_value(
                "asyncdapo_scheduler_gateway_errors_total", {"gateway": g.address, "code": "INVALID_ARGUMENT"}
            )
            or 0
            for g in gws
        )
        assert errors == 2  # one try per request
        assert all(g.up for g in d.pool.members)


async def test_a_stream_broken_mid_flight_is_redispatched_to_the_other_gateway() -> None:
    async with sim_gateways(2) as gws, dispatcher([g.address for g in gws]) as (d, sink):
        victim, other = (d.pool.get(g.address) for g in gws)
        assert victim is not None and other is not None
        other.drain_requested = True  # everything lands on the victim first
        ts = tasks(8, 4, 400)  # ~1 s each: still running when the victim dies
        d.submit(requests(ts))
        await wait_for(lambda: victim.in_flight == 32, 5, "all requests on the victim")
        other.drain_requested = False
        await gws[0].server.stop(0)  # abrupt: the stream breaks with everything in flight
        await wait_for(lambda: len(sink.responses) == 32, 20, "every response, from the survivor")
        assert {addr for _, addr, _ in sink.responses} == {other.address}
        assert {(r.task.pid, r.idx) for r, _, _ in sink.responses} == {
            (t.pid, i) for t in ts for i in range(4)
        }
        assert all(r.tries == 1 for r, _, _ in sink.responses)
        assert not victim.up and not victim.calls and victim.in_flight == 0
        assert not sink.given_up


async def test_gateway_down_cancels_its_stream_and_the_engine_stops_generating() -> None:
    async with sim_gateways(2) as gws, dispatcher([g.address for g in gws]) as (d, _):
        first, second = (d.pool.get(g.address) for g in gws)
        assert first is not None and second is not None
        second.drain_requested = True
        d.submit(requests(tasks(2, 4, 100_000)))
        await wait_for(lambda: first.in_flight == 8, 5, "requests on the first gateway")
        await wait_for(lambda: gws[0].server.service.in_flight == 8, 5, "requests running there")
        second.drain_requested = False
        d.pool.mark_down(first, "test: presumed dead")
        # the requests moved at once, and the gateway the stream was cancelled on aborted them
        assert first.in_flight == 0 and not first.calls
        await wait_for(lambda: second.in_flight == 8, 5, "requests re-dispatched")
        await wait_for(lambda: gws[0].server.service.in_flight == 0, 5, "aborted on the first engine")


async def test_abort_fan_out_ends_streamed_requests_and_counts_their_tokens() -> None:
    async with sim_gateways(2) as gws, dispatcher([g.address for g in gws]) as (d, sink):
        ts = tasks(4, 4, 100_000)
        d.submit(requests(ts))
        await wait_for(lambda: sum(g.in_flight for g in d.pool.members) == 16, 5, "all in flight")
        await asyncio.sleep(0.05)  # some tokens generated
        for t in ts:
            t.cancelled = True
        assert await d.abort(ts) == 16
        await wait_for(lambda: all(g.in_flight == 0 for g in d.pool.members), 5, "aborted replies")
        assert d.aborted_tokens > 0 and not sink.responses and not sink.given_up
        assert all(g.up for g in d.pool.members) and len(d.abort_fanout_s) == 1
