"""Publishing policy version v: a safetensors snapshot (or the same files in the trainer's own
WeightStore, `trainer.weight_transport: stream`), then Scheduler.PublishWeights (or Redis).

Snapshot: `{checkpoint_dir}/weights/v{N}/` is a complete Hugging Face model directory
(`model.safetensors` with HF tensor names, `config.json`, tokenizer files), so a gateway can
`reload_weights` from it with vLLM and a fresh gateway can even start from it. It is written into
a temporary directory and renamed, so a reader never sees a partial snapshot; the uri handed out
is the snapshot directory's absolute path.

Notification: with a scheduler address, PublishWeights(version, uri, trainer_epoch) over gRPC
(bearer token when given); the scheduler fans out to the gateways and owns `RunKeys.weights`.
Without one, the trainer sets `RunKeys.weights` = {version, uri} itself. Either way the trainer
first checks its fence (`fence.py`): a fenced-out trainer publishes nothing.

Waiting, not failing: UNAVAILABLE (scheduler away, or no gateway could load the version),
DEADLINE_EXCEEDED and RESOURCE_EXHAUSTED are retried with capped exponential backoff, without limit
by default: the trainer neither crashes nor skips a version. A retry may follow an attempt the
scheduler applied (its reply lost): when the scheduler then refuses the version as not newer,
GetRun tells whether it already runs it (done) or not (an error). FAILED_PRECONDITION about the
trainer epoch, or any refusal while this trainer no longer holds the fence, raises TrainerFenced.
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

from asyncdapo.contracts.redis_keys import RunKeys
from asyncdapo.runtime.backoff import Backoff
from asyncdapo.runtime.redis_outage import RedisWaiter
from asyncdapo.services.trainer.fence import TrainerFence, TrainerFenced, safe_id
from asyncdapo.services.trainer.fsdp import hf_model
from asyncdapo.services.trainer.redis_io import TRAINER_REDIS_BACKOFF

log = logging.getLogger(__name__)

_RETRYABLE = ("UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED")
# the wait between tries of a transient gRPC failure to the scheduler: 0.5 s, doubled, at most 10 s
PUBLISH_RETRY_BACKOFF = Backoff(0.5, 10.0)
_MODEL_FILE_SUFFIXES = frozenset({".safetensors", ".json", ".txt", ".model", ".tiktoken", ".jinja"})


class PublishError(RuntimeError):
    """Weights could not be published; the message names the version and the cause."""

    def __init__(self, message: str, code: str = "") -> None:
        super().__init__(message)
        self.code = code


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
    model: torch.nn.Module,
    tokenizer: Any,
    checkpoint_dir: str | Path,
    version: int,
    dtype: torch.dtype,
    writer: str = "",
) -> Path:
    """Write (or reuse, when already complete) the snapshot of `version`; returns its directory.
    The temporary directory is named after `writer` (the trainer id): never another's."""
    final = snapshot_dir(checkpoint_dir, version)
    if (final / "model.safetensors").is_file() or (final / "model.safetensors.index.json").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".tmp-{final.name}-{safe_id(writer) if writer else os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    state = {k: v.detach().to(dtype) for k, v in model.state_dict().items()}
    hf_model(model).save_pretrained(tmp, state_dict=state, safe_serialization=True)
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


def remove_snapshot_leftovers(checkpoint_dir: str | Path) -> int:
    """Delete `.tmp-*` snapshot directories of crashed writers. Only while holding the trainer lease."""
    root = Path(checkpoint_dir).resolve() / "weights"
    n = 0
    for d in root.glob(".tmp-*"):
        shutil.rmtree(d, ignore_errors=True)
        n += 1
    return n


