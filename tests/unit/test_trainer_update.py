"""The PPO update's batching: micro-batch gradient accumulation gives the mini-batch gradient, and
data-parallel sharding keeps every rank's collective calls aligned."""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Iterator

import pytest
import torch

from asyncdapo.contracts.config import ConfigError, OldLogProbSource, RunConfig, parse_run_config
from asyncdapo.contracts.v1 import rollout_pb2
from asyncdapo.services.trainer.algos import grpo_advantages
from asyncdapo.services.trainer.batch import TrainBatch, build_batch
from asyncdapo.services.trainer.dist import DistContext
from asyncdapo.services.trainer.model import Precision, compute_log_probs
from asyncdapo.services.trainer.update import (
    Recompute,
    UpdateSettings,
    micro_chunks,
    mini_batch_rows,
    old_log_probs,
    ppo_update,
)


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


def _tiny_policy() -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg_model = Qwen2Config(
        vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
    )  # fmt: skip
    return Qwen2ForCausalLM(cfg_model)


@pytest.mark.parametrize(
    "mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
)
def test_gradient_accumulation_matches_one_pass(mode: str) -> None:
    base = _tiny_policy()
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


# ----------------------------------------------------------------------------- old log-probs


PREC = Precision(torch.float32, torch.device("cpu"))


def _recompute(model: torch.nn.Module, batch: TrainBatch, calls: list[list[int]]) -> Recompute:
    """What the loop passes: the current weights on `rows`, scattered into full-size tensors."""

    def run(rows: list[int], with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor]:
        calls.append(rows)
        lp, ent = compute_log_probs(
            model, batch.select(rows), micro_batch_size=4, temperature=1.0, precision=PREC,
            with_entropy=with_entropy,
        )  # fmt: skip
        full_lp, full_ent = torch.zeros_like(batch.response_mask), torch.zeros_like(batch.response_mask)
        full_lp[rows] = lp
        if ent is not None:
            full_ent[rows] = ent
        return full_lp, full_ent

    return run


def _with_behaviour(groups: list[rollout_pb2.Group], lp: torch.Tensor, shift: float = 0.0) -> None:
    """Give every response the engine log-probs `lp + shift` of its tokens (rows in batch order)."""
    rows = [r for g in groups for r in g.responses]
    for i, r in enumerate(rows):
        r.logprobs[:] = (lp[i, : len(r.token_ids)] + shift).tolist()


def _cfg(old_log_prob: str, **algorithm: object) -> RunConfig:
    return parse_run_config({
        "data": {"train_batch_size": 3}, "rollout": {"n": 3}, "reward": {"overlong_buffer": {"enable": False}},
        "algorithm": {"old_log_prob": old_log_prob, **algorithm},
        "trainer": {"ppo_mini_batch_size": 3, "micro_batch_size": 4, "grad_clip": 1e9},
    })  # fmt: skip


def _train(
    base: torch.nn.Module, batch: TrainBatch, source: str
) -> tuple[dict[str, float], dict[str, torch.Tensor], list[list[int]]]:
    """One update of a copy of `base` with old log-probs from `source`: (metrics, delta, passes)."""
    model = copy.deepcopy(base)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)  # params move by exactly -grad
    calls: list[list[int]] = []
    rows = list(range(batch.size))
    old, _, _ = old_log_probs(OldLogProbSource(source), batch, rows, _recompute(model, batch, calls))
    adv = grpo_advantages(batch.rewards, batch.group_ordinal)
    metrics = ppo_update(
        model, opt, batch, adv, old, UpdateSettings.from_config(_cfg(source)), DistContext(), PREC,
        first_epoch_stats=source == "rollout",
    )  # fmt: skip
    delta = {k: v - base.state_dict()[k] for k, v in model.state_dict().items()}
    return metrics, delta, calls


def test_rollout_log_probs_equal_to_recomputed_give_the_same_update_without_the_pass() -> None:
    base = _tiny_policy()
    groups = _groups()
    lp, _ = compute_log_probs(
        base, build_batch(groups, 0), micro_batch_size=9, temperature=1.0, precision=PREC
    )
    _with_behaviour(groups, lp)
    batch = build_batch(groups, 0)
    m_re, d_re, calls_re = _train(base, batch, "recompute")
    m_ro, d_ro, calls_ro = _train(base, batch, "rollout")
    assert calls_re == [list(range(9))] and calls_ro == []  # rollout: no forward pass before the update
    assert m_ro["actor/pg_loss"] == pytest.approx(m_re["actor/pg_loss"], abs=1e-6)
    for k, d in d_re.items():
        assert torch.allclose(d_ro[k], d, atol=1e-6, rtol=0), k
    assert any(d.abs().max() > 0 for d in d_re.values())
    # measured in the update when no pass precedes it: the engine matches the trainer exactly here
    assert m_ro["rollout/kl"] == pytest.approx(0.0, abs=1e-6)
    assert m_ro["actor/entropy"] > 0 and "actor/entropy" not in m_re


