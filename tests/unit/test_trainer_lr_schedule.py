"""The LR schedule: the factor of trainer.lr each update uses (hand-computed), what the optimizer
actually gets step by step, and that a resumed run continues the schedule where the checkpoint was."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from asyncdapo.contracts.config import ConfigError, LrSchedule, TrainerConfig, parse_run_config
from asyncdapo.services.trainer.checkpoint import CheckpointStore, TrainerState
from asyncdapo.services.trainer.lr_schedule import lr_factor, make_lr_scheduler


def _factors(schedule: LrSchedule, warmup: int, total: int, steps: int, **kw: float) -> list[float]:
    return [
        lr_factor(k, schedule=schedule, warmup_steps=warmup, total_steps=total, **kw) for k in range(steps)
    ]


def test_constant_warms_up_from_the_first_update_then_holds() -> None:
    assert _factors(LrSchedule.CONSTANT, 4, 10, 7) == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 1.0, 1.0])
    assert _factors(LrSchedule.CONSTANT, 0, 10, 3) == [1.0, 1.0, 1.0]


def test_cosine_hand_computed_with_a_floor() -> None:
    # W = 2, total = 6, min_lr_ratio = 0.1: after warm-up p = (k - 2) / 4 and
    # factor = cos(pi * p) * 0.45 + 0.55 (one half-cosine, num_cycles 0.5)
    got = _factors(LrSchedule.COSINE, 2, 6, 7, min_lr_ratio=0.1)
    c = math.cos(math.pi / 4)
    expected = [0.5, 1.0, 1.0, c * 0.45 + 0.55, 0.55, -c * 0.45 + 0.55, 0.1]
    assert got == pytest.approx(expected, abs=1e-12)
    # a full wave (num_cycles 1) is back at the top at the end
    full = _factors(LrSchedule.COSINE, 0, 4, 5, min_lr_ratio=0.2, num_cycles=1.0)
    assert full == pytest.approx([1.0, 0.6, 0.2, 0.6, 1.0], abs=1e-12)
    # warm-up as long as the run: no division by zero
    assert lr_factor(3, schedule=LrSchedule.COSINE, warmup_steps=3, total_steps=3) == pytest.approx(1.0)


def _optimizer() -> torch.optim.Optimizer:
    return torch.optim.AdamW(torch.nn.Linear(2, 1).parameters(), lr=0.01)


def _lrs_used(opt: torch.optim.Optimizer, sched: torch.optim.lr_scheduler.LRScheduler, n: int) -> list[float]:
    """The LR of each of `n` training steps, stepped as the loop does (once per training step)."""
    out = []
    for _ in range(n):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def test_the_optimizer_gets_lr_times_the_factor_each_step() -> None:
    t = TrainerConfig(lr=0.01, warmup_steps=2, total_steps=6, lr_schedule="cosine", min_lr_ratio=0.1)
    opt = _optimizer()
    used = _lrs_used(opt, make_lr_scheduler(opt, t), 6)
    assert used == pytest.approx([0.01 * f for f in _factors(LrSchedule.COSINE, 2, 6, 6, min_lr_ratio=0.1)])


def test_resume_from_a_checkpoint_continues_the_schedule(tmp_path: Path) -> None:
    t = TrainerConfig(
        lr=0.01, warmup_steps=2, total_steps=8, lr_schedule="cosine", min_lr_ratio=0.1, lr_num_cycles=0.5
    )
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=t.lr)
    uninterrupted = _lrs_used(opt, make_lr_scheduler(opt, t), 8)

    model = torch.nn.Linear(2, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=t.lr)
    sched = make_lr_scheduler(opt, t)
    first = _lrs_used(opt, sched, 3)
    store = CheckpointStore(tmp_path)
    store.save(TrainerState(step=3), model, opt, sched)
    # a new process: build optimizer and scheduler as the trainer does, then restore
    model2 = torch.nn.Linear(2, 1)
    opt2 = torch.optim.AdamW(model2.parameters(), lr=t.lr)
    sched2 = make_lr_scheduler(opt2, t)
    latest = store.latest()
    assert latest is not None
    assert store.load_into(latest, model2, opt2, sched2, torch.device("cpu")).step == 3
    rest = _lrs_used(opt2, sched2, 5)
    assert first + rest == pytest.approx(uninterrupted)
    assert rest[0] != pytest.approx(
        t.lr * lr_factor(0, schedule=LrSchedule.COSINE, warmup_steps=2, total_steps=8)
    )


@pytest.mark.parametrize(
    ("trainer", "field"),
    [({"min_lr_ratio": 1.5}, "min_lr_ratio"), ({"min_lr_ratio": -0.1}, "min_lr_ratio"),
     ({"lr_num_cycles": 0.0}, "lr_num_cycles"), ({"lr_schedule": "linear"}, "lr_schedule")],
)  # fmt: skip
def test_schedule_fields_are_checked(trainer: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=f"trainer.{field}"):
        parse_run_config({"trainer": trainer})


def test_defaults_are_verls() -> None:
    t = TrainerConfig()
    assert (t.lr_schedule, t.min_lr_ratio, t.lr_num_cycles) == (LrSchedule.CONSTANT, 0.0, 0.5)
