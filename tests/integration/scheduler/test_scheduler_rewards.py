"""The reward of a response as the scheduler records it (the groups stream) and answers it
(Evaluate): the configured score of the verifier's verdict (`reward.correct_reward` /
`incorrect_reward`) plus DAPO's overlong penalty; validation samples with the `val_*` settings.

In-process sim gateways, a real redis-server and the labelled `RuleScorer` (`mixed`: response
indices 0 and 2 right, 1 and 3 wrong)."""

from __future__ import annotations

from typing import Any

import pytest
from scheduler_harness import RuleScorer, groups, load_prompts, run_config, scheduler, sim_gateways, wait_for

from asyncdapo.contracts.v1 import common_pb2, scheduler_pb2
from asyncdapo.services.scheduler.evaluate import evaluate
from asyncdapo.services.scheduler.rollout import Phase
from asyncdapo.services.scheduler.tasks import Request

# max_response_length 64, overlong buffer 16 (run_config): penalised from 48 tokens, -1 at 64;
# responses of ~48 tokens put many of them in the buffer
LONG = {"length_mean": 48.0, "length_sigma": 0.3}


def _penalty(length: int) -> float:
    return -min(max(length - 48, 0) / 16, 1.0)


@pytest.mark.parametrize(
    ("reward", "correct", "incorrect"),
    [({}, 1.0, -1.0), ({"incorrect_reward": 0.0}, 1.0, 0.0), ({"correct_reward": 2.0}, 2.0, -1.0)],
    ids=["dapo-default", "gsm8k-style", "custom"],
)
async def test_recorded_groups_carry_the_configured_score_plus_the_overlong_penalty(
    redis_url: str, reward: dict[str, Any], correct: float, incorrect: float
) -> None:
    cfg = run_config(reward=reward)
    load_prompts(redis_url, "t", ["mixed"] * 8)
    async with (
        sim_gateways(1, **LONG) as gws,
        scheduler(cfg, redis_url, [g.address for g in gws], RuleScorer()) as ro,
    ):
        ro.start_run()
        await wait_for(lambda: ro.phase == Phase.BOUND, 30, "bound of version 0")
        await ro.wait_idle(10)
    responses = [r for g in groups(redis_url, "t") for r in g.responses]
    assert len(responses) == 16
    assert {r.acc for r in responses} == {0.0, 1.0}
    for r in responses:
        assert r.score == (correct if r.acc else incorrect)
        assert r.overlong_penalty == pytest.approx(_penalty(len(r.token_ids)))
        assert r.reward == pytest.approx(r.score + r.overlong_penalty)
    assert any(r.overlong_penalty < 0 for r in responses)  # the shaping was exercised


async def test_evaluate_samples_with_the_val_settings_and_answers_scores_and_an_accuracy(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = run_config(
        rollout={"top_p": 0.5, "top_k": 50, "val_temperature": 0.25, "val_top_p": 0.75, "val_top_k": 7},
        reward={"incorrect_reward": -0.5},
    )
    async with (
        sim_gateways(1, **LONG) as gws,
        scheduler(cfg, redis_url, [g.address for g in gws], RuleScorer()) as ro,
    ):
        sent: list[common_pb2.SamplingParams] = []
        submit = ro.dispatcher.submit

        def spy(reqs: list[Request]) -> None:
            sent.extend(r.task.sampling for r in reqs)
            submit(reqs)

        monkeypatch.setattr(ro.dispatcher, "submit", spy)
        req = scheduler_pb2.EvaluateRequest(
            prompts=[scheduler_pb2.EvalPrompt(id=f"v{i}", prompt_token_ids=[5, 6, i], ground_truth="mixed")
                     for i in range(3)],
            n=4,
        )  # fmt: skip
        out = await evaluate(ro, req)
    assert len(sent) == 12
    for s in sent:  # the run's validation sampling, not its training sampling
        assert (s.temperature, s.top_p, s.top_k, s.max_tokens) == (0.25, 0.75, 7, 64)
    for res in out.results:
        assert list(res.acc) == [1.0, 0.0, 1.0, 0.0]
        assert list(res.score) == [1.0, -0.5, 1.0, -0.5]
    assert out.accuracy == 0.5  # an accuracy: the mean of acc, whatever the scores are
