"""The scheduler's `GatewayStream` against a real (SIMULATOR) gateway over gRPC: aborts sent in the
stream are answered in order, and a stream that dies answers the aborts still waiting."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import grpc
from scheduler_harness import sim_gateways

from asyncdapo.contracts.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from asyncdapo.services.scheduler.gateway_stream import GatewayStream


class _Recorder:
    def __init__(self) -> None:
        self.responses: dict[str, gateway_pb2.GenerateResponse] = {}
        self.broken: list[str] = []

    def on_message(self, stream: GatewayStream, msg: gateway_pb2.GenerateStreamResponse) -> None:
        self.responses.update({r.request_id: r for r in msg.responses})

    def on_broken(self, stream: GatewayStream, code: str, details: str) -> None:
        self.broken.append(code)


def _send(stream: GatewayStream, rid: str, max_tokens: int) -> None:
    msg = stream.add(SimpleNamespace(rid=rid))
    msg.request_id = rid
    msg.prompt_token_ids.extend([1, 2, 3])
    msg.sampling.max_tokens = max_tokens
    msg.sampling.ignore_eos = True


async def _until(cond: Any, what: str, timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not cond():
            await asyncio.sleep(0.01)
    assert cond(), what


@contextlib.asynccontextmanager
async def _stream_to_a_sim_gateway() -> AsyncIterator[tuple[Any, GatewayStream, _Recorder]]:
    async with sim_gateways(1) as (g,), grpc.aio.insecure_channel(g.address) as ch:
        rec = _Recorder()
        gw = SimpleNamespace(address=g.address, stub=gateway_pb2_grpc.GatewayStub(ch))
        yield g, GatewayStream(gw, rec.on_message, rec.on_broken, lambda reqs: None), rec


async def test_aborts_in_the_stream_are_answered_in_order_and_reach_requests_in_transit() -> None:
    async with _stream_to_a_sim_gateway() as (g, stream, rec):
        _send(stream, "a", 100_000)
        _send(stream, "b", 100_000)
        first = stream.abort(["a"])  # in the same write as the requests it aborts
        also = stream.abort(["b", "nope"])  # the same write again: one answer shared out
        assert await asyncio.wait_for(first, 10) == ["a"]
        assert await asyncio.wait_for(also, 10) == ["b"]
        _send(stream, "c", 100_000)
        again = stream.abort(["a"])  # already aborted: answered, with nothing
        assert await asyncio.wait_for(again, 10) == []
        await _until(lambda: {"a", "b"} <= set(rec.responses), "aborted responses")
        assert all(rec.responses[r].finish_reason == common_pb2.FINISH_REASON_ABORT for r in "ab")
        assert "c" not in rec.responses and g.server.service.in_flight == 1
        stream.close()
        await _until(lambda: g.server.service.in_flight == 0, "c aborted by closing the stream")
        assert rec.broken == []  # our own close is not a failure


async def test_a_dying_stream_answers_its_pending_aborts_empty() -> None:
    async with _stream_to_a_sim_gateway() as (g, stream, rec):
        _send(stream, "a", 100_000)
        await _until(lambda: g.server.service.in_flight == 1, "request started")
        await g.server.stop(0)
        pending = stream.abort(["a"])  # the gateway is gone: it is never answered by it
        assert await asyncio.wait_for(pending, 10) == []
        await _until(lambda: rec.broken, "the stream reported broken")
        assert len(rec.broken) == 1 and stream.dead
        assert await asyncio.wait_for(stream.abort(["a"]), 1) == []  # a dead stream answers at once
