"""DAPO/GRPO math in pure torch, with the semantics of verl's `trainer/ppo/core_algos.py`.

Conventions (as in verl): every per-token tensor is `(batch, response_length)` with responses
right-padded; `response_mask` is 1 on real response tokens and 0 on padding. Masked positions
never influence a result, even when they hold NaN or inf.

Invariants:
- `grpo_advantages` is constant within a group, has zero group mean for groups of size >= 2, and is
  the raw score for a group of size 1 (mean 0, std 1, as verl).
- `agg_loss` ignores fully masked rows in the sequence modes, returns 0 (not NaN) when nothing is
  unmasked, and, given the global normalisers of a mini-batch, summing its value over micro-batches
  (and averaging over `dp_size` data-parallel replicas) equals the loss of the whole mini-batch.
  `seq-mean-token-sum-norm` divides by a constant `horizon` (data.max_response_length), never by a
  tensor's width: responses are padded to the batch's longest one, which changes from step to step.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch
from torch import Tensor

from asyncdapo.contracts.config import LossAggMode

__all__ = ["LossAggMode", "agg_loss", "entropy_from_logits", "grpo_advantages", "policy_loss", "tis_weights"]

LOG_RATIO_CLAMP = 20.0  # verl clamps log-ratios to +-20 before exp for stability


def masked_sum(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    # `where`, not `values * mask`: NaN * 0 is NaN, and padded positions may hold anything.
    kept = torch.where(mask.bool(), values, torch.zeros((), dtype=values.dtype, device=values.device))
    return kept.sum() if dim is None else kept.sum(dim=dim)


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """verl's masked mean: sum / (count + 1e-8), so an all-zero mask gives 0."""
    count = mask.sum() if dim is None else mask.sum(dim=dim)
    return masked_sum(values, mask, dim) / (count.to(values.dtype) + 1e-8)


def grpo_advantages(
    scores: Tensor,
    group_index: Sequence[Hashable] | Tensor,
    eps: float = 1e-6,
    norm_by_std: bool = True,
) -> Tensor:
    """GRPO outcome advantage, one per response: (score - group mean) / (group std + eps).

    The std uses Bessel's correction (torch.std). A group with a single response gets mean 0 and
    std 1. `norm_by_std=False` is Dr. GRPO: score - group mean.
    """
    if scores.dim() != 1:
        raise ValueError(f"scores must be 1-D (one per response), got shape {tuple(scores.shape)}")
    keys = group_index.tolist() if isinstance(group_index, Tensor) else list(group_index)
    if len(keys) != scores.shape[0]:
        raise ValueError(f"group_index has {len(keys)} entries for {scores.shape[0]} scores")
    slot: dict[Hashable, int] = {}
    gid = torch.tensor([slot.setdefault(k, len(slot)) for k in keys], dtype=torch.long, device=scores.device)
    n_groups = len(slot)
    x = scores.detach().to(torch.promote_types(scores.dtype, torch.float32))
    zeros = torch.zeros(n_groups, dtype=x.dtype, device=x.device)
    count = zeros.clone().index_add_(0, gid, torch.ones_like(x))
    mean = zeros.clone().index_add_(0, gid, x) / count
    sq = zeros.clone().index_add_(0, gid, (x - mean[gid]) ** 2)
    std = torch.sqrt(sq / (count - 1).clamp(min=1))
    single = count == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    centred = x - mean[gid]
    adv = centred / (std[gid] + eps) if norm_by_std else centred
    return adv.to(scores.dtype)


