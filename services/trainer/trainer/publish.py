"""Publishing policy version v: a safetensors snapshot, then Scheduler.PublishWeights (or Redis).

Snapshot: `{checkpoint_dir}/weights/v{N}/` is a complete Hugging Face model directory
(`model.safetensors` with HF tensor names, `config.json`, tokenizer files), so a gateway can
`reload_weights` from it with vLLM and a fresh gateway can even start from it. It is written into
a temporary directory and renamed, so a reader never sees a partial snapshot; the uri handed out
is the snapshot directory's absolute path.

Notification: with a scheduler address, PublishWeights(version, uri) over gRPC (bearer token when
given), retried with exponential backoff on UNAVAILABLE / DEADLINE_EXCEEDED, raising after the
last attempt; the scheduler fans out to the gateways and owns `RunKeys.weights`. Without one, the
trainer sets `RunKeys.weights` = {version, uri} itself.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from asyncdapo.redis_keys import RunKeys

log = logging.getLogger(__name__)

_RETRYABLE = ("UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED")


class PublishError(RuntimeError):
    """Weights could not be published; the message names the version and the cause."""


@dataclass
class PublishResult:
    version: int
    uri: str
    write_s: float
    notify_s: float
    gateway_errors: list[str] = field(default_factory=list)


def snapshot_dir(checkpoint_dir: str | Path, version: int) -> Path:
    return Path(checkpoint_dir).resolve() / "weights" / f"v{version}"


def write_snapshot(
    model: torch.nn.Module, tokenizer: Any, checkpoint_dir: str | Path, version: int, dtype: torch.dtype
) -> Path:
    """Write (or reuse, when already complete) the snapshot of `version`; returns its directory."""
    final = snapshot_dir(checkpoint_dir, version)
    if (final / "model.safetensors").is_file() or (final / "model.safetensors.index.json").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".tmp-{final.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    state = {k: v.detach().to(dtype) for k, v in model.state_dict().items()}
    model.save_pretrained(tmp, state_dict=state, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    for f in tmp.iterdir():
        with f.open("rb") as fh:
            os.fsync(fh.fileno())
    os.rename(tmp, final)
    return final


def prune_snapshots(checkpoint_dir: str | Path, keep_from_version: int) -> None:
    """Delete snapshots older than `keep_from_version` (gateways load a snapshot once)."""
    root = Path(checkpoint_dir).resolve() / "weights"
    for d in root.glob("v*"):
        try:
            v = int(d.name[1:])
        except ValueError:
            continue
        if v < keep_from_version:
            shutil.rmtree(d, ignore_errors=True)


class Notifier:
    """Tells the rollout side about a new version: the scheduler over gRPC, or Redis directly."""

    def __init__(
        self,
        client: Any,
        keys: RunKeys,
        scheduler_addr: str | None,
        token: str | None = None,
        attempts: int = 6,
        timeout_s: float = 600.0,
        tls_ca: str | None = None,
    ) -> None:
        self.client = client
        self.keys = keys
        self.scheduler_addr = scheduler_addr
        self.token = token
        self.tls_ca = tls_ca
        self.attempts = attempts
        self.timeout_s = timeout_s
        self._channel: Any = None
        self._stub: Any = None

    def scheduler_stub(self) -> Any:
        if self._stub is None:
            from asyncdapo.grpc_security import ClientTls, sync_channel
            from asyncdapo.v1 import scheduler_pb2_grpc

            tls = ClientTls.from_file(self.tls_ca, "--scheduler-tls-ca") if self.tls_ca else None
            self._channel = sync_channel(self.scheduler_addr, tls)
            self._stub = scheduler_pb2_grpc.SchedulerStub(self._channel)
        return self._stub

    def metadata(self) -> list[tuple[str, str]]:
        from asyncdapo.grpc_security import bearer_metadata

        return list(bearer_metadata(self.token))

    def call(self, what: str, fn: Any) -> Any:
        """fn() with exponential backoff on transient gRPC errors; PublishError after the last try."""
        import grpc

        delay = 0.5
        for attempt in range(1, self.attempts + 1):
            try:
                return fn()
            except grpc.RpcError as err:
                code = err.code().name if err.code() else "UNKNOWN"
                if code not in _RETRYABLE or attempt == self.attempts:
                    raise PublishError(
                        f"{what} to {self.scheduler_addr} failed: {code}: {err.details()}"
                    ) from None
                log.warning("%s attempt %d: %s; retrying in %.1fs", what, attempt, code, delay)
                time.sleep(delay)
                delay = min(delay * 2, 15.0)
        raise AssertionError("unreachable")

    def current_version(self, run: str) -> int:
        """The policy version the rollout side was last told about (0: none yet)."""
        if not self.scheduler_addr:
            raw = self.client.hget(self.keys.weights, "version")
            return int(raw) if raw is not None else 0
        from asyncdapo.v1 import scheduler_pb2

        req = scheduler_pb2.GetRunRequest(run=run)
        resp = self.call(
            "GetRun", lambda: self.scheduler_stub().GetRun(req, metadata=self.metadata(), timeout=60.0)
        )
        return int(resp.policy_version)

    def notify(self, version: int, uri: str) -> list[str]:
        """Announce `version`; returns per-gateway errors the scheduler reported (empty: all ok)."""
        if not self.scheduler_addr:
            self.client.hset(self.keys.weights, mapping={"version": version, "uri": uri})
            return []
        from asyncdapo.v1 import scheduler_pb2

        req = scheduler_pb2.PublishWeightsRequest(version=version, uri=uri)
        resp = self.call(
            f"PublishWeights(version={version})",
            lambda: self.scheduler_stub().PublishWeights(
                req, metadata=self.metadata(), timeout=self.timeout_s
            ),
        )
        return [f"{r.gateway}: {r.error}" for r in resp.results if not r.ok]

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()


def publish(
    model: torch.nn.Module,
    tokenizer: Any,
    checkpoint_dir: str | Path,
    version: int,
    dtype: torch.dtype,
    notifier: Notifier,
    keep_versions: int = 2,
) -> PublishResult:
    t0 = time.perf_counter()
    path = write_snapshot(model, tokenizer, checkpoint_dir, version, dtype)
    t1 = time.perf_counter()
    errors = notifier.notify(version, str(path))
    t2 = time.perf_counter()
    if errors:
        log.warning("weights v%d: %d gateway(s) failed to load: %s", version, len(errors), "; ".join(errors))
    prune_snapshots(checkpoint_dir, version - keep_versions + 1)
    return PublishResult(version, str(path), t1 - t0, t2 - t1, errors)
