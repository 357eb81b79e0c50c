"""`asyncdapo config from-verl`: each verl recipe family converts to the run config verl would run,
checked field by field against the values verl runs (the script's, else verl's defaults for its
entry); what cannot train is refused; --strict fails only on what changes the algorithm."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from asyncdapo.contracts.config import LossAggMode, RunConfig, load_run_config
from asyncdapo.tools.from_verl import MAPPED, Entry, VerlRecipeError, convert, keys_table, read_sources
from asyncdapo.tools.from_verl.derive import derive
from asyncdapo.tools.from_verl.entries import verl_defaults
from asyncdapo.tools.from_verl.probe import DataProbe

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "docs" / "examples" / "verl"
DOC = REPO / "docs" / "coming-from-verl.md"


def _parquet(path: Path, rows: int, data_source: str) -> Path:
    """A training file in verl's layout (the columns from-verl reads: data_source; the rest as verl has them)."""
    pq.write_table(
        pa.Table.from_pylist([
            {"data_source": data_source, "prompt": [{"role": "user", "content": f"q{i}"}], "ability": "MATH",
             "reward_model": {"ground_truth": str(i), "style": "rule"}, "extra_info": {"index": f"id-{i}"}}
            for i in range(rows)
        ]),
        path,
    )  # fmt: skip
    return path


