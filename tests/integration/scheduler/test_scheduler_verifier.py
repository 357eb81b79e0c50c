"""The scheduler with the real verifier service (and sim gateways): retries through an outage,
recovery, and `verifier_error` — never a reward — when it stays down."""

from __future__ import annotations

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

from asyncdapo.local.ports import free_port
from asyncdapo.redis_keys import RunKeys
from asyncdapo.scheduler.scoring import Detokenizer, HttpVerifier
from asyncdapo.verifier.local import VerifierServer


def _verifier_errors(ro: object, kind: str) -> float:
    return (
        ro.metrics.registry.get_sample_value("asyncdapo_scheduler_verifier_errors_total", {"kind": kind})
        or 0.0
    )


async def test_verifier_down_then_up_scores_everything_after_recovery(
    redis_url: str, tiny_model_dir: Path
) -> None:
    port = free_port()
    cfg = run_config(reward={"verifier_max_retries": 30})
    load_prompts(redis_url, "t", ["7"] * 6)
    verifier = HttpVerifier(f"http://127.0.0.1:{port}", Detokenizer(tiny_model_dir), timeout_s=30)
    server = VerifierServer(workers=1, port=port)
    async with (
        sim_gateways(1, model_dir=str(tiny_model_dir)) as gws,
        scheduler(cfg, redis_url, [gws[0].address], verifier) as ro,
    ):
        ro.start_run()
        await wait_for(lambda: _verifier_errors(ro, "call") >= 3, 30, "failed verifier calls")
        # nothing scored, so nothing recorded while the verifier is down
        assert counters(redis_url, "t").get("completions", 0) == 0
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
    assert all(
        len(outs) == 1 and outs[0] in ("filtered", "valid")
        for outs in outcome_ledger(redis_url, "t").values()
    )


async def test_verifier_that_stays_down_drops_with_verifier_error_and_no_reward(
    redis_url: str, tiny_model_dir: Path
) -> None:
    cfg = run_config(reward={"verifier_max_retries": 1}, rollout={"max_concurrent_prompts": 3})
    ids = load_prompts(redis_url, "t", ["7"] * 3)
    verifier = HttpVerifier(f"http://127.0.0.1:{free_port()}", Detokenizer(tiny_model_dir), timeout_s=5)
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
