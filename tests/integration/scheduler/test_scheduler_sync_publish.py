"""Sync mode across a weight publish, against sim gateways and a real redis-server.

In sync mode the rest of a generation batch keeps running after the batch's first B valid groups
are committed. If the trainer publishes the next version before that rest finishes, its groups hold
tokens of the old version: the trainer (s = 0) drops them as stale, so they must not be committed
and counted toward the new version's bound — the step would wait forever for groups that never come.
"""

from __future__ import annotations

from pathlib import Path

from scheduler_harness import (
    RuleScorer,
    groups,
    load_prompts,
    run_config,
    scheduler,
    sim_gateways,
    wait_for,
    write_fake_snapshot,
)

from asyncdapo.scheduler.rollout import Phase


async def test_sync_batch_rest_is_not_committed_for_the_next_version(redis_url: str, tmp_path: Path) -> None:
    still_running_at_bound = 0
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
            sim_gateways(2, length_mean=40.0, length_sigma=1.0, base_step_s=0.01) as gws,
            scheduler(cfg, redis_url, [g.address for g in gws], RuleScorer()) as ro,
        ):
            ro.start_run()
            await wait_for(lambda ro=ro: ro.phase == Phase.BOUND, 30, "bound of version 0")
            still_running_at_bound += len(ro.tasks)
            # a fast trainer publishes while the rest of the batch is still generating
            await ro.publish_weights(1, write_fake_snapshot(tmp_path / run), 0)
            await wait_for(
                lambda ro=ro: ro.phase == Phase.BOUND and ro.valid_produced == 8, 30, "bound of version 1"
            )
            await ro.wait_idle(10)
        gs = groups(redis_url, run)
        assert len(gs) == 8
        assert [g.min_version for g in gs] == [0] * 4 + [1] * 4, [(g.min_version, g.max_version) for g in gs]
    assert still_running_at_bound > 0, "no batch was still running at the bound: the race was not exercised"
