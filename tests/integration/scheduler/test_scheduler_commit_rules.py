"""When the scheduler may commit a valid group, against sim gateways and a real redis-server.

- `sync` mode is verl's loop: a generation batch is filtered and committed only once every prompt
  of it is done, never while some of it is still generating.
- A group whose oldest token is older than the staleness bound allows (t − v > s) is requeued, not
  committed: the trainer would drop it as stale, yet it would count toward the bound and the step
  would wait forever for groups that never come.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from scheduler_harness import (
    RuleScorer,
    counters,
    groups,
    load_prompts,
    run_config,
    scheduler,
    sim_gateways,
    wait_for,
    write_fake_snapshot,
)

from asyncdapo.services.scheduler.rollout import Phase

# heavy-tailed response lengths, slow enough that a batch's prompts finish far apart
SLOW_TAIL = {"length_mean": 40.0, "length_sigma": 1.0, "base_step_s": 0.01}


async def test_sync_batch_is_committed_only_when_all_of_it_is_done(redis_url: str) -> None:
    # sampling seeds whose slowest prompt is admitted after the batch's B-th valid group
    for seed in (101, 103):
        run = f"s{seed}"
        cfg = run_config(
            name=run,
            data={"max_response_length": 512},
            rollout={"mode": "sync", "max_concurrent_prompts": 12, "seed": seed},
        )
        load_prompts(redis_url, run, ["mixed"] * 30)
        async with (
            sim_gateways(2, **SLOW_TAIL) as gws,
            scheduler(cfg, redis_url, [g.address for g in gws], RuleScorer()) as ro,
        ):
            ro.start_run()
            # commits and outcomes of one finisher round are applied together: look right after
            await wait_for(lambda ro=ro: ro.valid_produced > 0, 30, "the first commit")
            assert not ro.tasks, f"seed {seed}: committed while {len(ro.tasks)} prompts of the batch ran"
            assert ro.valid_produced == 4
        c = counters(redis_url, run)
        assert c["admitted"] == 12 and c["outcome:valid"] == 4 and c["outcome:dropped:surplus"] == 8


async def test_a_group_older_than_the_staleness_bound_is_requeued(redis_url: str, tmp_path: Path) -> None:
    cfg = run_config(
        data={"max_response_length": 512}, rollout={"max_staleness": 1, "admission": {"policy": "greedy"}}
    )
    load_prompts(redis_url, "t", ["mixed"] * 60)
    # 25-60 tokens at 10 ms a step: every response is still generating after 0.15 s
    async with (
        sim_gateways(2, length_mean=40.0, length_sigma=0.3, base_step_s=0.01) as gws,
        scheduler(cfg, redis_url, [g.address for g in gws], RuleScorer()) as ro,
    ):
        ro.start_run()
        await wait_for(lambda: len(ro.tasks) > 0, 10, "admission at version 0")
        await asyncio.sleep(0.15)  # version-0 tokens are out
        # two versions go by while every prompt admitted at version 0 is still generating
        for v in (1, 2):
            await ro.publish_weights(v, write_fake_snapshot(tmp_path / f"v{v}"))
        assert ro.valid_produced == 0
        await wait_for(lambda: ro.phase == Phase.BOUND, 30, "bound of version 2")
        await ro.wait_idle(10)
    gs = groups(redis_url, "t")
    assert len(gs) == cfg.valid_group_bound(2)
    # at version 2 with s = 1 only tokens of version >= 1 are trainable
    assert all(g.min_version >= 1 for g in gs), [(g.min_version, g.max_version) for g in gs]
    # the stale ones went back to the queue with their own reason (decided by FINISH)
    assert counters(redis_url, "t")["requeued:stale"] > 0
