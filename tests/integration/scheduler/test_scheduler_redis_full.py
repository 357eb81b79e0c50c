"""The scheduler against a Redis at `maxmemory` (`maxmemory-policy noeviction`, as the chart, the
operator's managed Redis and `asyncdapo up --redis-maxmemory` run it): a real redis-server with a
small cap, filled past it while prompts are in flight, so that Redis refuses the scheduler's writes
with OOM. The writes wait (reported as full: a warning, `redis_full` 1, health NOT_SERVING), no
background loop dies, and once memory frees every outcome lands: nothing is lost or doubled."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
import redis
from scheduler_harness import (
    RuleScorer,
    check_one_outcome_per_attempt,
    counters,
    load_prompts,
    rollout_state,
    run_config,
    scheduler,
    sim_gateways,
    wait_for,
    write_fake_snapshot,
)

from asyncdapo.contracts.redis_keys import RunKeys
from asyncdapo.services.scheduler.rollout import Phase
from asyncdapo.tools.local.redis_server import RedisServer

MAXMEMORY = 32 * 1024 * 1024


def fill(r: redis.Redis) -> None:
    """Fill Redis to its maxmemory: values of 1 MB, then ever smaller ones, until even a 16-byte
    write is refused (a command's own argument counts, so a large value is refused early)."""
    k = 0
    for size in (2**20, 2**16, 2**12, 2**8, 16):
        while True:
            k += 1
            try:
                r.set(f"ballast:{k}", b"x" * size)
            except redis.exceptions.OutOfMemoryError:
                break


async def test_a_full_redis_makes_writes_wait_and_loses_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = RedisServer(tmp_path / "redis", maxmemory=str(MAXMEMORY)).start()
    url = server.url
    r = redis.Redis.from_url(url)
    try:
        conf = r.config_get("maxmemory*")
        assert (conf["maxmemory"], conf["maxmemory-policy"]) == (str(MAXMEMORY), "noeviction")
        cfg = run_config(rollout={"max_concurrent_prompts": 8})
        ids = load_prompts(url, "t", ["mixed", "all0", "mixed"] * 30)
        slow = {"length_mean": 60.0, "length_sigma": 0.3, "base_step_s": 0.01}
        health: list[bool] = []
        caplog.set_level(logging.WARNING, logger="asyncdapo.runtime.redis_outage")
        async with (
            sim_gateways(2, **slow) as gws,
            scheduler(cfg, url, [g.address for g in gws], RuleScorer()) as ro,
        ):
            ro.health_listeners.append(health.append)
            ro.start_run()
            await wait_for(lambda: len(ro.tasks) >= 4, 10, "prompts in flight")
            fill(r)  # from now on every command that may grow the data set is refused (OOM)
            await wait_for(lambda: ro.redis_link.full, 20, "the scheduler seeing Redis full")
            await asyncio.sleep(3.0)
            assert ro.redis_link.full and not ro.redis_link.up and health[-1] is False
            assert ro.metrics.redis_full._value.get() == 1 and ro.metrics.redis_up._value.get() == 0
            assert "is full (maxmemory reached" in caplog.text and "the write waits" in caplog.text
            assert all(not t.done() for t in ro._bg), "a background loop died while Redis was full"
            status = await ro.status()  # reads are served at maxmemory
            assert status.run == "t"
            valid_while_full, bound_v0 = counters(url, "t").get("outcome:valid", 0), ro.bound
            r.delete(*r.keys("ballast:*"))  # memory frees (as when the trainer consumes and trims groups)
            await wait_for(lambda: ro.redis_link.up, 30, "redis seen writable again")
            assert not ro.redis_link.full and ro.metrics.redis_full._value.get() == 0
            assert health[-1] is True and "is back after" in caplog.text
            await wait_for(
                lambda: ro.phase == Phase.BOUND,
                60,
                "bound after memory freed",
                lambda: rollout_state(ro, url, "t"),
            )
            # admission is alive: the next version rolls out too
            await ro.publish_weights(1, write_fake_snapshot(tmp_path / "v1"))
            await wait_for(lambda: ro.phase == Phase.BOUND and ro.valid_produced == 8, 60, "bound of v1")
            await ro.wait_idle(10)
            assert all(not t.done() for t in ro._bg)
        c = counters(url, "t")
        assert valid_while_full < 4 == bound_v0  # outcomes were held back while Redis was full
        assert c["outcome:valid"] == 8
        assert not any(k.startswith("outcome:dropped") for k in c)
        check_one_outcome_per_attempt(url, "t", ids)  # every claimed prompt: exactly one outcome
        assert r.xlen(RunKeys("t").groups) == 8
    finally:
        r.close()
        server.stop()


def test_a_full_redis_does_not_cost_the_scheduler_its_lease(tmp_path: Path) -> None:
    """At maxmemory Redis refuses SET but allows PEXPIRE: the lease script extends a lease still
    ours with PEXPIRE, so a full Redis does not let the scheduler's lease lapse and strand its
    claims (found with the whole stack held full for longer than the 15 s lease)."""
    from asyncdapo.contracts.redis_scripts import RedisScript, script

    server = RedisServer(tmp_path / "redis", maxmemory=str(MAXMEMORY)).start()
    r = redis.Redis.from_url(server.url)
    try:
        lease = r.register_script(script(RedisScript.SCHEDULER_LEASE))
        keys = ["scheduler:epoch", "scheduler:lease"]
        r.set("scheduler:epoch", "7")
        assert lease(keys=keys, args=["s1", "7", 1000]) == 1  # not held yet: SET
        assert r.get("scheduler:lease") == b"s1|7"
        # full, deterministically: the cap below what Redis holds refuses every write that may grow it
        r.config_set("maxmemory", str(int(r.info("memory")["used_memory"]) // 2))
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            r.set("probe", b"x")  # full: a write that may grow memory is refused
        for _ in range(3):
            assert lease(keys=keys, args=["s1", "7", 60_000]) == 1
        assert r.pttl("scheduler:lease") > 30_000  # extended to the new lease, at maxmemory
        assert lease(keys=keys, args=["s2", "8", 60_000]) == 0  # a stale epoch is still fenced
    finally:
        server.stop()
