"""Validation through the scheduler's eval mode (Scheduler.Evaluate: nothing filtered or stopped)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from asyncdapo.config import RunConfig
from asyncdapo.data.verl_format import Example


def eval_request(cfg: RunConfig, examples: Sequence[Example], encode: Any) -> Any:
    from asyncdapo.v1 import common_pb2, scheduler_pb2

    prompts = []
    for ex in examples:
        ids, text = encode(ex)
        if (
            len(ids) > cfg.data.max_prompt_length
        ):  # dropped like in training (the engine's context fits no more)
            continue
        prompts.append(
            scheduler_pb2.EvalPrompt(
                id=f"val-{ex.index}", prompt_token_ids=ids, prompt=text, ground_truth=ex.ground_truth
            )
        )
    sampling = common_pb2.SamplingParams(
        max_tokens=cfg.data.max_response_length,
        temperature=cfg.rollout.val_temperature,
        top_p=cfg.rollout.top_p,
        top_k=cfg.rollout.top_k,
    )
    return scheduler_pb2.EvaluateRequest(prompts=prompts, n=cfg.rollout.val_n, sampling=sampling)


def evaluate(
    stub: Any, request: Any, metadata: list[tuple[str, str]], timeout_s: float = 3600.0
) -> dict[str, float]:
    resp = stub.Evaluate(request, metadata=metadata, timeout=timeout_s)
    return {
        "val/accuracy": resp.accuracy,
        "val/mean_response_length": resp.mean_response_length,
        "val/policy_version": float(resp.policy_version),
        "val/prompts": float(len(resp.results)),
    }