def _from_verl(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    base = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")}
    return subprocess.run(
        [sys.executable, "-m", "asyncdapo.cli", "config", "from-verl", *args],
        capture_output=True, text=True, env={**base, **(env or {})}, timeout=60, cwd=cwd,
    )  # fmt: skip


def _fields(cfg: RunConfig, *paths: str) -> dict[str, Any]:
    data = cfg.model_dump(mode="json")
    out = {}
    for p in paths:
        node: Any = data
        for part in p.split("."):
            node = node[part]
        out[p] = node
    return out


def test_dapo_recipe_with_dynamic_sampling(tmp_path: Path) -> None:
    train = _parquet(tmp_path / "dapo-math-17k.parquet", 1000, "math_dapo")
    out = tmp_path / "run.yaml"
    proc = _from_verl(str(EXAMPLES / "dapo.sh"), "-o", str(out), "--strict", env={"TRAIN_FILE": str(train)})
    assert proc.returncode == 0, proc.stderr
    cfg = load_run_config(out)
    assert "verl entry: main_dapo" in proc.stderr
    assert cfg.name == "dapo-qwen2-5-math-7b" and cfg.model.path == "Qwen/Qwen2.5-Math-7B"
    assert _fields(cfg, "data.train_files", "data.max_prompt_length", "data.max_response_length",
                   "data.train_batch_size", "data.truncation") == {
        "data.train_files": [str(train)], "data.max_prompt_length": 1024, "data.max_response_length": 3072,
        "data.train_batch_size": 64, "data.truncation": "left",
    }  # fmt: skip
    # the generation batch (3 x the training batch) is the number of prompts in flight
    assert (cfg.rollout.max_concurrent_prompts, cfg.rollout.max_num_gen_batches) == (192, 10)
    assert (cfg.rollout.n, cfg.rollout.max_staleness, cfg.rollout.early_stop_order.value) == (8, 0, "fifo")
    assert (cfg.reward.filter_groups, cfg.reward.filter_metric.value) == (True, "acc")
    ob = cfg.reward.overlong_buffer
    assert (ob.enable, ob.len, ob.penalty_factor) == (True, 1024, 1.0)
    # data_source math_dapo: verl's DAPO scorer, +1 / -1
    assert (cfg.reward.correct_reward, cfg.reward.incorrect_reward) == (1.0, -1.0)
    a = cfg.algorithm
    assert (a.clip_ratio_low, a.clip_ratio_high, a.clip_ratio_c, a.kl_coef, a.entropy_coeff) == (
        0.2,
        0.28,
        10.0,
        0,
        0,
    )
    assert (
        a.loss_agg_mode is LossAggMode.TOKEN_MEAN
        and a.old_log_prob.value == "recompute"
        and a.tis_cap is None
    )
    t = cfg.trainer
    assert (t.lr, t.weight_decay, t.warmup_steps, t.lr_schedule.value, t.grad_clip) == (
        1e-6,
        0.1,
        10,
        "constant",
        1.0,
    )
    assert (t.total_steps, t.ppo_mini_batch_size, t.val_every, t.checkpoint_every) == (200, 16, 10, 10)
    assert (t.workers, t.sharding.value, t.activation_checkpointing) == (8, "fsdp", True)
    # use_remove_padding, use_dynamic_bsz with ppo_max_token_len_per_gpu (prompt + response) x 2
    assert (t.packing, t.micro_batch_tokens) == (True, (1024 + 3072) * 2)
    assert (cfg.rollout.val_n, cfg.rollout.val_temperature, cfg.rollout.val_top_p) == (4, 1.0, 0.7)
    assert [b.value for b in cfg.logging.backends] == ["wandb"] and cfg.logging.project == "DAPO"
    text = out.read_text()
    # performance-only keys are listed (file and stderr), not fatal under --strict
    for key in (
        "actor_rollout_ref.rollout.gpu_memory_utilization",
        "actor_rollout_ref.actor.fsdp_config.param_offload",
    ):
        assert f"#   {key}=" in text and key in proc.stderr


def test_dapo_without_dynamic_sampling_and_the_newer_reward_layout(tmp_path: Path) -> None:
    train = _parquet(tmp_path / "train.parquet", 1300, "math_dapo")
    conv = convert(read_sources([str(EXAMPLES / "dapo-no-dynamic-sampling.sh")]),
                   probe=DataProbe(rows=1300, data_sources=frozenset({"math_dapo"})))  # fmt: skip
    del train
    cfg = conv.config
    assert conv.entry is Entry.MAIN_DAPO and not conv.different
    assert cfg.reward.filter_groups is False
    # reward.reward_kwargs.overlong_buffer_cfg.*: a 2048-token buffer, not asyncdapo's default 128
    assert (cfg.reward.overlong_buffer.enable, cfg.reward.overlong_buffer.len) == (True, 2048)
    # data.gen_batch_size unset: recipe.dapo's ${data.train_batch_size}
    assert (
        cfg.data.train_batch_size,
        cfg.rollout.max_concurrent_prompts,
        cfg.trainer.ppo_mini_batch_size,
    ) == (128, 128, 32)
    # 2 epochs x (1300 // 128) batches, as verl's dataloader (drop_last) counts them
    assert cfg.trainer.total_steps == 20
    # save_freq -1 (never): the final step only
    assert cfg.trainer.checkpoint_every == 20


def test_plain_grpo_is_not_turned_into_dapo(tmp_path: Path) -> None:
    train = _parquet(tmp_path / "gsm8k-train.parquet", 7473, "openai/gsm8k")
    out = tmp_path / "grpo.yaml"
    proc = _from_verl(str(EXAMPLES / "grpo.sh"), "-o", str(out), "--strict", env={"TRAIN_FILE": str(train)})
    assert proc.returncode == 0, proc.stderr
    cfg = load_run_config(out)
    assert "verl entry: main_ppo" in proc.stderr
    # GRPO: no dynamic sampling, symmetric clip, verl's dual-clip 3, no overlong shaping
    assert cfg.reward.filter_groups is False and cfg.reward.overlong_buffer.enable is False
    a = cfg.algorithm
    assert (a.clip_ratio_low, a.clip_ratio_high, a.clip_ratio_c) == (0.2, 0.2, 3.0)
    assert (a.kl_coef, a.norm_adv_by_std, a.old_log_prob.value) == (0.001, True, "recompute")
    # verl's optimizer defaults, not asyncdapo's DAPO ones
    t = cfg.trainer
    assert (t.weight_decay, t.warmup_steps, t.lr) == (0.01, 0, 1e-6)
    # 15 epochs x (7473 // 256)
    assert (t.total_steps, t.micro_batch_size, t.ppo_mini_batch_size) == (15 * 29, 8, 64)
    # GSM8K rows: verl's gsm8k scorer gives 1 / 0
    assert (cfg.reward.correct_reward, cfg.reward.incorrect_reward) == (1.0, 0.0)
    assert (cfg.data.truncation.value, cfg.rollout.n, cfg.rollout.max_concurrent_prompts) == ("drop", 5, 256)
    assert (cfg.rollout.val_n, cfg.rollout.val_temperature) == (1, 0.0)  # verl validates greedily by default


def test_one_step_off(tmp_path: Path) -> None:
    conv = convert(read_sources([str(EXAMPLES / "one-step-off.sh")]),
                   probe=DataProbe(rows=17000, data_sources=frozenset({"math_dapo"})))  # fmt: skip
    cfg = conv.config
    assert conv.entry is Entry.ONE_STEP_OFF and not conv.different
    r = cfg.rollout
    assert (r.max_staleness, r.weight_update_mode.value, r.max_concurrent_prompts) == (1, "wait", 256)
    # bypass mode (the entry's default): the PPO ratio against the rollout's log-probs
    assert cfg.algorithm.old_log_prob.value == "rollout"
    # one-step-off has no dynamic sampling; the overlong buffer came through +reward_model.reward_kwargs
    assert cfg.reward.filter_groups is False
    assert (cfg.reward.overlong_buffer.enable, cfg.reward.overlong_buffer.len) == (True, 4096)
    # training GPUs: 8 - 4 for rollout
    assert (cfg.trainer.workers, cfg.trainer.sharding.value, cfg.trainer.total_steps) == (4, "fsdp", 400)


def test_fully_async(tmp_path: Path) -> None:
    conv = convert(read_sources([str(EXAMPLES / "fully-async.sh")]),
                   probe=DataProbe(rows=17000, data_sources=frozenset({"math_dapo"})))  # fmt: skip
    cfg = conv.config
    assert conv.entry is Entry.FULLY_ASYNC and not conv.different
    # one trainer update = require_batches (4) x ppo_mini_batch_size (32) samples; weights sync every 4
    assert (cfg.data.train_batch_size, cfg.trainer.ppo_mini_batch_size, cfg.trainer.publish_every) == (
        128,
        32,
        4,
    )
    # staleness_threshold 0.1 over a 4-update sync: (1 + 0.1) x 4 - 1 updates
    assert cfg.rollout.max_staleness == pytest.approx(3.4)
    assert cfg.valid_group_bound(0) == int(128 * 4 * 1.1)  # verl: (1 + threshold) x a sync's samples
    # partial rollout: requests continue on the new weights; old log-probs from the rollout
    assert (cfg.rollout.weight_update_mode.value, cfg.algorithm.old_log_prob.value) == ("keep", "rollout")
    # $(((512*100))) samples / 128 per update; validation every 10 syncs
    assert (cfg.trainer.total_steps, cfg.trainer.val_every) == (400, 40)
    # verl's rollouter: 16 in flight per engine (8 GPUs / TP 1), at most what one sync may produce
    assert cfg.rollout.max_concurrent_prompts == 128
    assert cfg.reward.filter_groups is False and cfg.rollout.early_stop_order.value == "any"
    # train_batch_size=0 is unused by verl's fully-async trainer: reported, not an error
    assert any(k == "data.train_batch_size" for k, _, _ in conv.no_effect)


def test_an_unset_key_means_verls_default() -> None:
    conv = convert(read_sources(["algorithm.adv_estimator=grpo", "actor_rollout_ref.model.path=m"]), entry="main_ppo",
                   probe=DataProbe(rows=4096, data_sources=frozenset({"openai/gsm8k"})))  # fmt: skip
    cfg = conv.config
    d = verl_defaults(Entry.MAIN_PPO)
    assert cfg.data.train_batch_size == d["data.train_batch_size"] == 1024
    assert cfg.rollout.n == 1 and cfg.trainer.ppo_mini_batch_size == 256
    assert (cfg.algorithm.clip_ratio_high, cfg.algorithm.clip_ratio_c) == (0.2, 3.0)
    assert (cfg.trainer.weight_decay, cfg.trainer.warmup_steps) == (0.01, 0)
    assert (cfg.data.max_prompt_length, cfg.data.max_response_length, cfg.data.truncation.value) == (
        512,
        512,
        "error",
    )
    assert cfg.trainer.total_steps == 30 * 4  # 30 epochs (verl's default) x 4096 // 1024
    assert cfg.trainer.val_every == 0 and cfg.rollout.val_temperature == 0.0


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["actor_rollout_ref.model.path=m"], r"adv_estimator=gae \(verl's default.*critic"),
        (["algorithm.adv_estimator=rloo", "actor_rollout_ref.model.path=m"], "'rloo' advantage estimator"),
        (["algorithm.adv_estimator=grpo", "actor_rollout_ref.model.path=m", "algorithm.filter_groups.enable=True",
          "algorithm.filter_groups.metric=acc"], "n=1 with algorithm.filter_groups.enable=True"),
        (["algorithm.adv_estimator=grpo", "actor_rollout_ref.model.path=m", "actor_rollout_ref.model.lora_rank=64"],
         "LoRA is not supported"),
        (["algorithm.adv_estimator=grpo", "actor_rollout_ref.model.path=m", "actor_rollout_ref.rollout.n=8",
          "algorithm.filter_groups.enable=True"], "without algorithm.filter_groups.metric"),
    ],
)  # fmt: skip
def test_what_cannot_train_is_refused(args: list[str], expected: str) -> None:
    with pytest.raises(VerlRecipeError, match=expected):
        convert(read_sources(args), probe=DataProbe(rows=100, data_sources=frozenset({"math_dapo"})))


