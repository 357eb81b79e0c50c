"""Weight updates fanned out to gateways: Pause(mode) → LoadWeights → Resume, all in parallel.

A gateway that fails keeps its old weights; its `Load.weight_version` stays behind, so dispatch
skips it (`stale_weights`) until a resync succeeds. Gateways are marked `publishing` meanwhile so
no request is dispatched to a paused engine.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

import grpc

from asyncdapo.scheduler.group_state import redis_retry
from asyncdapo.scheduler.pool import Gateway
from asyncdapo.v1 import common_pb2, gateway_pb2, scheduler_pb2

if TYPE_CHECKING:
    from asyncdapo.scheduler.rollout import Rollout

log = logging.getLogger(__name__)
_MODES = {
    "keep": common_pb2.PAUSE_MODE_KEEP,
    "abort": common_pb2.PAUSE_MODE_ABORT,
    "wait": common_pb2.PAUSE_MODE_WAIT,
}


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
            gw.refresh()
        finally:
            await gw.stub.Resume(gateway_pb2.ResumeRequest(), metadata=gw.auth, timeout=timeout_s)
            gw.load.paused = False
            gw.refresh()
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


async def publish_weights(
    ro: Rollout, version: int, uri: str, mode: int
) -> scheduler_pb2.PublishWeightsResponse:
    """PublishWeights: fan the update out, persist {version, uri} in Redis, raise the bound.
    Repeating the current (version, uri) is a no-op (a retry whose first reply was lost)."""
    if mode == common_pb2.PAUSE_MODE_UNSPECIFIED:
        mode = _MODES[ro.cfg.rollout.weight_update_mode.value]
    async with ro.publish_lock:
        if version == ro.version and uri == ro.uri:
            return scheduler_pb2.PublishWeightsResponse(
                version=version,
                results=[
                    scheduler_pb2.GatewayResult(
                        gateway=g.address,
                        ok=g.weight_version >= version,
                        error="" if g.weight_version >= version else f"serves version {g.weight_version}",
                    )
                    for g in ro.pool.up_gateways()
                ],
            )
        if version <= ro.version:
            raise PublishError(f"version {version} is not newer than the current version {ro.version}")
        t0 = time.perf_counter()
        results = await fan_out_weights(ro.pool.up_gateways(), version, uri, mode)
        await redis_retry(lambda: ro.redis.hset(ro.keys.weights, mapping={"version": version, "uri": uri}))
        dt = time.perf_counter() - t0
        ro.metrics.publish_seconds.observe(dt)
        ro.weights_published(version, uri)
    return scheduler_pb2.PublishWeightsResponse(version=version, results=results, duration_s=dt)


async def resync(ro: Rollout, gw: Gateway) -> None:
    """A gateway that came (back) up with old weights loads the current ones before it serves
    (dispatch skips it as `stale_weights` until then)."""
    ro.syncing.add(gw.address)
    try:
        async with ro.publish_lock:
            if gw.weight_version < ro.version:
                (res,) = await fan_out_weights([gw], ro.version, ro.uri, common_pb2.PAUSE_MODE_KEEP)
                if not res.ok:
                    log.warning("resync of %s failed: %s", gw.address, res.error)
    finally:
        ro.syncing.discard(gw.address)
    ro.dispatcher.pump()
