"""Supervised warm-start: a short pass of next-token training on reference solutions.

A random-weight model never answers correctly, so every group would have zero reward variance and
DAPO would filter everything. The demo therefore warm-starts the tiny model on the synthetic
format (`extra_info.solution`) until it is right *sometimes*; RL then has signal to work with.
Loss is on response tokens only (prompt tokens are masked), as in SFT for chat models.

`slip_fraction` makes the warm-start deliberately unreliable, like a base model with noisy habits:
that fraction of demonstrations (drawn anew each time an example is sampled, seeded) states an
answer off by one. The model
learns both habits; only the reward can teach it which one pays, and since the habit is global the
lesson carries over to held-out problems.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from asyncdapo.data.prompting import prompt_token_ids
from asyncdapo.data.verl_format import DatasetError, Example


@dataclass(frozen=True)
class SFTResult:
    steps: int
    final_loss: float
    wall_s: float
    out_dir: Path


HABITS = ("refuse", "off-by-one")
REFUSAL = "I don't know."


def _slipped(solution: str, ground_truth: str, habit: str = "off-by-one") -> str:
    """The demonstration as the bad habit would write it."""
    if habit == "refuse":
        return REFUSAL
    try:
        wrong = int(ground_truth) + 1
    except ValueError:
        return solution
    return solution.replace(ground_truth, str(wrong))


def _encode(
    examples: Sequence[Example], tokenizer, apply_chat_template: bool, habit: str
) -> list[tuple[list[int], list[int], list[int]]]:
    """(prompt, correct response, slipped response) token ids for each example."""
    encoded = []
    for e in examples:
        solution = e.extra_info.get("solution")
        if not isinstance(solution, str):
            raise DatasetError(f"example {e.index} has no extra_info.solution to warm-start on")
        prompt = prompt_token_ids(e, tokenizer, apply_chat_template)
        right, slipped = (
            tokenizer(s, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            for s in (solution, _slipped(solution, e.ground_truth, habit))
        )
        encoded.append((prompt, right, slipped))
    return encoded


def supervised_warm_start(
    model_dir: str | Path,
    examples: Sequence[Example],
    out_dir: str | Path,
    *,
    steps: int = 200,
    batch_size: int = 32,
    lr: float = 3e-3,
    seed: int = 0,
    slip_fraction: float = 0.0,
    habit: str = "refuse",
    apply_chat_template: bool = True,
    on_step: Callable[[int, float], None] | None = None,
) -> SFTResult:
    """Train `model_dir` on `examples`' solutions for `steps` AdamW steps and save to `out_dir`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    rng = random.Random(seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    if not 0.0 <= slip_fraction < 1.0:
        raise ValueError("slip_fraction must be in [0, 1)")
    if habit not in HABITS:
        raise ValueError(f"habit must be one of {HABITS}, got {habit!r}")
    data = _encode(examples, tokenizer, apply_chat_template, habit)
    if not data:
        raise DatasetError("no examples to warm-start on")
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    # Cosine decay: a short run must end with a small LR or the last steps undo the progress.
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))
    )
    pad = tokenizer.pad_token_id
    start = time.monotonic()
    loss_value = float("nan")
    for step in range(steps):
        batch = []
        for _ in range(batch_size):
            prompt, right, slipped = data[rng.randrange(len(data))]
            batch.append((prompt + (slipped if rng.random() < slip_fraction else right), len(prompt)))
        width = max(len(ids) for ids, _ in batch)
        input_ids = torch.full((len(batch), width), pad, dtype=torch.long)
        labels = torch.full((len(batch), width), -100, dtype=torch.long)
        attention = torch.zeros((len(batch), width), dtype=torch.long)
        for i, (ids, plen) in enumerate(batch):
            input_ids[i, : len(ids)] = torch.tensor(ids)
            labels[i, plen : len(ids)] = torch.tensor(ids[plen:])
            attention[i, : len(ids)] = 1
        loss = model(input_ids=input_ids, attention_mask=attention, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        loss_value = float(loss.detach())
        if on_step is not None:
            on_step(step + 1, loss_value)
    out = Path(out_dir)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return SFTResult(steps=steps, final_loss=loss_value, wall_s=time.monotonic() - start, out_dir=out)