def test_the_gae_example_exits_non_zero_naming_the_key() -> None:
    proc = _from_verl(str(EXAMPLES / "ppo-gae.sh"))
    assert proc.returncode == 2 and not proc.stdout
    assert "algorithm.adv_estimator=gae" in proc.stderr and "GRPO" in proc.stderr


def test_strict_fails_only_on_what_changes_the_algorithm() -> None:
    base = ["algorithm.adv_estimator=grpo", "actor_rollout_ref.model.path=m", "trainer.total_training_steps=5",
            "actor_rollout_ref.rollout.n=4"]  # fmt: skip
    perf = _from_verl(*base, "actor_rollout_ref.rollout.gpu_memory_utilization=0.9",
                      "actor_rollout_ref.actor.fsdp_config.param_offload=True", "--strict")  # fmt: skip
    assert perf.returncode == 0, perf.stderr
    assert (
        "gpu_memory_utilization" in perf.stderr
        and "DIFFERENT from verl (cannot be expressed): 0" in perf.stderr
    )
    corr = _from_verl(*base, "algorithm.rollout_correction.rollout_is=sequence", "--strict")
    assert corr.returncode == 1 and "rollout_is" in corr.stderr and "--strict: failing" in corr.stderr
    unknown = _from_verl(*base, "foo.bar=1", "--strict")
    assert unknown.returncode == 1 and "not a verl key asyncdapo knows" in unknown.stderr
    # a difference the user resolves with --set is not one any more
    epochs = ["algorithm.adv_estimator=grpo", "actor_rollout_ref.model.path=m", "trainer.total_epochs=3"]
    assert _from_verl(*epochs, "--strict").returncode == 1  # the train files are not here: steps unknown
    assert _from_verl(*epochs, "--strict", "--set", "trainer.total_steps=90").returncode == 0


