"""A version's manifest: its files, cut into chunks of at most CHUNK_BYTES, each with a SHA-256.

A chunk never spans two files, so a receiver writes each chunk at (file, offset) as it arrives,
in any order, and a relay can serve any chunk it has. The manifest's own digest (of the file
layout and the chunk digests) tells two manifests of one version apart: a receiver resumes a
partial copy only when the digests match.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from asyncdapo.contracts.v1 import weights_pb2

CHUNK_BYTES = 4 * 1024 * 1024  # gRPC messages stay far under the 64 MiB limit; hashing overlaps I/O
_READ_BYTES = CHUNK_BYTES


class ManifestError(ValueError):
    """A manifest that cannot describe a model directory (the message names the field)."""


@dataclass(frozen=True)
class FileEntry:
    name: str
    size: int
    first_chunk: int
    num_chunks: int


@dataclass(frozen=True)
class Manifest:
    version: int
    chunk_bytes: int
    files: tuple[FileEntry, ...]
    chunk_sha256: tuple[bytes, ...]

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def num_chunks(self) -> int:
        return len(self.chunk_sha256)

    def digest(self) -> str:
        h = hashlib.sha256(f"{self.version}:{self.chunk_bytes}".encode())
        for f in self.files:
            h.update(f"|{f.name}:{f.size}".encode())
        for d in self.chunk_sha256:
            h.update(d)
        return h.hexdigest()

    def locate(self, index: int) -> tuple[FileEntry, int, int]:
        """(file, byte offset in it, length) of chunk `index`."""
        for f in self.files:
            if f.first_chunk <= index < f.first_chunk + f.num_chunks:
                offset = (index - f.first_chunk) * self.chunk_bytes
                return f, offset, min(self.chunk_bytes, f.size - offset)
        raise IndexError(f"chunk {index} is outside 0..{self.num_chunks - 1}")

    def to_pb(self) -> weights_pb2.WeightManifest:
        return weights_pb2.WeightManifest(
            version=self.version,
            chunk_bytes=self.chunk_bytes,
            files=[
                weights_pb2.WeightFile(
                    name=f.name, size=f.size, first_chunk=f.first_chunk, num_chunks=f.num_chunks
                )
                for f in self.files
            ],
            chunk_sha256=list(self.chunk_sha256),
            total_bytes=self.total_bytes,
        )

    @classmethod
    def from_pb(cls, pb: weights_pb2.WeightManifest) -> Manifest:
        """Check the layout a sender claims before a byte is written: plain names, chunks in
        order without gaps, sizes that match the chunk count, 32-byte digests."""
        if pb.chunk_bytes <= 0:
            raise ManifestError(f"chunk_bytes must be > 0, got {pb.chunk_bytes}")
        files: list[FileEntry] = []
        nxt = 0
        for f in pb.files:
            if (
                not f.name
                or "/" in f.name
                or "\\" in f.name
                or f.name in (".", "..")
                or f.name.startswith(".")
            ):
                raise ManifestError(f"file name {f.name!r} is not a plain file name")
            if f.size < 0 or f.first_chunk != nxt:
                raise ManifestError(
                    f"file {f.name!r}: size {f.size} / first_chunk {f.first_chunk} out of order"
                )
            expected = max(1, -(-f.size // pb.chunk_bytes))
            if f.num_chunks != expected:
                raise ManifestError(
                    f"file {f.name!r}: {f.num_chunks} chunk(s) for {f.size} bytes, expected {expected}"
                )
            files.append(FileEntry(f.name, int(f.size), int(f.first_chunk), int(f.num_chunks)))
            nxt += f.num_chunks
        if len({f.name for f in files}) != len(files):
            raise ManifestError("a file name appears twice")
        if len(pb.chunk_sha256) != nxt or any(len(d) != 32 for d in pb.chunk_sha256):
            raise ManifestError(f"expected {nxt} SHA-256 digests of 32 bytes, got {len(pb.chunk_sha256)}")
        return cls(
            int(pb.version), int(pb.chunk_bytes), tuple(files), tuple(bytes(d) for d in pb.chunk_sha256)
        )


def build_manifest(directory: Path, version: int, chunk_bytes: int = CHUNK_BYTES) -> Manifest:
    """The manifest of the regular files directly in `directory` (sorted by name), hashing every
    chunk: one sequential read of the directory."""
    files: list[FileEntry] = []
    digests: list[bytes] = []
    for path in sorted(p for p in directory.iterdir() if p.is_file() and not p.name.startswith(".")):
        size = path.stat().st_size
        n = max(1, -(-size // chunk_bytes))
        files.append(FileEntry(path.name, size, len(digests), n))
        with path.open("rb") as fh:
            for _ in range(n):
                digests.append(hashlib.sha256(fh.read(chunk_bytes)).digest())
    if not files:
        raise ManifestError(f"{directory} holds no files")
    return Manifest(version, chunk_bytes, tuple(files), tuple(digests))
