"""`GenerateStream` over real gRPC with the token-timing SIMULATOR: per-request errors that match
unary Generate's, completion-order responses, abort and cancel semantics, drain."""

from __future__ import annotations

import asyncio
import time

import grpc

from asyncdapo.contracts.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc


def _req(
    rid: str, prompt: list[int], max_tokens: int, ignore_eos: bool = True
) -> gateway_pb2.GenerateRequest:
    return gateway_pb2.GenerateRequest(
        request_id=rid,
        prompt_token_ids=prompt,
        sampling=common_pb2.SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos),
    )


async def _read_until(call, want: set[str], timeout_s: float = 10.0) -> dict[str, object]:
    """Read stream messages until every id in `want` has a response or an error."""
    got: dict[str, object] = {}
    async with asyncio.timeout(timeout_s):
        while not want <= set(got):
            msg = await call.read()
            assert msg is not grpc.aio.EOF, f"stream ended early; got {sorted(got)}"
            for r in msg.responses:
                got[r.request_id] = r
            for e in msg.errors:
                got[e.request_id] = e
    return got


async def _in_flight(stub: gateway_pb2_grpc.GatewayStub) -> int:
    load = await stub.GetLoad(gateway_pb2.GetLoadRequest())
    return load.running + load.waiting


async def test_stream_answers_each_request_with_the_unary_result_or_error(sim_gateway_factory) -> None:
    gw = sim_gateway_factory()
    async with grpc.aio.insecure_channel(gw.target) as ch:
        stub = gateway_pb2_grpc.GatewayStub(ch)
        call = stub.GenerateStream()  # no token: a data-plane RPC
        long = _req("long", [1, 2], 100_000)
        await call.write(
            gateway_pb2.GenerateStreamRequest(
                requests=[
                    _req("short", [1, 2, 3], 3),
                    _req("badmax", [1], 0),
                    _req("", [1], 3),
                    _req("noprompt", [], 3),
                    long,
                ]
            )
        )
        got = await _read_until(call, {"short", "badmax", "", "noprompt"})
        short = got["short"]
        assert isinstance(short, gateway_pb2.GenerateResponse)
        assert len(short.token_ids) == len(short.logprobs) == 3
        assert short.finish_reason == common_pb2.FINISH_REASON_LENGTH
        assert list(short.prompt_token_ids) == [1, 2, 3]
        for rid, field in (("badmax", "sampling.max_tokens"), ("", "request_id"), ("noprompt", "prompt")):
            err = got[rid]
            assert isinstance(err, gateway_pb2.GenerateError), rid
            assert err.code == grpc.StatusCode.INVALID_ARGUMENT.value[0] and field in err.message, err

        # the stream stays open after errors; an id in flight is refused as unary Generate would
        await call.write(
            gateway_pb2.GenerateStreamRequest(requests=[_req("long", [1], 2), _req("after", [1], 4)])
        )
        got = await _read_until(call, {"long", "after"})
        dup = got["long"]
        assert isinstance(dup, gateway_pb2.GenerateError)
        assert dup.code == grpc.StatusCode.ALREADY_EXISTS.value[0] and "long" in dup.message
        assert len(got["after"].token_ids) == 4  # type: ignore[union-attr]

        # an Abort RPC ends a streamed request like a unary one: partial tokens, finish ABORT
        token = {"authorization": "Bearer test-token"}
        aborted = await stub.Abort(
            gateway_pb2.AbortRequest(request_ids=["long"]), metadata=tuple(token.items())
        )
        assert list(aborted.aborted_ids) == ["long"]
        resp = (await _read_until(call, {"long"}))["long"]
        assert isinstance(resp, gateway_pb2.GenerateResponse)
        assert resp.finish_reason == common_pb2.FINISH_REASON_ABORT and len(resp.token_ids) > 0

        # closing our side ends the stream once everything is answered
        await call.write(gateway_pb2.GenerateStreamRequest(requests=[_req("last", [1], 5)]))
        await call.done_writing()
        got = await _read_until(call, {"last"})
        async with asyncio.timeout(5):
            assert await call.read() is grpc.aio.EOF
        assert await call.code() == grpc.StatusCode.OK


