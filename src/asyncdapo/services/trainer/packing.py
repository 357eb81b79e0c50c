"""Padding-free micro-batches: rows packed into one sequence, and rows grouped by a token budget.

Packing (`trainer.packing`, verl's `use_remove_padding`): the real tokens of a micro-batch's rows
(each prompt without its left padding, then its response without its right padding) are laid end
to end in one row of shape (1, total_tokens); position ids restart at 0 at every sequence. Hugging
Face models read the restarts as sequence boundaries, and the pass hands them the boundaries too
(`cu_seq_lens_*`): flash-attention kernels run variable-length attention over them; a model on
SDPA (transformers' default, and the only choice on CPU) is switched to `PACKED_SDPA`
(`use_packed_attention`), which runs causal SDPA on each sequence in turn. Attention then costs the
sum of the sequences' squared lengths, where a block-diagonal mask over the packed row (what SDPA
and eager attention otherwise get from the position ids: correct, the fallback) would cost the
row's squared length and hold a (T, T) mask. No pad token is computed, so a micro-batch costs its
real tokens, not rows x the batch's longest row.

Token budget (`trainer.micro_batch_tokens`, verl's `use_dynamic_bsz` + `ppo_max_token_len_per_gpu`):
rows go first-fit, longest first, into micro-batches of at most the budget's tokens (what the
forward computes: real tokens when packed, the padded width otherwise); a row longer than the
budget goes alone. The loss normalisation is global (update.py), so the grouping never changes the
gradient, only how many passes compute it.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from asyncdapo.services.trainer.batch import TrainBatch

PACKED_SDPA = "asyncdapo_packed_sdpa"  # the attention implementation of packed passes on SDPA


@dataclass(frozen=True)
class PackedRows:
    """The rows of a padded batch as one packed sequence."""

    input_ids: Tensor  # (1, T) long: the real tokens of every row, row after row
    position_ids: Tensor  # (1, T) long: 0.. within each row's sequence
    logit_index: Tensor  # (N,) long: positions of T whose logits predict the N response tokens
    labels: Tensor  # (N,) long: the response tokens, row after row
    lengths: list[int]  # tokens of each sequence, in order

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[1])

    def boundaries(self, device: torch.device) -> dict[str, Any]:
        """The sequence boundaries as transformers' variable-length attention kwargs."""
        cu = torch.tensor([0, *self.lengths], dtype=torch.int32).cumsum(0, dtype=torch.int32).to(device)
        longest = max(self.lengths)
        return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest, "max_length_k": longest}


def pack_rows(batch: TrainBatch) -> PackedRows:
    """Pack `batch` (batch.py's layout: left-padded prompt | right-padded response).

    A row's real tokens are contiguous in the padded layout, so taking them in row-major order
    gives the rows end to end; the response tokens taken the same way are in the order
    `scatter_response` puts values back in.
    """
    real = batch.attention_mask.bool()
    # packed position of every real token of the padded layout (garbage where padded)
    packed_at = real.flatten().long().cumsum(0).view_as(real) - 1
    response = batch.response_mask.bool()
    logit_index = packed_at[:, batch.prompt_length :][response] - 1  # the logit before a token predicts it
    return PackedRows(
        input_ids=batch.input_ids[real].unsqueeze(0),
        position_ids=batch.position_ids[real].unsqueeze(0),
        logit_index=logit_index,
        labels=batch.responses[response],
        lengths=[int(n) for n in batch.attention_mask.sum(dim=-1).tolist()],
    )


def scatter_response(values: Tensor, response_mask: Tensor) -> Tensor:
    """Per-token values of the packed response tokens (N,) back in the (rows, R) layout, 0 on
    padding; differentiable, so the loss code sees what the padded forward gives."""
    out = values.new_zeros(response_mask.shape)
    return out.masked_scatter(response_mask.bool(), values)


def row_tokens(batch: TrainBatch, packing: bool) -> list[int]:
    """Tokens the forward computes for each row: its real tokens when packed, else the padded width."""
    if packing:
        return [int(n) for n in batch.attention_mask.sum(dim=-1).tolist()]
    return [int(batch.input_ids.shape[1])] * batch.size


def first_fit_decreasing(rows: Sequence[int], tokens: Sequence[int], budget: int) -> list[list[int]]:
    """`rows` in groups of at most `budget` tokens (`tokens[row]` each), few groups: longest row
    first, each into the first group it fits; a row over the budget alone. Each group ascending."""
    if budget < 1:
        raise ValueError(f"a token budget must be >= 1, got {budget}")
    bins: list[list[int]] = []
    used: list[int] = []
    for row in sorted(rows, key=lambda r: (-tokens[r], r)):
        n = tokens[row]
        for i, u in enumerate(used):
            if u + n <= budget:
                bins[i].append(row)
                used[i] += n
                break
        else:
            bins.append([row])
            used.append(n)
    return [sorted(b) for b in bins]


def _packed_sdpa(
    module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None, **kwargs: Any
) -> tuple[Tensor, None]:
    """transformers' SDPA attention, run on each packed sequence alone when the pass gives the
    boundaries (`cu_seq_lens_q`), causal within it; a padded pass is plain SDPA with its mask."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    cu = kwargs.pop("cu_seq_lens_q", None)
    if cu is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    for k in ("cu_seq_lens_k", "max_length_q", "max_length_k", "is_causal"):
        kwargs.pop(k, None)
    window = kwargs.get("sliding_window")
    bounds = [int(b) for b in cu.tolist()]
    outs = []
    for start, end in itertools.pairwise(bounds):
        n = end - start
        mask = None
        if window and n > window:  # a sliding-window layer: causal within the window
            i = torch.arange(n, device=query.device)
            mask = ((i[:, None] >= i[None, :]) & (i[:, None] - i[None, :] < window))[None, None]
        seq = slice(start, end)
        out, _ = sdpa_attention_forward(
            module, query[:, :, seq], key[:, :, seq], value[:, :, seq], mask, is_causal=True, **kwargs
        )
        outs.append(out)  # (1, n, heads, head_dim)
    return torch.cat(outs, dim=1), None


def use_packed_attention(model: nn.Module) -> None:
    """Run packed passes of `model` sequence by sequence if it attends with SDPA (see the module
    docstring); padded passes are unchanged. Flash-attention and other implementations stay."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(PACKED_SDPA, _packed_sdpa)
    AttentionMaskInterface.register(PACKED_SDPA, sdpa_mask)  # padded passes: SDPA's own masks
    from asyncdapo.services.trainer.fsdp import hf_model

    inner = hf_model(getattr(model, "module", model))
    if getattr(inner.config, "_attn_implementation", None) == "sdpa":
        inner.set_attn_implementation(PACKED_SDPA)
