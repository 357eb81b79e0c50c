"""Atomic trainer checkpoints: model, optimizer, LR schedule, RNG, data cursor, version, stream ids.

Layout under `{checkpoint_dir}/checkpoints/`:
    step-00000012/  model.pt  optimizer.pt  scheduler.pt  rng.pt  state.json
    latest          text: the name of the newest complete checkpoint

Atomicity: a checkpoint is written into a `.tmp-{name}-{writer}` directory, every file and the
directory are fsynced, then it is renamed into place and `latest` is replaced (write tmp + fsync +
rename). A crash at any point leaves either the previous or the new checkpoint as `latest`, never a
partial one.

Several writers: two trainer processes may share the directory for a while (a replacement pod
overlapping the old one). Only the holder of the trainer lease writes (`fence.py`): the loop checks
the fence before a save, and `save(before_commit=...)` checks it again between writing the
temporary directory and renaming it into place, so a fenced-out writer never publishes a
checkpoint. Temporary directories carry their writer's id, a save never deletes another's, and
leftovers are removed only by `remove_leftovers()`, which the trainer calls once it holds the lease
(no other writer is live then).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

LATEST = "latest"


@dataclass
class TrainerState:
    step: int = 0  # completed training steps == policy version of the weights
    feed_cursor: dict[str, int] | None = None  # asyncdapo.services.trainer.data_feed.Cursor.to_dict()
    covered_group_ids: list[str] = field(default_factory=list)  # trained since the previous checkpoint
    # newest stream id processed (trained or dropped) as of this checkpoint: the redelivery fence;
    # an entry delivered again at or below it is never trained or credited again
    last_stream_id: str = "0-0"
    published_version: int = 0
    counters: dict[str, float] = field(default_factory=dict)  # cumulative (dropped groups, tokens …)
    trainer_id: str = ""  # the writer (lease holder) of this checkpoint
    trainer_epoch: int = 0  # its fencing epoch


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _save(obj: Any, path: Path) -> None:
    with path.open("wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def _write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


class CheckpointStore:
    def __init__(self, checkpoint_dir: str | Path, keep: int = 2, writer: str = "") -> None:
        if keep < 1:
            raise ValueError("keep must be >= 1")
        self.root = Path(checkpoint_dir) / "checkpoints"
        self.keep = keep
        self.writer = re.sub(r"[^A-Za-z0-9_.-]", "_", writer) or str(os.getpid())

    def remove_leftovers(self) -> int:
        """Delete every `.tmp-*` directory (crashed saves). Only while holding the trainer lease."""
        n = 0
        for stale in self.root.glob(".tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
            n += 1
        return n

    def save(
        self,
        state: TrainerState,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        lr_scheduler: Any,
        before_commit: Callable[[], None] | None = None,
    ) -> Path:
        """Write the checkpoint of `state.step`; `before_commit()` runs after the temporary directory
        is complete and before it becomes visible (the trainer's fence check: it raises to abort)."""
        self.root.mkdir(parents=True, exist_ok=True)
        name = f"step-{state.step:08d}"
        tmp = self.root / f".tmp-{name}-{self.writer}"
        shutil.rmtree(tmp, ignore_errors=True)  # our own, from an earlier attempt
        tmp.mkdir()
        _save(model.state_dict(), tmp / "model.pt")
        _save(optimizer.state_dict(), tmp / "optimizer.pt")
        _save(lr_scheduler.state_dict(), tmp / "scheduler.pt")
        _save({"torch": torch.get_rng_state()}, tmp / "rng.pt")
        with (tmp / "state.json").open("w") as f:
            json.dump(asdict(state), f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(tmp)
        if before_commit is not None:
            try:
                before_commit()
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        final = self.root / name
        if final.exists():  # the same step saved again after a restart
            shutil.rmtree(final)
        os.rename(tmp, final)
        _fsync_dir(self.root)
        _write_text_atomic(self.root / LATEST, name)
        self._prune(keep_name=name)
        return final

    def _prune(self, keep_name: str) -> None:
        done = sorted(p for p in self.root.glob("step-*") if p.is_dir())
        for old in done[: max(0, len(done) - self.keep)]:
            if old.name != keep_name:
                shutil.rmtree(old, ignore_errors=True)

    def latest(self) -> Path | None:
        marker = self.root / LATEST
        if marker.is_file():
            path = self.root / marker.read_text().strip()
            if (path / "state.json").is_file():
                return path
        done = sorted(p for p in self.root.glob("step-*") if (p / "state.json").is_file())
        return done[-1] if done else None

    def load_state(self, path: Path) -> TrainerState:
        return TrainerState(**json.loads((path / "state.json").read_text()))

    def load_into(
        self,
        path: Path,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        lr_scheduler: Any,
        device: torch.device,
    ) -> TrainerState:
        """Restore model, optimizer, LR schedule and RNG from `path`; returns its TrainerState."""
        model.load_state_dict(torch.load(path / "model.pt", map_location=device, weights_only=True))
        optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location=device, weights_only=True))
        lr_scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=True))
        torch.set_rng_state(torch.load(path / "rng.pt", weights_only=True)["torch"])
        return self.load_state(path)