async def test_responses_come_in_completion_order(sim_gateway_factory) -> None:
    gw = sim_gateway_factory()
    async with grpc.aio.insecure_channel(gw.target) as ch:
        call = gateway_pb2_grpc.GatewayStub(ch).GenerateStream()
        sizes = {"a": 60, "b": 2, "c": 20}
        await call.write(
            gateway_pb2.GenerateStreamRequest(requests=[_req(k, [1], v) for k, v in sizes.items()])
        )
        order: list[str] = []
        async with asyncio.timeout(10):
            while len(order) < 3:
                msg = await call.read()
                order += [r.request_id for r in msg.responses]
        assert order == ["b", "c", "a"]
        call.cancel()


async def test_cancelling_the_stream_aborts_its_requests_on_the_engine(sim_gateway_factory) -> None:
    gw = sim_gateway_factory()
    async with grpc.aio.insecure_channel(gw.target) as ch:
        stub = gateway_pb2_grpc.GatewayStub(ch)
        call = stub.GenerateStream()
        await call.write(
            gateway_pb2.GenerateStreamRequest(requests=[_req(f"r{i}", [1, 2], 100_000) for i in range(4)])
        )
        deadline = time.monotonic() + 5
        while await _in_flight(stub) < 4:
            assert time.monotonic() < deadline, "requests never started"
            await asyncio.sleep(0.02)
        call.cancel()
        deadline = time.monotonic() + 5
        while await _in_flight(stub) > 0:
            assert time.monotonic() < deadline, "the engine kept generating for a cancelled stream"
            await asyncio.sleep(0.02)
        # the ids are free again: the aborted requests left the gateway
        r = await stub.Generate(_req("r0", [1], 2))
        assert len(r.token_ids) == 2


async def test_abort_ids_abort_this_streams_requests_even_those_just_sent(sim_gateway_factory) -> None:
    gw = sim_gateway_factory()
    async with grpc.aio.insecure_channel(gw.target) as ch:
        stub = gateway_pb2_grpc.GatewayStub(ch)
        other = stub.GenerateStream()  # another client's stream: its requests are not ours to abort
        await other.write(gateway_pb2.GenerateStreamRequest(requests=[_req("theirs", [1], 100_000)]))
        call = stub.GenerateStream()
        await call.write(gateway_pb2.GenerateStreamRequest(requests=[_req("old", [1, 2], 100_000)]))
        # "new" is aborted in the message that brings it: it has not reached the engine yet
        await call.write(
            gateway_pb2.GenerateStreamRequest(
                requests=[_req("new", [1, 2], 100_000)], abort_ids=["old", "new", "theirs", "unknown"]
            )
        )
        await call.write(gateway_pb2.GenerateStreamRequest(abort_ids=["old"]))  # already aborted
        responses: dict[str, gateway_pb2.GenerateResponse] = {}
        acks: list[list[str]] = []
        async with asyncio.timeout(10):
            while len(acks) < 2 or len(responses) < 2:
                msg = await call.read()
                assert msg is not grpc.aio.EOF
                responses.update({r.request_id: r for r in msg.responses})
                acks += [list(a.aborted_ids) for a in msg.aborts]
        assert acks == [["old", "new"], []]  # one answer per abort message, in order
        assert set(responses) == {"old", "new"}
        assert all(r.finish_reason == common_pb2.FINISH_REASON_ABORT for r in responses.values())
        assert len(responses["new"].token_ids) == len(responses["new"].logprobs)
        assert await _in_flight(stub) == 1  # "theirs" runs on
        aborts = gw._registry.get_sample_value("asyncdapo_gateway_aborts_total", {"cause": "abort_stream"})
        assert aborts == 2
        call.cancel()
        other.cancel()


async def test_a_draining_gateway_refuses_streamed_requests_as_unavailable(sim_gateway_factory) -> None:
    gw = sim_gateway_factory()
    assert gw.server is not None
    gw.call(gw.server.service.drain(0.0))
    async with grpc.aio.insecure_channel(gw.target) as ch:
        call = gateway_pb2_grpc.GatewayStub(ch).GenerateStream()
        await call.write(gateway_pb2.GenerateStreamRequest(requests=[_req("x", [1], 3)]))
        err = (await _read_until(call, {"x"}))["x"]
        assert isinstance(err, gateway_pb2.GenerateError)
        assert err.code == grpc.StatusCode.UNAVAILABLE.value[0] and "draining" in err.message
        call.cancel()
