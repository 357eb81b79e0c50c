"""Crash and restart: the trainer dies (SIGKILL between steps, or at each point inside a step's
commit) and resumes with no group lost or trained twice, ending with exactly the weights of an
uninterrupted run on the same groups."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from asyncdapo.contracts.redis_keys import GROUP_FIELD, GROUPS_CONSUMER_GROUP, RunKeys
from asyncdapo.services.trainer.crash_points import ENV, SimulatedCrash
from asyncdapo.services.trainer.loop import Trainer
from asyncdapo.services.trainer.trainer_options import TrainerOptions

STEPS = 4
# publish (and so checkpoint) every 2 steps: steps 1 and 3 live only in memory until 2 and 4
OVER = {"trainer__total_steps": STEPS, "trainer__publish_every": 2, "rollout__max_staleness": 4}


def _weights(snapshot: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(snapshot / "model.safetensors"))


def _ledger(out: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (out / "trained.jsonl").read_text().splitlines()]


def _assert_exactly_once_and_same_weights(
    out: Path,
    groups: list[Any],
    make_config: Any,
    tmp_path: Path,
    redis_url: str,
    redis_client: Any,
    cfg: Any,
) -> None:
    ledger = _ledger(out)
    assert [x["step"] for x in ledger] == list(range(1, STEPS + 1))
    trained = [pid for x in ledger for pid in x["group_ids"]]
    assert trained == [g.prompt_id for g in groups]  # each group exactly once, in stream order
    assert redis_client.xpending(RunKeys(cfg.name).groups, GROUPS_CONSUMER_GROUP)["pending"] == 0
    assert redis_client.hget(RunKeys(cfg.name).weights, "version") == str(STEPS).encode()
    steps_in_metrics = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(steps_in_metrics) == len(set(steps_in_metrics))

    ref_cfg = make_config(tmp_path / "ref", **OVER)
    ref_cfg.name = "trainer-ref"
    for g in groups:
        redis_client.xadd(RunKeys(ref_cfg.name).groups, {GROUP_FIELD: g.SerializeToString()})
    Trainer(ref_cfg, TrainerOptions(redis_url, tmp_path / "ref", max_wait_s=30)).run()
    got, ref = _weights(out / "weights" / f"v{STEPS}"), _weights(tmp_path / "ref" / "weights" / f"v{STEPS}")
    assert got.keys() == ref.keys()
    for k in ref:
        assert torch.allclose(got[k], ref[k], atol=1e-6, rtol=0), k


def test_sigkill_between_steps_then_restart(
    tmp_path: Path, make_config: Any, rollout: Any, redis_url: str, redis_client: Any
) -> None:
    cfg = make_config(tmp_path / "out", **OVER)
    keys = RunKeys(cfg.name)
    records = iter(rollout.records(60, epoch=11))
    groups = rollout.produce(redis_client, keys, records, 4, version=0)  # two steps' worth
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    env.pop(ENV, None)
    # the restart below reuses the trainer id, like a container restarted in its pod: it takes the
    # killed process's lease over at once (another id would wait for it to expire: test_trainer_faults)
    cmd = [sys.executable, "-m", "asyncdapo.cli", "trainer", "--config", str(config), "--redis", redis_url,
           "--out", str(tmp_path / "out"), "--log-level", "WARNING", "--trainer-id", "pod-0"]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        metrics = tmp_path / "out" / "metrics.jsonl"
        deadline = time.monotonic() + 240
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
            assert proc.poll() is None, proc.stderr.read()[-3000:] if proc.stderr else ""
            assert time.monotonic() < deadline, "trainer made no 2 steps in time"
            time.sleep(0.2)
        time.sleep(0.5)  # now blocked waiting for step 3's groups
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    assert proc.returncode == -signal.SIGKILL
    groups += rollout.produce(redis_client, keys, records, 4, version=2)
    Trainer(cfg, TrainerOptions(redis_url, tmp_path / "out", max_wait_s=30, trainer_id="pod-0")).run()
    _assert_exactly_once_and_same_weights(
        tmp_path / "out", groups, make_config, tmp_path, redis_url, redis_client, cfg
    )


def test_crash_at_every_commit_point_resumes_exactly_once(
    tmp_path: Path,
    make_config: Any,
    rollout: Any,
    redis_url: str,
    redis_client: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfg = make_config(tmp_path / "out", **OVER)
    groups = rollout.produce(redis_client, RunKeys(cfg.name), iter(rollout.records(60, epoch=13)), 2 * STEPS)
    opts = TrainerOptions(redis_url, tmp_path / "out", max_wait_s=30)
    chain = [  # (crash point, version the rollout side was told about afterwards)
        ("after_update@1", None),  # nothing durable yet: step 1 is redone from the start
        ("after_checkpoint@2", None),  # checkpoint durable, v2 not published, groups not acked
        ("after_update@4", b"2"),  # the restart published v2; steps 3, 4 only in memory: replayed
        ("after_publish@4", b"4"),  # v4 checkpointed and published, groups not acked
    ]
    for crash, published in chain:
        monkeypatch.setenv(ENV, f"{crash}:raise")
        with pytest.raises(SimulatedCrash, match=crash):
            Trainer(cfg, opts).run()
        assert redis_client.hget(RunKeys(cfg.name).weights, "version") == published, crash
    monkeypatch.delenv(ENV)
    state = Trainer(cfg, opts).run()
    assert state.step == STEPS and state.published_version == STEPS
    _assert_exactly_once_and_same_weights(
        tmp_path / "out", groups, make_config, tmp_path, redis_url, redis_client, cfg
    )
