"""The PPO update of one training batch: epochs → mini-batches (optimizer steps) → micro-batches.

Loss normalisation is global: every micro-batch's loss is divided by the token (or sequence)
count of its whole mini-batch, over all data-parallel ranks, and multiplied by the world size
that DDP's gradient averaging divides by again. The accumulated gradient is therefore exactly the
gradient of the mini-batch loss, whatever the micro-batch size or the number of workers.

Every rank runs the same number of micro-batches per mini-batch (DDP all-reduces on the last
backward, FSDP all-gathers in every forward and reduce-scatters in every backward); a rank whose
share runs out first repeats its mini-batch's shortest row with weight 0. A micro-batch is
`micro_batch_size` rows, or rows grouped by the `micro_batch_tokens` budget (packing.py); with
`packing` each runs as one padding-free pass. The same code trains a replica (DDP) or a shard
(FSDP, fsdp.py): the gradient norm is global either way.

With old log-probs from the rollout (`algorithm.old_log_prob: rollout`) no forward pass precedes
the update, so the update's first epoch also measures what that pass would have: `actor/entropy`
and `rollout/kl` (KL(behaviour || pi) on the tokens whose behaviour log-prob is known), each over
the policy as its mini-batch is trained (pi_old for the first mini-batch), as verl's bypass mode.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TypedDict

import numpy as np
import torch
from torch import Tensor, nn

from asyncdapo.contracts.config import OldLogProbSource, RunConfig
from asyncdapo.services.trainer.algos import agg_loss, low_var_kl, masked_sum, policy_loss
from asyncdapo.services.trainer.batch import TrainBatch, group_row_ranges, rows_without_behaviour_log_probs
from asyncdapo.services.trainer.dist import DistContext
from asyncdapo.services.trainer.fsdp import clip_grad_norm, no_sync
from asyncdapo.services.trainer.model import Precision, forward_response
from asyncdapo.services.trainer.packing import first_fit_decreasing, row_tokens


@dataclass(frozen=True)
class UpdateSettings:
    groups_per_mini_batch: int
    micro_batch_size: int
    packing: bool  # padding-free forward passes (packing.py)
    micro_batch_tokens: int | None  # token budget of a micro-batch; None: micro_batch_size rows
    ppo_epochs: int
    grad_clip: float
    clip_ratio_low: float
    clip_ratio_high: float
    clip_ratio_c: float
    loss_agg_mode: str
    entropy_coeff: float
    kl_coef: float
    temperature: float
    loss_horizon: int  # seq-mean-token-sum-norm's constant divisor: data.max_response_length

    @classmethod
    def from_config(cls, cfg: RunConfig) -> UpdateSettings:
        a, t = cfg.algorithm, cfg.trainer
        return cls(
            groups_per_mini_batch=t.ppo_mini_batch_size,
            micro_batch_size=t.micro_batch_size,
            packing=t.packing,
            micro_batch_tokens=t.micro_batch_tokens,
            ppo_epochs=t.ppo_epochs,
            grad_clip=t.grad_clip,
            clip_ratio_low=a.clip_ratio_low,
            clip_ratio_high=a.clip_ratio_high,
            clip_ratio_c=a.clip_ratio_c,
            loss_agg_mode=a.loss_agg_mode.value,
            entropy_coeff=a.entropy_coeff,
            kl_coef=a.kl_coef,
            temperature=cfg.rollout.temperature or 1.0,
            loss_horizon=cfg.data.max_response_length,
        )


class _Norm(TypedDict):
    """The global normalisers every micro-batch's loss is divided by (see the module docstring)."""

    num_tokens: Tensor
    num_seqs: Tensor
    dp_size: int
    horizon: float


def mini_batch_rows(batch: TrainBatch, groups_per_mini_batch: int) -> list[list[int]]:
    """Row indices of each mini-batch: consecutive runs of `groups_per_mini_batch` whole groups."""
    ranges = group_row_ranges(batch)
    out = []
    for g in range(0, len(ranges), groups_per_mini_batch):
        chunk = ranges[g : g + groups_per_mini_batch]
        out.append(list(range(chunk[0][0], chunk[-1][1])))
    return out


def rows_of_rank(batch: TrainBatch, groups_per_mini_batch: int, dist: DistContext) -> list[int]:
    """Every row this rank trains (its shard of each mini-batch)."""
    return [r for rows in mini_batch_rows(batch, groups_per_mini_batch) for r in dist.shard(rows)]


