"""The gateway's gRPC API (`--engine sim`) on generated requests, with and without the bearer
token: every call answers within the bound with OK or a status that names the caller's mistake or
the service's state (INVALID_ARGUMENT, FAILED_PRECONDITION, UNAUTHENTICATED, NOT_FOUND,
RESOURCE_EXHAUSTED, …), never INTERNAL, UNKNOWN or no answer; afterwards the server is healthy."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from fuzz_budget import BOUND_MS, answered, fuzz_settings
from grpc_checks import REFUSED, LoopThread, check_status
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_messages import messages
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from asyncdapo.contracts.v1 import gateway_pb2, gateway_pb2_grpc

SURFACE = "grpc"
TOKEN = "fuzz-token"
AUTH = st.sampled_from(
    [
        (),
        (("authorization", f"Bearer {TOKEN}"),),
        (("authorization", "Bearer wrong"),),
        (("authorization", "Basic x"),),
    ]
)
BOUND_S = BOUND_MS / 1000


@pytest.fixture(scope="module")
def gateway() -> Iterator[tuple[str, grpc.Channel]]:
    from asyncdapo.services.gateway.gateway_service import GatewayOptions
    from asyncdapo.services.gateway.metrics import GatewayMetrics
    from asyncdapo.services.gateway.server import GatewayServer, ServerSettings
    from asyncdapo.services.gateway.sim_engine import SimTiming, SimulatedEngine

    loop = LoopThread()

    async def start() -> GatewayServer:
        engine = SimulatedEngine(
            SimTiming(base_step_s=0.001, per_seq_step_s=0.0001, length_dist="fixed", length_mean=8),
            max_concurrency=16,
        )
        server = GatewayServer(
            engine,
            GatewayOptions(gateway_id="fuzz", pool="fast", capacity=16),
            ServerSettings(host="127.0.0.1", port=0, token=TOKEN, drain_timeout_s=0.5),
            GatewayMetrics(CollectorRegistry()),
            None,
        )
        await server.start()
        return server

    server = loop.run(start())
    target = f"127.0.0.1:{server.port}"
    with grpc.insecure_channel(target, options=[("grpc.max_send_message_length", 64 << 20)]) as channel:
        yield target, channel
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=BOUND_S)
        assert health.status == health_pb2.HealthCheckResponse.SERVING, (
            "the gateway is not healthy after the fuzz"
        )
    loop.run(server.stop(grace_s=0.5))
    loop.stop()


UNARY = {
    "Generate": messages(gateway_pb2.GenerateRequest),
    "Abort": messages(gateway_pb2.AbortRequest),
    "Pause": messages(gateway_pb2.PauseRequest),
    "Resume": messages(gateway_pb2.ResumeRequest),
    "LoadWeights": messages(gateway_pb2.LoadWeightsRequest),
    "GetLoad": messages(gateway_pb2.GetLoadRequest),
}


@fuzz_settings(0.5)
@given(data=st.data(), method=st.sampled_from(sorted(UNARY)), auth=AUTH)
def test_gateway_unary_rpcs_answer_in_bound(
    gateway: tuple[str, grpc.Channel], data: st.DataObject, method: str, auth: Any
) -> None:
    _, channel = gateway
    stub = gateway_pb2_grpc.GatewayStub(channel)
    request = data.draw(UNARY[method])
    with answered(SURFACE, (method, request)):
        try:
            getattr(stub, method)(request, metadata=auth, timeout=BOUND_S)
        except grpc.RpcError as err:
            check_status(err, (method, request), details_fit=True)
    # a Pause the fuzz sent must not hold the next example's requests
    stub.Resume(
        gateway_pb2.ResumeRequest(), metadata=(("authorization", f"Bearer {TOKEN}"),), timeout=BOUND_S
    )


@fuzz_settings(0.2)
@given(request=messages(gateway_pb2.WatchLoadRequest))
def test_gateway_watch_load_answers_in_bound(gateway: tuple[str, grpc.Channel], request: Any) -> None:
    _, channel = gateway
    with answered(SURFACE, request):
        call = gateway_pb2_grpc.GatewayStub(channel).WatchLoad(request, timeout=BOUND_S)
        try:
            next(call)
        except grpc.RpcError as err:
            check_status(err, request, details_fit=True)
        finally:
            call.cancel()


@fuzz_settings(0.3)
@given(batch=st.lists(messages(gateway_pb2.GenerateStreamRequest, depth=3), min_size=1, max_size=3))
def test_gateway_generate_stream_answers_every_request(
    gateway: tuple[str, grpc.Channel], batch: list[Any]
) -> None:
    _, channel = gateway
    with answered(SURFACE, batch):
        try:
            for response in gateway_pb2_grpc.GatewayStub(channel).GenerateStream(
                iter(batch), timeout=BOUND_S
            ):
                for error in response.errors:
                    code = grpc.StatusCode(next(c for c in grpc.StatusCode if c.value[0] == error.code))
                    assert code not in REFUSED, f"{code.name}: {error.message!r:.300}"
        except grpc.RpcError as err:
            check_status(err, batch, details_fit=True)
