"""The `asyncdapo.v1.Scheduler` gRPC service (grpc.aio), with reflection and health.

Errors are caught here, at the boundary, and become status codes naming what was wrong:
a run name that is not this scheduler's → NOT_FOUND; a stale weight version or a fenced trainer →
FAILED_PRECONDITION; a weight version past the largest the run counts its bound for, or a uri no
gateway can read by its form (`rpc_input_checks.check_publish`) → INVALID_ARGUMENT; no gateway could load the weights
(nothing changed, retry) → UNAVAILABLE; an unknown gateway → NOT_FOUND; bad eval input (checked
before dispatch, or refused by a gateway) or a watch interval out of bounds → INVALID_ARGUMENT; a
missing or wrong bearer token on a control RPC → UNAUTHENTICATED; a verifier or gateways that stay
down during Evaluate → UNAVAILABLE. Every status' details are bounded (`runtime.status_details`):
past gRPC's metadata limit the caller would get RESOURCE_EXHAUSTED instead of the answer.

Control RPCs (`CONTROL_METHODS`: they change the run or spend the gateways' time) require the
bearer token when the scheduler has one; GetRun, WatchRun, ListGateways, health and reflection are
read-only and stay open. The token is checked by `grpc_security.BearerAuthInterceptor` before any
handler runs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from asyncdapo.contracts.v1 import gateway_pb2, scheduler_pb2, scheduler_pb2_grpc
from asyncdapo.contracts.wire_enums import UnknownEnumValue, pause_mode_from_pb
from asyncdapo.runtime.grpc_security import (
    BearerAuthInterceptor,
    ServerTls,
    add_port,
    method_names,
    watch_interval_s,
)
from asyncdapo.runtime.status_details import abort_call, shown
from asyncdapo.services.scheduler.eval_waiters import EvalRefused
from asyncdapo.services.scheduler.evaluate import evaluate
from asyncdapo.services.scheduler.rollout import Rollout
from asyncdapo.services.scheduler.rpc_input_checks import RequestError, check_publish
from asyncdapo.services.scheduler.weight_publisher import PublishError, PublishUnavailable

log = logging.getLogger(__name__)

SERVICE_NAME = scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"].full_name
CONTROL_METHODS = method_names(
    SERVICE_NAME, ("StartRun", "StopRun", "PublishWeights", "DrainGateway", "Evaluate")
)
WATCH_DEFAULT_MS = 500


class SchedulerService(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(self, rollout: Rollout) -> None:
        self.rollout = rollout

    async def _check_run(self, run: str, context: grpc.aio.ServicerContext) -> None:
        if run and run != self.rollout.cfg.name:
            await abort_call(
                context,
                grpc.StatusCode.NOT_FOUND,
                f"run {shown(run)}: this scheduler serves run {self.rollout.cfg.name!r}",
            )

    async def StartRun(self, request, context):
        await self._check_run(request.run, context)
        self.rollout.start_run()
        return await self.rollout.status()

    async def GetRun(self, request, context):
        await self._check_run(request.run, context)
        return await self.rollout.status()

    async def StopRun(self, request, context):
        await self._check_run(request.run, context)
        self.rollout.stop_run(request.abort_in_flight)
        return await self.rollout.status()

    async def WatchRun(self, request, context) -> AsyncIterator[scheduler_pb2.RunStatus]:
        try:
            interval = watch_interval_s(request.interval_ms, WATCH_DEFAULT_MS)
        except ValueError as err:
            await abort_call(context, grpc.StatusCode.INVALID_ARGUMENT, str(err))
        await self._check_run(request.run, context)
        while True:
            yield await self.rollout.status()
            await asyncio.sleep(interval)

    async def PublishWeights(self, request, context):
        try:
            check_publish(request.version, request.uri, self.rollout.cfg)
            mode = pause_mode_from_pb(request.mode)  # None: the run's weight_update_mode
        except (RequestError, UnknownEnumValue) as err:
            await abort_call(context, grpc.StatusCode.INVALID_ARGUMENT, str(err))
        try:
            return await self.rollout.publish_weights(
                request.version, request.uri, mode, request.trainer_epoch
            )
        except PublishError as err:
            await abort_call(context, grpc.StatusCode.FAILED_PRECONDITION, str(err))
        except PublishUnavailable as err:
            await abort_call(context, grpc.StatusCode.UNAVAILABLE, str(err))

    async def ListGateways(self, request, context):
        return scheduler_pb2.ListGatewaysResponse(gateways=[g.info() for g in self.rollout.pool.members])

    async def DrainGateway(
        self,
        request: scheduler_pb2.DrainGatewayRequest,
        context: grpc.aio.ServicerContext[
            scheduler_pb2.DrainGatewayRequest, scheduler_pb2.DrainGatewayResponse
        ],
    ) -> scheduler_pb2.DrainGatewayResponse:
        gw = self.rollout.pool.get(request.address)
        if gw is None:
            await abort_call(
                context, grpc.StatusCode.NOT_FOUND, f"address {shown(request.address)} is not in the pool"
            )
        gw.drain_requested = True
        if request.abort_in_flight and gw.calls:
            # aborts we did not cause come back with finish=abort and continue elsewhere
            try:
                await gw.stub.Abort(
                    gateway_pb2.AbortRequest(request_ids=list(gw.calls)), metadata=gw.auth, timeout=5.0
                )
            except grpc.aio.AioRpcError as err:
                log.warning("drain abort on %s failed: %s", gw.address, err.code().name)
        return scheduler_pb2.DrainGatewayResponse(gateway=gw.info())

    async def Evaluate(self, request, context):
        try:
            return await evaluate(self.rollout, request)
        except (RequestError, EvalRefused) as err:
            await abort_call(context, grpc.StatusCode.INVALID_ARGUMENT, str(err))
        except RuntimeError as err:
            await abort_call(context, grpc.StatusCode.UNAVAILABLE, str(err))


async def build_server(
    rollout: Rollout, bind: str, token: str | None = None, tls: ServerTls | None = None
) -> tuple[grpc.aio.Server, int, health.aio.HealthServicer]:
    """A started server on `bind` (host:port; port 0 picks one), TLS with `tls`, control RPCs
    behind `token` when given. Returns (server, port, health). Raises OSError if `bind` is taken."""
    server = grpc.aio.server(
        interceptors=[BearerAuthInterceptor(token, CONTROL_METHODS)] if token else [],
        options=[("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)],
    )
    scheduler_pb2_grpc.add_SchedulerServicer_to_server(SchedulerService(rollout), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
        server,
    )
    port = add_port(server, bind, tls)
    await server.start()

    pending: set[asyncio.Future[None]] = set()

    def on_health(serving: bool) -> None:
        # NOT_SERVING while Redis is away or after a successor fenced this scheduler out
        status = (
            health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", SERVICE_NAME):
            t = asyncio.ensure_future(health_servicer.set(name, status))
            pending.add(t)
            t.add_done_callback(pending.discard)

    rollout.health_listeners.append(on_health)
    status = (
        health_pb2.HealthCheckResponse.SERVING
        if rollout.serving
        else health_pb2.HealthCheckResponse.NOT_SERVING
    )
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, status)
    return server, port, health_servicer
