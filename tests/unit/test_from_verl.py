"""`asyncdapo config from-verl`: the verl DAPO recipe shipped in the docs converts to a valid run
config with the recipe's values; every key is mapped or reported; the docs table is the rules'."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from asyncdapo.config import ConfigError, LossAggMode, load_run_config
from asyncdapo.from_verl import convert, keys_table, read_sources
from asyncdapo.from_verl.shell import read_script

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "docs" / "examples" / "verl-dapo-recipe.sh"
DOC = REPO / "docs" / "coming-from-verl.md"


def test_the_docs_recipe_converts(tmp_path: Path) -> None:
    out = tmp_path / "run.yaml"
    proc = subprocess.run(
        [sys.executable, "-m", "asyncdapo.cli", "config", "from-verl", str(RECIPE), "-o", str(out),
         "--set", "rollout.max_staleness=1"],
        capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    cfg = load_run_config(out)
    assert cfg.name == "dapo-qwen2-5-math-7b-gsm8k"
    assert cfg.model.path == "Qwen/Qwen2.5-Math-7B"
    assert cfg.data.train_files == ["data/gsm8k/train.parquet"]
    # $((1024 * 1)), $((1024 * 3)) and the overlong buffer under reward_kwargs.overlong_buffer_cfg
    assert (cfg.data.max_prompt_length, cfg.data.max_response_length) == (1024, 3072)
    assert cfg.reward.overlong_buffer.len == 1024 and cfg.reward.overlong_buffer.enable
    assert (cfg.data.train_batch_size, cfg.rollout.n, cfg.trainer.ppo_mini_batch_size) == (64, 8, 16)
    assert (cfg.algorithm.clip_ratio_low, cfg.algorithm.clip_ratio_high, cfg.algorithm.clip_ratio_c) == (
        0.2, 0.28, 10.0,
    )  # fmt: skip
    assert cfg.algorithm.loss_agg_mode is LossAggMode.TOKEN_MEAN and cfg.algorithm.kl_coef == 0.0
    assert cfg.trainer.lr == 1e-6 and cfg.trainer.warmup_steps == 10 and cfg.trainer.total_steps == 200
    assert (cfg.trainer.val_every, cfg.trainer.checkpoint_every) == (10, 10)
    assert (cfg.rollout.val_n, cfg.rollout.val_temperature) == (4, 1.0)
    assert [b.value for b in cfg.logging.backends] == ["wandb"]
    assert cfg.logging.project == "DAPO" and cfg.logging.experiment == "DAPO-Qwen2.5-Math-7B-gsm8k"
    assert cfg.rollout.max_staleness == 1  # --set after the conversion
    text = out.read_text()
    # what could not be mapped is listed, with the reason, in the file and on stderr
    for key in ("data.gen_batch_size", "actor_rollout_ref.rollout.gpu_memory_utilization", "trainer.nnodes"):
        assert f"#   {key}=" in text and key in proc.stderr


def test_shell_expansion_like_bash(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FROM_ENV", "/data")
    script = """
a=4
b=$((a * 3 + 1))  # a comment
P=${P:-"${FROM_ENV}/models"}
python3 -m x \\
    k.a=${a} k.b="${b}" k.c=$((b - a)) k.p="${P}/m" 'k.q=${a}' \\
    k.u=${UNSET_VAR_XYZ} --flag k.list=['console','wandb']
"""
    read = read_script(script)
    assert read.overrides == ["k.a=4", "k.b=13", "k.c=9", "k.p=/data/models/m", "k.q=${a}",
                              "k.u=${UNSET_VAR_XYZ}", "k.list=[console,wandb]"]  # fmt: skip
    assert read.unresolved == {"k.u=${UNSET_VAR_XYZ}": "${UNSET_VAR_XYZ}"}


def test_verl_yaml_and_interpolation(tmp_path: Path) -> None:
    f = tmp_path / "verl.yaml"
    f.write_text(yaml.safe_dump({
        "data": {"train_batch_size": 32, "gen_batch_size": "${data.train_batch_size}", "max_response_length": 256},
        "actor_rollout_ref": {"actor": {"clip_ratio": 0.25, "clip_ratio_high": 0.3, "ppo_mini_batch_size": 8,
                                        "use_kl_loss": True, "kl_loss_coef": 0.01}},
        "algorithm": {"adv_estimator": "grpo"},
        "trainer": {"experiment_name": "My_Exp!", "logger": ["console", "tensorboard", "file"]},
    }))  # fmt: skip
    conv = convert(read_sources([str(f), "trainer.total_training_steps=7"]))
    cfg = conv.config
    assert cfg.data.train_batch_size == 32 and cfg.trainer.total_steps == 7
    assert (cfg.algorithm.clip_ratio_low, cfg.algorithm.clip_ratio_high) == (0.25, 0.3)  # high given
    assert cfg.algorithm.kl_coef == 0.01  # use_kl_loss=True keeps kl_loss_coef
    assert cfg.name == "my-exp" and [b.value for b in cfg.logging.backends] == ["tensorboard", "jsonl"]
    assert ("data.gen_batch_size", 32) in [(k, v) for k, v, _ in conv.unmapped]


def test_unmappable_values_are_reported_not_guessed() -> None:
    conv = convert(read_sources(["algorithm.adv_estimator=gae", "trainer.logger=['swanlab']", "foo.bar=1"]))
    why = {k: reason for k, _, reason in conv.unmapped}
    assert "GRPO advantages only" in why["algorithm.adv_estimator"]
    assert "swanlab" in why["trainer.logger"]
    assert why["foo.bar"] == "not a verl key asyncdapo knows"
    with pytest.raises(ConfigError, match=r"set by verl key actor_rollout_ref\.actor\.ppo_mini_batch_size"):
        convert(read_sources(["data.train_batch_size=6", "actor_rollout_ref.actor.ppo_mini_batch_size=4"]))


def test_docs_table_is_the_rules() -> None:
    assert keys_table() in DOC.read_text(), (
        "regenerate the table: python -c 'from asyncdapo.from_verl import keys_table; print(keys_table())'"
    )
