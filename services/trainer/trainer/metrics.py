"""Step metrics: one JSON line per training step, and Prometheus gauges/counters.

The JSON lines file is consistent with the checkpoints: on resume, lines of steps after the
restored checkpoint are dropped (those steps are trained again), so every step appears once.
Each line has `step` and `group_ids` (the stream prompt ids the step trained), so the file is also
the ledger of what was trained.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

PREFIX = "asyncdapo_trainer_"
# record keys that Prometheus gets as labelled counters instead of one gauge per key
LABELLED = ("dropped/", "staleness/")


def _prom_name(key: str) -> str:
    return PREFIX + re.sub(r"[^a-zA-Z0-9_]", "_", key)


class JsonlLog:
    """Append-only JSON lines with a `step` field, truncatable back to a checkpointed step."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def truncate_after(self, step: int) -> int:
        """Drop lines of steps > `step` (they are retrained after a restore); returns how many."""
        if not self.path.exists():
            return 0
        lines = [ln for ln in self.path.read_text().splitlines() if ln.strip()]
        kept = []
        for ln in lines:
            try:
                if json.loads(ln).get("step", 0) <= step:
                    kept.append(ln)
            except json.JSONDecodeError:  # a line torn by a crash mid-write
                pass
        if len(kept) != len(lines) or not self.path.read_text().endswith("\n"):
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text("".join(ln + "\n" for ln in kept))
            os.replace(tmp, self.path)
        return len(lines) - len(kept)

    def write(self, record: Mapping[str, Any]) -> None:
        """Append one record, fsynced."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(json.dumps(record, separators=(",", ":")) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(ln) for ln in self.path.read_text().splitlines() if ln.strip()]


class MetricsSink:
    """Step records to a JSON lines file and to Prometheus gauges (one per numeric key)."""

    def __init__(self, jsonl_path: Path, port: int | None = None) -> None:
        self.log = JsonlLog(jsonl_path)
        self.registry = CollectorRegistry()
        self._gauges: dict[str, Gauge] = {}
        self.dropped = Counter(
            PREFIX + "dropped_groups", "Groups dropped instead of trained, by DropReason", ["reason"],
            registry=self.registry,
        )  # fmt: skip
        self.staleness = Counter(
            PREFIX + "trained_groups", "Groups trained, by staleness (version - min_version)", ["staleness"],
            registry=self.registry,
        )  # fmt: skip
        self._server: Any = None
        if port is not None:
            self._server = start_http_server(port, addr="0.0.0.0", registry=self.registry)

    def truncate_after(self, step: int) -> int:
        return self.log.truncate_after(step)

    def write(self, record: Mapping[str, Any]) -> None:
        self.log.write(record)
        for key, value in record.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or key.startswith(LABELLED):
                continue
            gauge = self._gauges.get(key)
            if gauge is None:
                gauge = Gauge(_prom_name(key), f"trainer metric {key}", registry=self.registry)
                self._gauges[key] = gauge
            gauge.set(value)

    def close(self) -> None:
        if self._server is not None:
            server, thread = self._server
            server.shutdown()
            thread.join(timeout=5)
            self._server = None
