"""The trainer's durability mechanisms in process, against a real redis-server: the fence stops a
replaced trainer before it writes, lost replies (refill, read, drop, publish) neither lose nor
double anything, a redelivered entry is never trained or credited twice, and the stream stays
trimmed. Process-level faults (kills, Redis restarts and rollbacks) are in test_trainer_faults."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis
from trainer_procs import KillableRedis

from asyncdapo.contracts.redis_keys import (
    GROUP_FIELD,
    GROUPS_CONSUMER_GROUP,
    TRAINER_REDELIVERED,
    VALID_CREDITED,
    RunKeys,
)
from asyncdapo.contracts.v1 import rollout_pb2, scheduler_pb2, scheduler_pb2_grpc
from asyncdapo.contracts.verl_format import Example
from asyncdapo.runtime.redis_outage import RedisWaiter
from asyncdapo.services.trainer import loop as loop_module
from asyncdapo.services.trainer.crash_points import CrashPoint
from asyncdapo.services.trainer.data_feed import PromptFeed
from asyncdapo.services.trainer.fence import TrainerFence, TrainerFenced
from asyncdapo.services.trainer.groups_reader import GroupDropReason, GroupsReader
from asyncdapo.services.trainer.loop import Trainer
from asyncdapo.services.trainer.publish import VersionNotifier
from asyncdapo.services.trainer.redis_io import TRAINER_REDIS_BACKOFF
from asyncdapo.services.trainer.trainer_options import TrainerOptions
from asyncdapo.tools.local.ports import free_port

KEYS = RunKeys("durability")


class LossyRedis(redis.Redis):
    """A client that loses the reply of one chosen script call after Redis applied it (what a
    connection drop right after the server acts looks like to the caller)."""

    lose: Callable[[tuple[Any, ...]], bool] | None = None

    def evalsha(self, sha: str, numkeys: int, *args: Any) -> Any:  # type: ignore[override]
        reply = super().evalsha(sha, numkeys, *args)
        if self.lose is not None and self.lose(args):
            self.lose = None
            raise redis.ConnectionError("reply lost after the server applied the script (test)")
        return reply


def _group(pid: str, version: int = 0) -> bytes:
    g = rollout_pb2.Group(run=KEYS.run, prompt_id=pid, prompt_token_ids=[1, 2], min_version=version,
                          max_version=version)  # fmt: skip
    g.responses.add(token_ids=[3], reward=1.0)
    g.responses.add(token_ids=[4], reward=0.0)
    return g.SerializeToString()


def _counter(client: Any, field: str, keys: RunKeys = KEYS) -> int:
    return int(client.hget(keys.counters, field) or 0)


# ---------------------------------------------------------------------------- lost replies


def test_lost_refill_reply_queues_nothing_twice(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    client = redis.Redis.from_url(redis_url)
    examples = [Example(prompt=f"q{i}", ground_truth=str(i), data_source="t", index=i) for i in range(20)]
    feed = PromptFeed(client, KEYS, examples, lambda ex: ([1, 2, 3], ex.prompt_text()), watermark=4,
                      max_prompt_length=64, seed=1, shuffle=True)  # fmt: skip
    feed.restore(None)
    real_execute = redis.client.Pipeline.execute
    lost: list[bool] = []
    monkeypatch.setattr(
        redis.client.Pipeline,
        "execute",
        lambda self, raise_on_error=True: _lose_first_rpush_exec(self, raise_on_error, real_execute, lost),
    )
    waiter = RedisWaiter(TRAINER_REDIS_BACKOFF)
    assert waiter.call(lambda _a: feed.refill(), "refill") == 0  # applied once; the retry sees it
    assert lost and waiter.outages == 1
    queued = [x.decode() for x in client.lrange(KEYS.prompts, 0, -1)]
    assert len(queued) == 4 == len(set(queued)) == _counter(client, "trainer:prompts_queued")
    popped = [client.lpop(KEYS.prompts).decode() for _ in range(3)]
    assert waiter.call(lambda _a: feed.refill(), "refill") == 3  # continues after the lost refill
    everything = popped + [x.decode() for x in client.lrange(KEYS.prompts, 0, -1)]
    assert len(everything) == 7 == len(set(everything)), everything


def _lose_first_rpush_exec(pipe: Any, raise_on_error: bool, real: Any, lost: list[bool]) -> Any:
    rpush = any(args[0] == "RPUSH" for args, _ in pipe.command_stack)
    reply = real(pipe, raise_on_error)
    if rpush and not lost:
        lost.append(True)
        raise redis.ConnectionError("EXEC reply lost after the server applied it (test)")
    return reply


def test_lost_read_reply_entries_are_replayed_not_lost(redis_url: str) -> None:
    client = LossyRedis.from_url(redis_url)
    ids = [client.xadd(KEYS.groups, {GROUP_FIELD: _group(f"p{i}")}).decode() for i in range(3)]
    reader = GroupsReader(client, KEYS, waiter=RedisWaiter(TRAINER_REDIS_BACKOFF))
    reader.start([])
    client.lose = lambda args: args[-1] in (b">", ">")  # the XREADGROUP '>' delivered, reply lost
    got = reader.read(3, block_ms=10)
    assert [e.id for e in got] == ids and reader.rescans == 1
    assert reader.read(3, block_ms=10) == []
    assert reader.pending_count() == 3  # delivered once, held for the checkpoint


def test_lost_drop_reply_credits_once(redis_url: str) -> None:
    client = LossyRedis.from_url(redis_url)
    client.xadd(KEYS.groups, {GROUP_FIELD: _group("stale")})
    reader = GroupsReader(client, KEYS, waiter=RedisWaiter(TRAINER_REDIS_BACKOFF))
    reader.start([])
    (entry,) = reader.read(1, block_ms=10)
    client.lose = lambda args: b"stale" in args or "stale" in args
    assert reader.drop([(entry, GroupDropReason.STALE)]) == 0  # the retry found it credited already
    assert _counter(client, VALID_CREDITED) == 1 and _counter(client, "trainer:dropped:stale") == 1
    assert reader.pending_count() == 0


def test_redelivered_entries_are_not_returned_or_credited_again(redis_url: str) -> None:
    """XGROUP SETID back (a rolled-back consumer-group position): the reader hands out nothing it
    already processed, and the dropped entry it meets again is not credited twice."""
    client = redis.Redis.from_url(redis_url)
    ids = [client.xadd(KEYS.groups, {GROUP_FIELD: _group(f"p{i}")}).decode() for i in range(4)]
    reader = GroupsReader(client, KEYS)
    reader.start([])
    got = reader.read(4, block_ms=10)
    assert [e.id for e in got] == ids
    assert reader.drop([(got[1], GroupDropReason.STALE)]) == 1
    client.xgroup_setid(KEYS.groups, GROUPS_CONSUMER_GROUP, "0")
    assert reader.read(4, block_ms=10) == []  # all four again: none is new
    assert reader.redelivered == 4 and _counter(client, TRAINER_REDELIVERED) == 4
    assert _counter(client, VALID_CREDITED) == 1  # not credited twice
    assert reader.commit([ids[0], ids[2], ids[3]]) == 4  # the checkpoint's XACK, then the trim
    assert reader.pending_count() == 0 and client.xlen(KEYS.groups) == 0
    # credit markers go with the trimmed entries (those of MINID's own millisecond at the next trim)
    assert client.zcard(KEYS.trainer_credited) <= 1
    time.sleep(0.01)
    fresh = client.xadd(KEYS.groups, {GROUP_FIELD: _group("p4")}).decode()
    assert [e.id for e in reader.read(4, block_ms=10)] == [fresh]
    reader.commit([fresh])
    assert client.zcard(KEYS.trainer_credited) == 0 and client.xlen(KEYS.groups) == 0


# ---------------------------------------------------------------------------- the fence


def test_fenced_out_trainer_writes_nothing_and_its_successor_trains_the_step(
    tmp_path: Path,
    make_config: Any,
    rollout: Any,
    redis_url: str,
    redis_client: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfg = make_config(tmp_path / "out", trainer__total_steps=2)
    keys = RunKeys(cfg.name)
    records = iter(rollout.records(60, epoch=41))
    groups = rollout.produce(redis_client, keys, records, 2, version=0)
    groups += rollout.produce(redis_client, keys, records, 2, version=1)

    def take_over(point: CrashPoint, step: int) -> None:
        if point is CrashPoint.AFTER_UPDATE and step == 2:  # while step 2 computes, another takes over
            redis_client.set(keys.trainer_lease, "successor")
            redis_client.incr(keys.trainer_epoch)
            redis_client.set(keys.trainer_owner, "successor")

    monkeypatch.setattr(loop_module, "maybe_crash", take_over)
    opts = TrainerOptions(redis_url, tmp_path / "out", max_wait_s=30, trainer_id="first")
    with pytest.raises(TrainerFenced, match="held by 'successor'"):
        Trainer(cfg, opts).run()
    out = tmp_path / "out"
    ledger = [json.loads(x) for x in (out / "trained.jsonl").read_text().splitlines()]
    assert [x["step"] for x in ledger] == [1]  # no ledger line, checkpoint or version for step 2
    assert (out / "checkpoints" / "latest").read_text() == "step-00000001"
    assert not (out / "weights" / "v2").exists() and redis_client.hget(keys.weights, "version") == b"1"
    assert (
        redis_client.xpending(keys.groups, GROUPS_CONSUMER_GROUP)["pending"] == 2
    )  # step 2's, for the successor
    assert redis_client.get(keys.trainer_lease) == b"successor"  # a fenced trainer releases nothing

    monkeypatch.undo()
    state = Trainer(cfg, TrainerOptions(redis_url, out, max_wait_s=30, trainer_id="successor")).run()
    assert state.step == 2 and state.trainer_epoch == 3
    ledger = [json.loads(x) for x in (out / "trained.jsonl").read_text().splitlines()]
    assert [x["step"] for x in ledger] == [1, 2]
    assert [p for x in ledger for p in x["group_ids"]] == [g.prompt_id for g in groups]


def test_a_second_trainer_waits_for_the_live_lease(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    first = TrainerFence(client, KEYS, "first")
    assert first.acquire() == 1
    second = TrainerFence(client, KEYS, "second")
    with pytest.raises(TimeoutError, match="still held by first"):
        second.acquire(timeout_s=1.5)
    first.check()  # still the holder
    first.release()
    assert second.acquire() == 2
    with pytest.raises(TrainerFenced, match="held by 'second' at epoch 2"):
        first.check()


def test_redis_down_during_the_commit_waits_then_commits_once(
    tmp_path: Path, make_config: Any, rollout: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis SIGKILLed while a step computes: the fence check before its ledger line and
    checkpoint waits for Redis, then the step commits once and the run goes on."""
    kredis = KillableRedis(tmp_path / "redis").start()
    try:
        client = redis.Redis.from_url(kredis.url)
        cfg = make_config(tmp_path / "out", trainer__total_steps=2, rollout__max_staleness=1)
        keys = RunKeys(cfg.name)
        groups = rollout.produce(client, keys, iter(rollout.records(60, epoch=45)), 4, version=0)
        restarted = threading.Event()

        def outage(point: CrashPoint, step: int) -> None:
            if point is CrashPoint.AFTER_UPDATE and step == 1:
                kredis.kill()
                threading.Timer(3.0, lambda: (kredis.start(), restarted.set())).start()

        monkeypatch.setattr(loop_module, "maybe_crash", outage)
        trainer = Trainer(cfg, TrainerOptions(kredis.url, tmp_path / "out", max_wait_s=30))
        state = trainer.run()
        assert restarted.is_set() and state.step == 2
        assert trainer.waiter.outages == 1 and trainer.waiter.up
        lines = [json.loads(x) for x in (tmp_path / "out" / "trained.jsonl").read_text().splitlines()]
        assert [x["step"] for x in lines] == [1, 2]
        assert [p for x in lines for p in x["group_ids"]] == [g.prompt_id for g in groups]
        assert client.hget(keys.weights, "version") == b"2" and client.xlen(keys.groups) == 0
    finally:
        kredis.stop()


