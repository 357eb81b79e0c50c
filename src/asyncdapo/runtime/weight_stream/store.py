"""The versions one process holds (trainer: what it published; gateway: what it loaded or is
receiving), each a model directory under one root plus the chunk bitmap of a partial copy.

Thread-safe: the trainer's training thread adds versions while its gRPC thread serves them; a
gateway's fetch writes chunks while its servicer relays them. The root is meant to be memory
(`/dev/shm`, a `medium: Memory` emptyDir): a version is written once and read by vLLM and by peers.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from asyncdapo.contracts.errors import AsyncdapoError
from asyncdapo.runtime.weight_stream.manifest import Manifest, build_manifest


class ChunkCorrupt(ValueError):
    """A chunk whose bytes do not match its manifest digest (or length)."""


class NotHeld(KeyError):
    """The store neither holds nor receives that version."""


class StoreFull(AsyncdapoError):
    """The store's directory has not the room for a version (a small /dev/shm, e.g. a container's
    64 MiB default): the message names the directory, what is needed and what is free."""


def check_room(root: Path, needed: int, what: str) -> None:
    free = shutil.disk_usage(root).free
    if free < needed:
        raise StoreFull(
            f"{what}: {root} has {free / 2**30:.2f} GiB free, a version needs {needed / 2**30:.2f} GiB; "
            "give the weight store a larger directory (trainer.weight_store_dir / gateway "
            "--weight-store-dir; on Kubernetes a bigger medium: Memory emptyDir)"
        )


_OWNED = re.compile(r"^asyncdapo-(?:gw|trainer)-(\d+)-")


def remove_orphans(root: Path) -> int:
    """Delete the versions of gateways and trainers that died without cleaning up (a SIGKILL):
    directories named after a process id that no longer exists. A memory-backed root would
    otherwise keep them until the host reboots."""
    removed = 0
    for d in root.glob("asyncdapo-*"):
        m = _OWNED.match(d.name)
        if m is None or not d.is_dir():
            continue
        try:
            os.kill(int(m.group(1)), 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
            removed += 1
        except PermissionError:  # alive, another user's
            pass
    return removed


def default_root() -> Path:
    """`/dev/shm` when the host has it (memory), else the temporary directory."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


@dataclass
class HeldVersion:
    manifest: Manifest
    directory: Path
    have: bytearray  # 1 per chunk present and checked
    complete: bool = False
    received_bytes: int = 0
    progress: int = 0  # rises with every chunk written: relays wait on it
    _cond: threading.Condition = field(default_factory=threading.Condition, repr=False)

    def missing(self) -> list[int]:
        return [i for i, h in enumerate(self.have) if not h]


class WeightStore:
    """Versions under `root/<name>-v{N}/`; `name` keeps two stores on one host apart."""

    def __init__(self, root: Path | str | None, name: str) -> None:
        self.root = Path(root) if root else default_root()
        self.name = name
        self._lock = threading.Lock()
        self._held: dict[int, HeldVersion] = {}
        self.bytes_served = 0  # chunk bytes sent to readers (all versions)

    def directory(self, version: int) -> Path:
        return self.root / f"asyncdapo-{self.name}-v{version}"

    # --- holding -------------------------------------------------------------------------------

    def hold_complete(self, version: int, directory: Path) -> Manifest:
        """Serve the finished model directory `directory` (moved under the root when elsewhere)."""
        target = self.directory(version)
        if directory.resolve() != target.resolve():
            shutil.rmtree(target, ignore_errors=True)
            shutil.move(str(directory), target)
        manifest = build_manifest(target, version)
        held = HeldVersion(manifest, target, bytearray([1]) * manifest.num_chunks, complete=True)
        with self._lock:
            self._held[version] = held
        return manifest

    def begin(self, manifest: Manifest) -> HeldVersion:
        """Start (or resume, when the same manifest is already partly here) receiving a version:
        its files exist at full size from now on and fill in as chunks arrive."""
        with self._lock:
            held = self._held.get(manifest.version)
            if held is not None and held.manifest.digest() == manifest.digest():
                return held
            self._held.pop(manifest.version, None)
        target = self.directory(manifest.version)
        shutil.rmtree(target, ignore_errors=True)
        check_room(self.root, manifest.total_bytes, f"receiving weights v{manifest.version}")
        target.mkdir(parents=True)
        for f in manifest.files:
            with (target / f.name).open("wb") as fh:
                fh.truncate(f.size)
        held = HeldVersion(manifest, target, bytearray(manifest.num_chunks))
        with self._lock:
            self._held[manifest.version] = held
        return held

    def get(self, version: int) -> HeldVersion:
        with self._lock:
            held = self._held.get(version)
        if held is None:
            raise NotHeld(version)
        return held

    def versions(self) -> list[int]:
        with self._lock:
            return sorted(self._held)

    def drop(self, version: int) -> None:
        with self._lock:
            held = self._held.pop(version, None)
        if held is not None:
            shutil.rmtree(held.directory, ignore_errors=True)

    def keep_only(self, versions: set[int]) -> None:
        for v in self.versions():
            if v not in versions:
                self.drop(v)

    def close(self) -> None:
        for v in self.versions():
            self.drop(v)

    # --- chunks ------------------------------------------------------------------------------

    def write(self, version: int, index: int, data: bytes) -> bool:
        """Check and store chunk `index`; True when it completed the version."""
        held = self.get(version)
        m = held.manifest
        f, offset, length = m.locate(index)
        if len(data) != length or hashlib.sha256(data).digest() != m.chunk_sha256[index]:
            raise ChunkCorrupt(
                f"v{version} chunk {index} ({f.name} @ {offset}): {len(data)} bytes do not match the "
                f"manifest ({length} bytes, sha256 {m.chunk_sha256[index].hex()[:16]}…)"
            )
        with held._cond:
            if held.have[index]:
                return False
        fd = os.open(held.directory / f.name, os.O_WRONLY)
        try:
            os.pwrite(fd, data, offset)
        finally:
            os.close(fd)
        with held._cond:
            if not held.have[index]:
                held.have[index] = 1
                held.received_bytes += length
            held.progress += 1
            done = not held.complete and all(held.have)
            if done:
                held.complete = True
            held._cond.notify_all()
        return done

    def read(self, version: int, index: int) -> bytes:
        """Chunk `index` (present: check `has` first)."""
        held = self.get(version)
        f, offset, length = held.manifest.locate(index)
        with (held.directory / f.name).open("rb") as fh:
            fh.seek(offset)
            data = fh.read(length)
        with self._lock:
            self.bytes_served += len(data)
        return data

    def has(self, version: int, index: int) -> bool:
        held = self.get(version)
        return bool(held.have[index])

    def wait_for(self, version: int, index: int, timeout_s: float) -> bool:
        """Block until chunk `index` is here (True) or `timeout_s` passes without it (False)."""
        held = self.get(version)
        with held._cond:
            return held._cond.wait_for(lambda: bool(held.have[index]), timeout_s)
