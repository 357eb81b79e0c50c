"""Process-level faults at default settings (30 s lease, unlimited waiting), real processes: two
trainers on one run, Redis rolled back to an older AOF under a running and a restarted trainer,
Redis SIGKILLed for 5 s and for 65 s mid-run, a trainer crash between a drop and its checkpoint,
SIGTERM (the lease is given up).

The invariant checked each time is the one a user relies on: the trainer's ledger (`trained.jsonl`)
lists every step once and every group of the stream exactly once, in stream order, and every
dropped group is credited to the scheduler's bound exactly once (`counters.valid_credited`). The
rollout side is the labelled `RolloutDouble` writing groups to the stream (no scheduler: the
trainer announces versions in `RunKeys.weights` itself)."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from trainer_procs import KillableRedis, TrainerProc, assert_trained_exactly_once, ledger, wait_for

from asyncdapo.contracts.redis_keys import (
    GROUP_FIELD,
    GROUPS_CONSUMER_GROUP,
    TRAINER_REDELIVERED,
    VALID_CREDITED,
    RunKeys,
)
from asyncdapo.services.trainer.crash_points import EXIT_CODE
from asyncdapo.services.trainer.fence import DEFAULT_LEASE_S
from asyncdapo.tools.local.ports import free_port

STALE = "trainer:dropped:stale"


@pytest.fixture()
def kredis(tmp_path: Path) -> Iterator[KillableRedis]:
    server = KillableRedis(tmp_path / "redis").start()
    yield server
    server.stop()


class Producer:
    """Writes valid groups for a step like the scheduler would (labelled with its version)."""

    def __init__(self, rollout: Any, url: str, keys: RunKeys, epoch: int) -> None:
        self.rollout = rollout
        self.url = url
        self.keys = keys
        self.records = iter(rollout.records(100, epoch=epoch))
        self.prompt_ids: list[str] = []  # trainable groups, in stream order

    def step(self, step: int, n: int = 2) -> None:
        """n groups for training step `step` (1-based): produced by version step - 1."""
        client = redis.Redis.from_url(self.url)
        made = self.rollout.produce(client, self.keys, self.records, n, version=step - 1)
        self.prompt_ids += [g.prompt_id for g in made]
        client.close()

    def stale(self) -> None:
        """One group of version 0: stale for every step after the first (max_staleness 0)."""
        client = redis.Redis.from_url(self.url)
        self.rollout.produce(client, self.keys, self.records, 1, version=0)
        client.close()


def _counters(client: Any, keys: RunKeys) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in client.hgetall(keys.counters).items()}


def test_two_trainers_second_waits_then_takes_over_after_sigkill(
    tmp_path: Path, make_config: Any, rollout: Any, kredis: KillableRedis
) -> None:
    out = tmp_path / "out"
    cfg = make_config(out, trainer__total_steps=6)
    keys = RunKeys(cfg.name)
    client = redis.Redis.from_url(kredis.url)
    produce = Producer(rollout, kredis.url, keys, epoch=21)
    for step in (1, 2):
        produce.step(step)
    a = TrainerProc(cfg, kredis.url, tmp_path, "trainer-a").start()
    b: TrainerProc | None = None
    try:
        a.wait_steps(2)
        # a temporary directory of the live writer: nobody but its writer may delete it
        foreign_tmp = out / "checkpoints" / ".tmp-step-00000099-trainer-a"
        foreign_tmp.mkdir()
        b = TrainerProc(cfg, kredis.url, tmp_path, "trainer-b").start()
        b.wait_log("is held by trainer-a")
        for step in (3, 4):
            produce.step(step)
        a.wait_steps(4)
        # a keeps renewing its lease (heartbeat every 10 s, and each fence check) while b waits
        low = [client.pttl(keys.trainer_lease)]

        def renewed() -> bool:
            ttl = client.pttl(keys.trainer_lease)
            low[0] = min(low[0], ttl)
            return ttl > low[0] + 500

        wait_for(renewed, DEFAULT_LEASE_S / 3 + 5, "a renewal of trainer-a's lease")
        b.assert_alive()
        assert "holds the lease" not in b.log()
        assert client.get(keys.trainer_lease) == b"trainer-a" and client.get(keys.trainer_epoch) == b"1"
        # a's work is intact: its checkpoints, its versions, its temporary directory
        state = json.loads((out / "checkpoints" / "step-00000004" / "state.json").read_text())
        assert state["trainer_id"] == "trainer-a" and state["trainer_epoch"] == 1
        assert client.hget(keys.weights, "version") == b"4" and (out / "weights" / "v4").is_dir()
        assert foreign_tmp.is_dir()

        a.signal(signal.SIGKILL)
        assert a.wait(10) == -signal.SIGKILL
        killed = time.monotonic()
        b.wait_log("trainer trainer-b holds the lease", timeout_s=DEFAULT_LEASE_S + 10)
        took_over_s = time.monotonic() - killed
        assert took_over_s < DEFAULT_LEASE_S + 5, took_over_s
        wait_for(lambda: not foreign_tmp.exists(), 10, "b to remove a's leftover temporary directory")
        for step in (5, 6):
            produce.step(step)
        assert b.wait(120) == 0, b.log()[-4000:]
    finally:
        a.stop()
        if b is not None:
            b.stop()

    assert_trained_exactly_once(out, produce.prompt_ids, 6)
    assert [x["step"] for x in ledger(out)] == [1, 2, 3, 4, 5, 6]
    state = json.loads((out / "checkpoints" / "step-00000006" / "state.json").read_text())
    assert state["trainer_id"] == "trainer-b" and state["trainer_epoch"] == 2
    assert client.hget(keys.weights, "version") == b"6"
    assert client.xpending(keys.groups, GROUPS_CONSUMER_GROUP)["pending"] == 0
    assert client.get(keys.trainer_lease) is None  # released at b's graceful end
    print(f"trainer-b took over {took_over_s:.1f}s after trainer-a was killed (lease {DEFAULT_LEASE_S:.0f}s)")


def test_redis_rolled_back_to_an_older_aof_nothing_trained_twice(
    tmp_path: Path, make_config: Any, rollout: Any, kredis: KillableRedis
) -> None:
    """Redis restarts from an AOF copied before steps 3-4 were read: their entries come back
    undelivered, the stale group's drop and its credit are lost. Neither the running trainer nor a
    restarted one trains them again, and the stale group is credited exactly once."""
    out = tmp_path / "out"
    cfg = make_config(out, trainer__total_steps=6)
    keys = RunKeys(cfg.name)
    produce = Producer(rollout, kredis.url, keys, epoch=22)
    for step in (1, 2):
        produce.step(step)
    t = TrainerProc(cfg, kredis.url, tmp_path, "t-b").start()
    snapshot = tmp_path / "aof-before-step-3"
    try:
        t.wait_steps(2)
        t.signal(signal.SIGSTOP)  # so the snapshot has steps 3-4 written but not read
        produce.step(3)
        produce.stale()
        produce.step(4)
        kredis.snapshot_aof(snapshot)
        t.signal(signal.SIGCONT)
        t.wait_steps(4)
        client = redis.Redis.from_url(kredis.url)
        assert _counters(client, keys)[VALID_CREDITED] == 1
        client.close()

        kredis.kill()
        kredis.restore_aof(snapshot)
        kredis.start()
        client = redis.Redis.from_url(kredis.url)
        # the running trainer meets steps 3-4 and the stale group again: not trained, credit restored
        wait_for(lambda: _counters(client, keys).get(TRAINER_REDELIVERED) == 5, 60, "5 redeliveries")
        c = _counters(client, keys)
        assert c[VALID_CREDITED] == 1 and c[STALE] == 1, c
        for step in (5, 6):
            produce.step(step)
        assert t.wait(120) == 0, t.log()[-4000:]
        assert "redelivered group(s)" in t.log()
    finally:
        t.stop()
    assert_trained_exactly_once(out, produce.prompt_ids, 6)

    # the same rollback under a restarted trainer: its checkpoint's last_stream_id is the fence
    kredis.kill()
    kredis.restore_aof(snapshot)
    kredis.start()
    cfg8 = make_config(out, trainer__total_steps=8)
    t2 = TrainerProc(cfg8, kredis.url, tmp_path, "t-b").start()
    try:
        client = redis.Redis.from_url(kredis.url)
        wait_for(lambda: _counters(client, keys).get(TRAINER_REDELIVERED) == 5, 120, "5 redeliveries")
        for step in (7, 8):
            produce.step(step)
        assert t2.wait(120) == 0, t2.log()[-4000:]
    finally:
        t2.stop()
    assert_trained_exactly_once(out, produce.prompt_ids, 8)
    c = _counters(client, keys)
    assert c[VALID_CREDITED] == 1 and c[STALE] == 1, c
    assert client.xpending(keys.groups, GROUPS_CONSUMER_GROUP)["pending"] == 0
    assert client.xlen(keys.groups) == 0  # consumed and trimmed
    assert client.hget(keys.weights, "version") == b"8"


def test_redis_outages_a_crash_and_sigterm_in_one_run(
    tmp_path: Path, make_config: Any, rollout: Any, kredis: KillableRedis
) -> None:
    """One run through: Redis SIGKILLed for 5 s (step 3) and for 65 s (step 6, longer than the
    lease and than the waiter's one-minute reminder; the 120 s outage of the whole loop is
    tests/integration/faults/test_durability_stack.py) and restarted on its AOF; the trainer killed between dropping two groups and the
    checkpoint of their step (step 4), restarted with its id; finally SIGTERM. The trainer waits
    through both outages, trains every group once, credits each drop once, and leaves its lease."""
    out = tmp_path / "out"
    steps = 8
    cfg = make_config(out, trainer__total_steps=steps + 1)  # SIGTERMed while it waits for the last
    keys = RunKeys(cfg.name)
    client = redis.Redis.from_url(kredis.url)
    produce = Producer(rollout, kredis.url, keys, epoch=23)
    t = TrainerProc(
        cfg, kredis.url, tmp_path, "t-c", crash="after_update@4", metrics_port=free_port()
    ).start()
    first = t
    max_xlen = 0
    outages = {3: 5.0, 6: 65.0}  # step during which Redis is down -> seconds
    try:
        for step in range(1, steps + 1):
            if step == 4:
                produce.stale()
                client.xadd(keys.groups, {GROUP_FIELD: b"\xff not a Group"})
            produce.step(step)
            if step in outages:
                kredis.kill()  # the trainer is reading or training this step's groups
                wait_for(lambda t=t: t.scrape("asyncdapo_trainer_redis_up") == 0, 30, "redis_up 0")
                time.sleep(outages[step])
                t.assert_alive()
                kredis.start()
                client = redis.Redis.from_url(kredis.url)
            if step == 4:
                # dropped (XACK + credit) and trained, then killed before the step's checkpoint
                assert t.wait(120) == EXIT_CODE, t.log()[-4000:]
                c = _counters(client, keys)
                assert c[VALID_CREDITED] == 2 and c[STALE] == 1 and c["trainer:dropped:malformed"] == 1, c
                assert [x["step"] for x in ledger(out)] == [1, 2, 3]
                t = TrainerProc(cfg, kredis.url, tmp_path, "t-c", metrics_port=free_port()).start()
            t.wait_steps(step, timeout_s=150)
            assert t.scrape("asyncdapo_trainer_redis_up") == 1
            max_xlen = max(max_xlen, client.xlen(keys.groups))
        t.signal(signal.SIGTERM)
        assert t.wait(30) == 128 + signal.SIGTERM, t.log()[-4000:]
    finally:
        t.stop()
    assert client.get(keys.trainer_lease) is None  # given up at SIGTERM: a successor starts at once
    assert client.get(keys.trainer_epoch) == b"2"  # the crashed process's restart; never replaced
    assert_trained_exactly_once(out, produce.prompt_ids, steps)
    c = _counters(client, keys)
    assert c[VALID_CREDITED] == 2 and c[STALE] == 1 and c["trainer:dropped:malformed"] == 1, c
    assert client.xpending(keys.groups, GROUPS_CONSUMER_GROUP)["pending"] == 0
    assert max_xlen <= 4 and client.xlen(keys.groups) == 0, max_xlen
    # one line per state change (and a reminder a minute), not one per retry
    log = first.log() + t.log()
    assert log.count("unavailable (") == 2, log[-4000:]
    assert log.count("is back after") == 2
    assert "still unavailable after" in log  # the 65 s outage
    assert "re-took its expired lease" in t.log()  # Redis was away longer than the 30 s lease