def test_rollout_mode_ratio_is_taken_against_the_behaviour_log_probs() -> None:
    base = _tiny_policy()
    g = rollout_pb2.Group(prompt_id="p", prompt_token_ids=[5, 6, 7])
    g.responses.add(
        token_ids=[8, 9], reward=1.0
    )  # a single response: advantage = its reward (1 / (1 + 1e-6))
    lp, _ = compute_log_probs(base, build_batch([g], 0), micro_batch_size=1, temperature=1.0, precision=PREC)
    # the engine saw each token as 0.1 more / 0.05 less likely than the trainer's weights do
    g.responses[0].logprobs[:] = (lp[0] + torch.tensor([0.1, -0.05])).tolist()
    batch = build_batch([g], 0)
    a = 1.0 / (1.0 + 1e-6)
    m_ro, _, _ = _train(base, batch, "rollout")
    # ratio = exp(logp - behaviour) = exp(-0.1), exp(0.05): inside [0.8, 1.28], so no clipping
    assert m_ro["actor/pg_loss"] == pytest.approx(-a * (math.exp(-0.1) + math.exp(0.05)) / 2, abs=1e-6)
    assert m_ro["actor/ppo_kl"] == pytest.approx((0.1 - 0.05) / 2, abs=1e-6)  # k1 of KL(behaviour || pi)
    assert m_ro["rollout/kl"] == pytest.approx((0.1 - 0.05) / 2, abs=1e-6)
    m_re, _, _ = _train(base, batch, "recompute")  # ratio 1: the behaviour log-probs play no part
    assert m_re["actor/pg_loss"] == pytest.approx(-a, abs=1e-6)
    assert m_re["actor/ppo_kl"] == pytest.approx(0.0, abs=1e-6)


def test_rollout_mode_recomputes_only_rows_without_behaviour_log_probs() -> None:
    base = _tiny_policy()
    groups = _groups()
    batch0 = build_batch(groups, 0)
    lp, _ = compute_log_probs(base, batch0, micro_batch_size=9, temperature=1.0, precision=PREC)
    _with_behaviour(groups, lp, shift=-0.5)
    del groups[1].responses[2].logprobs[:]  # rows 5 and 6: their gateway reported none
    del groups[2].responses[0].logprobs[:]
    batch = build_batch(groups, 0)
    calls: list[list[int]] = []
    mine = [0, 2, 4, 5, 8]  # this rank's rows: it recomputes only row 5
    old, ent, fallback = old_log_probs(OldLogProbSource.ROLLOUT, batch, mine, _recompute(base, batch, calls))
    assert calls == [[5]] and fallback == [5, 6] and ent is None
    n5 = int(batch.response_mask[5].sum())
    assert torch.allclose(old[5, :n5], lp[5, :n5], atol=1e-6)  # recomputed: the ratio starts at 1
    for r in (0, 2, 4, 8):
        n = int(batch.response_mask[r].sum())
        assert torch.allclose(old[r, :n], lp[r, :n] - 0.5, atol=1e-6)  # the engine's values
    # a rank without such rows still runs one row, so sharded ranks run the same collectives
    calls.clear()
    old_log_probs(OldLogProbSource.ROLLOUT, batch, [0, 1], _recompute(base, batch, calls))
    assert calls == [[0]]
    # every response reported: no pass at all
    calls.clear()
    full = build_batch(_groups(), 0)
    full.rollout_logprob_mask.fill_(1.0)
    old_log_probs(OldLogProbSource.ROLLOUT, full, [0, 1], _recompute(base, full, calls))
    assert calls == []


def test_tis_cap_with_rollout_log_probs_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"tis_cap \(2.0\) cannot be used with old_log_prob: rollout"):
        _cfg("rollout", tis_cap=2.0)
    assert _cfg("recompute", tis_cap=2.0).algorithm.tis_cap == 2.0
