"""Groups from the stream → padded training tensors.

Layout (verl's): each row is one response; `input_ids = [left-padded prompt | right-padded
response]`, so every prompt ends at column `prompt_length - 1` and every response starts at column
`prompt_length`. `attention_mask` is 1 on real tokens, `position_ids = clamp(cumsum(mask) - 1, 0)`,
`response_mask` is 1 on the real response tokens (EOS included when the engine produced it).

Invariants: rows of one group are contiguous and in stream order; `group_ordinal[i]` is the position
of row i's group in the batch (what advantages are grouped by) and `group_index[i]` its prompt id;
a row's behaviour log-probs are usable only where `rollout_logprob_mask` is 1. A response carries
its engine's log-prob for every token or for none (`validate_group`), so the mask is 1 on a whole
row or 0 on a whole row: 0 only when the gateway reported no log-probs for that response (tokens
resumed from an earlier request keep the log-probs their engine reported, `continuation_logprobs`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import Tensor

from asyncdapo.contracts.v1 import common_pb2, rollout_pb2


class MalformedGroup(ValueError):
    """A group from the stream violates the Group contract; the message names the field."""


def validate_group(group: rollout_pb2.Group, vocab_size: int, max_response_length: int) -> None:
    """Raise MalformedGroup naming the first wrong field of `group`."""
    where = f"group {group.prompt_id or '<no prompt_id>'}"
    if not group.prompt_id:
        raise MalformedGroup(f"{where}: prompt_id is empty")
    if not group.prompt_token_ids:
        raise MalformedGroup(f"{where}: prompt_token_ids is empty")
    if not group.responses:
        raise MalformedGroup(f"{where}: responses is empty")
    if any(t < 0 or t >= vocab_size for t in group.prompt_token_ids):
        raise MalformedGroup(f"{where}: prompt_token_ids has ids outside [0, {vocab_size})")
    for i, r in enumerate(group.responses):
        n = len(r.token_ids)
        if n > max_response_length:
            raise MalformedGroup(
                f"{where}: responses[{i}].token_ids has {n} tokens > max_response_length "
                f"{max_response_length}"
            )
        if any(t < 0 or t >= vocab_size for t in r.token_ids):
            raise MalformedGroup(f"{where}: responses[{i}].token_ids has ids outside [0, {vocab_size})")
        if r.logprobs and len(r.logprobs) != n:
            raise MalformedGroup(
                f"{where}: responses[{i}].logprobs has {len(r.logprobs)} entries for {n} tokens"
            )
        covered = sum(v.num_tokens for v in r.version_runs)
        if r.version_runs and covered != n:
            raise MalformedGroup(f"{where}: responses[{i}].version_runs cover {covered} tokens, not {n}")


@dataclass
class TrainBatch:
    input_ids: Tensor  # (N, P+R) long
    attention_mask: Tensor  # (N, P+R) long
    position_ids: Tensor  # (N, P+R) long
    responses: Tensor  # (N, R) long
    response_mask: Tensor  # (N, R) float
    rollout_log_probs: Tensor  # (N, R) float, 0 where unknown
    rollout_logprob_mask: Tensor  # (N, R) float: 1 where the engine reported a log-prob
    rewards: Tensor  # (N,) float: score + overlong penalty
    scores: Tensor  # (N,) float: reward.correct_reward or incorrect_reward
    acc: Tensor  # (N,) float
    truncated: Tensor  # (N,) bool: finish_reason LENGTH
    group_ordinal: Tensor  # (N,) long: position of the row's group in the batch (0, 0, .., 1, ..)
    group_index: list[str]  # (N,) prompt id per row
    prompt_length: int  # P

    @property
    def size(self) -> int:
        return self.responses.shape[0]

    @property
    def response_lengths(self) -> Tensor:
        return self.response_mask.sum(dim=-1)

    def select(self, rows: Sequence[int] | Tensor) -> TrainBatch:
        """The sub-batch of `rows` (same padding: P and R are unchanged)."""
        idx = torch.as_tensor(rows, dtype=torch.long)
        out: dict[str, Any] = {}  # field name -> its rows (a tensor, a list) or its value
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, Tensor):
                out[f.name] = v.index_select(0, idx.to(v.device))
            elif isinstance(v, list):
                out[f.name] = [v[i] for i in idx.tolist()]
            else:
                out[f.name] = v
        return TrainBatch(**out)

    def to(self, device: torch.device | str) -> TrainBatch:
        return TrainBatch(**{
            f.name: (getattr(self, f.name).to(device) if isinstance(getattr(self, f.name), Tensor)
                     else getattr(self, f.name))
            for f in fields(self)
        })  # fmt: skip


def build_batch(groups: Sequence[rollout_pb2.Group], pad_token_id: int) -> TrainBatch:
    """Pad every response of `groups` into one batch (rows in group order, then response order)."""
    if not groups:
        raise ValueError("build_batch needs at least one group")
    rows = [(g, r) for g in groups for r in g.responses]
    n = len(rows)
    p_len = max(len(g.prompt_token_ids) for g in groups)
    r_len = max(1, max(len(r.token_ids) for _, r in rows))  # width >= 1 keeps every shape non-empty

    prompt = torch.full((n, p_len), pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros((n, p_len), dtype=torch.long)
    resp = torch.full((n, r_len), pad_token_id, dtype=torch.long)
    resp_mask = torch.zeros((n, r_len), dtype=torch.float32)
    rollout_lp = torch.zeros((n, r_len), dtype=torch.float32)
    rollout_lp_mask = torch.zeros((n, r_len), dtype=torch.float32)
    for i, (g, r) in enumerate(rows):
        pl, rl = len(g.prompt_token_ids), len(r.token_ids)
        prompt[i, p_len - pl :] = torch.tensor(list(g.prompt_token_ids), dtype=torch.long)
        prompt_mask[i, p_len - pl :] = 1
        if rl:
            resp[i, :rl] = torch.tensor(list(r.token_ids), dtype=torch.long)
            resp_mask[i, :rl] = 1.0
        if r.logprobs:
            rollout_lp[i, :rl] = torch.tensor(list(r.logprobs), dtype=torch.float32)
            rollout_lp_mask[i, :rl] = 1.0

    attention_mask = torch.cat([prompt_mask, resp_mask.long()], dim=1)
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    return TrainBatch(
        input_ids=torch.cat([prompt, resp], dim=1),
        attention_mask=attention_mask,
        position_ids=position_ids,
        responses=resp,
        response_mask=resp_mask,
        rollout_log_probs=rollout_lp,
        rollout_logprob_mask=rollout_lp_mask,
        rewards=torch.tensor([r.reward for _, r in rows], dtype=torch.float32),
        scores=torch.tensor([r.score for _, r in rows], dtype=torch.float32),
        acc=torch.tensor([r.acc for _, r in rows], dtype=torch.float32),
        truncated=torch.tensor([r.finish_reason == common_pb2.FINISH_REASON_LENGTH for _, r in rows]),
        group_ordinal=torch.tensor([k for k, g in enumerate(groups) for _ in g.responses], dtype=torch.long),
        group_index=[g.prompt_id for g, _ in rows],
        prompt_length=p_len,
    )


def rows_without_behaviour_log_probs(batch: TrainBatch) -> list[int]:
    """Rows with a response token whose behaviour log-prob the engine did not report."""
    unknown = (batch.response_mask > 0) & (batch.rollout_logprob_mask == 0)
    return [int(i) for i in unknown.any(dim=-1).nonzero().flatten().tolist()]


def group_row_ranges(batch: TrainBatch) -> list[tuple[int, int]]:
    """[start, end) rows of each group, in order (groups are contiguous by construction)."""
    ranges: list[tuple[int, int]] = []
    ordinal = batch.group_ordinal.tolist()
    start = 0
    for i in range(1, batch.size + 1):
        if i == batch.size or ordinal[i] != ordinal[start]:
            ranges.append((start, i))
            start = i
    return ranges