def agg_loss(
    loss_mat: Tensor,
    mask: Tensor,
    mode: LossAggMode | str,
    *,
    num_tokens: float | Tensor | None = None,
    num_seqs: float | Tensor | None = None,
    dp_size: int = 1,
    horizon: float | None = None,
) -> Tensor:
    """Reduce a (batch, length) loss to a scalar.

    token-mean: sum over unmasked tokens / num_tokens; seq-mean-token-sum: mean over rows of the
    row sums; seq-mean-token-mean: mean over rows of the row means; seq-mean-token-sum-norm (Dr.
    GRPO): mean over rows of the row sums / `horizon` (required in that mode, the constant the
    config sets: data.max_response_length). Fully masked rows do not count as rows. `num_tokens` /
    `num_seqs` default to this batch's counts; pass the whole mini-batch's (over every micro-batch
    and replica) for gradient accumulation, with `dp_size` the number of replicas whose gradients
    are averaged.
    """
    mode = LossAggMode(mode)
    if mode is LossAggMode.SEQ_MEAN_TOKEN_SUM_NORM and (horizon is None or horizon <= 0):
        raise ValueError(f"loss_agg_mode {mode.value} needs a constant horizon > 0, got {horizon}")
    if mode is LossAggMode.TOKEN_MEAN:
        total = masked_sum(loss_mat, mask)
        denom = mask.sum() if num_tokens is None else num_tokens
    else:
        row_tokens = mask.sum(dim=-1)
        row_loss = masked_sum(loss_mat, mask, dim=-1)
        if mode is LossAggMode.SEQ_MEAN_TOKEN_MEAN:
            row_loss = row_loss / (row_tokens.to(row_loss.dtype) + 1e-8)
        elif mode is LossAggMode.SEQ_MEAN_TOKEN_SUM_NORM:
            assert horizon is not None, "checked above"
            row_loss = row_loss / horizon
        row_mask = row_tokens > 0
        total = masked_sum(row_loss, row_mask)
        denom = row_mask.sum() if num_seqs is None else num_seqs
    denom_t = torch.as_tensor(denom, dtype=total.dtype, device=total.device)
    if float(denom_t) == 0.0:
        return total * 0.0
    return total / denom_t * dp_size


def tis_weights(old_log_prob: Tensor, rollout_log_prob: Tensor, cap: float) -> Tensor:
    """Truncated importance weights min(pi_old / pi_behaviour, cap) for off-policy rollouts (s >= 1)."""
    if cap <= 0:
        raise ValueError(f"tis cap must be > 0, got {cap}")
    log_ratio = (old_log_prob - rollout_log_prob).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.exp(log_ratio).clamp(max=cap).detach()


def policy_loss(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float,
    loss_agg_mode: LossAggMode | str,
    tis_weight: Tensor | None = None,
    num_tokens: float | Tensor | None = None,
    num_seqs: float | Tensor | None = None,
    dp_size: int = 1,
    horizon: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """DAPO's clipped surrogate (verl `compute_policy_loss_vanilla`).

    ratio = exp(clamp(logp - old_logp, +-20)); per-token loss max(-A*ratio, -A*clip(ratio, 1-low,
    1+high)) (decoupled clip), and for A < 0 additionally capped at -A*clip_ratio_c (dual clip).
    `tis_weight` (from `tis_weights`) multiplies the per-token loss. `advantages` is per response
    `(batch,)` or per token `(batch, length)`. Metrics are masked means over this batch's tokens:
    pg_clipfrac, pg_clipfrac_lower, ppo_kl (k1 estimate of KL(pi_old || pi), whatever `old_log_prob`
    holds: recomputed or the engine's).
    """
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1.0 for dual-clip PPO, got {clip_ratio_c}")
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1).expand_as(log_prob)
    neg_kl = (log_prob - old_log_prob).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(neg_kl)
    ppo_kl = masked_mean(-neg_kl.detach(), response_mask)

    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    clip1 = torch.maximum(loss_unclipped, loss_clipped)
    pg_clipfrac = masked_mean((loss_clipped > loss_unclipped).float(), response_mask)

    loss_dual = -advantages * clip_ratio_c
    clip2 = torch.minimum(loss_dual, clip1)
    negative = advantages < 0
    pg_clipfrac_lower = masked_mean(((clip1 > loss_dual) & negative).float(), response_mask)
    per_token = torch.where(negative, clip2, clip1)
    if tis_weight is not None:
        per_token = per_token * tis_weight

    loss = agg_loss(
        per_token, response_mask, loss_agg_mode,
        num_tokens=num_tokens, num_seqs=num_seqs, dp_size=dp_size, horizon=horizon,
    )  # fmt: skip
    metrics = {"pg_clipfrac": pg_clipfrac, "pg_clipfrac_lower": pg_clipfrac_lower, "ppo_kl": ppo_kl}
    return loss, metrics


def low_var_kl(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    """Per-token k3 KL estimate of KL(pi || pi_ref), clamped to [-10, 10] (verl's low_var_kl)."""
    kl = (ref_log_prob - log_prob).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return (torch.exp(kl) - kl - 1.0).clamp(-10.0, 10.0)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of softmax(logits) over the last dim: logsumexp(z) - sum(p * z)."""
    logits = logits.float()
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def log_probs_from_logits(logits: Tensor, labels: Tensor) -> Tensor:
    """log softmax(logits)[labels] without materialising the full log-softmax."""
    logits = logits.float()
    picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)