# ---------------------------------------------------------------------------- trimming


def test_stream_stays_trimmed_over_many_steps(
    tmp_path: Path, make_config: Any, rollout: Any, redis_url: str, redis_client: Any
) -> None:
    steps = 16
    cfg = make_config(tmp_path / "out", trainer__total_steps=steps, trainer__publish_every=2,
                      trainer__checkpoint_every=2, rollout__max_staleness=1)  # fmt: skip
    keys = RunKeys(cfg.name)
    records = iter(rollout.records(100, epoch=43))
    trainer = Trainer(cfg, TrainerOptions(redis_url, tmp_path / "out", max_wait_s=30, poll_ms=50))
    xlen = []
    try:
        for step in range(1, steps + 1):
            if step == 9:
                rollout.produce(redis_client, keys, records, 1, version=0)  # stale at version 8: dropped
            rollout.produce(redis_client, keys, records, 2, version=step - 1)
            trainer.train_step()
            xlen.append(redis_client.xlen(keys.groups))
            if step % 2 == 0:  # checkpointed: XACKed, then trimmed
                assert redis_client.xpending(keys.groups, GROUPS_CONSUMER_GROUP)["pending"] == 0
    finally:
        trainer.close()
    # between checkpoints only the step that waits for its checkpoint stays in the stream (at step 9
    # also the dropped group: acknowledged at once, trimmed with the next checkpoint)
    expected = [2, 0] * (steps // 2)
    expected[8] = 3
    assert xlen == expected, xlen
    assert _counter(redis_client, VALID_CREDITED, keys) == 1
    assert redis_client.zcard(keys.trainer_credited) == 0


# ---------------------------------------------------------------------------- publish


class FencingScheduler(scheduler_pb2_grpc.SchedulerServicer):
    """TEST DOUBLE of the scheduler's PublishWeights as the durability guarantees specify it: UNAVAILABLE while no
    gateway can load the version, FAILED_PRECONDITION for a trainer epoch older than Redis'."""

    def __init__(self) -> None:
        self.version = 0
        self.min_epoch = 0  # the newest trainer epoch the scheduler has seen
        self.plan: list[str] = []  # per call: "unavailable" | "lost" (applied, reply lost) | "ok"
        self.requests: list[Any] = []

    def GetRun(self, request: Any, context: grpc.ServicerContext) -> Any:
        return scheduler_pb2.RunStatus(run=request.run, policy_version=self.version)

    def PublishWeights(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.requests.append(request)
        action = self.plan.pop(0) if self.plan else "ok"
        if action == "unavailable":
            context.abort(grpc.StatusCode.UNAVAILABLE, "no gateway could load the version")
        if request.trainer_epoch < self.min_epoch:
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"trainer_epoch {request.trainer_epoch} < {self.min_epoch}",
            )
        if request.version <= self.version:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"version {request.version} is not newer")
        self.version = request.version
        if action == "lost":
            context.abort(grpc.StatusCode.UNAVAILABLE, "connection reset")
        return scheduler_pb2.PublishWeightsResponse(version=request.version)


