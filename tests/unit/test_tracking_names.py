"""Tracked metric names: verl's where verl has one, and the docs table is the code's."""

from __future__ import annotations

from pathlib import Path

from asyncdapo.contracts.config import parse_run_config
from asyncdapo.services.trainer.tracking import Tracking, scalars
from asyncdapo.services.trainer.tracking.names import lookup, metrics_table, tracked_name

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def test_verl_names_by_default_and_ours_on_request() -> None:
    cfg = parse_run_config({"rollout": {"val_n": 16}})
    assert tracked_name("reward/mean", cfg) == "critic/rewards/mean"
    assert tracked_name("val/accuracy", cfg) == "val-core/all/acc/mean@16"
    assert tracked_name("timing/step_s", cfg) == "timing_s/step"
    assert tracked_name("acc/mean", cfg) == "acc/mean"  # verl has none
    assert tracked_name("something/new", cfg) == "something/new"
    ours = parse_run_config({"logging": {"metric_names": "asyncdapo"}})
    assert tracked_name("reward/mean", ours) == "reward/mean"


def test_only_numbers_are_tracked() -> None:
    rec = {"step": 3, "a": 1.5, "b": True, "c": [1], "d": "x", "e": float("nan")}
    assert set(scalars(rec)) == {"step", "a", "e"}
    names = Tracking(parse_run_config({}), []).names(rec)
    assert names["training/global_step"] == 3.0 and names["a"] == 1.5


def test_families_and_docs_table() -> None:
    assert lookup("staleness/3") is not None and lookup("dropped/stale") is not None
    assert metrics_table() in DOC.read_text()
