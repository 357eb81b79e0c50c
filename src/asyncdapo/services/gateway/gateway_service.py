"""The `asyncdapo.v1.Gateway` gRPC servicer: validation, request bookkeeping, control, load.

Error contract (every message names the field or state at fault):
- bad request fields → INVALID_ARGUMENT; weights that do not fit the served model →
  FAILED_PRECONDITION; a request id already in flight → ALREADY_EXISTS; draining → UNAVAILABLE;
  control RPCs without the right bearer token → UNAUTHENTICATED (`grpc_security.BearerAuthInterceptor`);
  a WatchLoad interval out of bounds → INVALID_ARGUMENT;
  an engine failure → INTERNAL. A rejected request never changes engine state.
- every status' details are bounded (`runtime.status_details`): past gRPC's metadata limit the
  caller would get RESOURCE_EXHAUSTED instead of the answer.

Invariants:
- a Generate response's token_ids, logprobs and version_runs cover the same tokens, continuation
  first; an aborted request returns its partial tokens with finish reason ABORT;
- Pause / Resume / LoadWeights are serialised by one lock; LoadWeights checks the snapshot before
  touching the engine, and, when generation is not paused, pauses (keep) and resumes around the
  reload itself, so in-flight requests always survive a reload.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import NoReturn

import grpc

from asyncdapo.contracts.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from asyncdapo.contracts.wire_enums import UnknownEnumValue, finish_to_pb, pause_mode_from_pb
from asyncdapo.runtime.grpc_security import method_names, watch_interval_s
from asyncdapo.runtime.status_details import abort_call, bounded_details
from asyncdapo.runtime.weight_stream.fetch import Fetcher, FetchError
from asyncdapo.runtime.weight_stream.store import NotHeld, WeightStore
from asyncdapo.runtime.weight_stream.uri import is_stream_uri, stream_address
from asyncdapo.services.gateway.engine import Engine, EngineError, EngineOutput, Finish, PauseMode
from asyncdapo.services.gateway.metrics import AbortCause, GatewayMetrics
from asyncdapo.services.gateway.request_checks import ModelLimits, Rejection, RequestError, validate_generate
from asyncdapo.services.gateway.stream import serve_stream
from asyncdapo.services.gateway.versions import concat
from asyncdapo.services.gateway.weight_loader import (
    WeightsError,
    WeightsProblem,
    WeightsValidator,
    read_dir,
    resolve_uri,
)

log = logging.getLogger(__name__)

SERVICE_NAME = gateway_pb2.DESCRIPTOR.services_by_name["Gateway"].full_name
CONTROL_METHODS = method_names(SERVICE_NAME, ("Abort", "Pause", "Resume", "LoadWeights"))
WATCH_DEFAULT_MS = 200

_STATUS = {
    Rejection.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    Rejection.FAILED_PRECONDITION: grpc.StatusCode.FAILED_PRECONDITION,
    Rejection.DUPLICATE_ID: grpc.StatusCode.ALREADY_EXISTS,
    Rejection.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    Rejection.DRAINING: grpc.StatusCode.UNAVAILABLE,
    Rejection.STARTING: grpc.StatusCode.UNAVAILABLE,
}
_WEIGHTS_REJECTION = {
    WeightsProblem.BAD_URI: Rejection.INVALID_ARGUMENT,
    WeightsProblem.NOT_FOUND: Rejection.INVALID_ARGUMENT,
    WeightsProblem.NO_SAFETENSORS: Rejection.INVALID_ARGUMENT,
    WeightsProblem.CORRUPT: Rejection.FAILED_PRECONDITION,
    WeightsProblem.MISMATCH: Rejection.FAILED_PRECONDITION,
}


class StreamWeights:
    """The gateway's WeightStore (versions it loaded or receives, served to peers) and the fetcher
    that fills it; one fetch per version at a time (a re-sync and a publish may ask at once)."""

    def __init__(self, store: WeightStore, fetcher: Fetcher) -> None:
        self.store = store
        self.fetcher = fetcher
        self._locks: dict[int, asyncio.Lock] = {}

    def lock(self, version: int) -> asyncio.Lock:
        for v in [v for v in self._locks if v < version and not self._locks[v].locked()]:
            del self._locks[v]
        return self._locks.setdefault(version, asyncio.Lock())


@dataclass(frozen=True)
class GatewayOptions:
    gateway_id: str
    pool: str = ""
    capacity: int = 64
    initial_version: int = 0


class GatewayService(gateway_pb2_grpc.GatewayServicer):
    def __init__(
        self,
        engine: Engine | None,
        options: GatewayOptions,
        metrics: GatewayMetrics,
        validator: WeightsValidator | None = None,
        weights: StreamWeights | None = None,
    ) -> None:
        self._weights = weights
        self._engine: Engine | None = None
        self._limits = ModelLimits(0, 0)
        self._options = options
        self._metrics = metrics
        self._validator = validator
        self._inflight: dict[str, float] = {}  # request id -> start (monotonic)
        self._idle = asyncio.Event()
        self._idle.set()
        self._stopping = asyncio.Event()
        self._control = asyncio.Lock()
        self._version = options.initial_version
        self._paused = False
        self._draining = False
        metrics.weight_version.set(self._version)
        if engine is not None:
            self.attach(engine)

    def starting_weights(self, validator: WeightsValidator | None, version: int) -> None:
        """The weights the engine will start from, once known (`--weights-from` fetches them after
        the port is bound): the reference later versions are checked against, and their version."""
        self._validator = validator
        self._version = version
        self._metrics.weight_version.set(version)

    def attach(self, engine: Engine) -> None:
        """Start serving with `engine` (until then every RPC but GetLoad answers UNAVAILABLE)."""
        self._limits = ModelLimits(engine.info.max_model_len, engine.info.vocab_size)
        self._engine = engine

    async def _ready(self, context: grpc.aio.ServicerContext) -> Engine:
        if self._engine is None:
            await self._reject(context, Rejection.STARTING, "the engine is still starting: retry shortly")
        return self._engine

    # --- state other components read ---

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def in_flight(self) -> int:
        return len(self._inflight)

    @property
    def weight_version(self) -> int:
        return self._version

    async def _reject(self, context: grpc.aio.ServicerContext, reason: Rejection, message: str) -> NoReturn:
        self._metrics.rejected.labels(reason.value).inc()
        await abort_call(context, _STATUS[reason], message)

    # --- data plane ---

    async def Generate(
        self, request: gateway_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.GenerateResponse:
        try:
            return await self.generate_one(request)
        except RequestError as err:
            await abort_call(context, _STATUS[err.reason], str(err))
        except EngineError as err:
            await abort_call(context, grpc.StatusCode.INTERNAL, str(err))

    async def GenerateStream(
        self,
        request_iterator: AsyncIterator[gateway_pb2.GenerateStreamRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[gateway_pb2.GenerateStreamResponse]:
        async for msg in serve_stream(
            request_iterator, self._generate_streamed, _stream_error, self._abort_streamed
        ):
            yield msg

    async def _generate_streamed(self, request: gateway_pb2.GenerateRequest) -> gateway_pb2.GenerateResponse:
        return await self.generate_one(request, require_id=True)

    async def generate_one(
        self, request: gateway_pb2.GenerateRequest, require_id: bool = False
    ) -> gateway_pb2.GenerateResponse:
        """One Generate request, unary or streamed: raises RequestError (a rejection, counted) or
        EngineError; a cancelled caller aborts the request on the engine. A streamed request needs
        its own id: the client matches responses by it."""
        try:
            if require_id and not request.request_id:
                raise RequestError(
                    Rejection.INVALID_ARGUMENT, "request_id is empty: GenerateStream matches responses by it"
                )
            if self._draining:
                raise RequestError(Rejection.DRAINING, "gateway is draining: send the request elsewhere")
            engine = self._engine
            if engine is None:
                raise RequestError(Rejection.STARTING, "the engine is still starting: retry shortly")
            rid = request.request_id or uuid.uuid4().hex
            if rid in self._inflight:
                raise RequestError(Rejection.DUPLICATE_ID, f"request_id {rid!r} is already in flight")
            inp = validate_generate(request, self._limits, engine.tokenize, rid)
        except RequestError as err:
            self._metrics.rejected.labels(err.reason.value).inc()
            raise

        start = time.monotonic()
        self._inflight[rid] = start
        self._idle.clear()
        self._metrics.in_flight.inc()
        try:
            if inp.engine.sampling.max_tokens == 0:  # the continuation already used every token
                out = EngineOutput([], [], Finish.LENGTH, [])
            else:
                out = await engine.generate(inp.engine)
        except asyncio.CancelledError:
            self._metrics.aborts.labels(AbortCause.CLIENT_CANCELLED.value).inc()
            raise
        except EngineError as err:
            log.error("generate %s failed: %s", rid, err)
            raise
        finally:
            del self._inflight[rid]
            self._metrics.in_flight.dec()
            if not self._inflight:
                self._idle.set()

        elapsed = time.monotonic() - start
        self._metrics.requests_by_finish[out.finish].inc()
        self._metrics.generated_tokens.inc(len(out.token_ids))
        self._metrics.request_seconds.observe(elapsed)
        return gateway_pb2.GenerateResponse(
            request_id=rid,
            token_ids=inp.continuation_token_ids + out.token_ids,
            logprobs=inp.continuation_logprobs + out.logprobs,
            finish_reason=finish_to_pb(out.finish),
            prompt_length=len(inp.prompt_token_ids),
            version_runs=[
                common_pb2.VersionRun(version=v, num_tokens=n)
                for v, n in concat(inp.continuation_runs, out.version_runs)
            ],
            prompt_token_ids=inp.prompt_token_ids,
            queue_s=out.queue_s,
            generate_s=elapsed,
        )

    # --- control plane (bearer token checked by the interceptor) ---

    async def Abort(
        self, request: gateway_pb2.AbortRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.AbortResponse:
        engine = await self._ready(context)
        if not request.all and not request.request_ids:
            await self._reject(context, Rejection.INVALID_ARGUMENT, "request_ids is empty and all is false")
        ids = list(self._inflight) if request.all else list(dict.fromkeys(request.request_ids))
        return gateway_pb2.AbortResponse(aborted_ids=await self._abort(engine, ids, AbortCause.ABORT_RPC))

    async def _abort(self, engine: Engine, ids: list[str], cause: AbortCause) -> list[str]:
        """Abort those of `ids` in flight; returns them."""
        ids = [rid for rid in ids if rid in self._inflight]
        await engine.abort(ids)
        self._metrics.aborts.labels(cause.value).inc(len(ids))
        return ids

    async def _abort_streamed(self, ids: list[str]) -> list[str]:
        engine = self._engine
        return [] if engine is None else await self._abort(engine, ids, AbortCause.ABORT_STREAM)

    async def Pause(
        self, request: gateway_pb2.PauseRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.PauseResponse:
        engine = await self._ready(context)
        try:
            mode = pause_mode_from_pb(request.mode) or PauseMode.KEEP  # UNSPECIFIED means KEEP
        except UnknownEnumValue as err:
            await self._reject(context, Rejection.INVALID_ARGUMENT, str(err))
        if request.wait_timeout_s < 0:
            await self._reject(
                context,
                Rejection.INVALID_ARGUMENT,
                f"wait_timeout_s must be >= 0, got {request.wait_timeout_s}",
            )
        async with self._control:
            result = await engine.pause(mode, request.wait_timeout_s)
            self._set_paused(True)
        self._metrics.aborts.labels(AbortCause.PAUSE.value).inc(result.aborted)
        held = len(self._inflight) if mode is PauseMode.KEEP else max(0, len(self._inflight) - result.aborted)
        log.info("paused (%s): %d aborted, %d held", mode.value, result.aborted, held)
        return gateway_pb2.PauseResponse(aborted=result.aborted, in_flight=held)

    async def Resume(
        self, request: gateway_pb2.ResumeRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.ResumeResponse:
        engine = await self._ready(context)
        async with self._control:
            await engine.resume()
            self._set_paused(False)
        return gateway_pb2.ResumeResponse()

    async def LoadWeights(
        self, request: gateway_pb2.LoadWeightsRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.LoadWeightsResponse:
        engine = await self._ready(context)
        if request.version < 0:
            await self._reject(
                context, Rejection.INVALID_ARGUMENT, f"version must be >= 0, got {request.version}"
            )
        uri, fetched, fetch_s = request.uri, 0, 0.0
        if is_stream_uri(request.uri):
            uri, fetched, fetch_s = await self._fetch(request, context)
        elif request.fetch_only or request.sources:
            await self._reject(
                context, Rejection.INVALID_ARGUMENT, "fetch_only and sources apply to stream:// uris only"
            )
        try:
            path, num_tensors = await asyncio.to_thread(self._check_weights, uri)
        except WeightsError as err:
            await self._reject(context, _WEIGHTS_REJECTION[err.problem], str(err))
        if request.fetch_only:
            return gateway_pb2.LoadWeightsResponse(
                version=request.version, num_tensors=num_tensors, bytes_received=fetched, fetch_s=fetch_s
            )
        async with self._control:
            start = time.monotonic()
            auto_pause = not self._paused
            try:
                if auto_pause:
                    await engine.pause(PauseMode.KEEP)
                try:
                    await engine.load_weights(str(path), request.version)
                finally:
                    if auto_pause:
                        await engine.resume()
            except EngineError as err:
                log.error("LoadWeights version %d from %s failed: %s", request.version, path, err)
                await abort_call(context, grpc.StatusCode.INTERNAL, str(err))
            elapsed = time.monotonic() - start
            self._version = request.version
        self._metrics.weight_version.set(request.version)
        self._metrics.reload_seconds.observe(elapsed)
        log.info("loaded weights version %d from %s in %.3f s", request.version, path, elapsed)
        if self._weights is not None:  # keep what peers may still fetch: this version and newer
            store = self._weights.store
            await asyncio.to_thread(store.keep_only, {v for v in store.versions() if v >= request.version})
        return gateway_pb2.LoadWeightsResponse(
            version=request.version,
            num_tensors=num_tensors,
            reload_s=elapsed,
            bytes_received=fetched,
            fetch_s=fetch_s,
        )

    async def _fetch(
        self, request: gateway_pb2.LoadWeightsRequest, context: grpc.aio.ServicerContext
    ) -> tuple[str, int, float]:
        """Pull a stream:// version into this gateway's store (a no-op when it is already whole
        here); returns (its directory, bytes received, seconds). No source → UNAVAILABLE: the
        scheduler's re-sync tries again."""
        if self._weights is None:
            await self._reject(
                context, Rejection.FAILED_PRECONDITION, "this gateway has no weight store for stream:// uris"
            )
        try:
            origin = stream_address(request.uri)
        except ValueError as err:
            await self._reject(context, Rejection.INVALID_ARGUMENT, str(err))
        store = self._weights.store
        with contextlib.suppress(NotHeld):
            held = store.get(request.version)
            if held.complete:
                return str(held.directory), 0, 0.0
        try:
            async with self._weights.lock(request.version):
                res = await self._weights.fetcher.fetch(
                    request.version, [*request.sources, origin], manifest_order=[origin, *request.sources]
                )
        except FetchError as err:
            log.error("weights v%d: %s", request.version, err)
            await abort_call(context, grpc.StatusCode.UNAVAILABLE, str(err))
        self._metrics.weight_bytes_received.inc(res.bytes_received)
        log.info(
            "fetched weights v%d: %.1f MB in %.2f s from %s",
            request.version,
            res.bytes_received / 1e6,
            res.seconds,
            {k: round(v / 1e6, 1) for k, v in res.bytes_by_source.items()},
        )
        return res.directory, res.bytes_received, res.seconds

    def _check_weights(self, uri: str) -> tuple[str, int]:
        if self._validator is not None:
            path, n = self._validator.check(uri)
        else:  # no reference checkpoint (simulator without a model dir): the snapshot must still be one
            path = resolve_uri(uri)
            n = len(read_dir(path))
        return str(path), n

    def _set_paused(self, paused: bool) -> None:
        self._paused = paused
        self._metrics.paused.set(int(paused))

    # --- load ---

    def current_load(self) -> gateway_pb2.Load:
        if self._engine is None:
            return gateway_pb2.Load(
                gateway_id=self._options.gateway_id,
                capacity=self._options.capacity,
                weight_version=self._version,
                draining=self._draining,
                pool=self._options.pool,
            )
        load = self._engine.load()
        self._metrics.observe_load(load)
        in_flight = len(self._inflight)
        # Engine stats refresh once per step; bound them by what is really in flight here.
        running = min(load.running, in_flight)
        return gateway_pb2.Load(
            gateway_id=self._options.gateway_id,
            running=running,
            waiting=in_flight - running,
            kv_cache_usage=load.kv_cache_usage,
            capacity=self._options.capacity,
            weight_version=self._version,
            draining=self._draining,
            paused=self._paused,
            pool=self._options.pool,
            engine=self._engine.info.kind,
            generated_tokens_total=load.generated_tokens_total,
            max_model_len=self._engine.info.max_model_len,
        )

    async def GetLoad(
        self, request: gateway_pb2.GetLoadRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.Load:
        return self.current_load()

    async def WatchLoad(
        self, request: gateway_pb2.WatchLoadRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[gateway_pb2.Load]:
        try:
            interval = watch_interval_s(request.interval_ms, WATCH_DEFAULT_MS)
        except ValueError as err:
            await self._reject(context, Rejection.INVALID_ARGUMENT, str(err))
        while not self._stopping.is_set():
            yield self.current_load()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await self._stopping.wait()

    # --- lifecycle ---

    async def drain(self, deadline_s: float) -> int:
        """Refuse new requests, let in-flight ones finish for `deadline_s`, abort the rest.

        Returns how many requests were aborted.
        """
        self._draining = True
        self._metrics.draining.set(1)
        try:
            async with asyncio.timeout(max(deadline_s, 0.0)):
                await self._idle.wait()
            return 0
        except TimeoutError:
            pass
        victims = list(self._inflight)
        log.warning("drain deadline: aborting %d in-flight request(s)", len(victims))
        if self._engine is not None:
            await self._engine.abort(victims)
        self._metrics.aborts.labels(AbortCause.DRAIN.value).inc(len(victims))
        try:  # let the aborted calls send their partial responses
            async with asyncio.timeout(5.0):
                await self._idle.wait()
        except TimeoutError:
            log.error("%d request(s) did not return after abort", len(self._inflight))
        return len(victims)

    def stop_watchers(self) -> None:
        self._stopping.set()


def _stream_error(request_id: str, err: Exception) -> gateway_pb2.GenerateError:
    """What unary Generate would have answered for `err`, as a per-request stream error."""
    if isinstance(err, RequestError):
        code, message = _STATUS[err.reason], str(err)
    elif isinstance(err, EngineError):
        code, message = grpc.StatusCode.INTERNAL, str(err)
    else:  # a bug: report it on this request instead of breaking the client's whole stream
        log.error("generate %s failed unexpectedly", request_id, exc_info=err)
        code, message = grpc.StatusCode.INTERNAL, f"{type(err).__name__}: {err}"
    return gateway_pb2.GenerateError(
        request_id=request_id, code=code.value[0], message=bounded_details(message)
    )