@pytest.fixture()
def fencing_scheduler() -> Iterator[tuple[FencingScheduler, str]]:
    servicer = FencingScheduler()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    scheduler_pb2_grpc.add_SchedulerServicer_to_server(servicer, server)
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(grace=None)


def test_publish_waits_for_the_scheduler_and_stops_when_fenced(
    redis_url: str, fencing_scheduler: tuple[FencingScheduler, str]
) -> None:
    servicer, addr = fencing_scheduler
    client = redis.Redis.from_url(redis_url)
    fence = TrainerFence(client, KEYS, "pub")
    fence.acquire()
    notifier = VersionNotifier(client, KEYS, addr, fence=fence)  # default: no attempt limit
    servicer.plan = ["unavailable"] * 3
    assert notifier.notify(1, "/w/v1") == [] and servicer.version == 1
    assert len(servicer.requests) == 4 and {r.trainer_epoch for r in servicer.requests} == {1}
    servicer.plan = ["lost"]  # applied, then the reply is lost: the retry is refused as not newer
    assert notifier.notify(2, "/w/v2") == [] and servicer.version == 2
    # the scheduler has seen a newer trainer epoch than ours: refused, and this trainer stops
    servicer.min_epoch = 2
    with pytest.raises(TrainerFenced, match="trainer_epoch 1 < 2"):
        notifier.notify(3, "/w/v3")
    # another trainer took the lease in Redis: refused before anything reaches the scheduler
    servicer.min_epoch = 0
    client.incr(KEYS.trainer_epoch)
    sent = len(servicer.requests)
    with pytest.raises(TrainerFenced, match="at epoch 2"):
        notifier.notify(3, "/w/v3")
    assert len(servicer.requests) == sent and servicer.version == 2
    notifier.close()
