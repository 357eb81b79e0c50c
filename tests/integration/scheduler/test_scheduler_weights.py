"""PublishWeights under faults, at default settings (sim gateways, real Redis): the version and the
bound rise only once a gateway serves the new weights; a gateway that missed an update is re-synced
in the background before it gets work again; a replaced trainer cannot publish."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis
from scheduler_harness import (
    RuleScorer,
    SimGateway,
    check_one_outcome_per_attempt,
    groups,
    load_prompts,
    rollout_state,
    run_config,
    scheduler,
    sim_gateways,
    start_sim_gateway,
    wait_for,
    write_fake_snapshot,
)

from asyncdapo.contracts.redis_keys import RunKeys
from asyncdapo.services.scheduler.rollout import Phase, Rollout
from asyncdapo.services.scheduler.weight_publisher import PublishError, PublishUnavailable


@contextlib.asynccontextmanager
async def keeper_and_victim(
    redis_url: str,
) -> AsyncIterator[tuple[Rollout, SimGateway, SimGateway, list[str]]]:
    """60 prompts and a run bound at v0 on two sim gateways: the keeper, which stays up, and the
    victim, which the test stops and restarts (and stops itself)."""
    cfg = run_config(rollout={"max_concurrent_prompts": 8})
    ids = load_prompts(redis_url, "t", ["mixed"] * 60)
    async with sim_gateways(1) as (keeper,):
        victim = await start_sim_gateway("victim")
        async with scheduler(cfg, redis_url, [keeper.address, victim.address], RuleScorer()) as ro:
            ro.start_run()
            await wait_for(lambda: ro.phase == Phase.BOUND, 30, "bound of v0")
            yield ro, keeper, victim, ids


async def test_publish_failing_on_every_gateway_changes_nothing_and_is_retryable(
    redis_url: str, tmp_path: Path
) -> None:
    cfg = run_config()
    load_prompts(redis_url, "t", ["mixed"] * 30)
    async with (
        sim_gateways(2) as gws,
        scheduler(cfg, redis_url, [g.address for g in gws], RuleScorer()) as ro,
    ):
        ro.start_run()
        await wait_for(lambda: ro.phase == Phase.BOUND, 30, "bound of v0")
        bound = ro.bound
        with pytest.raises(PublishUnavailable, match="no gateway loaded v1"):
            await ro.publish_weights(1, str(tmp_path / "no-such-snapshot"))
        assert (ro.version, ro.bound, ro.phase) == (0, bound, Phase.BOUND)
        assert not redis.Redis.from_url(redis_url).exists(RunKeys("t").weights)
        # the trainer's retry with a loadable snapshot goes through
        resp = await ro.publish_weights(1, write_fake_snapshot(tmp_path / "v1"))
        assert all(r.ok for r in resp.results) and ro.version == 1
        await wait_for(lambda: ro.phase == Phase.BOUND and ro.valid_produced == 8, 30, "bound of v1")


async def test_a_restarted_gateway_is_resynced_before_it_serves(redis_url: str, tmp_path: Path) -> None:
    """The gateway comes back with the weights it started with (v0): dispatch skips it until the
    background re-sync loaded the current version, so every committed group is on-policy."""
    async with keeper_and_victim(redis_url) as (ro, _keeper, victim, ids):
        port = victim.port
        await ro.publish_weights(1, write_fake_snapshot(tmp_path / "v1"))
        await victim.server.stop(0)
        await wait_for(lambda: not ro.pool.get(f"127.0.0.1:{port}").up, 10, "victim down")
        await ro.publish_weights(2, write_fake_snapshot(tmp_path / "v2"))  # it misses v2
        victim = await start_sim_gateway("victim", port=port)  # back, on v0
        try:
            gw = ro.pool.get(victim.address)
            await wait_for(lambda: gw.up, 10, "victim up again")
            await wait_for(
                lambda: gw.weight_version == 2,
                30,
                "victim re-synced",
                lambda: rollout_state(ro, redis_url, "t"),
            )
            await wait_for(lambda: ro.phase == Phase.BOUND and ro.valid_produced == 12, 30, "bound of v2")
            # its re-sync over, v3 goes to both at once, and dispatch spreads v3's groups by load
            await wait_for(lambda: victim.address not in ro.weights.syncing, 10, "re-sync over")
            await ro.publish_weights(3, write_fake_snapshot(tmp_path / "v3"))
            await wait_for(lambda: ro.phase == Phase.BOUND and ro.valid_produced == 16, 30, "bound of v3")
            await ro.wait_idle(10)
            assert ro.metrics.registry.get_sample_value(
                "asyncdapo_scheduler_gateway_weight_syncs_total", {"result": "ok"}
            )
        finally:
            await victim.server.stop(0)
    gs = groups(redis_url, "t")
    # on-policy throughout (s = 0): no group holds a token of an older version than its step's
    assert [(g.min_version, g.max_version) for g in gs[8:]] == [(2, 2)] * 4 + [(3, 3)] * 4
    # and the victim served again once re-synced
    assert any(r.gateway == victim.address for g in gs[8:] for r in g.responses)
    check_one_outcome_per_attempt(redis_url, "t", ids)


async def test_a_publish_during_a_resync_still_ends_on_the_newest_version(
    redis_url: str, tmp_path: Path
) -> None:
    """v3 is published while the returning gateway is still loading v2 in its re-sync: the publish
    leaves it to the re-sync, which loads again, so the gateway ends on v3 in one re-sync, and no
    group is ever served on an old version."""
    async with keeper_and_victim(redis_url) as (ro, keeper, victim, ids):
        port = victim.port
        await victim.server.stop(0)
        await wait_for(lambda: not ro.pool.get(f"127.0.0.1:{port}").up, 10, "victim down")
        await ro.publish_weights(2, write_fake_snapshot(tmp_path / "v2"))  # it misses v2
        victim = await start_sim_gateway("victim", port=port, reload_s=1.0)  # back, on v0; slow loads
        try:
            await wait_for(lambda: victim.address in ro.weights.syncing, 10, "victim re-syncing")
            resp = await ro.publish_weights(3, write_fake_snapshot(tmp_path / "v3"))
            assert [r.gateway for r in resp.results] == [keeper.address]  # left to its re-sync
            gw = ro.pool.get(victim.address)
            await wait_for(lambda: victim.address not in ro.weights.syncing, 20, "re-sync over")
            assert gw.weight_version == 3
            syncs = ro.metrics.registry.get_sample_value(
                "asyncdapo_scheduler_gateway_weight_syncs_total", {"result": "ok"}
            )
            assert syncs == 1
            await wait_for(lambda: ro.phase == Phase.BOUND and ro.valid_produced >= 12, 30, "bound of v3")
            await ro.wait_idle(10)
        finally:
            await victim.server.stop(0)
    gs = groups(redis_url, "t")
    assert all(g.min_version == g.max_version for g in gs)
    check_one_outcome_per_attempt(redis_url, "t", ids)


async def test_a_replaced_trainer_cannot_publish(redis_url: str, tmp_path: Path) -> None:
    cfg = run_config()
    async with (
        sim_gateways(1) as gws,
        scheduler(cfg, redis_url, [gws[0].address], RuleScorer()) as ro,
    ):
        redis.Redis.from_url(redis_url).set(RunKeys("t").trainer_epoch, 5)
        with pytest.raises(PublishError, match="fenced: trainer epoch 4"):
            await ro.publish_weights(1, write_fake_snapshot(tmp_path / "v1"), trainer_epoch=4)
        assert ro.version == 0
        resp = await ro.publish_weights(1, write_fake_snapshot(tmp_path / "v1"), trainer_epoch=5)
        assert resp.results[0].ok and ro.version == 1
