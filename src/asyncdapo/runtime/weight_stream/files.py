"""A few named files of the newest version a WeightStore serves — e.g. the `tokenizer.json` a
scheduler detokenizes with, so that it needs no model volume. Only those files' chunks move, each
checked against the manifest's SHA-256 before the file appears (written beside, then renamed)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

import grpc

from asyncdapo.contracts.errors import AsyncdapoError
from asyncdapo.contracts.v1 import weights_pb2, weights_pb2_grpc
from asyncdapo.runtime.grpc_security import ClientTls, aio_channel, bearer_metadata
from asyncdapo.runtime.weight_stream.manifest import Manifest, ManifestError
from asyncdapo.runtime.weight_stream.store_server import MAX_MESSAGE_BYTES

CALL_TIMEOUT_S = 60.0


class FilesUnavailable(RuntimeError):
    """The server is not up, serves no whole version yet, or sent bytes that do not match their
    digest: worth asking again later."""


class FileNotServed(AsyncdapoError):
    """The newest version holds no file of that name (e.g. a model directory without a
    tokenizer.json): asking again will not help."""


async def fetch_files(
    address: str,
    names: Sequence[str],
    dest: Path,
    token: str | None = None,
    tls: ClientTls | None = None,
) -> int:
    """Write the files `names` of the newest whole version `address` serves into `dest` (made if
    missing); returns that version. Raises FilesUnavailable or FileNotServed."""
    metadata = bearer_metadata(token)
    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
    async with aio_channel(address, tls, options) as channel:
        stub = weights_pb2_grpc.WeightStoreStub(channel)
        try:
            pb = await stub.GetManifest(
                weights_pb2.GetManifestRequest(version=-1), metadata=metadata, timeout=CALL_TIMEOUT_S
            )
            manifest = Manifest.from_pb(pb)
        except grpc.aio.AioRpcError as err:
            raise FilesUnavailable(f"{address}: manifest: {err.code().name}: {err.details()}") from None
        except ManifestError as err:
            raise FilesUnavailable(f"{address}: manifest: {err}") from None
        served = {f.name: f for f in manifest.files}
        absent = [n for n in names if n not in served]
        if absent:
            raise FileNotServed(
                f"weights v{manifest.version} served at {address} hold no {', '.join(absent)} "
                f"(its files: {', '.join(sorted(served))}); the model directory must include it"
            )
        dest.mkdir(parents=True, exist_ok=True)
        for name in names:
            entry = served[name]
            parts: list[bytes] = []
            try:
                async for chunk in stub.ReadChunks(
                    weights_pb2.ReadChunksRequest(
                        version=manifest.version, first=entry.first_chunk, count=entry.num_chunks
                    ),
                    metadata=metadata,
                    timeout=CALL_TIMEOUT_S,
                ):
                    expected_index = entry.first_chunk + len(parts)
                    if chunk.index != expected_index:
                        raise FilesUnavailable(
                            f"{address}: {name}: sent chunk {chunk.index}, expected {expected_index}"
                        )
                    if hashlib.sha256(chunk.data).digest() != manifest.chunk_sha256[chunk.index]:
                        raise FilesUnavailable(
                            f"{address}: {name}: chunk {chunk.index} does not match its digest"
                        )
                    parts.append(chunk.data)
            except grpc.aio.AioRpcError as err:
                raise FilesUnavailable(f"{address}: {name}: {err.code().name}: {err.details()}") from None
            if len(parts) != entry.num_chunks:
                raise FilesUnavailable(f"{address}: {name}: {len(parts)} of {entry.num_chunks} chunk(s) sent")
            partial = dest / f".{name}.partial"
            partial.write_bytes(b"".join(parts))
            os.replace(partial, dest / name)
    return manifest.version
