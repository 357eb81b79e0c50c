"""Turning an `Example` into the token ids a rollout engine is given."""

from __future__ import annotations

from typing import Any

from asyncdapo.data.verl_format import Example


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
