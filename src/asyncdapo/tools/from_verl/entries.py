"""verl's recipe families (the entry module a script runs) and the defaults each one starts from.

An unset key means what it means in verl, so a conversion starts from verl's own defaults for the
entry the recipe runs, not from asyncdapo's. The values below are facts read from verl's configs:
`verl/trainer/config/ppo_trainer.yaml` (with the actor, rollout, model, data and
rollout_correction files it composes; verl 0.7, January 2026), the DAPO recipe's
`config/dapo_trainer.yaml` (recipe/dapo, moved to the verl-recipe repository in 2026),
`one_step_off_ppo_trainer.yaml` and `fully_async_ppo_trainer.yaml` (verl/experimental). Only the
keys a conversion reads are listed; every other key is classified by `keys.py`.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class Entry(StrEnum):
    MAIN_PPO = "main_ppo"  # verl.trainer.main_ppo: the synchronous PPO/GRPO loop
    MAIN_DAPO = "main_dapo"  # recipe.dapo.main_dapo: + dynamic sampling and overlong shaping
    ONE_STEP_OFF = "one_step_off"  # one_step_off_policy.main_ppo: rollout one step ahead
    FULLY_ASYNC = "fully_async"  # fully_async_policy.fully_async_main: streaming, staleness threshold


# The module (`python -m …`) or script path of each entry, as verl's recipes start them.
_MODULES: dict[str, Entry] = {
    "verl.trainer.main_ppo": Entry.MAIN_PPO,
    "recipe.dapo.main_dapo": Entry.MAIN_DAPO,
    "recipe.dapo.src.main_dapo": Entry.MAIN_DAPO,
    "verl.experimental.one_step_off_policy.main_ppo": Entry.ONE_STEP_OFF,
    "recipe.one_step_off_policy.main_ppo": Entry.ONE_STEP_OFF,
    "verl.experimental.fully_async_policy.fully_async_main": Entry.FULLY_ASYNC,
    "recipe.fully_async_policy.fully_async_main": Entry.FULLY_ASYNC,
}


def entry_of(module: str) -> Entry | None:
    """The family of `python -m MODULE`, or of a script path that ends in one (…/verl/trainer/main_ppo.py)."""
    name = module.strip()
    if name.endswith(".py"):
        name = name[:-3].replace("/", ".")
        return next((e for m, e in _MODULES.items() if name == m or name.endswith("." + m)), None)
    return _MODULES.get(name)


def known_modules() -> list[str]:
    return sorted(_MODULES)


# ppo_trainer.yaml: what every entry composes first.
_PPO: dict[str, Any] = {
    # data
    "data.train_files": None,  # verl's own default is a placeholder path (~/data/rlhf/gsm8k/...)
    "data.val_files": None,
    "data.prompt_key": "prompt",
    "data.train_batch_size": 1024,
    "data.max_prompt_length": 512,
    "data.max_response_length": 512,
    "data.shuffle": True,
    "data.seed": None,
    "data.filter_overlong_prompts": False,
    "data.truncation": "error",
    "data.train_max_samples": -1,
    "data.val_max_samples": -1,
    "data.apply_chat_template_kwargs": {},
    # model
    "actor_rollout_ref.model.path": None,  # verl's default is a placeholder (~/models/deepseek-llm-7b-chat)
    "actor_rollout_ref.model.trust_remote_code": False,
    "actor_rollout_ref.model.enable_gradient_checkpointing": True,
    "actor_rollout_ref.model.lora_rank": 0,
    "actor_rollout_ref.model.custom_chat_template": None,
    "actor_rollout_ref.model.tokenizer_path": None,
    "actor_rollout_ref.model.use_remove_padding": True,
    # rollout (training and validation sampling)
    "actor_rollout_ref.rollout.n": 1,
    "actor_rollout_ref.rollout.temperature": 1.0,
    "actor_rollout_ref.rollout.top_p": 1.0,
    "actor_rollout_ref.rollout.top_k": -1,
    "actor_rollout_ref.rollout.do_sample": True,
    "actor_rollout_ref.rollout.ignore_eos": False,
    "actor_rollout_ref.rollout.over_sample_rate": 0,
    "actor_rollout_ref.rollout.multi_turn.enable": False,
    "actor_rollout_ref.rollout.tensor_model_parallel_size": 2,
    "actor_rollout_ref.rollout.val_kwargs.n": 1,
    "actor_rollout_ref.rollout.val_kwargs.temperature": 0.0,
    "actor_rollout_ref.rollout.val_kwargs.top_p": 1.0,
    "actor_rollout_ref.rollout.val_kwargs.top_k": -1,
    "actor_rollout_ref.rollout.val_kwargs.do_sample": False,
    # actor (the policy update)
    "actor_rollout_ref.actor.strategy": "fsdp",
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": 1,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 256,
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": None,
    "actor_rollout_ref.actor.use_dynamic_bsz": False,
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 16384,
    "actor_rollout_ref.actor.ppo_epochs": 1,
    "actor_rollout_ref.actor.shuffle": False,
    "actor_rollout_ref.actor.clip_ratio": 0.2,
    "actor_rollout_ref.actor.clip_ratio_low": 0.2,
    "actor_rollout_ref.actor.clip_ratio_high": 0.2,
    "actor_rollout_ref.actor.clip_ratio_c": 3.0,
    "actor_rollout_ref.actor.loss_agg_mode": "token-mean",
    "actor_rollout_ref.actor.loss_scale_factor": None,
    "actor_rollout_ref.actor.policy_loss.loss_mode": "vanilla",
    "actor_rollout_ref.actor.entropy_coeff": 0.0,
    "actor_rollout_ref.actor.use_kl_loss": False,
    "actor_rollout_ref.actor.kl_loss_coef": 0.001,
    "actor_rollout_ref.actor.kl_loss_type": "low_var_kl",
    "actor_rollout_ref.actor.grad_clip": 1.0,
    "actor_rollout_ref.actor.tis_imp_ratio_cap": -1,  # verl 0.5-0.6's truncated IS (-1: off)
    "actor_rollout_ref.actor.optim.optimizer": "AdamW",
    "actor_rollout_ref.actor.optim.lr": 1e-6,
    "actor_rollout_ref.actor.optim.weight_decay": 0.01,
    "actor_rollout_ref.actor.optim.betas": [0.9, 0.999],
    "actor_rollout_ref.actor.optim.lr_warmup_steps": -1,  # -1: lr_warmup_steps_ratio x total steps
    "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio": 0.0,
    "actor_rollout_ref.actor.optim.lr_scheduler_type": "constant",
    "actor_rollout_ref.actor.optim.warmup_style": None,  # older name of lr_scheduler_type
    "actor_rollout_ref.actor.optim.min_lr_ratio": 0.0,
    "actor_rollout_ref.actor.optim.num_cycles": 0.5,
    # algorithm
    "algorithm.adv_estimator": "gae",
    "algorithm.norm_adv_by_std_in_grpo": True,
    "algorithm.use_kl_in_reward": False,
    "algorithm.use_pf_ppo": False,
    "algorithm.rollout_correction.rollout_is": None,
    "algorithm.rollout_correction.rollout_is_threshold": 2.0,
    "algorithm.rollout_correction.rollout_rs": None,
    "algorithm.rollout_correction.rollout_token_veto_threshold": None,
    "algorithm.rollout_correction.bypass_mode": False,
    "algorithm.rollout_correction.loss_type": "ppo_clip",
    "algorithm.rollout_correction.rollout_is_batch_normalize": False,
    # reward
    "reward_model.enable": False,
    "reward_model.reward_manager": "naive",
    "custom_reward_function.path": None,
    # trainer
    "trainer.total_epochs": 30,
    "trainer.total_training_steps": None,
    "trainer.test_freq": -1,
    "trainer.save_freq": -1,
    "trainer.val_only": False,
    "trainer.logger": ["console", "wandb"],
    "trainer.project_name": "verl_examples",
    "trainer.experiment_name": "gsm8k",
    "trainer.n_gpus_per_node": 8,
    "trainer.nnodes": 1,
    "trainer.default_local_dir": None,  # checkpoints/${trainer.project_name}/${trainer.experiment_name}
}

# recipe/dapo/config/dapo_trainer.yaml: both switches off unless a script turns them on.
_DAPO: dict[str, Any] = {
    "data.gen_batch_size": None,  # ${data.train_batch_size}
    "reward_model.reward_manager": "dapo",
    "reward_model.overlong_buffer.enable": False,
    "reward_model.overlong_buffer.len": 0,
    "reward_model.overlong_buffer.penalty_factor": 0.0,
    "algorithm.filter_groups.enable": False,
    "algorithm.filter_groups.metric": None,
    "algorithm.filter_groups.max_num_gen_batches": 0,  # <= 0: no limit
    "trainer.project_name": "verl-dapo",
}

# one_step_off_ppo_trainer.yaml: separate rollout GPUs; old log-probs taken from the rollout.
_ONE_STEP_OFF: dict[str, Any] = {
    "rollout.nnodes": 1,
    "rollout.n_gpus_per_node": 8,
    "algorithm.rollout_correction.bypass_mode": True,
}

# fully_async_ppo_trainer.yaml
_FULLY_ASYNC: dict[str, Any] = {
    "async_training.staleness_threshold": 0.1,
    "async_training.trigger_parameter_sync_step": 4,
    "async_training.require_batches": 1,
    "async_training.partial_rollout": True,
    "async_training.use_rollout_log_probs": True,
    "async_training.compute_prox_log_prob": False,
    "rollout.nnodes": 1,
    "rollout.n_gpus_per_node": 8,
    "rollout.total_rollout_steps": 100,
    "rollout.total_epochs": 10,
    "rollout.test_freq": 1,
    "data.gen_batch_size": 1,
}


def verl_defaults(entry: Entry) -> dict[str, Any]:
    """verl's default value of every key a conversion of `entry` reads."""
    extra = {
        Entry.MAIN_PPO: {},
        Entry.MAIN_DAPO: _DAPO,
        Entry.ONE_STEP_OFF: _ONE_STEP_OFF,
        Entry.FULLY_ASYNC: _FULLY_ASYNC,
    }[entry]
    return {**_PPO, **extra}
