"""Turning an `Example` into the token ids a rollout engine is given."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from asyncdapo.contracts.config import PromptTruncation
from asyncdapo.contracts.verl_format import DatasetError, Example


class PromptTooLong(DatasetError):
    """A prompt longer than data.max_prompt_length under `data.truncation: error` (verl's default)."""


def fit_prompt(ids: Sequence[int], limit: int, mode: PromptTruncation, where: str) -> list[int] | None:
    """The prompt's token ids within `limit` tokens as `data.truncation` says: unchanged when they
    fit; None (drop); cut to the last `limit` (`left`), the first `limit` (`right`), or the first
    floor(limit/2) and the last ceil(limit/2) tokens (`middle`), as verl cuts them; `PromptTooLong`
    naming `where` (`error`)."""
    if len(ids) <= limit:
        return list(ids)
    if mode is PromptTruncation.DROP:
        return None
    if mode is PromptTruncation.LEFT:
        return list(ids[len(ids) - limit :])
    if mode is PromptTruncation.RIGHT:
        return list(ids[:limit])
    if mode is PromptTruncation.MIDDLE:
        head = limit // 2
        return [*ids[:head], *ids[len(ids) - (limit - head) :]]
    raise PromptTooLong(
        f"{where}: prompt of {len(ids)} tokens given; data.max_prompt_length is {limit} and data.truncation "
        "is error: raise max_prompt_length, or set data.truncation to drop, left, right or middle"
    )


def render_prompt(example: Example, tokenizer: Any, apply_chat_template: bool = True) -> str:
    """The prompt as text: chat messages go through the tokenizer's chat template when it has one
    (with the generation prompt appended); otherwise the contents are joined."""
    if example.is_chat and apply_chat_template and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(example.prompt, tokenize=False, add_generation_prompt=True)
    return example.prompt_text()


def prompt_token_ids(example: Example, tokenizer: Any, apply_chat_template: bool = True) -> list[int]:
    text = render_prompt(example, tokenizer, apply_chat_template)
    # The template already carries the special tokens it wants; never add BOS/EOS twice.
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])