class VersionNotifier:
    """Tells the rollout side about a new version: the scheduler over gRPC, or Redis directly.

    `attempts` None (the default): retry transient errors forever; a number: give up (PublishError)
    after that many attempts (tools and tests)."""

    def __init__(
        self,
        client: Any,
        keys: RunKeys,
        scheduler_addr: str | None,
        token: str | None = None,
        attempts: int | None = None,
        timeout_s: float = 600.0,
        fence: TrainerFence | None = None,
        waiter: RedisWaiter | None = None,
        tls_ca: str | None = None,
    ) -> None:
        self.client = client
        self.keys = keys
        self.scheduler_addr = scheduler_addr
        self.token = token
        self.tls_ca = tls_ca
        self.attempts = attempts
        self.timeout_s = timeout_s
        self.fence = fence
        self.waiter = waiter or (
            fence.waiter if fence else RedisWaiter(TRAINER_REDIS_BACKOFF, give_up_after_s=0)
        )
        self.retries = 0  # transient failures retried so far (all calls)
        self._channel: Any = None
        self._stub: Any = None

    def scheduler_stub(self) -> Any:
        if self._stub is None:
            from asyncdapo.contracts.v1 import scheduler_pb2_grpc
            from asyncdapo.runtime.grpc_security import ClientTls, sync_channel

            assert self.scheduler_addr is not None, "only called with a scheduler address"
            tls = ClientTls.from_file(self.tls_ca, "--scheduler-tls-ca") if self.tls_ca else None
            self._channel = sync_channel(self.scheduler_addr, tls)
            self._stub = scheduler_pb2_grpc.SchedulerStub(self._channel)
        return self._stub

    def metadata(self) -> list[tuple[str, str]]:
        from asyncdapo.runtime.grpc_security import bearer_metadata

        return list(bearer_metadata(self.token))

    def call(self, what: str, fn: Any, attempts: int | str | None = "default") -> Any:
        """fn() with capped exponential backoff on transient gRPC errors (UNAVAILABLE,
        DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED): forever, or PublishError after `attempts`."""
        import grpc

        limit = self.attempts if attempts == "default" else attempts
        delays = PUBLISH_RETRY_BACKOFF.delays()
        attempt = 0
        while True:
            attempt += 1
            try:
                return fn()
            except grpc.RpcError as err:
                code = err.code().name if err.code() else "UNKNOWN"
                if code not in _RETRYABLE or (limit is not None and attempt >= int(limit)):
                    raise PublishError(
                        f"{what} to {self.scheduler_addr} failed: {code}: {err.details()}", code
                    ) from None
                self.retries += 1
                delay = delays.next()
                log_fn = log.warning if attempt == 1 or attempt % 10 == 0 else log.info
                log_fn("%s attempt %d: %s: %s; retrying in %.1fs", what, attempt, code, err.details(), delay)
                time.sleep(delay)

    def current_version(self, run: str) -> int:
        """The policy version the rollout side was last told about (0: none yet)."""
        if not self.scheduler_addr:
            raw = self.waiter.call(lambda _a: self.client.hget(self.keys.weights, "version"), "weights read")
            return int(raw) if raw is not None else 0
        from asyncdapo.contracts.v1 import scheduler_pb2

        req = scheduler_pb2.GetRunRequest(run=run)
        resp = self.call(
            "GetRun", lambda: self.scheduler_stub().GetRun(req, metadata=self.metadata(), timeout=60.0)
        )
        return int(resp.policy_version)

    def notify(self, version: int, uri: str) -> list[str]:
        """Announce `version`; returns per-gateway errors the scheduler reported (empty: all ok)."""
        if self.fence is not None:
            self.fence.check()
        if not self.scheduler_addr:
            self.waiter.call(
                lambda _a: self.client.hset(self.keys.weights, mapping={"version": version, "uri": uri}),
                "weights announcement",
            )
            return []
        from asyncdapo.contracts.v1 import scheduler_pb2

        req = scheduler_pb2.PublishWeightsRequest(
            version=version, uri=uri, trainer_epoch=self.fence.epoch if self.fence else 0
        )
        retries_before = self.retries
        try:
            resp = self.call(
                f"PublishWeights(version={version})",
                lambda: self.scheduler_stub().PublishWeights(
                    req, metadata=self.metadata(), timeout=self.timeout_s
                ),
            )
        except PublishError as err:
            if err.code != "FAILED_PRECONDITION":
                raise
            self._raise_if_fenced(err)
            if self.retries > retries_before and self.current_version(self.keys.run) == version:
                # an earlier attempt was applied and its reply lost: the version is published
                log.warning("PublishWeights(version=%d): already applied by an earlier attempt", version)
                return []
            raise
        return [f"{r.gateway}: {r.error}" for r in resp.results if not r.ok]

    def _raise_if_fenced(self, err: PublishError) -> None:
        """A FAILED_PRECONDITION naming the trainer epoch, or any while our fence is gone."""
        if self.fence is None:
            return
        msg = str(err).lower()
        if "epoch" in msg or "fenc" in msg:
            raise TrainerFenced(
                f"the scheduler refused weights of trainer {self.fence.trainer_id} (epoch {self.fence.epoch}): "
                f"{err}. Another trainer took over the run, so this one stops without writing anything"
            ) from None
        self.fence.check()  # raises TrainerFenced if the lease or the epoch moved on

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()


