"""A small typed async client for one gateway, for tests, benchmarks and operators' scripts (the
scheduler speaks to the gateways through its own stream and pool, `scheduler/gateway_stream.py`).

RPC failures surface as `grpc.aio.AioRpcError` (check `.code()`: INVALID_ARGUMENT,
FAILED_PRECONDITION, ALREADY_EXISTS, UNAVAILABLE when draining, UNAUTHENTICATED, INTERNAL).

    async with GatewayClient("127.0.0.1:50051", token="s3cret") as gw:
        r = await gw.generate("req-1", [1, 2, 3], Sampling(max_tokens=64, seed=7))
        r.token_ids, r.logprobs, r.finish_reason, r.version_runs
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from asyncdapo.contracts.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from asyncdapo.contracts.wire_enums import finish_from_pb, pause_mode_to_pb
from asyncdapo.runtime.grpc_security import ClientTls, aio_channel, bearer_metadata
from asyncdapo.services.gateway.engine import Finish, PauseMode, Sampling
from asyncdapo.services.gateway.versions import Runs

_MAX_MESSAGE_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Continuation:
    """Tokens already generated for a request elsewhere (partial rollout, long-tail offload)."""

    token_ids: list[int]
    logprobs: list[float]
    version_runs: Runs

    @classmethod
    def of(cls, result: GenerateResult) -> Continuation:
        return cls(list(result.token_ids), list(result.logprobs), list(result.version_runs))


@dataclass(frozen=True)
class GenerateResult:
    request_id: str
    token_ids: list[int]  # the whole response, continuation first
    logprobs: list[float]  # of each sampled token
    finish_reason: Finish
    prompt_length: int
    prompt_token_ids: list[int]
    version_runs: Runs  # [(version, num_tokens)], sums to len(token_ids)
    queue_s: float
    generate_s: float

    @classmethod
    def from_pb(cls, r: gateway_pb2.GenerateResponse) -> GenerateResult:
        return cls(
            request_id=r.request_id,
            token_ids=list(r.token_ids),
            logprobs=list(r.logprobs),
            finish_reason=finish_from_pb(r.finish_reason),
            prompt_length=r.prompt_length,
            prompt_token_ids=list(r.prompt_token_ids),
            version_runs=[(v.version, v.num_tokens) for v in r.version_runs],
            queue_s=r.queue_s,
            generate_s=r.generate_s,
        )


@dataclass(frozen=True)
class GatewayLoad:
    gateway_id: str
    running: int
    waiting: int
    kv_cache_usage: float
    capacity: int
    weight_version: int
    draining: bool
    paused: bool
    pool: str
    engine: str
    generated_tokens_total: int
    max_model_len: int

    @property
    def in_flight(self) -> int:
        return self.running + self.waiting

    @classmethod
    def from_pb(cls, m: gateway_pb2.Load) -> GatewayLoad:
        return cls(
            gateway_id=m.gateway_id,
            running=m.running,
            waiting=m.waiting,
            kv_cache_usage=m.kv_cache_usage,
            capacity=m.capacity,
            weight_version=m.weight_version,
            draining=m.draining,
            paused=m.paused,
            pool=m.pool,
            engine=m.engine,
            generated_tokens_total=m.generated_tokens_total,
            max_model_len=m.max_model_len,
        )


@dataclass(frozen=True)
class PauseOutcome:
    aborted: int
    in_flight: int


@dataclass(frozen=True)
class LoadWeightsOutcome:
    version: int
    num_tensors: int
    reload_s: float


def sampling_pb(s: Sampling) -> common_pb2.SamplingParams:
    pb = common_pb2.SamplingParams(
        max_tokens=s.max_tokens,
        temperature=s.temperature,
        top_p=s.top_p,
        top_k=s.top_k,
        stop_token_ids=list(s.stop_token_ids),
        ignore_eos=s.ignore_eos,
    )
    if s.seed is not None:
        pb.seed = s.seed
    return pb


@dataclass
class GatewayClient:
    """Async client of one gateway. `token` is sent as a bearer token on control RPCs."""

    target: str
    token: str | None = None
    timeout_s: float | None = None  # default deadline of unary calls (None: none)
    tls: ClientTls | None = None  # verify the gateway's TLS certificate against this CA (None: plaintext)
    _channel: grpc.aio.Channel = field(init=False, repr=False)
    _stub: gateway_pb2_grpc.GatewayStub = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._channel = aio_channel(
            self.target,
            self.tls,
            [
                ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
            ],
        )
        self._stub = gateway_pb2_grpc.GatewayStub(self._channel)

    async def __aenter__(self) -> GatewayClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    def _control_md(self) -> tuple[tuple[str, str], ...] | None:
        return bearer_metadata(self.token) or None

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int] | None = None,
        sampling: Sampling | None = None,
        *,
        prompt: str | None = None,
        continuation: Continuation | None = None,
        timeout_s: float | None = None,
    ) -> GenerateResult:
        """Generate for a token-id prompt (or a text `prompt`); an aborted request returns its
        partial tokens with finish_reason ABORT."""
        if sampling is None:
            raise ValueError("sampling is required (at least Sampling(max_tokens=N))")
        req = gateway_pb2.GenerateRequest(
            request_id=request_id,
            prompt_token_ids=list(prompt_token_ids or ()),
            prompt=prompt or "",
            sampling=sampling_pb(sampling),
        )
        if continuation is not None:
            req.continuation_token_ids.extend(continuation.token_ids)
            req.continuation_logprobs.extend(continuation.logprobs)
            req.continuation_versions.extend(
                common_pb2.VersionRun(version=v, num_tokens=n) for v, n in continuation.version_runs
            )
        resp = await self._stub.Generate(req, timeout=timeout_s or self.timeout_s)
        return GenerateResult.from_pb(resp)

    async def abort(self, request_ids: Sequence[str] = (), *, all: bool = False) -> list[str]:
        """Abort the given in-flight requests (or all); returns the ids that were in flight."""
        resp = await self._stub.Abort(
            gateway_pb2.AbortRequest(request_ids=list(request_ids), all=all),
            metadata=self._control_md(),
            timeout=self.timeout_s,
        )
        return list(resp.aborted_ids)

    async def pause(self, mode: PauseMode = PauseMode.KEEP, wait_timeout_s: float = 0.0) -> PauseOutcome:
        resp = await self._stub.Pause(
            gateway_pb2.PauseRequest(mode=pause_mode_to_pb(mode), wait_timeout_s=wait_timeout_s),
            metadata=self._control_md(),
        )
        return PauseOutcome(resp.aborted, resp.in_flight)

    async def resume(self) -> None:
        await self._stub.Resume(
            gateway_pb2.ResumeRequest(), metadata=self._control_md(), timeout=self.timeout_s
        )

    async def load_weights(self, version: int, uri: str) -> LoadWeightsOutcome:
        resp = await self._stub.LoadWeights(
            gateway_pb2.LoadWeightsRequest(version=version, uri=uri), metadata=self._control_md()
        )
        return LoadWeightsOutcome(resp.version, resp.num_tensors, resp.reload_s)

    async def get_load(self) -> GatewayLoad:
        return GatewayLoad.from_pb(
            await self._stub.GetLoad(gateway_pb2.GetLoadRequest(), timeout=self.timeout_s)
        )

    async def watch_load(self, interval_ms: int = 200) -> AsyncIterator[GatewayLoad]:
        """Load every `interval_ms` until the caller stops iterating or the gateway stops."""
        call = self._stub.WatchLoad(gateway_pb2.WatchLoadRequest(interval_ms=interval_ms))
        try:
            async for m in call:
                yield GatewayLoad.from_pb(m)
        finally:
            call.cancel()

    async def healthy(self, timeout_s: float = 2.0) -> bool:
        """The standard gRPC health check of the Gateway service (False when unreachable)."""
        stub = health_pb2_grpc.HealthStub(self._channel)
        try:
            # types-grpcio-health-checking's HealthStub lacks the Check its __init__ sets
            resp = await stub.Check(  # type: ignore[attr-defined]
                health_pb2.HealthCheckRequest(service="asyncdapo.v1.Gateway"), timeout=timeout_s
            )
        except grpc.aio.AioRpcError:
            return False
        return resp.status == health_pb2.HealthCheckResponse.SERVING
