"""`asyncdapo.v1.WeightStore` over a `WeightStore`: manifests and chunks, relayed as they arrive.

Errors: a version this server does not hold → NOT_FOUND; a chunk range outside the manifest →
INVALID_ARGUMENT; a chunk that does not arrive within `chunk_wait_s` (a relay whose own source
stalled) → UNAVAILABLE, so the reader moves on to its next source instead of hanging.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc

from asyncdapo.contracts.v1 import weights_pb2, weights_pb2_grpc
from asyncdapo.runtime.grpc_security import method_names
from asyncdapo.runtime.weight_stream.store import HeldVersion, NotHeld, WeightStore

SERVICE_NAME = weights_pb2.DESCRIPTOR.services_by_name["WeightStore"].full_name
METHODS = method_names(SERVICE_NAME, ("GetManifest", "ReadChunks"))
CHUNK_WAIT_S = 10.0  # a relay's source stalled this long: let the reader try another


class WeightStoreService(weights_pb2_grpc.WeightStoreServicer):
    def __init__(self, store: WeightStore, chunk_wait_s: float = CHUNK_WAIT_S) -> None:
        self.store = store
        self.chunk_wait_s = chunk_wait_s

    async def GetManifest(
        self, request: weights_pb2.GetManifestRequest, context: grpc.aio.ServicerContext
    ) -> weights_pb2.WeightManifest:
        version = request.version
        if version < 0:  # the newest whole version held (a gateway starting from the trainer)
            whole = [v for v in self.store.versions() if self.store.get(v).complete]
            version = max(whole) if whole else version
        try:
            return self.store.get(version).manifest.to_pb()
        except NotHeld:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"this server holds weights versions {self.store.versions()}, not {request.version}",
            )
            raise  # unreachable: abort raises

    async def ReadChunks(
        self, request: weights_pb2.ReadChunksRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[weights_pb2.WeightChunk]:
        held = await self._held(request.version)
        if held is None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"weights version {request.version} is not held here"
            )
            return
        n = held.manifest.num_chunks
        last = n if request.count == 0 else request.first + request.count
        if request.first < 0 or request.count < 0 or last > n or request.first >= n:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"chunks [{request.first}, {last}) are outside the {n} chunk(s) of v{request.version}",
            )
            return
        for index in range(request.first, last):
            if not self.store.has(request.version, index):
                arrived = await asyncio.to_thread(
                    self.store.wait_for, request.version, index, self.chunk_wait_s
                )
                if not arrived:
                    await context.abort(
                        grpc.StatusCode.UNAVAILABLE,
                        f"chunk {index} of v{request.version} did not arrive here within {self.chunk_wait_s:.0f} s",
                    )
                    return
            data = await asyncio.to_thread(self.store.read, request.version, index)
            yield weights_pb2.WeightChunk(index=index, data=data)

    async def _held(self, version: int) -> HeldVersion | None:
        """The version, waiting up to `chunk_wait_s` for it to appear: a relay asked for a version
        it has not started receiving yet (the fan-out reaches every gateway at once) soon will."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.chunk_wait_s
        while True:
            try:
                return self.store.get(version)
            except NotHeld:
                if loop.time() >= deadline or (
                    self.store.versions() and max(self.store.versions()) > version
                ):
                    return None
            await asyncio.sleep(0.05)
