"""The whole local stack, as `make demo` runs it but shortened: `asyncdapo up` with real vLLM
gateways, the verifier, the scheduler and the trainer, against a Redis the test owns so it can
inspect what the run left behind."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import redis
import yaml
from process_tree import with_env

from asyncdapo.contracts.redis_keys import GROUPS_CONSUMER_GROUP, RunKeys
from asyncdapo.tools.local.stack import RUN_DIR_ENV

pytestmark = pytest.mark.slow
STEPS = 3
OVERRIDES = ["trainer.lr=4e-4", "rollout.val_n=2"]  # the YAML says 5e-4 and 1


def _config(tmp_path: Path, model: Path, data: Path) -> Path:
    cfg = {
        "name": "e2e-tiny",
        "model": {"path": str(model)},
        "data": {
            "train_files": [str(data / "train.parquet")],
            "val_files": [str(data / "val.parquet")],
            "train_batch_size": 4,
            "max_prompt_length": 64,
            "max_response_length": 16,
            "prompt_queue_watermark": 64,
        },
        # Many prompts in flight so the bound is reached with requests still running: early
        # stops must abort something.
        "rollout": {"n": 4, "max_concurrent_prompts": 24, "max_staleness": 0},
        "reward": {"overlong_buffer": {"enable": True, "len": 4, "penalty_factor": 0.5}},
        "trainer": {
            "total_steps": STEPS,
            "ppo_mini_batch_size": 4,
            "micro_batch_size": 32,
            "lr": 5e-4,
            "warmup_steps": 0,
            "val_every": STEPS,
        },
        "logging": {"backends": ["tensorboard", "wandb", "mlflow", "jsonl"]},
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _processes_of_run(run_dir: Path) -> list[str]:
    """Live processes carrying this run's marker (every service and its children inherit it)."""
    return with_env(RUN_DIR_ENV, str(run_dir.resolve()))


def test_short_run_trains_early_stops_and_cleans_up(
    warm_model: tuple[Path, Path], redis_url: str, tmp_path: Path
) -> None:
    model, data = warm_model
    config = _config(tmp_path, model, data)
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "asyncdapo.cli", "up", str(config), "--quiet", "--run-dir", str(run_dir),
         "--redis-url", redis_url, "--timeout-s", "600", *OVERRIDES],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]

    result = re.search(r"^RESULT (.*)$", proc.stdout, re.M)
    assert result, out[-2000:]
    fields = dict(kv.split("=") for kv in result.group(1).split())
    assert int(fields["steps"]) == STEPS
    assert int(fields["early_stops"]) >= STEPS
    assert 0.0 <= float(fields["val_acc_before"]) <= 1.0 and 0.0 <= float(fields["val_acc_after"]) <= 1.0

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] > 0]
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    # Versions advance: the rollout side serves the weights of the last step.
    assert steps[-1]["rollout/policy_version"] == STEPS
    assert steps[-1]["rollout/aborted_requests"] > 0
    assert (run_dir / "report.md").exists() and (run_dir / "report.png").stat().st_size > 0
    # Each engine ran on a core of its own, with the model in its engine-core process (no worker).
    logs = sorted((run_dir / "logs").glob("gateway-*.log"))
    assert len(logs) == 2, logs
    pinned = [re.search(r"pinned to core\(s\) \[(\d+)\]", log.read_text()) for log in logs]
    assert all(pinned) and len({m.group(1) for m in pinned if m}) == min(2, len(os.sched_getaffinity(0))), (
        pinned
    )
    assert not [log.name for log in logs if "(Worker pid=" in log.read_text()]

    r = redis.Redis.from_url(redis_url, decode_responses=True)
    keys = RunKeys("e2e-tiny")
    # Groups are consumed: every group the trainer read was acknowledged, and trimmed once a durable
    # checkpoint covered it; the stream keeps only groups never delivered to the trainer.
    assert int(r.hget(keys.counters, "valid_produced") or 0) >= STEPS * 4
    assert r.xpending(keys.groups, GROUPS_CONSUMER_GROUP)["pending"] == 0
    (group,) = r.xinfo_groups(keys.groups)
    delivered = tuple(int(x) for x in group["last-delivered-id"].split("-"))
    raw = redis.Redis.from_url(redis_url)  # entries are binary protobufs
    left = [tuple(int(x) for x in eid.split(b"-")) for eid, _ in raw.xrange(keys.groups)]
    raw.close()
    assert all(eid > delivered for eid in left), (delivered, left)
    # Every admitted prompt attempt ended in exactly one recorded outcome; nothing is left claimed.
    assert r.hlen(keys.prompts_claimed) == 0
    counters = r.hgetall(keys.counters)
    outcomes = {k: int(v) for k, v in counters.items() if k.startswith("outcome:")}
    assert int(counters["admitted"]) == sum(outcomes.values()) > 0
    assert outcomes.get("outcome:valid", 0) >= STEPS * 4
    for key in r.scan_iter(match=keys.prefix.replace("{", "\\{").replace("}", "\\}") + "prompt:*"):
        if key.endswith(":data"):
            continue
        state = r.hgetall(key)
        for attempt in range(1, int(state["attempt"]) + 1):
            assert f"o:{attempt}" in state, (key, state)

    assert not _processes_of_run(run_dir)
    _check_config_and_trackers(run_dir, steps)


def _check_config_and_trackers(run_dir: Path, steps: list[dict[str, object]]) -> None:
    """The overrides are in the resolved config.yaml the report links; every tracking backend holds,
    read back with its own library, the values of the trainer's metrics.jsonl, and so does the
    run's metrics.jsonl."""
    from asyncdapo.contracts.config import load_run_config
    from asyncdapo.services.trainer.tracking import tracking_dir
    from asyncdapo.services.trainer.tracking.names import lookup
    from asyncdapo.services.trainer.tracking.readers import READERS, expected_steps, mismatches

    cfg = load_run_config(run_dir / "config.yaml")
    assert (cfg.trainer.lr, cfg.rollout.val_n) == (4e-4, 2)
    assert "[config.yaml](config.yaml)" in (run_dir / "report.md").read_text()
    trainer_rows = [json.loads(ln) for ln in (run_dir / "trainer" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in trainer_rows] == list(range(1, STEPS + 1))
    # the trainer read the scheduler's rollout counters at the end of each step
    assert all(isinstance(r.get("rollout/early_stops"), int) for r in trainer_rows)
    # every metric is in the names table (docs/metrics.md)
    assert not [k for r in trainer_rows for k in r if k != "group_ids" and lookup(k) is None]
    for merged, own in zip(steps, trainer_rows, strict=True):
        assert {k: merged.get(k) for k in own} == own
    root = tracking_dir(cfg, run_dir / "trainer")
    for backend in ("tensorboard", "wandb", "mlflow", "jsonl"):
        got = READERS[backend](root)
        problems = mismatches(
            expected_steps(cfg, trainer_rows, backend), got, 1e-6 if backend == "tensorboard" else 0
        )
        assert not problems, (backend, problems[:10])
        assert "critic/rewards/mean" in got[1] and "actor/pg_loss" in got[1]
