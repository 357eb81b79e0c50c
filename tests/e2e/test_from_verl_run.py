"""A verl user's first run: a GRPO recipe script written the way verl's examples are, converted with
`asyncdapo config from-verl`, trains GRPO under `asyncdapo up` on data in DAPO-Math-17k's row shape
(chat prompt, `extra_info.index` a UUID string, data_source math_dapo)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis

from asyncdapo.contracts.config import load_run_config
from asyncdapo.contracts.redis_keys import RunKeys
from asyncdapo.contracts.verl_format import load_examples

pytestmark = pytest.mark.slow
STEPS = 2

GRPO_SCRIPT = """#!/usr/bin/env bash
set -xeuo pipefail
train_prompt_bsz=4
n_resp_per_prompt=4
python3 -m verl.trainer.main_ppo \\
    algorithm.adv_estimator=grpo \\
    data.train_files="${TRAIN_FILE}" \\
    data.val_files="${VAL_FILE}" \\
    data.train_batch_size=${train_prompt_bsz} \\
    data.max_prompt_length=64 \\
    data.max_response_length=$((8 * 2)) \\
    actor_rollout_ref.model.path="${MODEL_PATH}" \\
    actor_rollout_ref.rollout.n=${n_resp_per_prompt} \\
    actor_rollout_ref.rollout.name=vllm \\
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \\
    actor_rollout_ref.actor.ppo_mini_batch_size=${train_prompt_bsz} \\
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32 \\
    actor_rollout_ref.actor.optim.lr=4e-4 \\
    actor_rollout_ref.actor.use_kl_loss=False \\
    trainer.logger=['console'] \\
    trainer.project_name=e2e \\
    trainer.experiment_name=grpo-from-verl \\
    trainer.total_training_steps=${STEPS} \\
    trainer.test_freq=${STEPS}
"""


def _dapo_shaped(src: Path, dst: Path) -> Path:
    """The synthetic problems rewritten in DAPO-Math-17k's row shape."""
    rows = [
        {
            "data_source": "math_dapo",
            "prompt": [{"role": "user", "content": e.prompt_text()}],
            "ability": "MATH",
            "reward_model": {"ground_truth": e.ground_truth, "style": "rule-lighteval/MATH_v2"},
            "extra_info": {"index": str(uuid.UUID(int=i))},
        }
        for i, e in enumerate(load_examples([src]))
    ]
    pq.write_table(pa.Table.from_pylist(rows), dst)
    return dst


def test_a_converted_grpo_script_trains_grpo(
    warm_model: tuple[Path, Path], redis_url: str, tmp_path: Path
) -> None:
    model, data = warm_model
    train = _dapo_shaped(data / "train.parquet", tmp_path / "dapo-math-17k.parquet")
    val = _dapo_shaped(data / "val.parquet", tmp_path / "aime-2024.parquet")
    script = tmp_path / "run_grpo.sh"
    script.write_text(GRPO_SCRIPT)
    converted = tmp_path / "grpo.yaml"
    env = {"PATH": "/usr/bin:/bin", "TRAIN_FILE": str(train), "VAL_FILE": str(val), "MODEL_PATH": str(model),
           "STEPS": str(STEPS)}  # fmt: skip
    conv = subprocess.run(
        [sys.executable, "-m", "asyncdapo.cli", "config", "from-verl", str(script), "-o", str(converted), "--strict"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert conv.returncode == 0, conv.stderr
    assert "verl entry: main_ppo" in conv.stderr

    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "asyncdapo.cli", "up", str(converted), "--quiet", "--run-dir", str(run_dir),
         "--redis-url", redis_url, "--timeout-s", "600"],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]

    # the run's resolved config is GRPO as verl's main_ppo runs it
    cfg = load_run_config(run_dir / "config.yaml")
    assert cfg.reward.filter_groups is False and cfg.reward.overlong_buffer.enable is False
    a = cfg.algorithm
    assert (a.clip_ratio_low, a.clip_ratio_high, a.clip_ratio_c, a.kl_coef) == (0.2, 0.2, 3.0, 0.0)
    assert (cfg.trainer.weight_decay, cfg.trainer.warmup_steps, cfg.trainer.total_steps) == (0.01, 0, STEPS)
    assert (cfg.reward.correct_reward, cfg.reward.incorrect_reward) == (1.0, -1.0)  # data_source math_dapo

    rows = [json.loads(line) for line in (run_dir / "trainer" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    for r in rows:
        # no overlong shaping: the reward is the score, even with 16-token answers cut at the cap
        assert r["reward/mean"] == pytest.approx(r["score/mean"])
        # scores on verl's DAPO scale: +1 correct, -1 wrong
        assert r["score/mean"] == pytest.approx(2 * r["acc/mean"] - 1)
    # no dynamic sampling: every finished group was valid, none filtered
    counters = redis.Redis.from_url(redis_url, decode_responses=True).hgetall(RunKeys(cfg.name).counters)
    assert int(counters.get("outcome:filtered", 0)) == 0
    assert int(counters.get("outcome:valid", 0)) >= STEPS * cfg.data.train_batch_size