def micro_chunks(rows: list[int], dist: DistContext, micro_batch_size: int) -> list[list[int]]:
    """This rank's rows of one mini-batch in as many micro-batches as every other rank uses."""
    per_rank = math.ceil(len(rows) / dist.world)
    n_micro = max(1, math.ceil(per_rank / micro_batch_size))
    return [list(map(int, c)) for c in np.array_split(np.asarray(dist.shard(rows), dtype=np.int64), n_micro)]


def budget_chunks(rows: list[int], dist: DistContext, tokens: Sequence[int], budget: int) -> list[list[int]]:
    """This rank's rows of one mini-batch in micro-batches of at most `budget` tokens (`tokens[row]`
    each; a longer row alone), then empty micro-batches up to the count of the rank that needs the
    most. Every rank sees the whole batch, so each works out every rank's count without a collective."""
    counts = [
        len(first_fit_decreasing(replace(dist, rank=r).shard(rows), tokens, budget))
        for r in range(dist.world)
    ]
    mine = first_fit_decreasing(dist.shard(rows), tokens, budget)
    return mine + [[] for _ in range(max(counts) - len(mine))]


def micro_batches(
    rows: list[int], dist: DistContext, settings: UpdateSettings, tokens: Sequence[int]
) -> list[list[int]]:
    """This rank's micro-batches of one mini-batch: by `micro_batch_tokens` when set, else
    `micro_batch_size` rows; the same count on every rank (an empty one: a zero-weight pass)."""
    if settings.micro_batch_tokens is None:
        return micro_chunks(rows, dist, settings.micro_batch_size)
    return budget_chunks(rows, dist, tokens, settings.micro_batch_tokens)


# (rows, with_entropy) -> (log-probs, entropy) of the current weights, full-size (0 off `rows`)
Recompute = Callable[[list[int], bool], tuple[Tensor, Tensor]]


def old_log_probs(
    source: OldLogProbSource, batch: TrainBatch, mine: list[int], recompute: Recompute
) -> tuple[Tensor, Tensor | None, list[int]]:
    """(pi_old on this rank's rows, entropy or None, the batch's rows that fell back to recompute).

    `recompute`: the current weights on every row of `mine`, with entropy (one forward pass).
    `rollout`: the engine's log-prob of each sampled token, no pass. A response whose gateway
    reported no log-probs (a whole row, batch.py) falls back to the current weights' value, so the
    ratio of its tokens starts at 1 as under `recompute`. That pass runs only when some row of the
    whole batch needs it (every rank sees the whole batch and decides alike), over this rank's
    such rows, or one row when it has none, so that a sharded model's collectives line up.
    """
    if source is OldLogProbSource.RECOMPUTE:
        lp, ent = recompute(mine, True)
        return lp, ent, []
    behaviour = batch.rollout_log_probs
    unknown = rows_without_behaviour_log_probs(batch)
    if not unknown:
        return behaviour, None, []
    missing = sorted(set(mine) & set(unknown))
    recomputed, _ = recompute(missing or mine[:1], False)
    return torch.where(batch.rollout_logprob_mask.bool(), behaviour, recomputed), None, unknown