class TrainerWeightServer:
    """`trainer.weight_transport: stream`: the versions this trainer published, served from its
    own memory (`WeightStore` under `trainer.weight_store_dir`) to gateways over gRPC. The files
    are exactly a snapshot's (`write_snapshot`); the newest `keep` versions stay so gateways that
    are mid-fetch or catching up still find them."""

    def __init__(
        self,
        store_dir: str,
        listen: str,
        advertise: str | None = None,
        token: str | None = None,
        tls: Any = None,
        keep: int = 2,
    ) -> None:
        from asyncdapo.contracts.errors import AsyncdapoError
        from asyncdapo.runtime.weight_stream.store import WeightStore, remove_orphans
        from asyncdapo.runtime.weight_stream.store_server import WeightStoreServer

        self.store = WeightStore(store_dir or None, f"trainer-{os.getpid()}")
        if not self.store.root.is_dir():
            raise AsyncdapoError(f"trainer.weight_store_dir {str(self.store.root)!r} is not a directory")
        remove_orphans(self.store.root)
        self.server = WeightStoreServer(self.store, listen, token, tls)
        self.listen = listen
        self.advertise = advertise
        self.keep = keep
        self.address = ""

    def start(self) -> str:
        """Serve; returns the address gateways dial (`advertise`, else the listen host and port)."""
        port = self.server.start()
        host = self.listen.rpartition(":")[0]
        self.address = self.advertise or f"{host}:{port}"
        return self.address

    @property
    def uri(self) -> str:
        from asyncdapo.runtime.weight_stream.uri import stream_uri

        return stream_uri(self.address)

    def put(
        self, model: torch.nn.Module, tokenizer: Any, version: int, dtype: torch.dtype, writer: str
    ) -> Path:
        """Export `version` into the store (a snapshot written next to it, then moved in) and
        serve it; older versions beyond `keep` are dropped."""
        from asyncdapo.runtime.weight_stream.store import check_room

        size = sum(t.numel() for t in model.state_dict().values()) * dtype.itemsize
        check_room(self.store.root, size, f"exporting weights v{version}")
        staging = self.store.root / f"asyncdapo-{self.store.name}-staging"
        path = write_snapshot(model, tokenizer, staging, version, dtype, writer)
        self.store.hold_complete(version, path)
        self.store.keep_only({v for v in self.store.versions() if v > version - self.keep})
        shutil.rmtree(staging, ignore_errors=True)
        return self.store.directory(version)

    def put_model_dir(self, model_dir: Path, version: int) -> None:
        """Serve the base model directory itself as `version` (the run's start: nothing trained
        yet): its safetensors, JSON and tokenizer files, copied. A Hub id (no local directory) is
        skipped: gateways then need the model from elsewhere."""
        if not model_dir.is_dir():
            log.warning(
                "model %s is not a local directory: the weight store serves no v%d", model_dir, version
            )
            return
        staging = self.store.root / f"asyncdapo-{self.store.name}-staging-v{version}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        for f in model_dir.iterdir():
            if f.is_file() and (f.suffix in _MODEL_FILE_SUFFIXES or f.name.startswith("tokenizer")):
                shutil.copyfile(f, staging / f.name)
        self.store.hold_complete(version, staging)

    def serve_current(
        self,
        version: int,
        model_dir: Path,
        model: torch.nn.Module,
        tokenizer: Any,
        dtype: torch.dtype,
        writer: str,
    ) -> None:
        """At start: serve the version the gateways run (the base model's files at 0, else the
        restored weights), for gateways catching up after a restart and those started
        `--weights-from` the trainer."""
        if version == 0:
            self.put_model_dir(model_dir, 0)
        else:
            self.put(model, tokenizer, version, dtype, writer)

    def bytes_served_collector(self) -> Any:
        """A Prometheus collector: `asyncdapo_trainer_weight_store_bytes_served_total`, what the
        store sent (about rollout.weight_relay_fanout copies per version; more means gateways fell
        back to the trainer)."""
        from prometheus_client.core import CounterMetricFamily

        server = self

        class BytesServed:
            def collect(self) -> Any:
                yield CounterMetricFamily(
                    "asyncdapo_trainer_weight_store_bytes_served",
                    "Weight bytes the trainer's WeightStore sent to gateways (stream transport).",
                    value=server.bytes_served,
                )

        return BytesServed()

    @property
    def bytes_served(self) -> int:
        return self.store.bytes_served

    def close(self) -> None:
        self.server.stop()
        self.store.close()


def publish(
    model: torch.nn.Module,
    tokenizer: Any,
    checkpoint_dir: str | Path,
    version: int,
    dtype: torch.dtype,
    notifier: VersionNotifier,
    keep_versions: int = 2,
    writer: str = "",
    weight_server: TrainerWeightServer | None = None,
) -> PublishResult:
    """Export `version` (a snapshot under checkpoint_dir, or into `weight_server`'s memory) and
    announce it; returns once the rollout side serves it."""
    t0 = time.perf_counter()
    if weight_server is not None:
        weight_server.put(model, tokenizer, version, dtype, writer)
        uri = weight_server.uri
    else:
        uri = str(write_snapshot(model, tokenizer, checkpoint_dir, version, dtype, writer))
    t1 = time.perf_counter()
    errors = notifier.notify(version, uri)
    t2 = time.perf_counter()
    if errors:
        log.warning("weights v%d: %d gateway(s) failed to load: %s", version, len(errors), "; ".join(errors))
    if weight_server is None:
        prune_snapshots(checkpoint_dir, version - keep_versions + 1)
    return PublishResult(version, uri, t1 - t0, t2 - t1, errors)
