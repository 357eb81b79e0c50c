"""The trainer's side of the Scheduler gRPC contract: GetRun at start, PublishWeights after each
published step (bearer token, retries on UNAVAILABLE, errors reported), Evaluate every val_every.

`RecordingScheduler` is a TEST DOUBLE of the scheduler's gRPC surface (real grpc server, in
process), answering like asyncdapo.services.scheduler does (versions must increase, token required); the
scheduler's own behaviour is tested in tests/integration/scheduler.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch
from prometheus_client import generate_latest

from asyncdapo.contracts.redis_keys import RunKeys
from asyncdapo.contracts.v1 import scheduler_pb2, scheduler_pb2_grpc
from asyncdapo.services.trainer.loop import Trainer
from asyncdapo.services.trainer.publish import PublishError, VersionNotifier
from asyncdapo.services.trainer.trainer_options import TrainerOptions, TrainerStateError
from asyncdapo.tools.local.ports import free_port

TOKEN = "s3cret"


class RecordingScheduler(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(self, version: int = 0, unavailable_first: int = 0) -> None:
        self.version = version
        self.unavailable_left = unavailable_first
        self.published: list[tuple[int, str]] = []
        self.evaluated: list[scheduler_pb2.EvaluateRequest] = []
        self.on_publish: Any = None
        self.lock = threading.Lock()

    def _auth(self, context: grpc.ServicerContext) -> None:
        if dict(context.invocation_metadata()).get("authorization") != f"Bearer {TOKEN}":
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "bad token")

    def GetRun(self, request: Any, context: grpc.ServicerContext) -> Any:
        return scheduler_pb2.RunStatus(run=request.run, policy_version=self.version)

    def PublishWeights(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._auth(context)
        with self.lock:
            if self.unavailable_left:
                self.unavailable_left -= 1
                context.abort(grpc.StatusCode.UNAVAILABLE, "gateways restarting")
            if request.version <= self.version:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"version {request.version} is not newer")
            self.version = request.version
            self.published.append((request.version, request.uri))
            if self.on_publish is not None:  # e.g. read the weights at once, as a gateway would
                self.on_publish(request)
        return scheduler_pb2.PublishWeightsResponse(
            version=request.version,
            results=[scheduler_pb2.GatewayResult(gateway="gw-0", ok=True), scheduler_pb2.GatewayResult(
                gateway="gw-1", ok=False, error="LoadWeights: UNAVAILABLE")],
        )  # fmt: skip

    def Evaluate(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.evaluated.append(request)
        results = [scheduler_pb2.EvalResult(id=p.id, acc=[1.0, 0.0][: request.n], response_length=[3, 5][: request.n])
                   for p in request.prompts]  # fmt: skip
        return scheduler_pb2.EvaluateResponse(
            results=results, accuracy=0.5, mean_response_length=4.0, policy_version=self.version
        )


@pytest.fixture()
def scheduler() -> Iterator[tuple[RecordingScheduler, str]]:
    servicer = RecordingScheduler(unavailable_first=1)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    scheduler_pb2_grpc.add_SchedulerServicer_to_server(servicer, server)
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(grace=None)


def test_publish_and_validate_through_the_scheduler(
    tmp_path: Path,
    make_config: Any,
    rollout: Any,
    redis_url: str,
    redis_client: Any,
    scheduler: Any,
    train_file: Path,
) -> None:
    servicer, addr = scheduler
    # also exercises the optional terms: TIS weights, KL loss to a frozen reference, entropy bonus
    cfg = make_config(tmp_path / "out", trainer__total_steps=2, trainer__val_every=2, rollout__max_staleness=1,
                      data__val_files=[str(train_file)], data__val_size=3, rollout__val_n=2,
                      algorithm__tis_cap=2.0, algorithm__kl_coef=0.1, algorithm__entropy_coeff=0.01,
                      trainer__ppo_mini_batch_size=2)  # fmt: skip
    rollout.produce(redis_client, RunKeys(cfg.name), iter(rollout.records(40, epoch=31)), 4)
    opts = TrainerOptions(redis_url, tmp_path / "out", scheduler=addr, token=TOKEN, max_wait_s=30)
    Trainer(cfg, opts).run()

    weights = tmp_path / "out" / "weights"
    assert servicer.published == [(1, str((weights / "v1").resolve())), (2, str((weights / "v2").resolve()))]
    assert servicer.unavailable_left == 0  # the first attempt failed and was retried
    assert redis_client.hgetall(RunKeys(cfg.name).weights) == {}  # the scheduler owns the weights hash
    (req,) = servicer.evaluated  # val_every 2: once, after step 2
    assert len(req.prompts) == 3 and req.n == 2
    assert req.sampling.max_tokens == cfg.data.max_response_length and req.sampling.temperature == 0.0
    assert all(p.prompt_token_ids and p.ground_truth for p in req.prompts)
    lines = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert "val/accuracy" not in lines[0]
    assert lines[0]["tis/mean_weight"] == pytest.approx(1.0, abs=1e-3)  # behaviour == old policy here
    assert lines[0]["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)  # one mini-batch: still the reference
    assert lines[1]["actor/kl_loss"] > 0 and lines[1]["actor/entropy_loss"] > 0
    assert lines[1]["val/accuracy"] == 0.5 and lines[1]["val/policy_version"] == 2

    # a restart with the scheduler already at the checkpointed version publishes nothing again
    Trainer(cfg, opts).run()
    assert len(servicer.published) == 2
    # a scheduler ahead of every checkpoint means checkpoints were lost: refuse, say why
    servicer.version = 5
    with pytest.raises(TrainerStateError, match="rollout is at policy version 5"):
        Trainer(cfg, opts)


def test_publish_errors_are_reported_not_swallowed(scheduler: Any, redis_client: Any) -> None:
    servicer, addr = scheduler
    servicer.unavailable_left = 0
    servicer.version = 3
    notifier = VersionNotifier(redis_client, RunKeys("x"), addr, token=TOKEN, attempts=2)
    with pytest.raises(PublishError, match="FAILED_PRECONDITION"):
        notifier.notify(3, "/w/v3")
    assert notifier.notify(4, "/w/v4") == ["gw-1: LoadWeights: UNAVAILABLE"]
    bad = VersionNotifier(redis_client, RunKeys("x"), addr, token="wrong", attempts=2)
    with pytest.raises(PublishError, match="UNAUTHENTICATED"):
        bad.notify(5, "/w/v5")
    servicer.unavailable_left = 5
    with pytest.raises(PublishError, match="UNAVAILABLE"):
        notifier.notify(5, "/w/v5")  # retried, then reported
    notifier.close()
    bad.close()


def test_a_validation_prompt_over_the_limit_stops_the_run_at_start(
    tmp_path: Path, make_config: Any, redis_url: str, scheduler: Any, train_file: Path
) -> None:
    """data.truncation: error (verl's default) with a validation prompt longer than
    data.max_prompt_length: the trainer stops before its first step, naming the row and its length."""
    from asyncdapo.contracts.prompting import PromptTooLong

    servicer, addr = scheduler
    cfg = make_config(tmp_path / "out", trainer__val_every=2, data__val_files=[str(train_file)],
                      data__max_prompt_length=4, data__truncation="error")  # fmt: skip
    opts = TrainerOptions(redis_url, tmp_path / "out", scheduler=addr, token=TOKEN, max_wait_s=30)
    with pytest.raises(
        PromptTooLong, match=r"validation example 0 .*prompt of \d+ tokens given; data.max_prompt_length is 4"
    ):
        Trainer(cfg, opts).run()
    assert servicer.published == [] and servicer.evaluated == []


def _pull(uri: str, version: int) -> dict[str, bytes]:
    """A stream:// version read the way a gateway does (manifest, then every chunk, token sent),
    each chunk checked against its digest; file name -> bytes."""
    import hashlib

    from asyncdapo.contracts.v1 import weights_pb2, weights_pb2_grpc
    from asyncdapo.runtime.weight_stream.manifest import Manifest
    from asyncdapo.runtime.weight_stream.uri import stream_address

    md = [("authorization", f"Bearer {TOKEN}")]
    with grpc.insecure_channel(
        stream_address(uri), options=[("grpc.max_receive_message_length", 64 << 20)]
    ) as ch:
        stub = weights_pb2_grpc.WeightStoreStub(ch)
        m = Manifest.from_pb(stub.GetManifest(weights_pb2.GetManifestRequest(version=version), metadata=md))
        chunks = {
            c.index: c.data
            for c in stub.ReadChunks(weights_pb2.ReadChunksRequest(version=version), metadata=md)
        }
    assert sorted(chunks) == list(range(m.num_chunks))
    assert all(hashlib.sha256(chunks[i]).digest() == m.chunk_sha256[i] for i in chunks)
    return {
        f.name: b"".join(chunks[i] for i in range(f.first_chunk, f.first_chunk + f.num_chunks))
        for f in m.files
    }


def test_stream_transport_serves_each_published_version_from_memory(
    tmp_path: Path, make_config: Any, rollout: Any, redis_url: str, redis_client: Any, scheduler: Any
) -> None:
    """trainer.weight_transport stream: PublishWeights carries the trainer's WeightStore address;
    what it serves is the snapshot's files, nothing is written under checkpoint_dir/weights, and a
    restarted trainer serves the version the gateways run again (for those catching up)."""
    from safetensors.torch import load

    from asyncdapo.services.trainer.fsdp import unwrap

    servicer, addr = scheduler
    pulled: dict[int, dict[str, bytes]] = {}
    servicer.on_publish = lambda req: pulled.__setitem__(req.version, _pull(req.uri, req.version))
    cfg = make_config(tmp_path / "out", trainer__total_steps=2, rollout__max_staleness=1, trainer__weight_transport="stream",
                      trainer__weight_store_dir=str(tmp_path / "shm"))  # fmt: skip
    (tmp_path / "shm").mkdir()
    rollout.produce(redis_client, RunKeys(cfg.name), iter(rollout.records(40, epoch=41)), 4)
    opts = TrainerOptions(redis_url, tmp_path / "out", scheduler=addr, token=TOKEN, max_wait_s=30)
    trainer = Trainer(cfg, opts)
    trainer.run()
    assert [v for v, _ in servicer.published] == [1, 2]
    assert all(uri.startswith("stream://127.0.0.1:") for _, uri in servicer.published)
    assert not (tmp_path / "out" / "weights").exists()
    final = {k: v.detach() for k, v in unwrap(trainer.model).state_dict().items()}
    served = load(pulled[2]["model.safetensors"])
    assert served.keys() <= final.keys() and "model.embed_tokens.weight" in served
    for k, t in served.items():
        assert torch.equal(t, final[k].to(t.dtype)), k
    assert "config.json" in pulled[2] and any(n.startswith("tokenizer") for n in pulled[2])
    assert not list((tmp_path / "shm").iterdir())  # the store is emptied when the trainer stops
    # what the gateways (here: the double's reads) pulled is what the trainer reports sending
    text = generate_latest(trainer.metrics.registry).decode()
    sent = re.search(r"^asyncdapo_trainer_weight_store_bytes_served_total (\S+)$", text, re.M)
    assert sent is not None and float(sent.group(1)) == sum(
        len(b) for v in pulled.values() for b in v.values()
    )

    restarted = Trainer(cfg, opts)  # the scheduler serves v2: nothing to publish, v2 served again
    try:
        assert restarted.weight_server is not None
        again = _pull(restarted.weight_server.uri, 2)
        assert load(again["model.safetensors"]).keys() == served.keys()
        for k, t in load(again["model.safetensors"]).items():
            assert torch.equal(t, served[k]), k
    finally:
        restarted.close()
    assert len(servicer.published) == 2