def ppo_update(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: TrainBatch,
    advantages: Tensor,
    old_log_prob: Tensor,
    settings: UpdateSettings,
    dist: DistContext,
    precision: Precision,
    tis_weight: Tensor | None = None,
    ref_log_prob: Tensor | None = None,
    first_epoch_stats: bool = False,
) -> dict[str, float]:
    """Run the update; returns metrics averaged over the whole batch (all ranks).

    `first_epoch_stats` (old log-probs from the rollout): also `actor/entropy` and `rollout/kl`
    from the first epoch's forward passes (see the module docstring).
    """
    s = settings
    model.train()
    # sums over all ranks: [pg_loss, kl_loss, entropy_loss, clipfrac*tok, lower*tok, ppo_kl*tok, tok,
    #                       first epoch: entropy*tok, tok, (behaviour - logp)*known, known]
    acc = torch.zeros(11, dtype=torch.float64)
    grad_norms: list[float] = []
    skipped = 0
    n_mini = 0
    tokens = row_tokens(batch, s.packing)
    for epoch in range(s.ppo_epochs):
        measure = first_epoch_stats and epoch == 0
        for rows in mini_batch_rows(batch, s.groups_per_mini_batch):
            n_mini += 1
            mask_all = batch.response_mask[rows]
            n_tok = mask_all.sum()
            n_seq = (mask_all.sum(-1) > 0).sum()
            norm: _Norm = {
                "num_tokens": n_tok, "num_seqs": n_seq, "dp_size": dist.world, "horizon": s.loss_horizon
            }  # fmt: skip
            chunks = micro_batches(rows, dist, s, tokens)
            optimizer.zero_grad(set_to_none=True)
            for i, chunk in enumerate(chunks):
                weight = 1.0
                if not chunk:  # this rank has fewer micro-batches: keep the collective calls aligned
                    chunk, weight = [min(rows, key=lambda r: tokens[r])], 0.0  # the cheapest pass
                mb = batch.select(chunk).to(dist.device)
                idx = torch.as_tensor(chunk, device=old_log_prob.device)
                with no_sync(model, last=i == len(chunks) - 1):
                    logp, ent = forward_response(
                        model, mb, temperature=s.temperature, precision=precision,
                        with_entropy=s.entropy_coeff > 0 or measure, entropy_grad=s.entropy_coeff > 0,
                        packing=s.packing,
                    )  # fmt: skip
                    pg, m = policy_loss(
                        old_log_prob[idx], logp, advantages[idx], mb.response_mask,
                        clip_ratio_low=s.clip_ratio_low, clip_ratio_high=s.clip_ratio_high,
                        clip_ratio_c=s.clip_ratio_c, loss_agg_mode=s.loss_agg_mode,
                        tis_weight=None if tis_weight is None else tis_weight[idx], **norm,
                    )  # fmt: skip
                    loss = pg
                    ent_term = torch.zeros(())
                    kl_term = torch.zeros(())
                    if s.entropy_coeff > 0 and ent is not None:
                        ent_term = agg_loss(ent, mb.response_mask, s.loss_agg_mode, **norm)
                        loss = loss - s.entropy_coeff * ent_term
                    if s.kl_coef > 0 and ref_log_prob is not None:
                        kl_term = agg_loss(
                            low_var_kl(logp, ref_log_prob[idx]), mb.response_mask, s.loss_agg_mode, **norm
                        )
                        loss = loss + s.kl_coef * kl_term
                    (loss * weight).backward()
                tok = float(mb.response_mask.sum()) * weight
                first = [0.0, 0.0, 0.0, 0.0]
                if measure:
                    known = mb.response_mask * mb.rollout_logprob_mask
                    first = [
                        float(masked_sum(ent.detach(), mb.response_mask)) * weight if ent is not None else 0.0,
                        tok, float(masked_sum(mb.rollout_log_probs - logp.detach(), known)) * weight,
                        float(known.sum()) * weight,
                    ]  # fmt: skip
                acc += torch.tensor([
                    float(pg.detach()) * weight / dist.world, float(kl_term.detach()) * weight / dist.world,
                    float(ent_term.detach()) * weight / dist.world, float(m["pg_clipfrac"]) * tok,
                    float(m["pg_clipfrac_lower"]) * tok, float(m["ppo_kl"]) * tok, tok, *first,
                ], dtype=torch.float64)  # fmt: skip
            grad_norm = clip_grad_norm(model, s.grad_clip)
            if math.isfinite(grad_norm):
                optimizer.step()
                grad_norms.append(grad_norm)
            else:  # a non-finite gradient would poison the weights: skip this optimizer step
                skipped += 1
            optimizer.zero_grad(set_to_none=True)
    tot = dist.all_reduce_sum(acc).cpu()
    tok = max(float(tot[6]), 1.0)
    first_epoch: dict[str, float] = {}
    if first_epoch_stats:
        first_epoch = {
            "actor/entropy": float(tot[7]) / max(float(tot[8]), 1.0),
            "rollout/kl": float(tot[9]) / max(float(tot[10]), 1.0),
        }
    return {
        **first_epoch,
        "actor/pg_loss": float(tot[0]) / n_mini,
        "actor/kl_loss": float(tot[1]) / n_mini,
        "actor/entropy_loss": float(tot[2]) / n_mini,
        "actor/pg_clipfrac": float(tot[3]) / tok,
        "actor/pg_clipfrac_lower": float(tot[4]) / tok,
        "actor/ppo_kl": float(tot[5]) / tok,
        "actor/grad_norm": sum(grad_norms) / len(grad_norms) if grad_norms else float("nan"),
        "actor/grad_norm_max": max(grad_norms) if grad_norms else float("nan"),
        "actor/skipped_steps": float(skipped),
        "actor/optimizer_steps": float(len(grad_norms)),
    }