def test_padding_removal_and_dynamic_batch_size_set_packing_and_the_token_budget() -> None:
    probe = DataProbe(rows=100, data_sources=frozenset({"math_dapo"}))
    base = [
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.model.path=m",
        "trainer.total_training_steps=5",
    ]
    default = convert(read_sources(base), probe=probe)
    # verl's defaults: padding removed, micro-batches of ppo_micro_batch_size_per_gpu sequences
    assert (default.config.trainer.packing, default.config.trainer.micro_batch_tokens) == (True, None)
    dynamic = convert(read_sources([*base, "actor_rollout_ref.actor.use_dynamic_bsz=True",
                                    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=12000",
                                    "actor_rollout_ref.model.use_remove_padding=False"]), probe=probe)  # fmt: skip
    assert (dynamic.config.trainer.packing, dynamic.config.trainer.micro_batch_tokens) == (False, 12000)
    assert not dynamic.different
    mapped = {k: ours for k, _, ours in dynamic.mapped}
    assert mapped["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"] == "trainer.micro_batch_tokens"
    assert mapped["actor_rollout_ref.model.use_remove_padding"] == "trainer.packing"
    dynamic_default = convert(
        read_sources([*base, "actor_rollout_ref.actor.use_dynamic_bsz=True"]), probe=probe
    )
    assert dynamic_default.config.trainer.micro_batch_tokens == 16384  # verl's default budget
    # a budget without dynamic batch size: verl ignores it, so does the conversion (and says so)
    fixed = convert(
        read_sources([*base, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=12000"]), probe=probe
    )
    assert fixed.config.trainer.micro_batch_tokens is None
    assert [why for k, _, why in fixed.no_effect if k.endswith("ppo_max_token_len_per_gpu")] == [
        "only with use_dynamic_bsz"
    ]


def test_token_tis_and_the_older_tis_key() -> None:
    probe = DataProbe(rows=100, data_sources=frozenset({"math_dapo"}))
    base = [
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.model.path=m",
        "trainer.total_training_steps=5",
    ]
    tis = convert(read_sources([*base, "algorithm.rollout_correction.rollout_is=token",
                                "algorithm.rollout_correction.rollout_is_threshold=2.5"]), probe=probe)  # fmt: skip
    assert tis.config.algorithm.tis_cap == 2.5 and not tis.different
    old = convert(read_sources([*base, "actor_rollout_ref.actor.tis_imp_ratio_cap=2.0"]), probe=probe)
    assert old.config.algorithm.tis_cap == 2.0
    assert convert(read_sources(base), probe=probe).config.algorithm.tis_cap is None


def test_verl_yaml_and_interpolation(tmp_path: Path) -> None:
    f = tmp_path / "verl.yaml"
    f.write_text(yaml.safe_dump({
        "data": {"train_batch_size": 32, "gen_batch_size": "${data.train_batch_size}", "max_response_length": 256},
        "actor_rollout_ref": {"model": {"path": "m"}, "rollout": {"n": 4},
                              "actor": {"clip_ratio_low": None, "clip_ratio": 0.25, "clip_ratio_high": 0.3,
                                        "ppo_mini_batch_size": 8, "use_kl_loss": True, "kl_loss_coef": 0.01}},
        "algorithm": {"adv_estimator": "grpo"},
        "trainer": {"experiment_name": "My_Exp!", "logger": ["console", "tensorboard", "file"]},
    }))  # fmt: skip
    conv = convert(read_sources([str(f), "trainer.total_training_steps=7"]), entry="main_dapo",
                   probe=DataProbe(rows=100, data_sources=frozenset({"math_dapo"})))  # fmt: skip
    cfg = conv.config
    assert cfg.data.train_batch_size == 32 and cfg.trainer.total_steps == 7
    assert cfg.rollout.max_concurrent_prompts == 32  # gen_batch_size = ${data.train_batch_size}
    # clip_ratio fills clip_ratio_low, which is null; clip_ratio_high is given
    assert (cfg.algorithm.clip_ratio_low, cfg.algorithm.clip_ratio_high) == (0.25, 0.3)
    assert cfg.algorithm.kl_coef == 0.01  # use_kl_loss=True keeps kl_loss_coef
    assert cfg.name == "my-exp" and [b.value for b in cfg.logging.backends] == ["tensorboard", "jsonl"]


def test_every_key_the_conversion_reads_is_documented() -> None:
    """keys.MAPPED (the docs table) lists exactly the keys the conversion reads, over every entry
    with every switch on and off."""
    plain = {
        "algorithm.adv_estimator": "grpo",
        "actor_rollout_ref.model.path": "m",
        "actor_rollout_ref.rollout.n": 4,
    }
    switched = {
        **plain, "algorithm.filter_groups.enable": True, "algorithm.filter_groups.metric": "acc",
        "actor_rollout_ref.actor.use_kl_loss": True, "actor_rollout_ref.rollout.val_kwargs.do_sample": True,
        "actor_rollout_ref.actor.optim.lr_scheduler_type": "cosine", "reward_model.reward_manager": "dapo",
        "reward_model.overlong_buffer.enable": True, "reward_model.overlong_buffer.len": 16,
        "trainer.n_gpus_per_node": 2, "actor_rollout_ref.rollout.max_num_seqs": 64, "data.seed": 3,
        "actor_rollout_ref.model.enable_gradient_checkpointing": False, "data.val_max_samples": 8,
        "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio": 0.1, "algorithm.rollout_correction.rollout_is": "token",
        "actor_rollout_ref.actor.tis_imp_ratio_cap": 2.0, "actor_rollout_ref.actor.use_dynamic_bsz": True,
    }  # fmt: skip
    read: set[str] = set()
    for entry in Entry:
        for given in (plain, switched):
            read |= derive(given, entry, DataProbe(rows=100000, data_sources=frozenset({"math_dapo"}))).read
    documented = {m.verl for m in MAPPED}
    assert read - documented == set(), "document these keys in keys.MAPPED"
    assert documented - read == set(), "keys.MAPPED lists keys the conversion never reads"


def test_docs_table_is_the_rules() -> None:
    assert keys_table() in DOC.read_text(), (
        "regenerate the table: python -c 'from asyncdapo.tools.from_verl import keys_table; print(keys_table())'"
    )
