"""Validation of Generate requests: pure checks that turn a wire request into an engine request.

Every rejection names the offending field so a caller can fix it without reading gateway logs.
Tokenization of a text prompt is passed in as a function so this module stays free of I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from asyncdapo.contracts.v1 import gateway_pb2
from asyncdapo.services.gateway.engine import EngineRequest, Sampling
from asyncdapo.services.gateway.versions import Runs, check_runs

MAX_REQUEST_ID_LEN = 256


class Rejection(StrEnum):
    """Why an RPC was refused; each value is a metric label and maps to one gRPC status code."""

    INVALID_ARGUMENT = "invalid_argument"
    FAILED_PRECONDITION = "failed_precondition"
    DUPLICATE_ID = "duplicate_id"
    UNAUTHENTICATED = "unauthenticated"
    DRAINING = "draining"
    STARTING = "starting"  # the engine is still loading


class RequestError(ValueError):
    def __init__(self, reason: Rejection, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _invalid(message: str) -> RequestError:
    return RequestError(Rejection.INVALID_ARGUMENT, message)


@dataclass(frozen=True)
class ModelLimits:
    max_model_len: int
    vocab_size: int


@dataclass(frozen=True)
class GenerateInput:
    """A validated Generate request.

    Invariants: the prompt is non-empty and in-vocabulary; continuation tokens, log-probs and
    runs have equal length; `engine.sampling.max_tokens` is what is left after the continuation,
    clamped to the context (0 means nothing is left to generate).
    """

    request_id: str
    prompt_token_ids: list[int]
    continuation_token_ids: list[int]
    continuation_logprobs: list[float]
    continuation_runs: Runs
    engine: EngineRequest


def _check_vocab(ids: Sequence[int], field: str, vocab_size: int) -> None:
    if not ids or (min(ids) >= 0 and max(ids) < vocab_size):  # the common case, at C speed
        return
    for i, t in enumerate(ids):
        if not 0 <= t < vocab_size:
            raise _invalid(f"{field}[{i}] = {t} is outside the vocabulary [0, {vocab_size})")


def _sampling(req: gateway_pb2.GenerateRequest, limits: ModelLimits) -> Sampling:
    s = req.sampling
    if s.max_tokens <= 0:
        raise _invalid(f"sampling.max_tokens must be > 0, got {s.max_tokens}")
    temperature = s.temperature if s.HasField("temperature") else 1.0
    if not (math.isfinite(temperature) and temperature >= 0.0):
        raise _invalid(f"sampling.temperature must be a finite number >= 0, got {temperature}")
    top_p = s.top_p if s.HasField("top_p") else 1.0
    if not (math.isfinite(top_p) and 0.0 < top_p <= 1.0):
        raise _invalid(f"sampling.top_p must be in (0, 1], got {top_p}")
    top_k = s.top_k if s.HasField("top_k") else -1
    if top_k < -1:
        raise _invalid(f"sampling.top_k must be -1 or 0 (disabled) or >= 1, got {top_k}")
    _check_vocab(s.stop_token_ids, "sampling.stop_token_ids", limits.vocab_size)
    return Sampling(
        max_tokens=s.max_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=-1 if top_k == 0 else top_k,
        seed=s.seed if s.HasField("seed") else None,
        stop_token_ids=tuple(s.stop_token_ids),
        ignore_eos=s.ignore_eos,
    )


def _prompt(
    req: gateway_pb2.GenerateRequest, limits: ModelLimits, tokenize: Callable[[str], list[int]]
) -> list[int]:
    if req.prompt_token_ids and req.prompt:
        raise _invalid("set only one of prompt_token_ids and prompt (text)")
    if req.prompt_token_ids:
        ids = list(req.prompt_token_ids)
        _check_vocab(ids, "prompt_token_ids", limits.vocab_size)
        return ids
    if not req.prompt:
        raise _invalid("prompt is empty: set prompt_token_ids or prompt (text)")
    ids = tokenize(req.prompt)
    if not ids:
        raise _invalid("prompt (text) tokenizes to zero tokens")
    return ids


def validate_generate(
    req: gateway_pb2.GenerateRequest,
    limits: ModelLimits,
    tokenize: Callable[[str], list[int]],
    request_id: str,
) -> GenerateInput:
    """Check `req` and build the engine request; raises RequestError naming the wrong field."""
    if len(request_id) > MAX_REQUEST_ID_LEN:
        raise _invalid(f"request_id is longer than {MAX_REQUEST_ID_LEN} characters")
    sampling = _sampling(req, limits)
    prompt = _prompt(req, limits, tokenize)

    cont = list(req.continuation_token_ids)
    _check_vocab(cont, "continuation_token_ids", limits.vocab_size)
    if len(req.continuation_logprobs) != len(cont):
        raise _invalid(
            f"continuation_logprobs has {len(req.continuation_logprobs)} entries, "
            f"continuation_token_ids has {len(cont)}"
        )
    try:
        cont_runs = check_runs(
            ((r.version, r.num_tokens) for r in req.continuation_versions), len(cont), "continuation_versions"
        )
    except ValueError as err:
        raise _invalid(str(err)) from None
    if len(cont) > sampling.max_tokens:
        raise _invalid(
            f"continuation_token_ids has {len(cont)} tokens, more than sampling.max_tokens ({sampling.max_tokens})"
        )

    context_left = limits.max_model_len - len(prompt) - len(cont)
    if context_left < 1:
        raise _invalid(
            f"prompt_token_ids: the prompt ({len(prompt)} tokens) plus the continuation ({len(cont)}) "
            f"leave no room in the model's context of {limits.max_model_len} tokens"
        )
    left = min(sampling.max_tokens - len(cont), context_left)
    engine_sampling = Sampling(
        max_tokens=left,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        seed=sampling.seed,
        stop_token_ids=sampling.stop_token_ids,
        ignore_eos=sampling.ignore_eos,
    )
    return GenerateInput(
        request_id=request_id,
        prompt_token_ids=prompt,
        continuation_token_ids=cont,
        continuation_logprobs=list(req.continuation_logprobs),
        continuation_runs=cont_runs,
        engine=EngineRequest(request_id, prompt + cont, engine_sampling),
    )
