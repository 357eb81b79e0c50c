"""The PPO update's batching: micro-batch gradient accumulation gives the mini-batch gradient, and
data-parallel sharding keeps every rank's collective calls aligned."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator

import pytest
import torch

from asyncdapo.config import parse_run_config
from asyncdapo.trainer.algos import grpo_advantages
from asyncdapo.trainer.batch import build_batch
from asyncdapo.trainer.dist import DistContext
from asyncdapo.trainer.model import Precision, compute_log_probs
from asyncdapo.trainer.update import UpdateSettings, micro_chunks, mini_batch_rows, ppo_update
from asyncdapo.v1 import rollout_pb2


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("n_rows", [1, 4, 5, 7, 16])
@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("mbs", [1, 2, 5])
def test_micro_chunks_cover_rows_once_with_equal_counts_per_rank(n_rows: int, world: int, mbs: int) -> None:
    rows = list(range(100, 100 + n_rows))
    per_rank = [micro_chunks(rows, DistContext(rank=r, world=world), mbs) for r in range(world)]
    assert len({len(c) for c in per_rank}) == 1  # same number of backward passes on every rank
    flat = sorted(x for chunks in per_rank for c in chunks for x in c)
    assert flat == rows
    assert all(len(c) <= mbs for chunks in per_rank for c in chunks)


def _groups() -> list[rollout_pb2.Group]:
    gen = torch.Generator().manual_seed(0)
    groups = []
    for k in range(3):
        g = rollout_pb2.Group(
            prompt_id=f"p{k}", prompt_token_ids=torch.randint(3, 60, (2 + k,), generator=gen).tolist()
        )
        for i in range(3):
            n = int(torch.randint(1, 7, (1,), generator=gen))
            g.responses.add(
                token_ids=torch.randint(3, 60, (n,), generator=gen).tolist(), reward=float(i == k)
            )
        groups.append(g)
    return groups


def test_mini_batches_are_whole_groups() -> None:
    batch = build_batch(_groups(), 0)
    assert mini_batch_rows(batch, 2) == [list(range(6)), list(range(6, 9))]


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_gradient_accumulation_matches_one_pass(mode: str) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg_model = Qwen2Config(
        vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
    )  # fmt: skip
    base = Qwen2ForCausalLM(cfg_model)
    cfg = parse_run_config({
        "data": {"train_batch_size": 3}, "rollout": {"n": 3}, "reward": {"overlong_buffer": {"enable": False}},
        "algorithm": {"loss_agg_mode": mode},
        "trainer": {"ppo_mini_batch_size": 3, "micro_batch_size": 9, "grad_clip": 1e9},
    })  # fmt: skip
    prec = Precision(torch.float32, torch.device("cpu"))
    batch = build_batch(_groups(), 0)
    old, _ = compute_log_probs(base, batch, micro_batch_size=9, temperature=1.0, precision=prec)
    old = old - 0.05 * torch.arange(old.shape[1])  # ratio != 1 so clipping takes part
    adv = grpo_advantages(batch.rewards, batch.group_ordinal)
    deltas = []
    for mbs in (9, 2, 1):
        model = copy.deepcopy(base)
        opt = torch.optim.SGD(model.parameters(), lr=1.0)  # params move by exactly -grad
        settings = dataclasses.replace(UpdateSettings.from_config(cfg), micro_batch_size=mbs)
        ppo_update(model, opt, batch, adv, old, settings, DistContext(), prec)
        deltas.append({k: v - base.state_dict()[k] for k, v in model.state_dict().items()})
    for other in deltas[1:]:
        for k, d in deltas[0].items():
            assert torch.allclose(other[k], d, atol=1e-6, rtol=1e-4), k
    assert any(d.abs().max() > 0 for d in deltas[0].values())
