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

`demonstrate` replaces the fixed solution by one drawn afresh (seeded) each time an example is
sampled, so a warm-start can learn a *distribution* of answers per problem — lengths, styles, a
wrong share — rather than one string (the long-tail workload, `asyncdapo.tools.data.longtail`).

`answer_weight` (with `answer_marker`) weighs the loss of the tokens from the demonstration's last
`answer_marker` on (the final answer) that many times a body token's. On the long-tail workload a
response is hundreds of body tokens and 3-4 answer tokens: unweighted, the answer is ~1-2 % of the
gradient and a short warm start learns the lengths but not the answers.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from asyncdapo.contracts.prompting import prompt_token_ids
from asyncdapo.contracts.verl_format import DatasetError, Example


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


Item = tuple[list[int], int, int]  # token ids, prompt length, first answer token (len(ids): none)


def _backward(
    model, batch: list[Item], pad: int, micro_batch_tokens: int | None, answer_weight: float = 1.0
) -> float:
    """Accumulate the gradient of the weighted mean response-token loss of `batch` ((ids, prompt
    length, answer start) triples; answer tokens weigh `answer_weight`, the others 1); returns the
    loss. One pass unless `micro_batch_tokens` splits it by length."""
    import torch

    passes = [batch]
    if micro_batch_tokens is not None:
        passes = []
        current: list[Item] = []
        for item in sorted(batch, key=lambda x: len(x[0])):
            if current and len(item[0]) * (len(current) + 1) > micro_batch_tokens:
                passes.append(current)
                current = []
            current.append(item)
        passes.append(current)
    total = sum(
        (ans - plen) + answer_weight * (len(ids) - ans) for ids, plen, ans in batch
    )  # weighted response tokens
    loss_sum = 0.0
    for part in passes:
        width = max(len(ids) for ids, _, _ in part)
        input_ids = torch.full((len(part), width), pad, dtype=torch.long)
        labels = torch.full((len(part), width), -100, dtype=torch.long)
        weights = torch.ones((len(part), width), dtype=torch.float32)
        attention = torch.zeros((len(part), width), dtype=torch.long)
        for i, (ids, plen, ans) in enumerate(part):
            input_ids[i, : len(ids)] = torch.tensor(ids)
            labels[i, plen : len(ids)] = torch.tensor(ids[plen:])
            weights[i, ans : len(ids)] = answer_weight
            attention[i, : len(ids)] = 1
        logits = model(input_ids=input_ids, attention_mask=attention).logits[:, :-1]
        target = labels[:, 1:]
        token_loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(),
            target.reshape(-1),
            ignore_index=-100,
            reduction="none",
        )  # 0 where ignored
        weighted = (token_loss * weights[:, 1:].reshape(-1)).sum()
        (weighted / total).backward()
        loss_sum += float(weighted.detach())
    return loss_sum / total


def _demonstrated(prompt: list[int], text: str, tokenizer, marker: str) -> Item:
    """(ids, prompt length, first answer token) of a drawn demonstration: the answer starts at the
    first token that ends past the text's last `marker` (len(ids) - 1, the EOS, without one)."""
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = prompt + list(enc["input_ids"]) + [tokenizer.eos_token_id]
    at = text.rfind(marker)
    first = len(enc["input_ids"])
    if at >= 0:
        first = next((k for k, (_, end) in enumerate(enc["offset_mapping"]) if end > at), first)
    return ids, len(prompt), len(prompt) + first


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
    demonstrate: Callable[[Example, random.Random], str] | None = None,
    micro_batch_tokens: int | None = None,
    max_seq_tokens: int | None = None,
    answer_weight: float = 1.0,
    answer_marker: str = "\\boxed{",
    warmup_steps: int = 0,
) -> SFTResult:
    """Train `model_dir` on `examples`' solutions for `steps` AdamW steps and save to `out_dir`.
    With `demonstrate`, every sampled example is trained on a fresh `demonstrate(example, rng)`
    (`slip_fraction` must then be 0: the demonstrations carry their own mistakes).
    `micro_batch_tokens`: split each batch, sorted by length, into passes of at most this many
    padded tokens (gradients accumulate; the loss stays the mean over the batch's response tokens),
    so long and short sequences are not padded to one width. `max_seq_tokens`: cut longer
    sequences (what lies past a rollout's max_tokens is never generated anyway). `answer_weight`:
    the loss weight of the tokens from a `demonstrate`d text's last `answer_marker` on (the module
    docstring). `warmup_steps`: a linear LR warm-up before the cosine decay."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not 0.0 <= slip_fraction < 1.0:
        raise ValueError("slip_fraction must be in [0, 1)")
    if habit not in HABITS:
        raise ValueError(f"habit must be one of {HABITS}, got {habit!r}")
    if answer_weight <= 0:
        raise ValueError(f"answer_weight must be > 0, got {answer_weight}")
    if not 0 <= warmup_steps < steps:
        raise ValueError(f"warmup_steps must be in [0, steps), got {warmup_steps}")
    if demonstrate is not None and slip_fraction:
        raise ValueError("slip_fraction applies to fixed solutions; a `demonstrate` function draws its own")
    torch.manual_seed(seed)
    rng = random.Random(seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    if demonstrate is None:
        data = _encode(examples, tokenizer, apply_chat_template, habit)
    else:
        data = [(prompt_token_ids(e, tokenizer, apply_chat_template), [], []) for e in examples]
    if not data:
        raise DatasetError("no examples to warm-start on")
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)

    # Cosine decay: a short run must end with a small LR or the last steps undo the progress.
    def lr_factor(s: int) -> float:
        if s < warmup_steps:
            return (s + 1) / warmup_steps
        done = min(s - warmup_steps, steps - warmup_steps) / (steps - warmup_steps)
        return 0.5 * (1 + math.cos(math.pi * done))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor)
    pad = tokenizer.pad_token_id
    start = time.monotonic()
    loss_value = float("nan")
    for step in range(steps):
        batch = []
        for _ in range(batch_size):
            i = rng.randrange(len(data))
            prompt, right, slipped = data[i]
            if demonstrate is not None:
                batch.append(_demonstrated(prompt, demonstrate(examples[i], rng), tokenizer, answer_marker))
                continue
            ids = prompt + (slipped if rng.random() < slip_fraction else right)
            batch.append((ids, len(prompt), len(ids)))
        if max_seq_tokens is not None:
            batch = [(ids[:max_seq_tokens], plen, min(ans, max_seq_tokens)) for ids, plen, ans in batch]
        opt.zero_grad(set_to_none=True)
        loss = _backward(model, batch, pad, micro_batch_tokens, answer_weight)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        loss_value = loss
        if on_step is not None:
            on_step(step + 1, loss_value)
    out = Path(out_dir)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return SFTResult(steps=steps, final_loss=loss_value, wall_s=time.monotonic() - start, out_dir=out)
