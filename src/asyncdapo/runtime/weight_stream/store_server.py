"""A WeightStore gRPC server of its own, on a background thread: the trainer's (a synchronous
process) — a gateway adds the servicer to its own server instead."""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import Future

import grpc

from asyncdapo.contracts.v1 import weights_pb2_grpc
from asyncdapo.runtime.grpc_security import BearerAuthInterceptor, ServerTls, add_port
from asyncdapo.runtime.weight_stream.service import METHODS, WeightStoreService
from asyncdapo.runtime.weight_stream.store import WeightStore

log = logging.getLogger(__name__)
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


class WeightStoreServer:
    """`start()` binds `listen` (HOST:PORT, port 0 picks one) and returns the port; `stop()`."""

    def __init__(
        self, store: WeightStore, listen: str, token: str | None = None, tls: ServerTls | None = None
    ) -> None:
        self.store = store
        self.listen = listen
        self.token = token
        self.tls = tls
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None

    def start(self) -> int:
        started: Future[int] = Future()
        self._thread = threading.Thread(target=self._run, args=(started,), name="weight-store", daemon=True)
        self._thread.start()
        self.port = started.result(timeout=30)
        log.info("weight store serving on %s (port %d), root %s", self.listen, self.port, self.store.root)
        return self.port

    def _run(self, started: Future[int]) -> None:
        async def serve() -> None:
            interceptors = [BearerAuthInterceptor(self.token, METHODS)] if self.token else []
            server = grpc.aio.server(
                interceptors=interceptors,
                options=[
                    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                    ("grpc.so_reuseport", 0),
                ],
            )
            weights_pb2_grpc.add_WeightStoreServicer_to_server(WeightStoreService(self.store), server)
            try:
                port = add_port(server, self.listen, self.tls)
            except OSError as err:
                started.set_exception(err)
                return
            await server.start()
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            started.set_result(port)
            await self._stop.wait()
            await server.stop(1.0)

        asyncio.run(serve())

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout=15)
