"""The scheduler through a Redis outage, at default settings: a real redis-server of its own (AOF,
`appendfsync always`) killed with SIGKILL and restarted from its AOF on the same port while
prompts are in flight. Every background loop survives, health says NOT_SERVING while Redis is
away, nothing claimed is lost or given two outcomes, and the run reaches its bound afterwards."""

from __future__ import annotations

import asyncio
from pathlib import Path

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


async def test_redis_killed_for_5s_mid_run_loses_nothing(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis").start()
    url = server.url
    try:
        cfg = run_config(rollout={"max_concurrent_prompts": 8})
        ids = load_prompts(url, "t", ["mixed", "all0", "mixed"] * 30)
        slow = {"length_mean": 60.0, "length_sigma": 0.3, "base_step_s": 0.01}
        health: list[bool] = []
        async with (
            sim_gateways(2, **slow) as gws,
            scheduler(cfg, url, [g.address for g in gws], RuleScorer()) as ro,
        ):
            ro.health_listeners.append(health.append)
            ro.start_run()
            await wait_for(lambda: len(ro.tasks) >= 4, 10, "prompts in flight")
            server.kill()
            await asyncio.sleep(5.0)
            assert not ro.redis_link.up and health[-1] is False
            status = await ro.status()  # answers from memory while Redis is away
            assert not status.redis_available
            assert all(not t.done() for t in ro._bg), "a background loop died during the outage"
            server.start()
            await wait_for(lambda: ro.redis_link.up, 30, "redis seen up again")
            assert health[-1] is True
            await wait_for(
                lambda: ro.phase == Phase.BOUND,
                60,
                "bound after the outage",
                lambda: rollout_state(ro, url, "t"),
            )
            # admission is alive: the next version rolls out too
            await ro.publish_weights(1, write_fake_snapshot(tmp_path / "v1"))
            await wait_for(lambda: ro.phase == Phase.BOUND and ro.valid_produced == 8, 60, "bound of v1")
            await ro.wait_idle(10)
            assert all(not t.done() for t in ro._bg)
        c = counters(url, "t")
        assert c["outcome:valid"] == 8 and not any(k.startswith("outcome:dropped") for k in c)
        check_one_outcome_per_attempt(url, "t", ids)
        r = redis.Redis.from_url(url)
        assert r.xlen(RunKeys("t").groups) == 8
    finally:
        server.stop()
