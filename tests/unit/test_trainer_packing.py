"""Padding-free, token-budgeted micro-batches (trainer.packing, trainer.micro_batch_tokens): the
packed row holds only real tokens with positions restarting per sequence, a budget bounds every
micro-batch and keeps the ranks' pass counts equal, and the update (loss and gradient, every
loss_agg_mode) equals the padded fixed-size one."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from asyncdapo.contracts.config import LossAggMode, parse_run_config
from asyncdapo.contracts.v1 import rollout_pb2
from asyncdapo.services.trainer.algos import grpo_advantages
from asyncdapo.services.trainer.batch import TrainBatch, build_batch
from asyncdapo.services.trainer.dist import DistContext
from asyncdapo.services.trainer.model import Precision, compute_log_probs, forward_response
from asyncdapo.services.trainer.packing import (
    PACKED_SDPA,
    first_fit_decreasing,
    pack_rows,
    row_tokens,
    use_packed_attention,
)
from asyncdapo.services.trainer.update import UpdateSettings, budget_chunks, ppo_update

PAD = 0
CAP = 24  # the response cap: half the responses reach it, the rest are a few tokens
PREC = Precision(torch.float32, torch.device("cpu"))


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _groups() -> list[rollout_pb2.Group]:
    """4 groups of 4: prompts of 2-11 tokens; responses alternately at the cap and 1-5 tokens."""
    gen = torch.Generator().manual_seed(3)
    groups = []
    for k in range(4):
        g = rollout_pb2.Group(
            prompt_id=f"p{k}", prompt_token_ids=torch.randint(3, 60, (2 + 3 * k,), generator=gen).tolist()
        )
        for i in range(4):
            n = CAP if (i + k) % 2 == 0 else int(torch.randint(1, 6, (1,), generator=gen))
            g.responses.add(
                token_ids=torch.randint(3, 60, (n,), generator=gen).tolist(), reward=float((i + k) % 3 == 0)
            )
        groups.append(g)
    return groups


def _tiny_policy(**config: Any) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64, **config,
    )  # fmt: skip
    return Qwen2ForCausalLM(cfg)


def _per_sequence(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of `model` whose packed passes attend sequence by sequence (what the trainer runs)."""
    out = copy.deepcopy(model)
    use_packed_attention(out)
    assert getattr(out.config, "_attn_implementation", None) == PACKED_SDPA
    return out


# ----------------------------------------------------------------------------- the packed row


def test_packed_row_holds_every_real_token_once_with_positions_restarting_per_sequence() -> None:
    groups = _groups()
    batch = build_batch(groups, PAD)
    packed = pack_rows(batch)
    real = [list(g.prompt_token_ids) + list(r.token_ids) for g in groups for r in g.responses]
    assert packed.input_ids.shape == (1, sum(map(len, real)))
    assert packed.input_ids[0].tolist() == [t for seq in real for t in seq]  # rows end to end
    assert PAD not in packed.input_ids.tolist()[0]  # no pad token is computed
    assert packed.num_tokens < batch.input_ids.numel()  # the padded batch is larger
    assert packed.position_ids[0].tolist() == [p for seq in real for p in range(len(seq))]
    # each kept logit is the one just before a response token: it predicts that token
    assert torch.equal(packed.input_ids[0, packed.logit_index + 1], packed.labels)
    assert packed.labels.tolist() == [t for g in groups for r in g.responses for t in r.token_ids]


