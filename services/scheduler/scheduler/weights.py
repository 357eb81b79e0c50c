"""Weight updates fanned out to gateways: Pause(mode) → LoadWeights → Resume, all in parallel.

A gateway that fails keeps its old weights; its `Load.weight_version` stays behind, so dispatch
skips it (`stale_weights`) until a resync succeeds. Gateways are marked `publishing` meanwhile so
no request is dispatched to a paused engine.
"""

from __future__ import annotations

import asyncio
import time

import grpc

from asyncdapo.scheduler.pool import Gateway
from asyncdapo.v1 import gateway_pb2, scheduler_pb2


class PublishError(ValueError):
    pass


async def update_one(
    gw: Gateway, version: int, uri: str, mode: int, timeout_s: float
) -> scheduler_pb2.GatewayResult:
    t0 = time.perf_counter()
    aborted = 0
    gw.publishing = True
    try:
        paused = await gw.stub.Pause(gateway_pb2.PauseRequest(mode=mode), metadata=gw.auth, timeout=timeout_s)
        aborted = paused.aborted
        try:
            loaded = await gw.stub.LoadWeights(
                gateway_pb2.LoadWeightsRequest(version=version, uri=uri), metadata=gw.auth, timeout=timeout_s
            )
            gw.load.weight_version = loaded.version  # do not wait for the next load report
        finally:
            await gw.stub.Resume(gateway_pb2.ResumeRequest(), metadata=gw.auth, timeout=timeout_s)
            gw.load.paused = False
    except grpc.aio.AioRpcError as err:
        gw.last_error = f"weight update to v{version}: {err.code().name}: {err.details()}"
        return scheduler_pb2.GatewayResult(
            gateway=gw.address,
            ok=False,
            error=gw.last_error,
            duration_s=time.perf_counter() - t0,
            aborted=aborted,
        )
    finally:
        gw.publishing = False
    return scheduler_pb2.GatewayResult(
        gateway=gw.address, ok=True, duration_s=time.perf_counter() - t0, aborted=aborted
    )


async def fan_out_weights(
    gateways: list[Gateway], version: int, uri: str, mode: int, timeout_s: float = 600.0
) -> list[scheduler_pb2.GatewayResult]:
    return list(await asyncio.gather(*(update_one(g, version, uri, mode, timeout_s) for g in gateways)))
