"""The one Evaluate request builder (trainer validation and `asyncdapo up` use it alike)."""

from __future__ import annotations

import pytest

from asyncdapo.contracts.config import parse_run_config
from asyncdapo.contracts.errors import AsyncdapoError
from asyncdapo.contracts.verl_format import Example
from asyncdapo.services.trainer.eval_request import eval_request


def _ex(i: int, words: int) -> Example:
    return Example(prompt=" ".join(["w"] * words), ground_truth=str(i), data_source="t", index=i)


def _encode(e: Example) -> tuple[list[int], str]:
    text = str(e.prompt)
    return list(range(len(text.split()))), text


def test_prompts_longer_than_the_training_limit_are_left_out_and_sampling_follows_the_run() -> None:
    cfg = parse_run_config(
        {
            "data": {"max_prompt_length": 4, "max_response_length": 256},
            # training samples with top_p 0.5 / top_k 50; validation with its own settings
            "rollout": {
                "val_temperature": 0.3,
                "val_top_p": 0.9,
                "val_top_k": 5,
                "val_n": 2,
                "top_p": 0.5,
                "top_k": 50,
            },
        }
    )
    req = eval_request(cfg, [_ex(0, 3), _ex(1, 9), _ex(2, 4)], _encode)
    assert [p.id for p in req.prompts] == ["val-0", "val-2"]
    assert [p.ground_truth for p in req.prompts] == ["0", "2"]
    assert req.n == 2
    s = req.sampling
    assert (s.max_tokens, round(s.temperature, 3), round(s.top_p, 3), s.top_k) == (256, 0.3, 0.9, 5)


def test_no_prompt_that_fits_is_an_error_naming_the_limit() -> None:
    cfg = parse_run_config({"data": {"max_prompt_length": 2}})
    with pytest.raises(AsyncdapoError, match=r"data\.max_prompt_length"):
        eval_request(cfg, [_ex(0, 3)], _encode)
