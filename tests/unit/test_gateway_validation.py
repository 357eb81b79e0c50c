"""Generate-request validation: every rejection names the field at fault."""

from __future__ import annotations

import pytest

from asyncdapo.contracts.v1 import common_pb2, gateway_pb2
from asyncdapo.services.gateway.request_checks import ModelLimits, Rejection, RequestError, validate_generate

LIMITS = ModelLimits(max_model_len=32, vocab_size=100)


def _tokenize(text: str) -> list[int]:
    return [ord(c) % 100 for c in text]


def _req(**kw: object) -> gateway_pb2.GenerateRequest:
    sampling = kw.pop("sampling", common_pb2.SamplingParams(max_tokens=8))
    return gateway_pb2.GenerateRequest(request_id="r", sampling=sampling, **kw)  # type: ignore[arg-type]


def _error(req: gateway_pb2.GenerateRequest) -> str:
    with pytest.raises(RequestError) as info:
        validate_generate(req, LIMITS, _tokenize, "r")
    assert info.value.reason is Rejection.INVALID_ARGUMENT
    return str(info.value)


def test_token_prompt_becomes_an_engine_request_with_defaults() -> None:
    inp = validate_generate(_req(prompt_token_ids=[1, 2, 3]), LIMITS, _tokenize, "r")
    assert inp.prompt_token_ids == [1, 2, 3]
    assert inp.engine.prompt_token_ids == [1, 2, 3]
    s = inp.engine.sampling
    assert (s.max_tokens, s.temperature, s.top_p, s.top_k, s.seed) == (8, 1.0, 1.0, -1, None)


def test_text_prompt_is_tokenized() -> None:
    inp = validate_generate(_req(prompt="ab"), LIMITS, _tokenize, "r")
    assert inp.prompt_token_ids == [97, 98]


def test_sampling_fields_are_carried_over() -> None:
    sp = common_pb2.SamplingParams(
        max_tokens=4, temperature=0.0, top_p=0.5, top_k=0, seed=9, stop_token_ids=[7], ignore_eos=True
    )
    s = validate_generate(_req(prompt_token_ids=[1], sampling=sp), LIMITS, _tokenize, "r").engine.sampling
    assert (s.temperature, s.top_p, s.top_k, s.seed, s.stop_token_ids, s.ignore_eos) == (
        0.0,
        0.5,
        -1,
        9,
        (7,),
        True,
    )


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({}, "prompt is empty"),
        ({"prompt_token_ids": [1], "prompt": "x"}, "set only one of prompt_token_ids and prompt"),
        ({"prompt_token_ids": [1, 100]}, "prompt_token_ids[1] = 100 is outside the vocabulary [0, 100)"),
        (
            {"prompt_token_ids": [1], "sampling": common_pb2.SamplingParams()},
            "sampling.max_tokens must be > 0",
        ),
        (
            {"prompt_token_ids": [1], "sampling": common_pb2.SamplingParams(max_tokens=-3)},
            "sampling.max_tokens",
        ),
        (
            {"prompt_token_ids": [1], "sampling": common_pb2.SamplingParams(max_tokens=1, top_p=1.5)},
            "sampling.top_p",
        ),
        (
            {"prompt_token_ids": [1], "sampling": common_pb2.SamplingParams(max_tokens=1, top_p=0.0)},
            "sampling.top_p",
        ),
        (
            {"prompt_token_ids": [1], "sampling": common_pb2.SamplingParams(max_tokens=1, temperature=-1)},
            "sampling.temperature",
        ),
        (
            {"prompt_token_ids": [1], "sampling": common_pb2.SamplingParams(max_tokens=1, top_k=-2)},
            "sampling.top_k",
        ),
        (
            {
                "prompt_token_ids": [1],
                "sampling": common_pb2.SamplingParams(max_tokens=1, stop_token_ids=[500]),
            },
            "sampling.stop_token_ids[0] = 500",
        ),
        ({"prompt_token_ids": list(range(32))}, "prompt_token_ids: the prompt (32 tokens)"),
        (
            {"prompt_token_ids": [1], "continuation_token_ids": [2, 3], "continuation_logprobs": [-1.0]},
            "continuation_logprobs has 1 entries, continuation_token_ids has 2",
        ),
        (
            {"prompt_token_ids": [1], "continuation_token_ids": [2], "continuation_logprobs": [-1.0]},
            "continuation_versions cover 0 tokens but there are 1",
        ),
        (
            {
                "prompt_token_ids": [1],
                "continuation_token_ids": list(range(9)),
                "continuation_logprobs": [-1.0] * 9,
                "continuation_versions": [common_pb2.VersionRun(version=0, num_tokens=9)],
            },
            "continuation_token_ids has 9 tokens, more than sampling.max_tokens (8)",
        ),
    ],
)
def test_bad_requests_are_rejected_naming_the_field(kwargs: dict, fragment: str) -> None:
    assert fragment in _error(_req(**kwargs))


def test_text_prompt_that_tokenizes_to_nothing_is_rejected() -> None:
    with pytest.raises(RequestError, match="tokenizes to zero tokens"):
        validate_generate(_req(prompt="x"), LIMITS, lambda _: [], "r")


def test_overlong_request_id_is_rejected() -> None:
    with pytest.raises(RequestError, match="request_id is longer"):
        validate_generate(_req(prompt_token_ids=[1]), LIMITS, _tokenize, "x" * 300)


def test_continuation_is_appended_and_counts_against_max_tokens() -> None:
    req = _req(
        prompt_token_ids=[1, 2],
        continuation_token_ids=[5, 6, 7],
        continuation_logprobs=[-0.1, -0.2, -0.3],
        continuation_versions=[
            common_pb2.VersionRun(version=0, num_tokens=2),
            common_pb2.VersionRun(version=1, num_tokens=1),
        ],
    )
    inp = validate_generate(req, LIMITS, _tokenize, "r")
    assert inp.engine.prompt_token_ids == [1, 2, 5, 6, 7]
    assert inp.engine.sampling.max_tokens == 5
    assert inp.continuation_runs == [(0, 2), (1, 1)]
    assert inp.prompt_token_ids == [1, 2]


def test_max_tokens_is_clamped_to_the_context_left() -> None:
    inp = validate_generate(_req(prompt_token_ids=list(range(30))), LIMITS, _tokenize, "r")
    assert inp.engine.sampling.max_tokens == 2


def test_a_continuation_that_used_every_token_leaves_nothing_to_generate() -> None:
    req = _req(
        prompt_token_ids=[1],
        continuation_token_ids=[2] * 8,
        continuation_logprobs=[-1.0] * 8,
        continuation_versions=[common_pb2.VersionRun(version=0, num_tokens=8)],
    )
    assert validate_generate(req, LIMITS, _tokenize, "r").engine.sampling.max_tokens == 0
