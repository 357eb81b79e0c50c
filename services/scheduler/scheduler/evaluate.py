"""Eval mode: every prompt completes — no group state, no filtering, no early stop, no bound.

Evaluation requests share the dispatcher and the verifier batcher with the rollout (same
gateways, same FIFO queue, same retries), but never touch the prompt queue or the groups stream.
"""

from __future__ import annotations

import asyncio
import uuid

from asyncdapo.scheduler.rollout import Rollout
from asyncdapo.scheduler.tasks import Kind, PromptTask
from asyncdapo.v1 import scheduler_pb2


class EvalInputError(ValueError):
    pass


async def evaluate(rollout: Rollout, req: scheduler_pb2.EvaluateRequest) -> scheduler_pb2.EvaluateResponse:
    if not req.prompts:
        raise EvalInputError("prompts: at least one prompt is required")
    n = req.n or rollout.cfg.rollout.val_n
    sampling = rollout.sampling(rollout.cfg.rollout.val_temperature)
    if req.HasField("sampling"):
        sampling.MergeFrom(req.sampling)
    if sampling.max_tokens <= 0:
        raise EvalInputError("sampling.max_tokens must be > 0")
    loop = asyncio.get_running_loop()
    run_id = uuid.uuid4().hex[:8]
    tasks: list[PromptTask] = []
    for i, p in enumerate(req.prompts):
        if not p.prompt_token_ids and not p.prompt:
            raise EvalInputError(f"prompts[{i}]: one of prompt_token_ids or prompt is required")
        if not p.ground_truth:
            raise EvalInputError(f"prompts[{i}].ground_truth is empty")
        t = PromptTask(
            kind=Kind.EVAL,
            pid=f"eval-{run_id}-{p.id or i}",
            attempt=0,
            seq=i,
            n=n,
            prompt_token_ids=list(p.prompt_token_ids),
            prompt_text=p.prompt,
            ground_truth=p.ground_truth,
            sampling=sampling,
            version_admitted=rollout.version,
        )
        t.future = loop.create_future()
        tasks.append(t)
    rollout.dispatcher.submit([r for t in tasks for r in t.make_requests()])
    await asyncio.gather(*(t.future for t in tasks))
    out = scheduler_pb2.EvaluateResponse(policy_version=rollout.version)
    accs: list[float] = []
    lengths: list[int] = []
    for p, t in zip(req.prompts, tasks, strict=True):
        r = out.results.add(id=p.id)
        for resp, sc in zip(t.responses, t.scores, strict=True):
            assert resp is not None and sc is not None
            r.acc.append(sc.acc)
            r.score.append(sc.score)
            r.response_length.append(len(resp.token_ids))
            r.pred.append(sc.pred)
            accs.append(sc.acc)
            lengths.append(len(resp.token_ids))
    out.accuracy = sum(accs) / len(accs)
    out.mean_response_length = sum(lengths) / len(lengths)
    return out
