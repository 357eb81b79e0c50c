"""Step metrics: what a batch was (`batch_metrics`), one JSON line per training step, and
Prometheus gauges (one per numeric key) and labelled counters (drop reasons, staleness).

JSON lines files are kept consistent with the checkpoints: on resume, lines of steps after the
restored checkpoint are dropped (those steps are trained again), so no step appears twice. The
trainer's trained log `trained.jsonl` (step, stream ids, prompt ids) is written before the checkpoint,
so it lists every checkpointed step; `metrics.jsonl` is written at the end of a step and can miss
the line of a step whose process died between its checkpoint and its end.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter as Tally
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from asyncdapo.contracts.v1 import rollout_pb2
from asyncdapo.services.trainer.algos import masked_sum
from asyncdapo.services.trainer.batch import TrainBatch
from asyncdapo.services.trainer.dist import DistContext
from asyncdapo.services.trainer.tracking import Tracking

PREFIX = "asyncdapo_trainer_"
# record keys that Prometheus gets as labelled counters instead of one gauge per key
LABELLED = ("dropped/", "staleness/")
# Prometheus names of record keys that do not follow from the suffix rules below (deploy/METRICS.md)
RENAMED = {
    "actor/pg_clipfrac": "actor_pg_clip_ratio",
    "actor/pg_clipfrac_lower": "actor_pg_clip_lower_ratio",
    "rollout/logprob_coverage": "rollout_logprob_coverage_ratio",
}


def _prom_name(key: str) -> str:
    """Record key → gauge name, in Prometheus' base units: `timing/wait_s` →
    `asyncdapo_trainer_timing_wait_seconds`, a fraction `…_frac` → `…_ratio`."""
    if key in RENAMED:
        return PREFIX + RENAMED[key]
    name = re.sub(r"[^a-zA-Z0-9_]", "_", key)
    name = re.sub(r"_s$", "_seconds", name)
    name = re.sub(r"_frac$", "_ratio", name)
    return PREFIX + name


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
    """Step records to a JSON lines file, to Prometheus gauges (one per numeric key) and to the
    tracking backends of `logging.backends` (asyncdapo.services.trainer.tracking).

    `rollout_status`, when given, returns the scheduler's rollout counters (`rollout/*`, see
    `asyncdapo.services.trainer.tracking.rollout_metrics`); they are added to each record before it is written, so the
    trackers get the rollout side of the step as verl users see it in one place.
    """

    def __init__(
        self,
        jsonl_path: Path,
        port: int | None = None,
        tracking: Tracking | None = None,
        rollout_status: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.log = JsonlLog(jsonl_path)
        self.tracking = tracking
        self.rollout_status = rollout_status
        self.registry = CollectorRegistry()
        self._gauges: dict[str, Gauge] = {}
        self.dropped = Counter(
            PREFIX + "dropped_groups", "Groups dropped instead of trained, by GroupDropReason", ["reason"],
            registry=self.registry,
        )  # fmt: skip
        self.staleness = Counter(
            PREFIX + "trained_groups", "Groups trained, by staleness (version - min_version)", ["staleness"],
            registry=self.registry,
        )  # fmt: skip
        # One series: the newest durable checkpoint (an older path's series is removed, so the
        # `path` label stays bounded); the operator shows it as status.lastCheckpoint.
        self._checkpoint = Gauge(
            PREFIX + "checkpoint_info", "The newest checkpoint: label path, value its step", ["path"],
            registry=self.registry,
        )  # fmt: skip
        self._server: Any = None
        if port is not None:
            self._server = start_http_server(port, addr="0.0.0.0", registry=self.registry)

    def truncate_after(self, step: int) -> int:
        return self.log.truncate_after(step)

    def checkpoint(self, path: Path | str, step: int) -> None:
        """Export the checkpoint just made durable (or restored) as `checkpoint_info{path} = step`."""
        self._checkpoint.clear()
        self._checkpoint.labels(path=str(path)).set(step)

    def write(self, record: Mapping[str, Any]) -> None:
        if self.rollout_status is not None:
            record = {**record, **self.rollout_status()}
        self.log.write(record)
        if self.tracking is not None:
            self.tracking.log(record)
        for key, value in record.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or key.startswith(LABELLED):
                continue
            gauge = self._gauges.get(key)
            if gauge is None:
                gauge = Gauge(_prom_name(key), f"trainer metric {key}", registry=self.registry)
                self._gauges[key] = gauge
            gauge.set(value)

    def close(self) -> None:
        if self.tracking is not None:
            self.tracking.close()
            self.tracking = None
        if self._server is not None:
            server, thread = self._server
            server.shutdown()
            thread.join(timeout=5)
            self._server = None


def batch_metrics(
    batch: TrainBatch,
    dev_batch: TrainBatch,
    mine: list[int],
    old_lp: torch.Tensor | None,
    entropy: torch.Tensor | None,
    tis: torch.Tensor | None,
    tis_cap: float | None,
    version: int,
    groups: list[rollout_pb2.Group],
    dist: DistContext,
) -> dict[str, Any]:
    """What a step trained on: rewards, lengths, entropy, rollout/trainer mismatch, staleness.

    `old_lp` / `entropy` / `tis` hold values only on the rows this rank computed (`mine`); their
    sums are all-reduced, so every rank returns the same whole-batch figures. Without `old_lp`
    (old log-probs taken from the rollout) there is no `rollout/kl`, without `entropy` no
    `actor/entropy`: the update measures them then.
    """
    lengths = batch.response_lengths
    own = torch.zeros_like(dev_batch.response_mask)
    own[torch.as_tensor(mine, device=own.device)] = 1.0
    mask = dev_batch.response_mask * own
    known = mask * dev_batch.rollout_logprob_mask
    zero = torch.zeros((), device=mask.device)
    sums = torch.stack([
        masked_sum(entropy, mask) if entropy is not None else zero, mask.sum(),
        masked_sum(dev_batch.rollout_log_probs - old_lp, known) if old_lp is not None else zero, known.sum(),
        masked_sum(tis, mask) if tis is not None else zero,
        masked_sum((tis >= tis_cap).float(), mask) if tis is not None and tis_cap else zero,
    ]).double()  # fmt: skip
    sums = dist.all_reduce_sum(sums).cpu()
    tok, known_tok = max(float(sums[1]), 1.0), max(float(sums[3]), 1.0)
    staleness = Tally(version - g.min_version for g in groups)
    # the tokens of one response may come from several versions (weight_update_mode keep)
    runs = [run for g in groups for r in g.responses for run in r.version_runs]
    n_tokens = sum(run.num_tokens for run in runs)
    token_lag = sum(run.num_tokens * (version - run.version) for run in runs)
    out: dict[str, Any] = {
        "batch/groups": len(groups),
        "batch/responses": batch.size,
        "reward/mean": float(batch.rewards.mean()),
        "reward/std": float(batch.rewards.std()) if batch.size > 1 else 0.0,
        "score/mean": float(batch.scores.mean()),
        "acc/mean": float(batch.acc.mean()),
        "response_length/mean": float(lengths.mean()),
        "response_length/max": float(lengths.max()),
        "response_length/clip_ratio": float(batch.truncated.float().mean()),
        "prompt_length/mean": float(batch.attention_mask[:, : batch.prompt_length].sum(-1).float().mean()),
        **({"actor/entropy": float(sums[0]) / tok} if entropy is not None else {}),
        # k1 estimate of KL(behaviour || pi_old)
        **({"rollout/kl": float(sums[2]) / known_tok} if old_lp is not None else {}),
        "rollout/logprob_coverage": float(sums[3]) / tok,
        "rollout/token_staleness_mean": token_lag / n_tokens if n_tokens else 0.0,
        **{f"staleness/{k}": v for k, v in sorted(staleness.items())},
        "group_ids": [g.prompt_id for g in groups],
    }
    if tis is not None:
        out["tis/mean_weight"] = float(sums[4]) / tok
        out["tis/capped_frac"] = float(sums[5]) / tok
    return out
