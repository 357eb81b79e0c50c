"""Experiment tracking: the trainer's step records to TensorBoard, W&B, MLflow and/or JSON lines.

`open_tracking(cfg, out_dir, start_step)` opens the backends of `cfg.logging`; `Tracking.log(record)`
logs a step record's numeric values, under verl's metric names by default (see `names.py`).
metrics.jsonl stays the record of truth: the values logged are exactly its values.
A backend that fails while logging is reported once in the log and closed; training goes on.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from asyncdapo.contracts.config import RunConfig
from asyncdapo.contracts.errors import AsyncdapoError

log = logging.getLogger(__name__)


class TrackingError(AsyncdapoError):
    """A configured tracking backend cannot be used (its library is missing, or it fails to open)."""


def tracking_dir(cfg: RunConfig, out_dir: str | Path) -> Path:
    return Path(cfg.logging.dir) if cfg.logging.dir else Path(out_dir) / "tracking"


def check_tracking(cfg: RunConfig) -> None:
    """Fail early, naming the extra to install, when a configured backend's library is missing."""
    from asyncdapo.services.trainer.tracking.backends import REQUIRES

    for backend in cfg.logging.backends:
        module, extra = REQUIRES.get(backend.value, ("", ""))
        if module and importlib.util.find_spec(module) is None:
            raise TrackingError(
                f"logging.backends includes {backend.value}, but the {module} package is not installed: "
                f"pip install 'asyncdapo[{extra}]' (or drop it from logging.backends)"
            )


def scalars(record: Mapping[str, Any]) -> dict[str, float]:
    """The values a tracker logs: numbers (not bools), finite or not, keyed by our names."""
    out = {}
    for k, v in record.items():
        if isinstance(v, bool) or not isinstance(v, int | float):
            continue
        out[k] = float(v)
    return out


class Tracking:
    def __init__(self, cfg: RunConfig, backends: list[Any]) -> None:
        from asyncdapo.services.trainer.tracking.names import tracked_name

        self.cfg = cfg
        self.backends = backends
        self._name = tracked_name

    def names(self, record: Mapping[str, Any]) -> dict[str, float]:
        """{tracked name: value} of a step record (the `step` key included, as verl logs it)."""
        return {self._name(k, self.cfg): v for k, v in scalars(record).items()}

    def log(self, record: Mapping[str, Any]) -> None:
        step = int(record["step"])
        metrics = self.names(record)
        for backend in list(self.backends):
            try:
                backend.log(step, metrics)
            except Exception as err:  # a tracker never stops training; it is reported and closed
                log.error("tracking backend %s failed at step %d, closing it: %s", backend.name, step, err)
                self.backends.remove(backend)
                self._close(backend)

    def close(self) -> None:
        for backend in self.backends:
            self._close(backend)
        self.backends = []

    @staticmethod
    def _close(backend: Any) -> None:
        try:
            backend.close()
        except Exception as err:
            log.error("tracking backend %s failed to close: %s", backend.name, err)


def open_tracking(cfg: RunConfig, out_dir: str | Path, start_step: int = 0) -> Tracking:
    """The backends of `cfg.logging`, writing under the tracking directory; `start_step` is the
    checkpointed step the trainer resumes from (0: a new run)."""
    from asyncdapo.services.trainer.tracking.backends import BACKENDS

    check_tracking(cfg)
    root = tracking_dir(cfg, out_dir)
    root.mkdir(parents=True, exist_ok=True)
    opened: list[Any] = []
    try:
        for backend in cfg.logging.backends:
            opened.append(BACKENDS[backend.value](cfg, root, start_step))
    except Exception as err:
        Tracking(cfg, opened).close()
        raise TrackingError(f"logging.backends: {backend.value} failed to open: {err}") from err
    if opened:
        log.info("tracking to %s under %s", ", ".join(b.name for b in opened), root)
    return Tracking(cfg, opened)
