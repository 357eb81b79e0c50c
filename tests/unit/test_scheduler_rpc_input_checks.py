"""The scheduler's RPC input checks (`rpc_input_checks`), on the inputs the scheduler fuzz found and
their neighbours: each refusal names the field, what was given and what is allowed."""

from __future__ import annotations

import math

import pytest

from asyncdapo.contracts.config import RunConfig
from asyncdapo.contracts.v1 import common_pb2
from asyncdapo.services.scheduler.rpc_input_checks import (
    MAX_URI_CHARS,
    RequestError,
    check_eval_prompt_ids,
    check_eval_sampling,
    check_publish,
    largest_version,
)


def _cfg(b: int = 4, s: float = 0) -> RunConfig:
    return RunConfig.model_validate(
        {
            "data": {"train_batch_size": b},
            "trainer": {"ppo_mini_batch_size": b},
            "rollout": {"max_staleness": s},
        }
    )


@pytest.mark.parametrize(("b", "s"), [(4, 0), (1, 0), (3, 0.5), (512, 3.4)])
def test_the_largest_version_is_accepted_and_its_bound_fits_a_run_status(b: int, s: float) -> None:
    cfg = _cfg(b, s)
    most = largest_version(cfg)
    check_publish(most, "/ckpt/v", cfg)
    bound = cfg.valid_group_bound(most)
    assert 0 < bound <= 2**53 < 2**63  # RunStatus.valid_groups_bound is an int64
    assert abs(bound - math.floor((most + 1 + s) * b)) <= 1
    with pytest.raises(RequestError, match=f"up to version {most}"):
        check_publish(most + 1, "/ckpt/v", cfg)


def test_a_version_past_int64_bounds_is_refused_naming_the_run_limit() -> None:
    """Found by the fuzz: 2**63 - 1 was published, and every GetRun then failed (bound > int64)."""
    with pytest.raises(RequestError) as e:
        check_publish(2**63 - 1, "/ckpt/v1", _cfg())
    msg = str(e.value)
    assert str(2**63 - 1) in msg and "train_batch_size 4" in msg and f"{2**51 - 1}" in msg


@pytest.mark.parametrize(
    ("version", "uri", "message"),
    [
        (0, "/ckpt", "version must be > 0"),
        (-5, "/ckpt", "got -5"),
        (1, "", "uri is required"),
        (1, "   ", "uri is required"),
        (1, "x" * (MAX_URI_CHARS + 1), f"at most {MAX_URI_CHARS}"),
        (1, "/ckpt/\x00v1", "NUL"),
        (1, "s3://bucket/v1", "scheme 's3' is not supported"),
        (1, "stream://", "stream://HOST:PORT"),
        (1, "stream://host:99999", "port in 1..65535"),
    ],
)
def test_publish_refuses_a_version_or_uri_out_of_bounds(version: int, uri: str, message: str) -> None:
    with pytest.raises(RequestError, match=message.replace("*", r"\*")):
        check_publish(version, uri, _cfg())


@pytest.mark.parametrize("uri", ["/ckpt/v1", "relative/v1", "file:///ckpt/v1", "stream://10.0.0.3:50070"])
def test_publish_accepts_every_uri_form_a_gateway_loads(uri: str) -> None:
    check_publish(1, uri, _cfg())


def test_an_echoed_uri_is_cut() -> None:
    with pytest.raises(RequestError) as e:
        check_publish(1, "q://" + "é" * 3000, _cfg())
    assert len(str(e.value)) < 300 and "3004 characters" in str(e.value)


def _sampling(**kw: object) -> common_pb2.SamplingParams:
    fields: dict[str, object] = {"max_tokens": 16, "temperature": 1.0, "top_p": 1.0, "top_k": -1, **kw}
    return common_pb2.SamplingParams(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("max_tokens", 0, "sampling.max_tokens must be > 0, got 0"),
        ("temperature", -0.5, "sampling.temperature must be a finite number >= 0"),
        ("temperature", float("nan"), "sampling.temperature"),
        ("top_p", 0.0, r"sampling.top_p must be in \(0, 1\], got 0.0"),
        ("top_p", -0.0, "sampling.top_p"),  # found by the fuzz: 8 tries on the gateway, then UNAVAILABLE
        ("top_p", 1.5, "sampling.top_p"),
        ("top_p", float("inf"), "sampling.top_p"),
        ("top_k", -2, "sampling.top_k must be -1 or 0"),
    ],
)
def test_eval_sampling_a_gateway_would_refuse_is_refused_first(
    field: str, value: float, message: str
) -> None:
    s = _sampling()
    setattr(s, field, value)
    with pytest.raises(RequestError, match=message):
        check_eval_sampling(s)


def test_eval_sampling_in_bounds_passes_and_negative_stop_ids_do_not() -> None:
    check_eval_sampling(_sampling(top_k=0, stop_token_ids=[0, 7]))
    check_eval_sampling(common_pb2.SamplingParams(max_tokens=1))  # unset fields: the gateway's defaults
    with pytest.raises(RequestError, match=r"sampling.stop_token_ids\[1\] = -3"):
        check_eval_sampling(_sampling(stop_token_ids=[2, -3]))


def test_negative_prompt_token_ids_are_refused_naming_the_prompt_and_position() -> None:
    check_eval_prompt_ids([0, 5, 31999], 0)
    with pytest.raises(RequestError, match=r"prompts\[2\].prompt_token_ids\[1\] = -186"):
        check_eval_prompt_ids([5, -186, -1], 2)
