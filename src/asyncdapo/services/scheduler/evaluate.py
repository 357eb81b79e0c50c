"""Eval mode: every prompt completes — no group state, no filtering, no early stop, no bound.

Evaluation requests share the dispatcher and the verifier batcher with the rollout (same
gateways, same FIFO queue, same retries), but never touch the prompt queue or the groups stream.

Bounds (checked before anything is dispatched, so a bad request costs nothing and changes
nothing): `n` between 1 and `MAX_N`; at most `MAX_PROMPTS` prompts and `MAX_RESPONSES` responses
(prompts × n) per call — a larger evaluation is split by the caller; prompt ids unique (results
are matched by them; empty ids are matched by position); every prompt has tokens (>= 0) or text
and a ground truth; the sampling (the run's validation sampling, the request's fields over it) is
one a gateway accepts (`rpc_input_checks.check_eval_sampling`). What only a gateway can judge (token
ids past its vocabulary, a prompt longer than its context) it refuses as INVALID_ARGUMENT, and the
evaluation ends at once with that refusal (`EvalRefused`), never retried elsewhere.
"""

from __future__ import annotations

import asyncio
import uuid

from asyncdapo.contracts.v1 import scheduler_pb2
from asyncdapo.runtime.status_details import shown
from asyncdapo.services.scheduler.rollout import Rollout
from asyncdapo.services.scheduler.rpc_input_checks import (
    RequestError,
    check_eval_prompt_ids,
    check_eval_sampling,
)
from asyncdapo.services.scheduler.tasks import Kind, PromptTask

MAX_N = 1024  # as RunConfig's rollout.val_n
MAX_PROMPTS = 10_000
MAX_RESPONSES = 65_536


class EvalInputError(RequestError):
    """An evaluation request out of bounds: INVALID_ARGUMENT before anything is dispatched."""


def check_request(req: scheduler_pb2.EvaluateRequest) -> None:
    """Raise RequestError (EvalInputError) naming the first field out of bounds."""
    if not req.prompts:
        raise EvalInputError("prompts: at least one prompt is required")
    if not 1 <= req.n <= MAX_N:
        raise EvalInputError(f"n (responses per prompt) must be between 1 and {MAX_N}, got {req.n}")
    if len(req.prompts) > MAX_PROMPTS:
        raise EvalInputError(
            f"prompts: {len(req.prompts)} in one call, at most {MAX_PROMPTS}: split the evaluation"
        )
    if len(req.prompts) * req.n > MAX_RESPONSES:
        raise EvalInputError(
            f"{len(req.prompts)} prompts × n={req.n} = {len(req.prompts) * req.n} responses in one call, "
            f"at most {MAX_RESPONSES}: split the evaluation"
        )
    seen: dict[str, int] = {}
    for i, p in enumerate(req.prompts):
        if p.id and p.id in seen:
            raise EvalInputError(
                f"prompts[{i}].id {shown(p.id)} repeats prompts[{seen[p.id]}].id: ids must be unique"
            )
        seen.setdefault(p.id, i)
        if not p.prompt_token_ids and not p.prompt:
            raise EvalInputError(f"prompts[{i}]: one of prompt_token_ids or prompt is required")
        check_eval_prompt_ids(p.prompt_token_ids, i)
        if not p.ground_truth:
            raise EvalInputError(f"prompts[{i}].ground_truth is empty")


async def evaluate(rollout: Rollout, req: scheduler_pb2.EvaluateRequest) -> scheduler_pb2.EvaluateResponse:
    check_request(req)
    n = req.n
    sampling = rollout.sampling(validation=True)  # what the request sets overrides these
    if req.HasField("sampling"):
        sampling.MergeFrom(req.sampling)
    check_eval_sampling(sampling)
    run_id = uuid.uuid4().hex[:8]
    tasks: list[PromptTask] = []
    for i, p in enumerate(req.prompts):
        t = PromptTask(
            kind=Kind.EVAL,
            pid=f"eval-{run_id}-{i}",  # the position: ids may be empty, and "3" may be another's index
            attempt=0,
            seq=i,
            n=n,
            prompt_token_ids=list(p.prompt_token_ids),
            prompt_text=p.prompt,
            ground_truth=p.ground_truth,
            sampling=sampling,
            version_admitted=rollout.version,
        )
        tasks.append(t)
    try:
        await asyncio.gather(*rollout.submit_eval(tasks))
    finally:
        rollout.evals.forget(tasks)
    out = scheduler_pb2.EvaluateResponse(policy_version=rollout.version)
    accs: list[float] = []
    lengths: list[int] = []
    for p, t in zip(req.prompts, tasks, strict=True):
        r = out.results.add(id=p.id)
        for resp, sc in zip(t.responses, t.scores, strict=True):
            assert resp is not None and sc is not None
            r.acc.append(sc.acc)
            r.score.append(sc.score)  # reward.correct_reward / incorrect_reward: accuracy is acc's mean
            r.response_length.append(len(resp.token_ids))
            r.pred.append(sc.pred)
            accs.append(sc.acc)
            lengths.append(len(resp.token_ids))
    out.accuracy = sum(accs) / len(accs)
    out.mean_response_length = sum(lengths) / len(lengths)
    return out
