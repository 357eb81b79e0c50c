"""The gateway process: grpc.aio server (Gateway + reflection + standard health), metrics HTTP,
engine start, and graceful drain on SIGTERM.

Lifecycle: gRPC server bound (health NOT_SERVING, RPCs UNAVAILABLE) → engine start → SERVING.
On SIGTERM/SIGINT:
health NOT_SERVING and Load.draining, new Generate calls get UNAVAILABLE, in-flight requests get
`drain_timeout_s` to finish, the rest are aborted (they return partial tokens), then the server
and the engine stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from asyncdapo.contracts.v1 import gateway_pb2_grpc, weights_pb2_grpc
from asyncdapo.runtime.grpc_security import BearerAuthInterceptor, ServerTls, add_port
from asyncdapo.runtime.weight_stream import service as weight_store_service
from asyncdapo.services.gateway.engine import Engine
from asyncdapo.services.gateway.gateway_service import (
    CONTROL_METHODS,
    SERVICE_NAME,
    GatewayOptions,
    GatewayService,
    StreamWeights,
)
from asyncdapo.services.gateway.metrics import GatewayMetrics
from asyncdapo.services.gateway.request_checks import Rejection
from asyncdapo.services.gateway.weight_loader import WeightsValidator

log = logging.getLogger(__name__)
_STOP_SLACK_S = 10.0  # beyond the grace period, for grpc to cancel and reap the handlers

# Responses carry up to max_model_len token ids and log-probs: far below this, but not 4 MiB-safe
# for long-context models.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 0  # 0: pick a free port
    metrics_port: int | None = None  # None: no metrics HTTP server
    token: str | None = None  # bearer token for control RPCs (None: no auth)
    tls: ServerTls | None = None  # serve TLS with this certificate (None: plaintext)
    drain_timeout_s: float = 30.0
    health_poll_s: float = 1.0


class GatewayServer:
    """One gateway: engine + servicer + gRPC server. `start()` then `serve_until_signal()` or `stop()`.

    With `engine=None`, `start()` binds the port and answers health NOT_SERVING (and RPCs
    UNAVAILABLE) until `attach(engine)`: the port is held while a slow engine loads.
    """

    def __init__(
        self,
        engine: Engine | None,
        options: GatewayOptions,
        settings: ServerSettings,
        metrics: GatewayMetrics,
        validator: WeightsValidator | None = None,
        weights: StreamWeights | None = None,
    ) -> None:
        self.engine = engine
        self.options = options
        self.settings = settings
        self.metrics = metrics
        self.weights = weights
        self.service = GatewayService(engine, options, metrics, validator, weights)
        self.health = health.aio.HealthServicer()
        self.port = 0
        self._server: grpc.aio.Server | None = None
        self._metrics_http: Any = None
        self._monitor: asyncio.Task[None] | None = None
        self._stopped = asyncio.Event()

    async def start(self) -> int:
        interceptors = []
        if self.settings.token:
            rejected = self.metrics.rejected.labels(Rejection.UNAUTHENTICATED.value)
            protected = CONTROL_METHODS | weight_store_service.METHODS
            interceptors.append(BearerAuthInterceptor(self.settings.token, protected, rejected.inc))
        server = grpc.aio.server(
            interceptors=interceptors,
            options=[
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.so_reuseport", 0),
            ],
        )
        gateway_pb2_grpc.add_GatewayServicer_to_server(self.service, server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        services = [SERVICE_NAME]
        if self.weights is not None:  # peers relay through this gateway
            weights_pb2_grpc.add_WeightStoreServicer_to_server(
                weight_store_service.WeightStoreService(self.weights.store), server
            )
            services.append(weight_store_service.SERVICE_NAME)
        reflection.enable_server_reflection(
            (
                *services,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ),
            server,
        )
        self.port = add_port(server, f"{self.settings.host}:{self.settings.port}", self.settings.tls)
        await server.start()
        self._server = server
        if self.settings.metrics_port is not None:
            from prometheus_client import start_http_server

            self._metrics_http, _ = start_http_server(
                self.settings.metrics_port, addr=self.settings.host, registry=self.metrics.registry
            )
        if self.engine is None:
            await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
            log.info(
                "gateway %s listening on %s:%d; engine starting",
                self.options.gateway_id,
                self.settings.host,
                self.port,
            )
        else:
            await self.attach(self.engine)
        return self.port

    async def attach(self, engine: Engine) -> None:
        """Serve with `engine` from now on: health SERVING."""
        self.engine = engine
        self.service.attach(engine)
        await self._set_health(health_pb2.HealthCheckResponse.SERVING)
        self._monitor = asyncio.get_running_loop().create_task(self._watch_engine())
        log.info(
            "gateway %s serving %s engine on %s:%d",
            self.options.gateway_id,
            engine.info.kind,
            self.settings.host,
            self.port,
        )

    async def _set_health(self, status: int) -> None:
        for name in ("", SERVICE_NAME):
            await self.health.set(name, status)

    async def _watch_engine(self) -> None:
        """Refresh the load gauges for scrapes and turn health NOT_SERVING if the engine dies."""
        while True:
            await asyncio.sleep(self.settings.health_poll_s)
            self.service.current_load()
            if self.engine is not None and not self.engine.is_healthy():
                log.error("engine is not healthy: health NOT_SERVING")
                await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
                return

    async def drain(self, deadline_s: float | None = None) -> int:
        """Stop accepting, finish or abort in-flight requests; returns how many were aborted."""
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        deadline = self.settings.drain_timeout_s if deadline_s is None else deadline_s
        aborted = await self.service.drain(deadline)
        log.info("drained: %d request(s) aborted at the deadline", aborted)
        return aborted

    async def stop(self, grace_s: float = 1.0) -> None:
        """Stop the server and the engine (call `drain` first for a graceful exit)."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self.service.stop_watchers()
        if self._monitor is not None:
            self._monitor.cancel()
        if self._server is not None:
            try:  # grpc waits for every handler; one stuck handler must not stop the shutdown
                async with asyncio.timeout(grace_s + _STOP_SLACK_S):
                    await self._server.stop(grace_s)
            except TimeoutError:
                log.error(
                    "gRPC server did not stop within %.0f s; going on with the shutdown",
                    grace_s + _STOP_SLACK_S,
                )
        if self._metrics_http is not None:
            self._metrics_http.shutdown()
        if self.engine is not None:
            await self.engine.shutdown()
        if self.weights is not None:
            await self.weights.fetcher.close()
            self.weights.store.close()

    async def serve_until_signal(self) -> None:
        """Serve until SIGTERM/SIGINT, then drain and stop."""
        loop = asyncio.get_running_loop()
        got_signal = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, got_signal.set)
        try:
            await got_signal.wait()
            log.info("signal received: draining (deadline %.0f s)", self.settings.drain_timeout_s)
            await self.drain()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                with contextlib.suppress(Exception):
                    loop.remove_signal_handler(sig)
            await self.stop()
