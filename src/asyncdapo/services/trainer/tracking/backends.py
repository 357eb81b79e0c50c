"""The tracking backends: each takes (step, {name: value}) and writes it with its own library.

Every backend's library is imported only when that backend is configured. Local outputs live in
the tracking directory: tensorboard/ (event files), wandb/ (offline run files, `wandb sync` uploads
them), mlruns/ (MLflow file store), tracking.jsonl (verl's file-logger lines:
`{"step": n, "data": {...}}`). A resumed run continues the same W&B and MLflow runs (their ids are
kept in the directory) and hides the TensorBoard events of steps it trains again.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from asyncdapo.contracts.config import RunConfig


class Backend(Protocol):
    name: str

    def log(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


def _run_id(path: Path, make: Any) -> str:
    """The id kept in `path` (a resumed run continues its backend run), else a new one, kept."""
    if path.is_file() and path.read_text().strip():
        return path.read_text().strip()
    rid = str(make())
    path.write_text(rid + "\n")
    return rid


class TensorBoardBackend:
    name = "tensorboard"

    def __init__(self, cfg: RunConfig, root: Path, start_step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: events of steps after the checkpoint we resume from are hidden (retrained)
        self.writer = SummaryWriter(
            str(root / "tensorboard"), purge_step=start_step + 1 if start_step else None
        )

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbBackend:
    name = "wandb"

    def __init__(self, cfg: RunConfig, root: Path, start_step: int) -> None:
        import uuid

        import wandb

        (root / "wandb").mkdir(parents=True, exist_ok=True)
        rid = _run_id(root / "wandb-run-id", lambda: f"{cfg.name}-{uuid.uuid4().hex[:8]}")
        self.run = wandb.init(
            project=cfg.logging.project,
            name=cfg.logging.experiment or cfg.name,
            id=rid,
            resume="allow",
            dir=str(root),
            mode=cfg.logging.wandb_mode.value,
            config=cfg.model_dump(mode="json"),
            settings=wandb.Settings(silent=True, console="off", x_disable_stats=True),
        )

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log(dict(metrics), step=step)

    def close(self) -> None:
        self.run.finish()


_MLFLOW_BAD = re.compile(r"[^A-Za-z0-9_\-. :/]")


def mlflow_key(name: str) -> str:
    """MLflow refuses '@' and the like in metric names: `mean@16` is logged as `mean_16`."""
    return _MLFLOW_BAD.sub("_", name)


class MlflowBackend:
    name = "mlflow"

    def __init__(self, cfg: RunConfig, root: Path, start_step: int) -> None:
        uri = cfg.logging.mlflow_tracking_uri or (root / "mlruns").resolve().as_uri()
        if uri.startswith("file:"):
            # MLflow 3 keeps its file store in maintenance mode behind this switch; it is the only
            # local store that needs no database (set logging.mlflow_tracking_uri for sqlite/a server)
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        exp = self.client.get_experiment_by_name(cfg.logging.project)
        exp_id = exp.experiment_id if exp else self.client.create_experiment(cfg.logging.project)
        name = cfg.logging.experiment or cfg.name

        def create() -> str:
            run = self.client.create_run(exp_id, run_name=name, tags={"asyncdapo.run": cfg.name})
            return run.info.run_id

        self.run_id = _run_id(root / "mlflow-run-id", create)
        if start_step:
            self.client.update_run(self.run_id, status="RUNNING")

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(mlflow_key(k), float(v), now, step) for k, v in metrics.items()]
        for i in range(0, len(batch), 1000):  # MLflow's per-request limit
            self.client.log_batch(self.run_id, metrics=batch[i : i + 1000])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


class JsonlBackend:
    """verl's `file` logger format, one line per step, with the tracked (verl) names."""

    name = "jsonl"

    def __init__(self, cfg: RunConfig, root: Path, start_step: int) -> None:
        self.path = root / "tracking.jsonl"
        if self.path.exists():  # drop the lines of steps that are trained again after a resume
            keep = [ln for ln in self.path.read_text().splitlines() if _step_of(ln) <= start_step]
            self.path.write_text("".join(ln + "\n" for ln in keep))

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, "data": dict(metrics)}) + "\n")

    def close(self) -> None:
        pass


def _step_of(line: str) -> int:
    try:
        return int(json.loads(line).get("step", 0))
    except (ValueError, AttributeError):
        return 1 << 62  # a torn line: dropped


BACKENDS: dict[str, type] = {
    "tensorboard": TensorBoardBackend,
    "wandb": WandbBackend,
    "mlflow": MlflowBackend,
    "jsonl": JsonlBackend,
}
# the module each backend imports, and the extra that installs it
REQUIRES: dict[str, tuple[str, str]] = {
    "tensorboard": ("tensorboard", "trainer"),
    "wandb": ("wandb", "tracking"),
    "mlflow": ("mlflow", "tracking"),
}