@pytest.mark.parametrize("attention", ["per-sequence", "block-diagonal mask"])
@pytest.mark.parametrize("sliding_window", [None, 8])
def test_packed_forward_gives_the_padded_forwards_log_probs_and_entropy(
    attention: str, sliding_window: int | None
) -> None:
    window = {} if sliding_window is None else {"use_sliding_window": True, "sliding_window": sliding_window,
                                               "max_window_layers": 0}  # fmt: skip
    model = _tiny_policy(**window)
    batch = build_batch(_groups(), PAD)
    mask = batch.response_mask.bool()
    padded = forward_response(model, batch, temperature=0.7, precision=PREC, with_entropy=True)
    if attention == "per-sequence":
        model = _per_sequence(model)
        # padded passes of the per-sequence model are SDPA's own
        again = forward_response(model, batch, temperature=0.7, precision=PREC, with_entropy=False)
        assert torch.equal(again[0], padded[0])
    packed = forward_response(model, batch, temperature=0.7, precision=PREC, with_entropy=True, packing=True)
    for a, b in zip(padded, packed, strict=True):
        assert a is not None and b is not None and a.shape == b.shape
        assert torch.allclose(b[mask], a[mask], atol=1e-5, rtol=1e-5)
        assert not b[~mask].any()  # padding holds 0
    # sequences do not see each other: a row packed with others equals that row alone
    alone, _ = forward_response(model, batch.select([5]), temperature=0.7, precision=PREC, with_entropy=False)
    assert torch.allclose(packed[0][5][mask[5]], alone[0][mask[5]], atol=1e-5, rtol=1e-5)
    budgeted, _ = compute_log_probs(
        model, batch, micro_batch_size=3, temperature=0.7, precision=PREC, with_entropy=False,
        packing=True, micro_batch_tokens=40,
    )  # fmt: skip
    assert torch.allclose(budgeted[mask], padded[0][mask].detach(), atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- the token budget


@pytest.mark.parametrize("budget", [1, 7, 30, 64, 10_000])
def test_first_fit_decreasing_covers_rows_once_within_the_budget(budget: int) -> None:
    tokens = [5, 30, 2, 2, 17, 30, 8, 1, 25, 3]
    bins = first_fit_decreasing(range(len(tokens)), tokens, budget)
    assert sorted(r for b in bins for r in b) == list(range(len(tokens)))
    for b in bins:
        assert sum(tokens[r] for r in b) <= budget or len(b) == 1  # a longer row goes alone
    assert len(bins) <= len(tokens)
    if budget >= sum(tokens):
        assert len(bins) == 1


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("budget", [10, 40, 100])
def test_budget_chunks_give_every_rank_the_same_number_of_passes(world: int, budget: int) -> None:
    batch = build_batch(_groups(), PAD)
    tokens = row_tokens(batch, packing=True)
    rows = list(range(2, 14))
    per_rank = [budget_chunks(rows, DistContext(rank=r, world=world), tokens, budget) for r in range(world)]
    assert len({len(c) for c in per_rank}) == 1  # same number of backward passes on every rank
    assert sorted(x for chunks in per_rank for c in chunks for x in c) == rows
    for chunks in per_rank:
        assert all(sum(tokens[r] for r in c) <= budget or len(c) == 1 for c in chunks)


def test_budget_counts_real_tokens_when_packed_and_the_padded_width_otherwise() -> None:
    batch = build_batch(_groups(), PAD)
    packed = row_tokens(batch, packing=True)
    assert packed == batch.attention_mask.sum(-1).tolist() and min(packed) < max(packed)
    assert row_tokens(batch, packing=False) == [batch.input_ids.shape[1]] * batch.size


# ----------------------------------------------------------------------------- the update


class _RecordingSGD(torch.optim.SGD):
    """Keeps the gradient of every parameter at each step (in parameter order); moves nothing."""

    def __init__(self, params: Iterator[torch.nn.Parameter]) -> None:
        super().__init__(params, lr=0.0)  # the weights stay: each step's gradient at the same point
        self.grads: list[list[torch.Tensor]] = []

    def step(self, closure: None = None) -> None:  # type: ignore[override]
        self.grads.append([p.grad.detach().clone() for g in self.param_groups for p in g["params"]])
        super().step()


def _update(
    base: torch.nn.Module, batch: TrainBatch, settings: UpdateSettings
) -> tuple[dict[str, float], list[list[torch.Tensor]]]:
    """One update of a copy of `base`: (metrics, the gradient of each optimizer step)."""
    model = _per_sequence(base) if settings.packing else copy.deepcopy(base)
    opt = _RecordingSGD(model.parameters())
    old, _ = compute_log_probs(base, batch, micro_batch_size=16, temperature=0.8, precision=PREC)
    old = old - 0.04 * torch.arange(old.shape[1])  # ratio != 1 so clipping takes part
    ref = old + 0.1 * torch.cos(torch.arange(old.shape[1], dtype=torch.float32))
    adv = grpo_advantages(batch.rewards, batch.group_ordinal)
    metrics = ppo_update(model, opt, batch, adv, old, settings, DistContext(), PREC, ref_log_prob=ref)
    return metrics, opt.grads


@pytest.mark.parametrize("mode", [m.value for m in LossAggMode])
def test_packed_token_budget_update_equals_the_padded_update(mode: str) -> None:
    base = _tiny_policy()
    batch = build_batch(_groups(), PAD)
    cfg = parse_run_config({
        "data": {"train_batch_size": 4, "max_response_length": CAP}, "rollout": {"n": 4, "temperature": 0.8},
        "reward": {"overlong_buffer": {"enable": False}},
        "algorithm": {"loss_agg_mode": mode, "entropy_coeff": 0.01, "kl_coef": 0.1},
        "trainer": {"ppo_mini_batch_size": 2, "micro_batch_size": 3, "grad_clip": 1e9,
                    "packing": False},
    })  # fmt: skip
    padded = UpdateSettings.from_config(cfg)
    assert not padded.packing and padded.micro_batch_tokens is None
    longest = max(row_tokens(batch, packing=True))
    # a budget below the longest sequence: those go alone, short ones share a pass
    packed = dataclasses.replace(padded, packing=True, micro_batch_tokens=longest - 3)
    m_pad, g_pad = _update(base, batch, padded)
    m_pk, g_pk = _update(base, batch, packed)
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy_loss", "actor/grad_norm", "actor/ppo_kl"):
        assert m_pk[key] == pytest.approx(m_pad[key], rel=1e-5, abs=1e-7), key
    assert m_pad["actor/pg_loss"] != 0.0 and m_pad["actor/kl_loss"] > 0.0
    assert len(g_pad) == len(g_pk) == 2  # two mini-batches: two optimizer steps
    for step_pad, step_pk in zip(g_pad, g_pk, strict=True):
        for i, (a, b) in enumerate(zip(step_pad, step_pk, strict=True)):
            assert float((b - a).norm()) <= 1e-5 * float(a.norm()) + 1e-12, i
        assert any(float(a.abs().max()) > 0 for a in step_pad)
