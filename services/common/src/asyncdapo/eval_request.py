"""The one builder of a `Scheduler.Evaluate` request from validation examples.

Used by the trainer (validation every `trainer.val_every` steps) and by `asyncdapo up` (before and
after training), so both measure the same thing: every example's prompt, encoded as in training,
dropped when longer than `data.max_prompt_length` (as in training: the engines fit no more), sampled
with the run's validation settings.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from asyncdapo.config import RunConfig
from asyncdapo.data.verl_format import Example
from asyncdapo.errors import AsyncdapoError
from asyncdapo.v1 import common_pb2, scheduler_pb2

# example -> (prompt token ids, rendered prompt text)
Encode = Callable[[Example], tuple[list[int], str]]


def eval_request(
    cfg: RunConfig, examples: Sequence[Example], encode: Encode
) -> scheduler_pb2.EvaluateRequest:
    """The Evaluate request for `examples`; an error when none of them fits `data.max_prompt_length`."""
    prompts = []
    for ex in examples:
        ids, text = encode(ex)
        if len(ids) > cfg.data.max_prompt_length:
            continue
        prompts.append(
            scheduler_pb2.EvalPrompt(
                id=f"val-{ex.index}", prompt_token_ids=ids, prompt=text, ground_truth=ex.ground_truth
            )
        )
    if not prompts:
        raise AsyncdapoError(
            f"every validation prompt is longer than data.max_prompt_length ({cfg.data.max_prompt_length})"
        )
    sampling = common_pb2.SamplingParams(
        max_tokens=cfg.data.max_response_length,
        temperature=cfg.rollout.val_temperature,
        top_p=cfg.rollout.top_p,
        top_k=cfg.rollout.top_k,
    )
    return scheduler_pb2.EvaluateRequest(prompts=prompts, n=cfg.rollout.val_n, sampling=sampling)
