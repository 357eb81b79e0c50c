"""The PPO update of one training batch: epochs → mini-batches (optimizer steps) → micro-batches.

Loss normalisation is global: every micro-batch's loss is divided by the token (or sequence)
count of its whole mini-batch, over all data-parallel ranks, and multiplied by the world size
that DDP's gradient averaging divides by again. The accumulated gradient is therefore exactly the
gradient of the mini-batch loss, whatever the micro-batch size or the number of workers.

Every rank runs the same number of micro-batches per mini-batch (DDP all-reduces on the last
backward, FSDP all-gathers in every forward and reduce-scatters in every backward); a rank whose
share runs out first repeats a row with weight 0. The same code trains a replica (DDP) or a shard
(FSDP, fsdp.py): the gradient norm is global either way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from asyncdapo.config import RunConfig
from asyncdapo.trainer.algos import agg_loss, low_var_kl, policy_loss
from asyncdapo.trainer.batch import TrainBatch, group_row_ranges
from asyncdapo.trainer.dist import DistContext
from asyncdapo.trainer.fsdp import clip_grad_norm, no_sync
from asyncdapo.trainer.model import Precision, forward_response


@dataclass(frozen=True)
class UpdateSettings:
    groups_per_mini_batch: int
    micro_batch_size: int
    ppo_epochs: int
    grad_clip: float
    clip_ratio_low: float
    clip_ratio_high: float
    clip_ratio_c: float
    loss_agg_mode: str
    entropy_coeff: float
    kl_coef: float
    temperature: float

    @classmethod
    def from_config(cls, cfg: RunConfig) -> UpdateSettings:
        a, t = cfg.algorithm, cfg.trainer
        return cls(
            groups_per_mini_batch=t.ppo_mini_batch_size,
            micro_batch_size=t.micro_batch_size,
            ppo_epochs=t.ppo_epochs,
            grad_clip=t.grad_clip,
            clip_ratio_low=a.clip_ratio_low,
            clip_ratio_high=a.clip_ratio_high,
            clip_ratio_c=a.clip_ratio_c,
            loss_agg_mode=a.loss_agg_mode.value,
            entropy_coeff=a.entropy_coeff,
            kl_coef=a.kl_coef,
            temperature=cfg.rollout.temperature or 1.0,
        )


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
) -> dict[str, float]:
    """Run the update; returns metrics averaged over the whole batch (all ranks)."""
    s = settings
    model.train()
    # sums over all ranks: [pg_loss, kl_loss, entropy, clipfrac*tok, lower*tok, ppo_kl*tok, tok]
    acc = torch.zeros(7, dtype=torch.float64)
    grad_norms: list[float] = []
    skipped = 0
    n_mini = 0
    for _ in range(s.ppo_epochs):
        for rows in mini_batch_rows(batch, s.groups_per_mini_batch):
            n_mini += 1
            mask_all = batch.response_mask[rows]
            n_tok = mask_all.sum()
            n_seq = (mask_all.sum(-1) > 0).sum()
            norm = {"num_tokens": n_tok, "num_seqs": n_seq, "dp_size": dist.world}
            chunks = micro_chunks(rows, dist, s.micro_batch_size)
            optimizer.zero_grad(set_to_none=True)
            for i, chunk in enumerate(chunks):
                weight = 1.0
                if not chunk:  # this rank has fewer rows: keep DDP's collective calls aligned
                    chunk, weight = rows[:1], 0.0
                mb = batch.select(chunk).to(dist.device)
                idx = torch.as_tensor(chunk, device=old_log_prob.device)
                with no_sync(model, last=i == len(chunks) - 1):
                    logp, ent = forward_response(
                        model, mb, temperature=s.temperature, precision=precision,
                        with_entropy=s.entropy_coeff > 0,
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
                acc += torch.tensor([
                    float(pg.detach()) * weight / dist.world, float(kl_term.detach()) * weight / dist.world,
                    float(ent_term.detach()) * weight / dist.world, float(m["pg_clipfrac"]) * tok,
                    float(m["pg_clipfrac_lower"]) * tok, float(m["ppo_kl"]) * tok, tok,
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
    return {
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
