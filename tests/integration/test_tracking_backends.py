"""The tracking backends with their real libraries: what the trainer's sink logs, read back with each
library's own reader (TensorBoard's event accumulator, `wandb leet inspect`, MLflow's client), equals
the step records (metrics.jsonl), under verl's names; a resumed run continues without duplicates."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from asyncdapo.contracts.config import RunConfig, parse_run_config
from asyncdapo.services.trainer.tracking import TrackingError, check_tracking, open_tracking, tracking_dir
from asyncdapo.services.trainer.tracking.readers import READERS, expected_steps, mismatches

BACKENDS = ["tensorboard", "wandb", "mlflow", "jsonl"]
# TensorBoard stores scalars as float32
TOLERANCE = {"tensorboard": 1e-6}


def _cfg(**logging: object) -> RunConfig:
    return parse_run_config(
        {"name": "track-test", "rollout": {"val_n": 4}, "logging": {"backends": BACKENDS, **logging}}
    )


def _record(step: int) -> dict[str, object]:
    """A step record shaped like the trainer's (numbers, a list, a bool) with awkward values."""
    return {
        "step": step,
        "version": step,
        "lr": 1.5e-4 * step,
        "reward/mean": 0.1 * step - 1 / 3,
        "acc/mean": step / 7,
        "response_length/mean": 12.25 + step,
        "actor/pg_loss": -0.0123456789 * step,
        "actor/grad_norm": float("nan") if step == 2 else 0.5,
        "timing/step_s": 1.25,
        "rollout/kl": 1e-9 * step,
        "rollout/aborted_tokens": 123456789 + step,
        "staleness/0": 4,
        **({"val/accuracy": 0.375} if step == 3 else {}),
        "group_ids": ["a", "b"],
        "flag": True,
    }


def _write(cfg: RunConfig, out: Path, steps: range, start_step: int = 0) -> list[dict[str, object]]:
    tracking = open_tracking(cfg, out, start_step)
    rows = [_record(s) for s in steps]
    for row in rows:
        tracking.log(row)
    tracking.close()
    return rows


@pytest.mark.parametrize("backend", BACKENDS)
def test_read_back_equals_the_records(backend: str, tmp_path: Path) -> None:
    cfg = _cfg(backends=[backend])
    rows = _write(cfg, tmp_path, range(1, 4))
    got = READERS[backend](tracking_dir(cfg, tmp_path))
    expected = expected_steps(cfg, rows, backend)
    assert not mismatches(expected, got, TOLERANCE.get(backend, 0.0))
    # verl's names where verl has one, ours elsewhere
    names = set(got[3])
    assert {
        "critic/rewards/mean",
        "actor/lr",
        "timing_s/step",
        "rollout_corr/kl",
        "training/global_step",
    } <= names
    assert {"acc/mean", "rollout/aborted_tokens", "staleness/0"} <= names
    assert ("val-core/all/acc/mean_4" if backend == "mlflow" else "val-core/all/acc/mean@4") in names
    assert math.isnan(got[2]["actor/grad_norm"])


def test_all_backends_at_once_and_our_names(tmp_path: Path) -> None:
    cfg = _cfg(metric_names="asyncdapo")
    rows = _write(cfg, tmp_path, range(1, 3))
    root = tracking_dir(cfg, tmp_path)
    assert sorted(p.name for p in root.iterdir()) == sorted(
        ["tensorboard", "wandb", "wandb-run-id", "mlruns", "mlflow-run-id", "tracking.jsonl"]
    )
    for backend in BACKENDS:
        got = READERS[backend](root)
        assert not mismatches(expected_steps(cfg, rows, backend), got, TOLERANCE.get(backend, 0.0)), backend
        assert "reward/mean" in got[1] and "critic/rewards/mean" not in got[1]


def test_resume_hides_retrained_steps(tmp_path: Path) -> None:
    """A trainer that crashed after logging step 3 but resumed from its step-2 checkpoint logs
    step 3 again: TensorBoard and the JSON lines show the new step 3 only, W&B and MLflow continue
    the same run."""
    cfg = _cfg(backends=["tensorboard", "jsonl", "wandb", "mlflow"])
    _write(cfg, tmp_path, range(1, 4))
    root = tracking_dir(cfg, tmp_path)
    wandb_id, mlflow_id = (root / "wandb-run-id").read_text(), (root / "mlflow-run-id").read_text()
    tracking = open_tracking(cfg, tmp_path, start_step=2)
    again = {**_record(3), "reward/mean": 42.0}
    tracking.log(again)
    tracking.close()
    for backend in ("tensorboard", "jsonl"):
        assert READERS[backend](root)[3]["critic/rewards/mean"] == 42.0, backend
    lines = [json.loads(ln) for ln in (root / "tracking.jsonl").read_text().splitlines()]
    assert [ln["step"] for ln in lines] == [1, 2, 3]
    assert (root / "wandb-run-id").read_text() == wandb_id
    assert (root / "mlflow-run-id").read_text() == mlflow_id
    assert READERS["mlflow"](root)[3]["critic/rewards/mean"] in (42.0, _record(3)["reward/mean"])


def test_missing_library_is_named_with_its_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    with pytest.raises(
        TrackingError, match=r"wandb package is not installed: pip install 'asyncdapo\[tracking\]'"
    ):
        check_tracking(_cfg())
