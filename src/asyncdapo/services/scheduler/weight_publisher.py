"""Weight updates fanned out to gateways: Pause(mode) → LoadWeights → Resume, all in parallel, and
the re-sync of gateways that missed one. A stream:// version is first fetched by every gateway
(LoadWeights fetch_only, no pause; relayed gateway to gateway down `relay_plan`'s tree) and then
loaded under the pause from the gateway's own memory.

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

`WeightPublisher` owns the publish lock, the set of gateways in a re-sync and the re-sync loop; it
sees the run only through `RunWeights` (the version it serves, whether it was fenced, and the one
call that raises the bound), so the run's state has one owner: the rollout core.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

import grpc
from redis.asyncio import Redis

from asyncdapo.contracts.config import PauseMode, RolloutConfig
from asyncdapo.contracts.redis_keys import RunKeys
from asyncdapo.contracts.v1 import gateway_pb2, scheduler_pb2
from asyncdapo.contracts.wire_enums import pause_mode_to_pb
from asyncdapo.runtime.backoff import Backoff, Delays, Jitter
from asyncdapo.runtime.weight_stream.uri import is_stream_uri
from asyncdapo.services.scheduler.gateway_pool import Gateway, GatewayPool
from asyncdapo.services.scheduler.metrics import SchedulerMetrics
from asyncdapo.services.scheduler.relay_plan import resync_sources, tree_sources

log = logging.getLogger(__name__)
RESUME_TIMEOUT_S = 10.0  # a Resume after a failed load gets its own short bound
# per gateway, after a failed re-sync: 1 s, doubled, at most 30 s, each wait drawn from [d/2, d]
SYNC_BACKOFF = Backoff(1.0, 30.0, jitter=Jitter.EQUAL)


class PublishError(ValueError):
    """The request cannot be applied (not newer, fenced): FAILED_PRECONDITION."""


class PublishUnavailable(RuntimeError):
    """No gateway could load the version: nothing changed, the caller retries (UNAVAILABLE)."""


async def update_one(
    gw: Gateway, version: int, uri: str, mode: PauseMode, timeout_s: float, sources: Sequence[str] = ()
) -> scheduler_pb2.GatewayResult:
    """Pause → LoadWeights → Resume on one gateway within `timeout_s` in all; Resume is tried even
    when the load failed (a paused engine serves nobody). A gateway that goes down meanwhile (its
    load reports stopped: dead, paused, cut off) fails at once instead of at the deadline."""
    down = asyncio.ensure_future(gw.went_down.wait())
    work = asyncio.ensure_future(_update(gw, version, uri, mode, timeout_s, sources))
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
    gw: Gateway, version: int, uri: str, mode: PauseMode, timeout_s: float, sources: Sequence[str]
) -> scheduler_pb2.GatewayResult:
    t0 = time.perf_counter()
    deadline = time.monotonic() + timeout_s
    aborted = 0
    paused_ok = False
    error = ""
    request = gateway_pb2.LoadWeightsRequest(version=version, uri=uri, sources=list(sources))
    if is_stream_uri(uri):
        # fetch while the engine still generates: the pause below covers only the in-place load
        try:
            await gw.stub.LoadWeights(
                gateway_pb2.LoadWeightsRequest(
                    version=version, uri=uri, sources=list(sources), fetch_only=True
                ),
                metadata=gw.auth,
                timeout=timeout_s,
            )
        except grpc.aio.AioRpcError as err:
            gw.last_error = f"weight update to v{version}: fetch: {err.code().name}: {err.details()}"
            return scheduler_pb2.GatewayResult(
                gateway=gw.address, ok=False, error=gw.last_error, duration_s=time.perf_counter() - t0
            )
    gw.publishing = True
    try:
        paused = await gw.stub.Pause(
            gateway_pb2.PauseRequest(mode=pause_mode_to_pb(mode)), metadata=gw.auth, timeout=timeout_s
        )
        paused_ok = True
        aborted = paused.aborted
        loaded = await gw.stub.LoadWeights(
            request,
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
    gateways: list[Gateway],
    version: int,
    uri: str,
    mode: PauseMode,
    timeout_s: float,
    fanout: int = 2,
    sources: dict[str, list[str]] | None = None,
) -> list[scheduler_pb2.GatewayResult]:
    """Update every gateway at once; stream:// versions relay down a tree (`relay_plan`) unless
    `sources` says where each gateway pulls from."""
    if sources is None:
        sources = tree_sources([g.address for g in gateways], fanout) if is_stream_uri(uri) else {}
    return list(
        await asyncio.gather(
            *(update_one(g, version, uri, mode, timeout_s, sources.get(g.address, ())) for g in gateways)
        )
    )


PAUSED_GRACE_S = 5.0  # a paused report this soon after an update may predate its Resume


class RunWeights(Protocol):
    """What the publisher needs from the run — and no more."""

    @property
    def version(self) -> int: ...

    @property
    def uri(self) -> str: ...

    @property
    def fenced(self) -> bool: ...

    def weights_published(self, version: int, uri: str) -> None:
        """At least one gateway serves `version` and Redis has it: raise the bound."""

    def gateways_changed(self) -> None:
        """A gateway finished a re-sync: requests waiting for a gateway may be placed now."""


class WeightPublisher:
    """PublishWeights and the background re-sync of gateways behind the current version."""

    def __init__(
        self,
        run: RunWeights,
        pool: GatewayPool,
        cfg: RolloutConfig,
        metrics: SchedulerMetrics,
        redis: Redis,
        keys: RunKeys,
        redis_call: Callable[[Callable[[], Awaitable[Any]]], Awaitable[Any]],
    ) -> None:
        self._run = run
        self._pool = pool
        self._cfg = cfg
        self._metrics = metrics
        self._redis = redis
        self._keys = keys
        self._r = redis_call  # waits through a Redis outage
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self.syncing: set[str] = set()  # gateways in a re-sync of their own

    def wake(self) -> None:
        """Look for gateways behind the current weights now (they re-sync in the background)."""
        self._wake.set()

    async def check_trainer_epoch(self, trainer_epoch: int) -> None:
        """Refuse a publish from a trainer that was replaced (its epoch is older than Redis')."""
        if trainer_epoch <= 0:
            return
        raw = await self._r(lambda: self._redis.get(self._keys.trainer_epoch))
        current = int(raw or 0)
        if trainer_epoch < current:
            raise PublishError(
                f"fenced: trainer epoch {trainer_epoch} is older than the run's trainer epoch {current}"
            )

    async def publish(
        self, version: int, uri: str, mode: PauseMode | None = None, trainer_epoch: int = 0
    ) -> scheduler_pb2.PublishWeightsResponse:
        """PublishWeights: fan the update out, persist {version, uri} in Redis, raise the bound.
        Repeating the current (version, uri) is a no-op (a retry whose first reply was lost).
        `mode` None is the run's `rollout.weight_update_mode`."""
        mode = mode or self._cfg.weight_update_mode
        run = self._run
        await self.check_trainer_epoch(trainer_epoch)
        if run.fenced:
            raise PublishUnavailable(
                "this scheduler was replaced by another one (fenced): ask the run's current scheduler"
            )
        async with self._lock:
            if version == run.version and uri == run.uri:
                return scheduler_pb2.PublishWeightsResponse(
                    version=version,
                    results=[
                        scheduler_pb2.GatewayResult(
                            gateway=g.address,
                            ok=g.weight_version >= version,
                            error="" if g.weight_version >= version else f"serves version {g.weight_version}",
                        )
                        for g in self._pool.up_gateways()
                    ],
                )
            if version <= run.version:
                raise PublishError(f"version {version} is not newer than the current version {run.version}")
            t0 = time.perf_counter()
            # a gateway in a re-sync of its own is left to it: it ends on the newest version anyway
            targets = [g for g in self._pool.up_gateways() if g.address not in self.syncing]
            results = await fan_out_weights(
                targets, version, uri, mode, self._cfg.weight_sync_timeout_s, self._cfg.weight_relay_fanout
            )
            dt = time.perf_counter() - t0
            self._metrics.publish_seconds.observe(dt)
            if not any(r.ok for r in results):
                errors = "; ".join(f"{r.gateway}: {r.error}" for r in results) or "no gateway is up"
                raise PublishUnavailable(
                    f"no gateway loaded v{version} ({errors}); still serving v{run.version}"
                )
            await self._r(
                lambda: self._redis.hset(self._keys.weights, mapping={"version": version, "uri": uri})
            )
            run.weights_published(version, uri)
        for r in results:
            if not r.ok:
                log.warning(
                    "gateway %s missed v%d (%s): re-syncing it in the background", r.gateway, version, r.error
                )
        self.wake()
        return scheduler_pb2.PublishWeightsResponse(version=version, results=results, duration_s=dt)

    def behind(self, gw: Gateway) -> bool:
        """Up, yet not serving the current version (or left paused by an update that failed)."""
        if not gw.up or gw.publishing or gw.removed:
            return False
        stale = bool(self._run.uri) and gw.weight_version < self._run.version
        left_paused = gw.load.paused and time.monotonic() - gw.updated_at > PAUSED_GRACE_S
        return stale or left_paused

    async def resync(self, gw: Gateway) -> bool:
        """Load the current weights into one gateway (dispatch skips it until then). A publish
        meanwhile leaves this gateway to the re-sync, so the re-sync ends on the newest version:
        it loads again while the run moved on during its load."""
        self.syncing.add(gw.address)
        try:
            while True:
                version, ok = await self._load_current(gw)
                # no uri: only a pause was undone, and there is nothing newer to load
                if not ok or version >= self._run.version or not self._run.uri:
                    break
        finally:
            self.syncing.discard(gw.address)
        self._metrics.gateway_weight_syncs.labels("ok" if ok else "failed").inc()
        if ok:
            log.info("gateway %s re-synced to v%d", gw.address, version)
        self._run.gateways_changed()
        return ok

    async def _load_current(self, gw: Gateway) -> tuple[int, bool]:
        """One Pause(keep) → LoadWeights → Resume of the run's current version into `gw`: the
        version tried and whether it took."""
        version, uri = self._run.version, self._run.uri
        if not uri:  # nothing published yet: only a pause to undo
            version = gw.weight_version
        holders = [
            g.address
            for g in self._pool.up_gateways()
            if g is not gw and g.weight_version >= version and not g.publishing
        ]
        random.shuffle(holders)  # spread catch-ups over the holders
        (res,) = await fan_out_weights(
            [gw],
            version,
            uri,
            PauseMode.KEEP,
            self._cfg.weight_sync_timeout_s,
            sources={gw.address: resync_sources(holders)} if is_stream_uri(uri) else {},
        )
        if not uri and not res.ok and "INVALID_ARGUMENT" in res.error:
            return version, True  # LoadWeights without a uri is refused, but the Resume went through
        if not res.ok:
            log.warning("re-sync of %s to v%d failed: %s", gw.address, version, res.error)
        return version, res.ok

    async def sync_loop(self, poll_s: float = 1.0) -> None:
        """Keep every up gateway on the current version, with capped exponential backoff per
        gateway; wakes at once on a publish or a gateway coming up."""
        next_try: dict[str, float] = {}
        failures: dict[str, Delays] = {}  # gateways whose latest re-sync failed
        running: dict[str, asyncio.Task[bool]] = {}
        while True:
            try:
                async with asyncio.timeout(poll_s):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            now = time.monotonic()
            for addr, t in list(running.items()):
                if t.done():
                    del running[addr]
                    ok = not t.cancelled() and t.exception() is None and t.result()
                    if ok:
                        failures.pop(addr, None)
                        next_try.pop(addr, None)
                    else:
                        next_try[addr] = now + failures.setdefault(addr, SYNC_BACKOFF.delays()).next()
            if self._run.fenced:
                continue
            for gw in list(self._pool.members):
                a = gw.address
                if a in running or a in self.syncing or now < next_try.get(a, 0.0) or not self.behind(gw):
                    continue
                running[a] = asyncio.create_task(self.resync(gw), name=f"resync {a}")
