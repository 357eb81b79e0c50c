"""Read back what each tracking backend wrote, with that backend's own reader: TensorBoard's event
accumulator, W&B's transaction-log inspector (`wandb leet inspect --json`, the reader wandb ships
for offline run files), MLflow's client, and the JSON lines. Each returns {step: {name: value}}.

For checking a run's trackers against its metrics.jsonl (`expected_steps`), as the tests do.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from asyncdapo.contracts.config import RunConfig

Steps = dict[int, dict[str, float]]


def read_tensorboard(root: Path) -> Steps:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(root / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    out: Steps = {}
    for tag in acc.Tags()["scalars"]:
        for ev in acc.Scalars(tag):
            out.setdefault(ev.step, {})[tag] = ev.value
    return out


def read_wandb(root: Path) -> Steps:
    runs = sorted((root / "wandb").glob("offline-run-*/run-*.wandb")) + sorted(
        (root / "wandb").glob("run-*/run-*.wandb")
    )
    out: Steps = {}
    wandb_cli = Path(sys.executable).with_name("wandb")
    for f in runs:
        proc = subprocess.run(
            [str(wandb_cli), "leet", "inspect", "--json", str(f)],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        for line in proc.stdout.splitlines():
            rec = json.loads(line)
            if rec.get("type") != "history":
                continue
            hist = rec["history"]
            step = int(hist["step"]["num"])
            out.setdefault(step, {}).update(
                {k: float(v) for k, v in hist["item"].items() if not k.startswith("_")}
            )
    return out


def read_mlflow(root: Path, uri: str | None = None) -> Steps:
    import os

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri or (root / "mlruns").resolve().as_uri())
    run_id = (root / "mlflow-run-id").read_text().strip()
    out: Steps = {}
    for key in client.get_run(run_id).data.metrics:
        for m in client.get_metric_history(run_id, key):
            out.setdefault(m.step, {})[m.key] = m.value
    return out


def read_jsonl(root: Path) -> Steps:
    out: Steps = {}
    for line in (root / "tracking.jsonl").read_text().splitlines():
        rec = json.loads(line)
        out.setdefault(int(rec["step"]), {}).update(rec["data"])
    return out


READERS = {"tensorboard": read_tensorboard, "wandb": read_wandb, "mlflow": read_mlflow, "jsonl": read_jsonl}


def expected_steps(cfg: RunConfig, rows: Iterable[Mapping[str, Any]], backend: str) -> Steps:
    """What `backend` should hold for these metrics.jsonl rows (names as that backend logs them)."""
    from asyncdapo.services.trainer.tracking import Tracking
    from asyncdapo.services.trainer.tracking.backends import mlflow_key

    tracking = Tracking(cfg, [])
    out: Steps = {}
    for row in rows:
        names = tracking.names(row)
        if backend == "mlflow":
            names = {mlflow_key(k): v for k, v in names.items()}
        out.setdefault(int(row["step"]), {}).update(names)
    return out


def mismatches(expected: Steps, got: Steps, rel: float = 0.0) -> list[str]:
    """Differences between two step tables (`rel`: relative tolerance, for TensorBoard's float32)."""
    problems = []
    for step in sorted(set(expected) | set(got)):
        e, g = expected.get(step, {}), got.get(step, {})
        for name in sorted(set(e) | set(g)):
            if name not in g:
                problems.append(f"step {step}: {name} missing")
            elif name not in e:
                problems.append(f"step {step}: {name} unexpected ({g[name]})")
            elif not _close(e[name], g[name], rel):
                problems.append(f"step {step}: {name} = {g[name]!r}, metrics.jsonl has {e[name]!r}")
    return problems


def _close(a: float, b: float, rel: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b or abs(a - b) <= rel * max(abs(a), abs(b), 1e-30)
