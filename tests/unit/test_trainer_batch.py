"""Batch building: padding layout, masks, positions, validation, and that padding never changes
the log-probs a model assigns to a response."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from asyncdapo.contracts.v1 import common_pb2, rollout_pb2
from asyncdapo.services.trainer.batch import (
    MalformedGroup,
    build_batch,
    group_row_ranges,
    validate_group,
)
from asyncdapo.services.trainer.model import Precision, compute_log_probs

PAD = 0


@pytest.fixture()
def one_torch_thread() -> Iterator[None]:
    """A shared small box: OpenMP's spinning threads make tiny-model passes ~5x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _group(
    pid: str, prompt: list[int], responses: list[list[int]], rewards: list[float]
) -> rollout_pb2.Group:
    g = rollout_pb2.Group(run="r", prompt_id=pid, prompt_token_ids=prompt, min_version=0, max_version=0)
    for toks, rew in zip(responses, rewards, strict=True):
        g.responses.add(
            token_ids=toks,
            logprobs=[-0.5] * len(toks),
            version_runs=[common_pb2.VersionRun(version=0, num_tokens=len(toks))] if toks else [],
            finish_reason=common_pb2.FINISH_REASON_STOP,
            reward=rew,
            score=rew,
            acc=rew,
        )
    return g


def test_layout_left_padded_prompts_right_padded_responses() -> None:
    groups = [
        _group("a", [5, 6, 7], [[8, 9], [10]], [1.0, 0.0]),
        _group("b", [11], [[12, 13, 14], []], [0.0, 1.0]),
    ]
    b = build_batch(groups, PAD)
    assert b.prompt_length == 3
    assert b.input_ids.tolist() == [
        [5, 6, 7, 8, 9, PAD],
        [5, 6, 7, 10, PAD, PAD],
        [PAD, PAD, 11, 12, 13, 14],
        [PAD, PAD, 11, PAD, PAD, PAD],
    ]
    assert b.attention_mask.tolist() == [
        [1, 1, 1, 1, 1, 0],
        [1, 1, 1, 1, 0, 0],
        [0, 0, 1, 1, 1, 1],
        [0, 0, 1, 0, 0, 0],
    ]
    assert b.position_ids.tolist() == [
        [0, 1, 2, 3, 4, 4],
        [0, 1, 2, 3, 3, 3],
        [0, 0, 0, 1, 2, 3],
        [0, 0, 0, 0, 0, 0],
    ]
    assert b.response_mask.tolist() == [[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]]
    assert b.rollout_logprob_mask.tolist() == b.response_mask.tolist()
    assert b.rollout_log_probs[0].tolist() == [-0.5, -0.5, 0.0]
    assert b.group_ordinal.tolist() == [0, 0, 1, 1]
    assert b.group_index == ["a", "a", "b", "b"]
    assert b.rewards.tolist() == [1.0, 0.0, 0.0, 1.0]
    assert group_row_ranges(b) == [(0, 2), (2, 4)]
    sub = b.select([3, 0])
    assert sub.group_index == ["b", "a"] and sub.input_ids.shape == (2, 6)


def test_same_prompt_id_twice_still_two_groups() -> None:
    g = _group("a", [1], [[2], [3]], [1.0, 0.0])
    b = build_batch([g, g], PAD)
    assert group_row_ranges(b) == [(0, 2), (2, 4)]


def test_truncated_flag() -> None:
    g = _group("a", [1], [[2, 3, 4]], [0.0])
    g.responses[0].finish_reason = common_pb2.FINISH_REASON_LENGTH
    h = _group("b", [1], [[2]], [0.0])
    assert build_batch([g, h], PAD).truncated.tolist() == [True, False]


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda g: g.ClearField("prompt_token_ids"), "prompt_token_ids"),
        (lambda g: g.ClearField("responses"), "responses"),
        (lambda g: g.responses[0].logprobs.append(-1.0), "logprobs"),
        (lambda g: g.responses[0].token_ids.append(999), "token_ids"),
        (lambda g: g.responses[0].token_ids.extend([1] * 20), "max_response_length"),
        (lambda g: g.responses[0].version_runs[0].__setattr__("num_tokens", 7), "version_runs"),
        (lambda g: g.__setattr__("prompt_id", ""), "prompt_id"),
    ],
)
def test_validate_group_names_the_field(mutate, field: str) -> None:  # type: ignore[no-untyped-def]
    g = _group("a", [1, 2], [[3, 4], [5]], [1.0, 0.0])
    validate_group(g, vocab_size=100, max_response_length=16)
    mutate(g)
    with pytest.raises(MalformedGroup, match=field):
        validate_group(g, vocab_size=100, max_response_length=16)


def test_padding_does_not_change_log_probs(one_torch_thread: None) -> None:
    """Each row's log-probs in a padded batch equal those of the row run alone, unpadded."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
    )  # fmt: skip
    model = Qwen2ForCausalLM(cfg).eval()
    groups = [
        _group("a", [5, 6, 7, 8], [[9, 10, 11], [12]], [1.0, 0.0]),
        _group("b", [13], [[14, 15, 16, 17, 18], [19, 20]], [0.0, 1.0]),
    ]
    prec = Precision(torch.float32, torch.device("cpu"))
    batch = build_batch(groups, PAD)
    lp, ent = compute_log_probs(model, batch, micro_batch_size=3, temperature=0.7, precision=prec)
    assert ent is not None and ent.shape == lp.shape
    for i in range(batch.size):
        g, r = groups[i // 2], groups[i // 2].responses[i % 2]
        alone = build_batch([_group("x", list(g.prompt_token_ids), [list(r.token_ids)], [0.0])], PAD)
        lp1, _ = compute_log_probs(model, alone, micro_batch_size=1, temperature=0.7, precision=prec)
        n = len(r.token_ids)
        assert torch.allclose(lp[i, :n], lp1[0, :n], atol=1e-5), i
