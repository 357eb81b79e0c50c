"""Weight updates fanned out to gateways: Pause(mode) → LoadWeights → Resume, all in parallel, and
the re-sync of gateways that missed one.

Rules (each bounded, none can stall the run):
- one gateway's update is bounded by `rollout.weight_sync_timeout_s` as a whole (pause, load and
  resume together); a gateway that fails or hangs keeps its old weights, so dispatch skips it
  (`stale_weights`) — a gateway never serves this run on weights older than the current version;
- the version (and with it the bound) rises only when at least one gateway serves the new version;
  otherwise PublishWeights fails with `PublishUnavailable` (gRPC UNAVAILABLE) and the trainer
  retries; persisted in Redis only after that;
- `sync_loop` brings every gateway that is up but behind (it came back, it failed or hung during a
  publish, its Resume was lost) to the current version, retrying with capped backoff per gateway,
  and never holds the publish lock while a gateway hangs.
Gateways are marked `publishing` while an update runs so no request is dispatched to a paused
engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from typing import TYPE_CHECKING

import grpc

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
RESUME_TIMEOUT_S = 10.0  # a Resume after a failed load gets its own short bound
SYNC_BACKOFF_MAX_S = 30.0


class PublishError(ValueError):
    """The request cannot be applied (not newer, fenced): FAILED_PRECONDITION."""


class PublishUnavailable(RuntimeError):
    """No gateway could load the version: nothing changed, the caller retries (UNAVAILABLE)."""


async def update_one(
    gw: Gateway, version: int, uri: str, mode: int, timeout_s: float
) -> scheduler_pb2.GatewayResult:
    """Pause → LoadWeights → Resume on one gateway within `timeout_s` in all; Resume is tried even
    when the load failed (a paused engine serves nobody). A gateway that goes down meanwhile (its
    load reports stopped: dead, paused, cut off) fails at once instead of at the deadline."""
    down = asyncio.ensure_future(gw.went_down.wait())
    work = asyncio.ensure_future(_update(gw, version, uri, mode, timeout_s))
    try:
        await asyncio.wait({work, down}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        down.cancel()
    if not work.done():
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await work
        gw.publishing = False
        gw.last_error = f"weight update to v{version}: the gateway went down during the update"
        return scheduler_pb2.GatewayResult(gateway=gw.address, ok=False, error=gw.last_error)
    return work.result()


async def _update(
    gw: Gateway, version: int, uri: str, mode: int, timeout_s: float
) -> scheduler_pb2.GatewayResult:
    t0 = time.perf_counter()
    deadline = time.monotonic() + timeout_s
    aborted = 0
    paused_ok = False
    error = ""
    gw.publishing = True
    try:
        paused = await gw.stub.Pause(gateway_pb2.PauseRequest(mode=mode), metadata=gw.auth, timeout=timeout_s)
        paused_ok = True
        aborted = paused.aborted
        loaded = await gw.stub.LoadWeights(
            gateway_pb2.LoadWeightsRequest(version=version, uri=uri),
            metadata=gw.auth,
            timeout=max(deadline - time.monotonic(), 0.1),
        )
        gw.load.weight_version = loaded.version  # do not wait for the next load report
        gw.refresh()
    except grpc.aio.AioRpcError as err:
        error = f"weight update to v{version}: {err.code().name}: {err.details()}"
    except asyncio.CancelledError:
        # the gateway went down (update_one): no Resume now — it would hang on a dead or stopped
        # process until its deadline; the background re-sync pauses, loads and resumes it later
        paused_ok = False
        raise
    finally:
        if paused_ok:
            try:
                await gw.stub.Resume(
                    gateway_pb2.ResumeRequest(),
                    metadata=gw.auth,
                    timeout=max(deadline - time.monotonic(), RESUME_TIMEOUT_S),
                )
                gw.load.paused = False
                gw.refresh()
            except grpc.aio.AioRpcError as err:
                error = error or f"resume after v{version}: {err.code().name}: {err.details()}"
        gw.publishing = False
        gw.updated_at = time.monotonic()
    if error:
        gw.last_error = error
    return scheduler_pb2.GatewayResult(
        gateway=gw.address,
        ok=not error,
        error=error,
        duration_s=time.perf_counter() - t0,
        aborted=aborted,
    )


async def fan_out_weights(
    gateways: list[Gateway], version: int, uri: str, mode: int, timeout_s: float
) -> list[scheduler_pb2.GatewayResult]:
    return list(await asyncio.gather(*(update_one(g, version, uri, mode, timeout_s) for g in gateways)))


async def check_trainer_epoch(ro: Rollout, trainer_epoch: int) -> None:
    """Refuse a publish from a trainer that was replaced (its epoch is older than Redis')."""
    if trainer_epoch <= 0:
        return
    raw = await ro._r(lambda: ro.redis.get(ro.keys.trainer_epoch))
    current = int(raw or 0)
    if trainer_epoch < current:
        raise PublishError(
            f"fenced: trainer epoch {trainer_epoch} is older than the run's trainer epoch {current}"
        )


async def publish_weights(
    ro: Rollout, version: int, uri: str, mode: int, trainer_epoch: int = 0
) -> scheduler_pb2.PublishWeightsResponse:
    """PublishWeights: fan the update out, persist {version, uri} in Redis, raise the bound.
    Repeating the current (version, uri) is a no-op (a retry whose first reply was lost)."""
    if mode == common_pb2.PAUSE_MODE_UNSPECIFIED:
        mode = _MODES[ro.cfg.rollout.weight_update_mode.value]
    await check_trainer_epoch(ro, trainer_epoch)
    if ro.fenced:
        raise PublishUnavailable(
            "this scheduler was replaced by another one (fenced): ask the run's current scheduler"
        )
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
        # a gateway in a re-sync of its own is left to it: it ends on the newest version anyway
        targets = [g for g in ro.pool.up_gateways() if g.address not in ro.syncing]
        results = await fan_out_weights(targets, version, uri, mode, ro.cfg.rollout.weight_sync_timeout_s)
        dt = time.perf_counter() - t0
        ro.metrics.publish_seconds.observe(dt)
        if not any(r.ok for r in results):
            errors = "; ".join(f"{r.gateway}: {r.error}" for r in results) or "no gateway is up"
            raise PublishUnavailable(f"no gateway loaded v{version} ({errors}); still serving v{ro.version}")
        await ro._r(lambda: ro.redis.hset(ro.keys.weights, mapping={"version": version, "uri": uri}))
        ro.weights_published(version, uri)
    for r in results:
        if not r.ok:
            log.warning(
                "gateway %s missed v%d (%s): re-syncing it in the background", r.gateway, version, r.error
            )
    ro.wake_sync()
    return scheduler_pb2.PublishWeightsResponse(version=version, results=results, duration_s=dt)


PAUSED_GRACE_S = 5.0  # a paused report this soon after an update may predate its Resume


def behind(ro: Rollout, gw: Gateway) -> bool:
    """Up, yet not serving the current version (or left paused by an update that failed)."""
    if not gw.up or gw.publishing or gw.removed:
        return False
    stale = bool(ro.uri) and gw.weight_version < ro.version
    left_paused = gw.load.paused and time.monotonic() - gw.updated_at > PAUSED_GRACE_S
    return stale or left_paused


async def resync(ro: Rollout, gw: Gateway) -> bool:
    """Load the current weights into one gateway (dispatch skips it until then)."""
    ro.syncing.add(gw.address)
    try:
        version, uri = ro.version, ro.uri
        if not uri:  # nothing published yet: only a pause to undo
            version = gw.weight_version
        (res,) = await fan_out_weights(
            [gw], version, uri, common_pb2.PAUSE_MODE_KEEP, ro.cfg.rollout.weight_sync_timeout_s
        )
        if not uri and not res.ok and "INVALID_ARGUMENT" in res.error:
            res.ok = True  # LoadWeights without a uri is refused, but the Resume went through
    finally:
        ro.syncing.discard(gw.address)
    ro.metrics.gateway_weight_syncs.labels("ok" if res.ok else "failed").inc()
    if res.ok:
        log.info("gateway %s re-synced to v%d", gw.address, version)
    else:
        log.warning("re-sync of %s to v%d failed: %s", gw.address, version, res.error)
    ro.dispatcher.pump()
    return res.ok


async def sync_loop(ro: Rollout, poll_s: float = 1.0) -> None:
    """Keep every up gateway on the current version, with capped exponential backoff per
    gateway; wakes at once on a publish or a gateway coming up."""
    next_try: dict[str, float] = {}
    delay: dict[str, float] = {}
    running: dict[str, asyncio.Task[bool]] = {}
    while True:
        try:
            async with asyncio.timeout(poll_s):
                await ro._wake_sync.wait()
        except TimeoutError:
            pass
        ro._wake_sync.clear()
        now = time.monotonic()
        for addr, t in list(running.items()):
            if t.done():
                del running[addr]
                ok = not t.cancelled() and t.exception() is None and t.result()
                if ok:
                    delay.pop(addr, None)
                    next_try.pop(addr, None)
                else:
                    d = min(delay.get(addr, 0.5) * 2, SYNC_BACKOFF_MAX_S)
                    delay[addr] = d
                    next_try[addr] = now + d * (0.5 + random.random() / 2)
        if ro.fenced:
            continue
        for gw in list(ro.pool.members):
            a = gw.address
            if a in running or a in ro.syncing or now < next_try.get(a, 0.0) or not behind(ro, gw):
                continue
            running[a] = asyncio.create_task(resync(ro, gw), name=f"resync {a}")
