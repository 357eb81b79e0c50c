"""The one builder of a `Scheduler.Evaluate` request from validation examples.

Used by the trainer (validation every `trainer.val_every` steps) and by `asyncdapo up` (before and
after training), so both measure the same thing: every example's prompt, encoded as in training and
fitted to `data.max_prompt_length` as in training (`data.truncation`: dropped, cut, or an error),
sampled with the run's validation settings. Request ids are `val-<position>`: unique even where two
validation files reuse the same extra_info.index.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from asyncdapo.contracts.config import RunConfig
from asyncdapo.contracts.errors import AsyncdapoError
from asyncdapo.contracts.prompting import fit_prompt
from asyncdapo.contracts.v1 import common_pb2, scheduler_pb2
from asyncdapo.contracts.verl_format import Example

# example -> (prompt token ids, rendered prompt text)
Encode = Callable[[Example], tuple[list[int], str]]


def eval_request(
    cfg: RunConfig, examples: Sequence[Example], encode: Encode
) -> scheduler_pb2.EvaluateRequest:
    """The Evaluate request for `examples`; an error when none of them fits `data.max_prompt_length`."""
    prompts = []
    for ex in examples:
        ids, text = encode(ex)
        where = f"validation example {ex.index} (data_source {ex.data_source!r}, extra_info.index {ex.source_index!r})"
        fitted = fit_prompt(ids, cfg.data.max_prompt_length, cfg.data.truncation, where)
        if fitted is None:
            continue
        ids = fitted
        prompts.append(
            scheduler_pb2.EvalPrompt(
                id=f"val-{ex.index}", prompt_token_ids=ids, prompt=text, ground_truth=ex.ground_truth
            )
        )
    if not prompts:
        raise AsyncdapoError(
            f"every validation prompt is longer than data.max_prompt_length ({cfg.data.max_prompt_length}) "
            "and data.truncation is drop: raise max_prompt_length or truncate (left, right, middle)"
        )
    sampling = common_pb2.SamplingParams(
        max_tokens=cfg.data.max_response_length,
        temperature=cfg.rollout.val_temperature,
        top_p=cfg.rollout.val_top_p,
        top_k=cfg.rollout.val_top_k,
    )
    return scheduler_pb2.EvaluateRequest(prompts=prompts, n=cfg.rollout.val_n, sampling=sampling)
