"""Pull one version into a store from a list of WeightStore sources.

- The manifest comes from the first source that has it (callers list the authority, the trainer,
  first for the manifest: `manifest_order`), the chunks from the sources in the given order
  (relays first, the trainer last).
- Every chunk is checked against its SHA-256 before it is written; a corrupt chunk, an error or a
  source that sends nothing for `stall_s` ends that source's turn, and the next source is asked
  for exactly the chunks still missing. A version partly received earlier (same manifest) resumes.
- Memory is bounded by one chunk per stream: chunks go straight to their file.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import grpc

from asyncdapo.contracts.v1 import weights_pb2, weights_pb2_grpc
from asyncdapo.runtime.grpc_security import ClientTls, aio_channel, bearer_metadata
from asyncdapo.runtime.weight_stream.manifest import Manifest, ManifestError
from asyncdapo.runtime.weight_stream.service import CHUNK_WAIT_S
from asyncdapo.runtime.weight_stream.store import ChunkCorrupt, HeldVersion, StoreFull, WeightStore
from asyncdapo.runtime.weight_stream.store_server import MAX_MESSAGE_BYTES

STALL_S = CHUNK_WAIT_S + 5.0  # longer than a relay waits for its own source, so its error arrives
MANIFEST_TIMEOUT_S = 30.0
ROUNDS = 2  # passes over the sources before giving up


class FetchError(RuntimeError):
    """No source could provide the whole version; the message lists each source's failure."""


@dataclass
class FetchResult:
    manifest: Manifest
    directory: str
    bytes_received: int  # this call's, checked
    seconds: float
    bytes_by_source: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)  # sources that failed on the way


def missing_runs(have: bytearray) -> list[tuple[int, int]]:
    """(first, count) of each run of missing chunks."""
    runs: list[tuple[int, int]] = []
    start = -1
    for i, h in enumerate(have):
        if not h and start < 0:
            start = i
        elif h and start >= 0:
            runs.append((start, i - start))
            start = -1
    if start >= 0:
        runs.append((start, len(have) - start))
    return runs


class Fetcher:
    """One per process: keeps a channel per source address."""

    def __init__(self, store: WeightStore, token: str | None = None, tls: ClientTls | None = None) -> None:
        self.store = store
        self.metadata = bearer_metadata(token)
        self.tls = tls
        self._channels: dict[str, grpc.aio.Channel] = {}

    def _stub(self, address: str) -> weights_pb2_grpc.WeightStoreStub:
        ch = self._channels.get(address)
        if ch is None:
            ch = aio_channel(
                address,
                self.tls,
                [
                    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ],
            )
            self._channels[address] = ch
        return weights_pb2_grpc.WeightStoreStub(ch)

    async def close(self) -> None:
        for ch in self._channels.values():
            await ch.close()
        self._channels.clear()

    async def manifest(self, version: int, sources: Sequence[str], errors: list[str]) -> Manifest:
        for src in sources:
            try:
                pb = await self._stub(src).GetManifest(
                    weights_pb2.GetManifestRequest(version=version),
                    metadata=self.metadata,
                    timeout=MANIFEST_TIMEOUT_S,
                )
                return Manifest.from_pb(pb)
            except grpc.aio.AioRpcError as err:
                errors.append(f"{src}: manifest: {err.code().name}: {err.details()}")
            except ManifestError as err:
                errors.append(f"{src}: manifest: {err}")
        raise FetchError(f"no source has weights v{version}: " + "; ".join(errors))

    async def fetch(
        self,
        version: int,
        sources: Sequence[str],
        manifest_order: Sequence[str] | None = None,
        stall_s: float = STALL_S,
    ) -> FetchResult:
        t0 = time.monotonic()
        errors: list[str] = []
        sources = list(dict.fromkeys(sources))  # each once, order kept
        manifest = await self.manifest(version, list(manifest_order or sources), errors)
        try:
            held = await asyncio.to_thread(self.store.begin, manifest)
        except StoreFull as err:
            raise FetchError(str(err)) from None
        before = held.received_bytes
        by_source: dict[str, int] = {}
        for _ in range(ROUNDS):
            for src in sources:
                if held.complete:
                    break
                try:
                    by_source[src] = by_source.get(src, 0) + await self._pull(src, held, stall_s)
                except (grpc.aio.AioRpcError, TimeoutError, ChunkCorrupt, ValueError) as err:
                    errors.append(f"{src}: {_describe(err, stall_s)}")
            if held.complete:
                break
        if not held.complete:
            raise FetchError(
                f"weights v{version}: {len(held.missing())} of {manifest.num_chunks} chunk(s) still missing "
                f"after {ROUNDS} round(s) over {len(sources)} source(s): "
                + "; ".join(errors[-2 * len(sources) :])
            )
        return FetchResult(
            manifest,
            str(held.directory),
            held.received_bytes - before,
            time.monotonic() - t0,
            by_source,
            errors,
        )

    async def _pull(self, src: str, held: HeldVersion, stall_s: float) -> int:
        """The missing chunks from one source, run by run; returns the bytes written."""
        got = 0
        version = held.manifest.version
        for first, count in missing_runs(held.have):
            call = self._stub(src).ReadChunks(
                weights_pb2.ReadChunksRequest(version=version, first=first, count=count),
                metadata=self.metadata,
            )
            try:
                it: AsyncIterator[weights_pb2.WeightChunk] = call.__aiter__()
                while True:
                    try:
                        async with asyncio.timeout(stall_s):
                            chunk = await anext(it)
                    except StopAsyncIteration:
                        break
                    if not first <= chunk.index < first + count:
                        raise ValueError(
                            f"sent chunk {chunk.index} outside the asked [{first}, {first + count})"
                        )
                    if not held.have[chunk.index]:
                        await asyncio.to_thread(self.store.write, version, chunk.index, chunk.data)
                        got += len(chunk.data)
            finally:
                call.cancel()
        return got


def _describe(err: BaseException, stall_s: float) -> str:
    if isinstance(err, grpc.aio.AioRpcError):
        return f"{err.code().name}: {err.details()}"
    if isinstance(err, TimeoutError):
        return f"sent nothing for {stall_s:.0f} s"
    return str(err)
