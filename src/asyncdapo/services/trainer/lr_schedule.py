"""The learning-rate schedule: factor of `trainer.lr` for each update, stepped once per training step.

`lr_factor(k)` is the factor of update k (0-based; the k-th training step's optimizer steps):
- warm-up (k < warmup_steps): (k + 1) / warmup_steps, so the first update already moves. verl's
  warm-up starts at 0 (update k uses k / warmup_steps): its first update has LR 0;
- then `constant`: 1;
- or `cosine` (verl's get_cosine_schedule_with_warmup): with progress p = (k - W) / max(1, total - W),
  max(min_lr_ratio, cos(pi * num_cycles * 2 * p) * (1 - min_lr_ratio) / 2 + (1 + min_lr_ratio) / 2).

The LambdaLR's state (its step count) is checkpointed with the optimizer; the factor function itself
is a closure over the config, so a resumed run continues the schedule at the restored step.
"""

from __future__ import annotations

import math

import torch

from asyncdapo.contracts.config import LrSchedule, TrainerConfig


def lr_factor(
    k: int,
    *,
    schedule: LrSchedule,
    warmup_steps: int,
    total_steps: int,
    min_lr_ratio: float = 0.0,
    num_cycles: float = 0.5,
) -> float:
    """The factor of the base LR that update `k` (0-based) uses; see the module docstring."""
    if k < warmup_steps:
        return (k + 1) / warmup_steps
    if schedule is LrSchedule.CONSTANT:
        return 1.0
    progress = (k - warmup_steps) / max(1, total_steps - warmup_steps)
    wave = math.cos(math.pi * num_cycles * 2.0 * progress)
    return max(min_lr_ratio, wave * (1.0 - min_lr_ratio) / 2.0 + (1.0 + min_lr_ratio) / 2.0)


def make_lr_scheduler(
    optimizer: torch.optim.Optimizer, t: TrainerConfig
) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR over `optimizer` for `t`'s schedule; `.step()` once per training step."""
    schedule, warmup, total = LrSchedule(t.lr_schedule), t.warmup_steps, t.total_steps
    min_ratio, cycles = t.min_lr_ratio, t.lr_num_cycles

    def factor(k: int) -> float:  # a plain function: LambdaLR checkpoints no state of it
        return lr_factor(
            k,
            schedule=schedule,
            warmup_steps=warmup,
            total_steps=total,
            min_lr_ratio=min_ratio,
            num_cycles=cycles,
        )

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
