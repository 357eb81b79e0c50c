"""The gateway pool: addresses (a static list or the DNS of a headless Service, re-resolved), one
gRPC channel per gateway, live load from `WatchLoad`, up/down/draining state.

A gateway is up once it has sent a `Load` naming its engine (a gateway binds its port before its
engine has loaded and reports no engine until then); it goes down when its load stream breaks or stays
silent past `stale_after_s`, or when a request to it fails at the transport level
(`report_failure`). Going down cancels the calls the rollout has in flight there (`on_down`), so
they are re-dispatched at once instead of waiting for a dead connection. The watcher keeps
reconnecting with exponential backoff; the first `Load` brings the gateway back up.

Every `Load` is also handed to `on_load`: a report can make a gateway eligible again without any
up/down change (it resumed after a weight update, caught up with the weights, drained its queue),
and requests waiting for a gateway must then be placed; nothing else would wake them.

`Gateway` exposes the attributes of `dispatch.GatewayView`, so the pure dispatcher reads it
directly without a copy per decision.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc

from asyncdapo.contracts.v1 import gateway_pb2, gateway_pb2_grpc, scheduler_pb2
from asyncdapo.runtime.backoff import Backoff, Jitter
from asyncdapo.runtime.grpc_security import ClientTls, aio_channel, bearer_metadata

if TYPE_CHECKING:
    from asyncdapo.services.scheduler.tasks import Request

log = logging.getLogger(__name__)

# the load watcher's reconnects: 50 ms, doubled, at most 2 s, each wait drawn from [d/2, 3d/2]
WATCH_RECONNECT_BACKOFF = Backoff(0.05, 2.0, jitter=Jitter.SPREAD)

CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 256 << 20),
    ("grpc.max_send_message_length", 256 << 20),
    ("grpc.enable_retries", 0),
]


class GatewaySpecError(ValueError):
    pass


@dataclass(frozen=True)
class GatewaySpec:
    """`host:port,host:port` (static) or `dns:NAME:PORT` (headless Service, re-resolved)."""

    static: tuple[str, ...] = ()
    dns_name: str = ""
    dns_port: int = 0

    @classmethod
    def parse(cls, text: str) -> GatewaySpec:
        text = text.strip()
        if text.startswith("dns:"):
            parts = text[4:].rsplit(":", 1)
            if len(parts) != 2 or not parts[0] or not parts[1].isdigit():
                raise GatewaySpecError(f"--gateways: expected dns:NAME:PORT, got {text!r}")
            return cls(dns_name=parts[0], dns_port=int(parts[1]))
        addrs = tuple(a.strip() for a in text.split(",") if a.strip())
        if not addrs:
            raise GatewaySpecError("--gateways: no gateway address given")
        for a in addrs:
            host, _, port = a.rpartition(":")
            if not host or not port.isdigit():
                raise GatewaySpecError(f"--gateways: {a!r} is not host:port")
        return cls(static=addrs)


class Gateway:
    """One gateway as the pool sees it (attributes double as a `dispatch.GatewayView`).

    The view attributes are plain attributes, recomputed whenever `load`, `drain_requested` or
    `publishing` is assigned (or on `refresh()` after changing `load` in place): the dispatcher
    reads them for every gateway on every placement decision, and a property per read there cost
    several microseconds per request with 64 gateways.
    """

    def __init__(self, address: str, token: str | None, tls: ClientTls | None = None) -> None:
        self.address = address
        self.channel = aio_channel(address, tls, CHANNEL_OPTIONS)
        self.stub = gateway_pb2_grpc.GatewayStub(self.channel)
        self.auth = bearer_metadata(token)
        self._up = False
        # told of every change of what dispatch filters on (the pool points it at the
        # dispatcher's EligibleIndex); in-flight changes are reported by the dispatcher itself
        self.on_change: Callable[[Gateway], None] = lambda gw: None
        self._drain_requested = False  # DrainGateway: no new requests from us
        self._publishing = False  # weights are being loaded: dispatch holds its requests
        self.in_flight = 0  # requests this scheduler has in flight here
        self.calls: dict[str, Request] = {}  # request id -> Request in flight on our GenerateStream
        self.last_error = ""
        self.last_load_at = 0.0
        self.updated_at = 0.0  # monotonic time a weight update of ours last ended here
        self.went_down: asyncio.Event = asyncio.Event()  # set (and replaced) each time it goes down
        self.removed = False
        self.watch_task: asyncio.Task[None] | None = None
        self.load = gateway_pb2.Load()

    @property
    def up(self) -> bool:
        return self._up

    @up.setter
    def up(self, value: bool) -> None:
        self._up = value
        self.on_change(self)

    @property
    def load(self) -> gateway_pb2.Load:
        return self._load

    @load.setter
    def load(self, load: gateway_pb2.Load) -> None:
        self._load = load
        self.refresh()

    @property
    def drain_requested(self) -> bool:
        return self._drain_requested

    @drain_requested.setter
    def drain_requested(self, value: bool) -> None:
        self._drain_requested = value
        self.refresh()

    @property
    def publishing(self) -> bool:
        return self._publishing

    @publishing.setter
    def publishing(self, value: bool) -> None:
        self._publishing = value
        self.refresh()

    def refresh(self) -> None:
        """Recompute the `dispatch.GatewayView` attributes from the load report and our flags."""
        load = self._load
        self.draining = self._drain_requested or load.draining
        self.paused = self._publishing or load.paused
        self.pool = load.pool
        self.running = load.running
        self.waiting = load.waiting
        self.kv_cache_usage = load.kv_cache_usage
        self.capacity = load.capacity
        self.weight_version = load.weight_version
        self.on_change(self)

    def state(self) -> scheduler_pb2.GatewayState:
        if not self.up:
            return scheduler_pb2.GATEWAY_STATE_DOWN
        if self.draining:
            return scheduler_pb2.GATEWAY_STATE_DRAINING
        return scheduler_pb2.GATEWAY_STATE_UP

    def info(self) -> scheduler_pb2.GatewayInfo:
        return scheduler_pb2.GatewayInfo(
            address=self.address,
            state=self.state(),
            load=self.load,
            dispatched_in_flight=self.in_flight,
            last_error=self.last_error,
        )


MIN_WATCH_MS = 200
MAX_WATCH_MS = 2000
REPORTS_PER_S = 500  # load reports a second from the whole fleet, at most (above 100 gateways)


class GatewayPool:
    def __init__(
        self,
        spec: GatewaySpec,
        token: str | None = None,
        watch_interval_ms: int | None = None,
        tls: ClientTls | None = None,
        resolve_interval_s: float = 5.0,
        stale_after_s: float | None = None,
        on_up: Callable[[Gateway], None] | None = None,
        on_down: Callable[[Gateway], None] | None = None,
        on_load: Callable[[Gateway], None] | None = None,
        on_change: Callable[[Gateway], None] | None = None,
    ) -> None:
        self.spec = spec
        self.token = token
        self.tls = tls
        self._fixed_interval_ms = watch_interval_ms
        self._fixed_stale_s = stale_after_s
        self.resolve_interval_s = resolve_interval_s
        self.on_up = on_up or (lambda gw: None)
        self.on_down = on_down or (lambda gw: None)
        self.on_load = on_load or (lambda gw: None)
        self.on_change = on_change or (lambda gw: None)  # a gateway's dispatch inputs changed
        self.gateways: dict[str, Gateway] = {}
        self.members: list[Gateway] = []  # stable order for dispatch tie-breaks
        self._resolver: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def watch_interval_ms(self) -> int:
        """How often each gateway reports its load. Unless fixed, it grows with the fleet so that
        the whole fleet sends about REPORTS_PER_S reports a second (200 ms up to 100 gateways, ~1 s
        at 512, at most 2 s): watching 512 gateways at 200 ms took ~40 % of a core by itself."""
        if self._fixed_interval_ms is not None:
            return self._fixed_interval_ms
        return max(MIN_WATCH_MS, min(MAX_WATCH_MS, 1000 * len(self.members) // REPORTS_PER_S))

    @property
    def stale_after_s(self) -> float:
        """A gateway whose load reports stop for this long is down (a hung process; a dead one
        breaks its stream at once)."""
        if self._fixed_stale_s is not None:
            return self._fixed_stale_s
        return max(3.0, 10 * self.watch_interval_ms / 1000)

    async def start(self) -> None:
        self._apply(await self._resolve())
        if self.spec.dns_name:
            self._resolver = asyncio.create_task(self._resolve_loop())

    async def close(self) -> None:
        self._closed = True
        if self._resolver:
            self._resolver.cancel()
        for gw in list(self.gateways.values()):
            await self._remove(gw)

    def get(self, address: str) -> Gateway | None:
        return self.gateways.get(address)

    def up_gateways(self) -> list[Gateway]:
        return [g for g in self.members if g.up]

    async def wait_up(self, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.up_gateways()) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(self.up_gateways())}/{count} gateways up after {timeout_s:.0f} s")
            await asyncio.sleep(0.05)

    # --- membership ---
    async def _resolve(self) -> list[str]:
        if not self.spec.dns_name:
            return list(self.spec.static)
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(self.spec.dns_name, self.spec.dns_port, type=socket.SOCK_STREAM)
        addrs = sorted({f"{_host(str(info[4][0]))}:{self.spec.dns_port}" for info in infos})
        return addrs

    async def _resolve_loop(self) -> None:
        while not self._closed:
            await asyncio.sleep(self.resolve_interval_s)
            try:
                addrs = await self._resolve()
            except OSError as err:  # a DNS hiccup keeps the current members
                log.warning("resolving %s failed: %s", self.spec.dns_name, err)
                continue
            gone = set(self.gateways) - set(addrs)
            for a in gone:
                await self._remove(self.gateways[a])
            self._apply(addrs)

    def _apply(self, addrs: Iterable[str]) -> None:
        for a in addrs:
            if a not in self.gateways:
                gw = Gateway(a, self.token, self.tls)
                gw.on_change = lambda g: self.on_change(g)  # the pool's hook at call time
                self.gateways[a] = gw
                self.members.append(gw)
                gw.watch_task = asyncio.create_task(self._watch(gw))

    async def _remove(self, gw: Gateway) -> None:
        gw.removed = True
        self.gateways.pop(gw.address, None)
        if gw in self.members:
            self.members.remove(gw)
        if gw.watch_task:
            gw.watch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                async with asyncio.timeout(5.0):
                    await gw.watch_task
        self.mark_down(gw, "removed from the pool")
        await gw.channel.close()

    # --- health ---
    def mark_down(self, gw: Gateway, error: str) -> None:
        gw.last_error = error
        if not gw.up and not gw.calls:
            return
        gw.up = False
        log.warning("gateway %s down: %s", gw.address, error)
        gw.went_down.set()  # wakes whoever waits on this gateway (a weight update in flight)
        gw.went_down = asyncio.Event()
        self.on_down(gw)

    def report_failure(self, gw: Gateway, code: grpc.StatusCode, details: str) -> None:
        """A request failed: at the transport level (unavailable, deadline), the gateway is
        presumed down."""
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            self.presume_down(gw, f"{code.name}: {details}")

    def presume_down(self, gw: Gateway, error: str) -> None:
        """Down until the gateway sends a fresh Load (the watcher reconnects at once)."""
        self.mark_down(gw, error)
        if gw.watch_task and not gw.watch_task.done():
            gw.watch_task.cancel()
            gw.watch_task = asyncio.create_task(self._watch(gw, first_delay_s=0.05))

    async def _watch(self, gw: Gateway, first_delay_s: float = 0.0) -> None:
        reconnects = WATCH_RECONNECT_BACKOFF.delays()
        if first_delay_s:
            await asyncio.sleep(first_delay_s)
        while not gw.removed:
            call = gw.stub.WatchLoad(gateway_pb2.WatchLoadRequest(interval_ms=self.watch_interval_ms))
            try:
                while not gw.removed:
                    # asyncio.timeout, not wait_for: in 3.11 wait_for can swallow a cancellation
                    # that races with the read, and the watcher would then never stop
                    async with asyncio.timeout(self.stale_after_s):
                        load = await call.read()
                    if load is grpc.aio.EOF:
                        raise ConnectionError("load stream ended")
                    gw.load = load
                    gw.last_load_at = time.monotonic()
                    reconnects.reset()
                    if not load.engine:  # listening, but its engine is still starting
                        if gw.up:
                            self.mark_down(gw, "engine not attached")
                        continue
                    if not gw.up:
                        gw.up = True
                        gw.last_error = ""
                        log.info("gateway %s up (%s engine)", gw.address, load.engine or "?")
                        self.on_up(gw)
                    self.on_load(gw)
            except asyncio.CancelledError:
                call.cancel()
                raise
            except TimeoutError:
                call.cancel()
                # a silent stream may also be our own loop stalling: ask once before giving up
                try:
                    gw.load = await gw.stub.GetLoad(gateway_pb2.GetLoadRequest(), timeout=1.0)
                    self.on_load(gw)
                    continue
                except grpc.aio.AioRpcError:
                    self.mark_down(gw, f"no load report for {self.stale_after_s:.1f} s")
            except grpc.aio.AioRpcError as err:
                self.mark_down(gw, f"{err.code().name}: {err.details()}")
            except ConnectionError as err:
                self.mark_down(gw, str(err))
            await asyncio.sleep(reconnects.next())


def _host(ip: str) -> str:
    return f"[{ip}]" if ":" in ip else ip
