"""The rollout loop against in-process sim gateways and a real redis-server.

The verifier is the labelled `RuleScorer` stand-in (see conftest): the simulator's random tokens
cannot be judged by math-verify. Tests with the real verifier are in test_scheduler_verifier.py
and test_scheduler_vllm.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import redis
from scheduler_harness import (
    RuleScorer,
    check_one_outcome_per_attempt,
    counters,
    groups,
    load_prompts,
    rollout_state,
    run_config,
    scheduler,
    sim_gateways,
    wait_for,
    write_fake_snapshot,
)

from asyncdapo.contracts.redis_keys import RunKeys
from asyncdapo.contracts.v1 import common_pb2, gateway_pb2
from asyncdapo.services.scheduler.rollout import Phase


async def test_exactly_b_valid_per_version_rest_aborted_and_requeued(redis_url: str, tmp_path: Path) -> None:
    cfg = run_config(rollout={"admission": {"policy": "greedy"}})
    ids = load_prompts(redis_url, "t", ["mixed", "all0", "mixed", "all1"] * 20)
    async with (
        sim_gateways(2) as gws,
        scheduler(cfg, redis_url, [g.address for g in gws], RuleScorer()) as ro,
    ):
        ro.start_run()
        await wait_for(lambda: ro.phase == Phase.BOUND, 30, "bound of version 0")
        await ro.wait_idle(10)
        assert ro.valid_produced == 4 and len(groups(redis_url, "t")) == 4
        # the gateways confirmed the aborts, and nothing of ours is left running there
        assert ro.dispatcher.aborted_requests > 0
        aborted_in_streams = sum(
            g.server.metrics.registry.get_sample_value(
                "asyncdapo_gateway_aborts_total", {"cause": "abort_stream"}
            )
            or 0
            for g in gws
        )
        assert aborted_in_streams == ro.dispatcher.aborted_requests
        for g in gws:
            assert g.server.service.in_flight == 0
        assert counters(redis_url, "t")["requeued:early_stop"] > 0

        resp = await ro.publish_weights(1, write_fake_snapshot(tmp_path / "v1"))
        assert [r.ok for r in resp.results] == [True, True], resp
        await wait_for(lambda: ro.phase == Phase.BOUND and ro.valid_produced == 8, 30, "bound of version 1")
        await ro.wait_idle(10)
        for g in gws:
            load = await ro.pool.get(g.address).stub.GetLoad(gateway_pb2.GetLoadRequest())
            assert load.weight_version == 1
        reg = ro.metrics.registry

    gs = groups(redis_url, "t")
    assert len(gs) == 8
    # on-policy (s = 0): version-0 groups hold version-0 tokens only, version-1 groups version 1
    assert [(g.min_version, g.max_version) for g in gs] == [(0, 0)] * 4 + [(1, 1)] * 4
    for g in gs:
        assert g.ground_truth == "mixed" and len(g.responses) == 4 and g.reward_std > 0
        assert all(len(r.token_ids) == len(r.logprobs) > 0 for r in g.responses)
    led = check_one_outcome_per_attempt(redis_url, "t", ids)
    # prompts requeued by the early stop of version 0 were served again under version 1
    served_again = [p for p, outs in led.items() if outs[0] == "requeued" and len(outs) > 1]
    assert served_again
    # prompt_attempts: one sample per final outcome, at its attempt number (served again: 2 or more)
    for outcome in ("valid", "filtered"):
        final = [len(outs) for outs in led.values() if outs and outs[-1] == outcome]
        labels = {"outcome": outcome}
        assert reg.get_sample_value("asyncdapo_scheduler_prompt_attempts_count", labels) == len(final)
        assert reg.get_sample_value("asyncdapo_scheduler_prompt_attempts_sum", labels) == sum(final)
    assert any(len(led[p]) > 1 and led[p][-1] != "requeued" for p in served_again)
    # all-equal groups were filtered, never trained on
    filtered = {p for p, outs in led.items() if outs[-1] == "filtered"}
    assert filtered and all(int(p.split("-")[1]) % 2 == 1 for p in filtered)


async def test_fifo_order_commits_in_admission_order(redis_url: str) -> None:
    cfg = run_config(rollout={"early_stop_order": "fifo", "admission": {"policy": "greedy"}})
    ids = load_prompts(redis_url, "t", ["mixed"] * 40)
    async with (
        sim_gateways(2) as gws,
        scheduler(cfg, redis_url, [g.address for g in gws], RuleScorer()) as ro,
    ):
        ro.start_run()
        await wait_for(lambda: ro.phase == Phase.BOUND, 30, "bound")
        await ro.wait_idle(10)
    # every prompt is valid here, so fifo commits exactly the first four admitted
    assert [g.prompt_id for g in groups(redis_url, "t")] == ids[:4]
    check_one_outcome_per_attempt(redis_url, "t", ids)


async def test_sync_mode_waits_for_the_whole_batch_and_never_aborts(redis_url: str) -> None:
    cfg = run_config(rollout={"mode": "sync", "max_concurrent_prompts": 6})
    ids = load_prompts(redis_url, "t", ["mixed", "all0", "all0", "all0", "all0", "mixed"] + ["mixed"] * 12)
    async with (
        sim_gateways(2) as gws,
        scheduler(cfg, redis_url, [g.address for g in gws], RuleScorer()) as ro,
    ):
        ro.start_run()
        await wait_for(lambda: ro.phase == Phase.BOUND, 30, "bound")
        await ro.wait_idle(10)
        assert ro.dispatcher.aborted_requests == 0
    c = counters(redis_url, "t")
    # batch 1 yields 2 valid groups, batch 2 six: 2 of them complete B, the other 4 are spent for
    # the epoch, as in verl's loop (dropped with reason surplus, not requeued)
    assert c["admitted"] == 12 and c["outcome:valid"] == 4 and c["outcome:dropped:surplus"] == 4
    assert [g.prompt_id for g in groups(redis_url, "t")] == [ids[0], ids[5], ids[6], ids[7]]
    check_one_outcome_per_attempt(redis_url, "t", ids)


async def test_a_gateway_killed_mid_rollout_loses_no_prompt(redis_url: str) -> None:
    cfg = run_config(data={"train_batch_size": 8}, trainer={"ppo_mini_batch_size": 8})
    ids = load_prompts(redis_url, "t", ["mixed", "all1"] * 30)
    slow = {"length_mean": 60.0, "length_sigma": 0.2, "base_step_s": 0.004}
    async with (
        sim_gateways(2, **slow) as gws,
        scheduler(cfg, redis_url, [g.address for g in gws], RuleScorer()) as ro,
    ):
        ro.start_run()
        victim = gws[0]
        await wait_for(lambda: ro.pool.get(victim.address).in_flight >= 4, 10, "requests on the victim")
        await victim.server.stop(0)  # abrupt: in-flight calls fail
        await wait_for(lambda: ro.phase == Phase.BOUND, 60, "bound with one gateway")
        await ro.wait_idle(10)
        assert not ro.pool.get(victim.address).up
        redispatched = ro.metrics.registry.get_sample_value(
            "asyncdapo_scheduler_redispatched_requests_total", {"why": "gateway_failure"}
        )
        assert redispatched and redispatched > 0
    c = counters(redis_url, "t")
    assert c["outcome:valid"] == 8 and not any(k.startswith("outcome:dropped") for k in c)
    check_one_outcome_per_attempt(redis_url, "t", ids)


async def test_scheduler_crash_requeues_its_claims_at_once(redis_url: str) -> None:
    """A successor started while the crashed scheduler's lease (default 15 s) is still alive takes
    the run over at once: every claim of its predecessor is requeued before it admits anything."""
    cfg = run_config()
    ids = load_prompts(redis_url, "t", ["mixed"] * 20)
    slow = {"length_mean": 500.0, "length_sigma": 0.1, "base_step_s": 0.01}
    r = redis.Redis.from_url(redis_url)
    async with sim_gateways(1, **slow) as gws:
        async with scheduler(cfg, redis_url, [gws[0].address], RuleScorer(), owner="dead") as ro:
            ro.start_run()
            await wait_for(lambda: len(ro.tasks) >= 4, 10, "prompts in flight")
            for t in ro._bg:  # simulate a crash: no outcome recorded, no lease refresh
                t.cancel()
        claimed = counters(redis_url, "t")["admitted"]
        assert claimed >= 4
        assert r.hlen(RunKeys("t").prompts_claimed) == claimed
        assert r.pttl(RunKeys("t").scheduler_lease) > 10_000  # the dead one's lease is alive
        async with scheduler(cfg, redis_url, [gws[0].address], RuleScorer()) as ro2:
            assert r.hlen(RunKeys("t").prompts_claimed) == 0
            ro2.start_run()
            await wait_for(lambda: ro2.phase == Phase.BOUND, 60, "bound after restart")
            await ro2.wait_idle(10)
    c = counters(redis_url, "t")
    assert c["requeued:scheduler_restart"] == claimed and c["outcome:valid"] == 4
    check_one_outcome_per_attempt(redis_url, "t", ids)


async def test_dns_pool_resolves_and_follows_membership() -> None:
    from asyncdapo.services.scheduler.gateway_pool import GatewayPool, GatewaySpec

    async with sim_gateways(1) as gws:
        pool = GatewayPool(GatewaySpec.parse(f"dns:localhost:{gws[0].port}"), resolve_interval_s=0.1)
        await pool.start()
        try:
            await pool.wait_up(1, 10)
            assert f"127.0.0.1:{gws[0].port}" in [g.address for g in pool.up_gateways()]
            # the name now resolves to nothing we know: members that vanish are removed
            pool.spec = GatewaySpec.parse("dns:localhost:1")
            await wait_for(lambda: all(g.address.endswith(":1") for g in pool.members), 5, "re-resolution")
        finally:
            await pool.close()


async def test_pdsr_starts_every_response_fast_and_continues_capped_ones_on_the_heavy_pool(
    redis_url: str,
) -> None:
    from scheduler_harness import start_sim_gateway

    cfg = run_config(
        data={"train_batch_size": 8, "max_response_length": 96},
        trainer={"ppo_mini_batch_size": 8},
        rollout={"long_tail": {"policy": "pdsr", "offload_fraction": 0.2, "cap_factor": 1.2}},
    )
    ids = load_prompts(redis_url, "t", ["mixed", "all0"] * 30)
    timing = {"length_mean": 30.0, "length_sigma": 0.9}
    gws = [
        await start_sim_gateway("fast-0", pool="fast", **timing),
        await start_sim_gateway("fast-1", pool="fast", **timing),
        await start_sim_gateway("heavy-0", pool="heavy", **timing),
    ]
    heavy = gws[2].address
    heavy_served = gws[2].server.metrics.registry
    try:
        async with scheduler(cfg, redis_url, [g.address for g in gws], RuleScorer()) as ro:
            ro.start_run()
            await wait_for(lambda: ro.phase == Phase.BOUND, 60, "bound")
            await ro.wait_idle(10)
            m = ro.metrics.registry
            continued = (
                m.get_sample_value("asyncdapo_scheduler_long_tail_total", {"action": "cap_continue"}) or 0
            )
            assert continued > 0
            l_cut = ro.pdsr.probes.l_cut(0.2)
            counts = ro.core.counts
            assert counts.capped_responses == continued and counts.capped_groups > 0
            assert counts.continued_tokens > 0
            # the heavy pool received continuations only (finished, or aborted at the bound)
            heavy_requests = sum(
                heavy_served.get_sample_value("asyncdapo_gateway_requests_total", {"finish_reason": f}) or 0
                for f in ("stop", "length", "abort")
            )
            assert 0 < heavy_requests <= continued
    finally:
        for g in gws:
            await g.server.stop(0)
    gs = groups(redis_url, "t")
    assert len(gs) == 8
    assert l_cut is not None
    for g in gs:
        assert len(g.responses) == 4 and all(len(r.token_ids) == len(r.logprobs) for r in g.responses)
    # a response that finished on the heavy pool is a continuation: longer than the fast pool's cap
    assert all(len(r.token_ids) > l_cut for g in gs for r in g.responses if r.gateway == heavy)
    check_one_outcome_per_attempt(redis_url, "t", ids)


async def test_bad_prompts_are_dropped_with_a_reason_not_lost(redis_url: str) -> None:
    from asyncdapo.contracts.prompts import PromptRecord, queue_prompts

    r = redis.Redis.from_url(redis_url)
    keys = RunKeys("t")
    pipe = r.pipeline()
    queue_prompts(pipe, keys, [PromptRecord("long", list(range(1, 100)), "", "mixed", "", 0, 0)])
    queue_prompts(pipe, keys, [PromptRecord("nogt", [1, 2], "", "", "", 0, 1)])
    pipe.rpush(keys.prompts, "nodata")
    pipe.execute()
    ids = ["long", "nogt", "nodata", *load_prompts(redis_url, "t", ["mixed"] * 8)]
    async with (
        sim_gateways(1) as gws,
        scheduler(run_config(), redis_url, [gws[0].address], RuleScorer()) as ro,
    ):
        ro.start_run()
        await wait_for(lambda: ro.phase == Phase.BOUND, 30, "bound")
        await ro.wait_idle(10)
    c = counters(redis_url, "t")
    assert c["outcome:dropped:prompt_too_long"] == 1 and c["outcome:dropped:bad_prompt"] == 2
    check_one_outcome_per_attempt(redis_url, "t", ids)


async def test_requests_wait_out_a_paused_gateway_and_go_when_it_resumes(redis_url: str) -> None:
    """Only a load report says the gateway resumed (someone else paused it, or a report from the
    pause arrived after our own weight update): requests waiting for it must then be placed."""
    cfg = run_config()
    load_prompts(redis_url, "t", ["mixed"] * 8)
    async with (
        sim_gateways(1) as gws,
        scheduler(cfg, redis_url, [g.address for g in gws], RuleScorer()) as ro,
    ):
        gw = ro.pool.members[0]
        await gw.stub.Pause(gateway_pb2.PauseRequest(mode=common_pb2.PAUSE_MODE_KEEP))
        await wait_for(lambda: gw.load.paused, 5, "the paused load report")
        ro.start_run()
        await wait_for(lambda: len(ro.dispatcher.pending) > 0, 10, "requests waiting for a gateway")
        await asyncio.sleep(0.3)  # several load reports: still paused, nothing is sent
        assert gw.in_flight == 0
        await gw.stub.Resume(gateway_pb2.ResumeRequest())
        await wait_for(
            lambda: ro.phase == Phase.BOUND,
            30,
            "bound after the gateway resumed",
            state=lambda: rollout_state(ro, redis_url, "t"),
        )


async def test_response_log_holds_every_judged_and_cut_response_once(redis_url: str, tmp_path: Path) -> None:
    """`--response-log`: the trained groups' responses are there with their lengths and verdicts,
    the early stop's cancelled requests as `aborted` / `late`, and no response twice."""
    import json
    from collections import Counter

    from asyncdapo.services.scheduler.response_log import ResponseLog

    cfg = run_config(rollout={"admission": {"policy": "greedy"}})
    load_prompts(redis_url, "t", ["mixed", "all0"] * 30)
    log_path = tmp_path / "responses.jsonl"
    responses = ResponseLog(log_path)
    async with (
        sim_gateways(2) as gws,
        scheduler(cfg, redis_url, [g.address for g in gws], RuleScorer(), response_log=responses) as ro,
    ):
        ro.start_run()
        await wait_for(lambda: ro.phase == Phase.BOUND, 30, "bound of version 0")
        await ro.wait_idle(10)
        aborted_requests = ro.dispatcher.aborted_requests
    responses.close()
    lines = [json.loads(x) for x in log_path.read_text().splitlines()]
    events = Counter(x["event"] for x in lines)
    assert events["judged"] > 0 and events["aborted"] > 0, events
    assert set(events) <= {"judged", "aborted", "late"}
    assert events["aborted"] <= aborted_requests
    # one line per response of an attempt, whatever became of it
    keys = Counter((x["pid"], x["attempt"], x["idx"]) for x in lines)
    assert max(keys.values()) == 1
    judged = {(x["pid"], x["attempt"], x["idx"]): x for x in lines if x["event"] == "judged"}
    for x in judged.values():
        rule = "mixed" if int(x["pid"].split("-")[1]) % 2 == 0 else "all0"
        assert x["acc"] == (float(x["idx"] % 2 == 0) if rule == "mixed" else 0.0)
        assert x["tokens"] > 0 and x["prompt_tokens"] > 0
        # the gateway's time for the request, and the engine's queue time within it
        assert 0 <= x["queue_s"] <= x["generate_s"] and x["generate_s"] > 0, x
    # every trained group is there whole, with the lengths the trainer receives
    gs = groups(redis_url, "t")
    assert len(gs) == 4
    for g in gs:
        attempts = {a for p, a, _ in judged if p == g.prompt_id}
        lengths = [
            sorted(judged[(g.prompt_id, a, i)]["tokens"] for i in range(4) if (g.prompt_id, a, i) in judged)
            for a in attempts
        ]
        assert sorted(len(r.token_ids) for r in g.responses) in lengths
