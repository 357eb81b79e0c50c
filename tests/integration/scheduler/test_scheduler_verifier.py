"""The scheduler with the real verifier service (and sim gateways), scoring through the verifier's own
client: at default settings it waits through an outage (nothing dropped, the waiting gauge up, then
everything scored once the verifier is back); only an opt-in finite `verifier_max_retries` gives up,
as `verifier_error` — never a reward."""

from __future__ import annotations

import asyncio
from pathlib import Path

import redis
from scheduler_harness import (
    counters,
    load_prompts,
    outcome_ledger,
    run_config,
    scheduler,
    sim_gateways,
    wait_for,
)

from asyncdapo.contracts.redis_keys import RunKeys
from asyncdapo.services.scheduler.metrics import SchedulerMetrics
from asyncdapo.services.scheduler.score_batcher import Detokenizer, VerifierScorer
from asyncdapo.tools.local.local_server import VerifierServer
from asyncdapo.tools.local.ports import free_port


def _metric(metrics: SchedulerMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(f"asyncdapo_scheduler_{name}", labels) or 0.0


async def test_verifier_down_then_up_scores_everything_after_recovery(
    redis_url: str, tiny_model_dir: Path
) -> None:
    port = free_port()
    cfg = run_config()  # default reward.verifier_max_retries: wait as long as it takes
    assert cfg.reward.verifier_max_retries is None
    load_prompts(redis_url, "t", ["7"] * 6)
    metrics = SchedulerMetrics()
    verifier = VerifierScorer(f"http://127.0.0.1:{port}", Detokenizer(tiny_model_dir), cfg.reward, metrics)
    server = VerifierServer(workers=1, port=port)
    async with (
        sim_gateways(1, model_dir=str(tiny_model_dir)) as gws,
        scheduler(cfg, redis_url, [gws[0].address], verifier) as ro,
    ):
        ro.start_run()
        # responses wait for the verifier (those in failed calls are counted, more queue behind)
        await wait_for(lambda: _metric(metrics, "verifier_waiting_items") >= 1, 30, "waiting responses")
        await asyncio.sleep(8)  # longer than the old default retries (5, capped at 2 s) lasted
        assert _metric(metrics, "verifier_errors_total", kind="connect") >= 5
        # nothing scored, so nothing recorded, nothing dropped while the verifier is down
        assert counters(redis_url, "t").get("completions", 0) == 0 and len(ro.tasks) == 6
        server.start()
        try:
            await wait_for(
                lambda: len(ro.tasks) == 0 and ro.lengths.completed >= 24, 90, "all six prompts scored"
            )
            await ro.wait_idle(10)
        finally:
            ro.stop_run(abort_in_flight=True)
            server.stop()
        await verifier.aclose()
    c = counters(redis_url, "t")
    assert c["completions"] == 24 and not any(k.startswith("outcome:dropped") for k in c)
    assert _metric(metrics, "verifier_waiting_items") == 0
    assert all(
        len(outs) == 1 and outs[0] in ("filtered", "valid")
        for outs in outcome_ledger(redis_url, "t").values()
    )


async def test_opt_in_finite_retries_drop_with_verifier_error_and_no_reward(
    redis_url: str, tiny_model_dir: Path
) -> None:
    cfg = run_config(reward={"verifier_max_retries": 1}, rollout={"max_concurrent_prompts": 3})
    ids = load_prompts(redis_url, "t", ["7"] * 3)
    verifier = VerifierScorer(f"http://127.0.0.1:{free_port()}", Detokenizer(tiny_model_dir), cfg.reward)
    async with (
        sim_gateways(1, model_dir=str(tiny_model_dir)) as gws,
        scheduler(cfg, redis_url, [gws[0].address], verifier) as ro,
    ):
        ro.start_run()
        await wait_for(
            lambda: counters(redis_url, "t").get("outcome:dropped:verifier_error", 0) == 3, 30, "drops"
        )
        await ro.wait_idle(10)
        await verifier.aclose()
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    for pid in ids:
        state = r.hgetall(RunKeys("t").prompt(pid))
        assert state["outcome"] == "dropped:verifier_error"
        # no reward was ever recorded (a final outcome compacts the state: the fields may be gone)
        assert state.get("done", "0") == "0" and float(state.get("rmean", 0)) == 0.0
    c = counters(redis_url, "t")
    assert c.get("completions", 0) == 0 and c.get("outcome:valid", 0) == 0
