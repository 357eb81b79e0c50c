#!/usr/bin/env bash
# DAPO without dynamic sampling, with the reward settings in the layout of verl-recipe's 2026 scripts
# (reward.reward_manager.name, reward.reward_kwargs.overlong_buffer_cfg.*). Filtering off means every
# group trains, zero-variance ones included, exactly as verl's recipe.dapo runs it.
#   asyncdapo config from-verl docs/examples/verl/dapo-no-dynamic-sampling.sh -o runs/dapo-wo-ds.yaml
set -xeuo pipefail

project_name='DAPO'
exp_name='DAPO-wo-DS-Qwen2.5-7B'

max_prompt_length=$((1024 * 2))
max_response_length=$((1024 * 8))
overlong_buffer_len=$((1024 * 2))
train_prompt_bsz=128
train_prompt_mini_bsz=$((train_prompt_bsz / 4))
n_resp_per_prompt=16

MODEL_PATH=${MODEL_PATH:-"Qwen/Qwen2.5-7B"}
TRAIN_FILE=${TRAIN_FILE:-"data/dapo-math-17k.parquet"}
TEST_FILE=${TEST_FILE:-"data/aime-2024.parquet"}

python3 -m recipe.dapo.main_dapo \
    data.train_files="${TRAIN_FILE}" \
    data.val_files="${TEST_FILE}" \
    data.truncation='left' \
    data.max_prompt_length=${max_prompt_length} \
    data.max_response_length=${max_response_length} \
    data.train_batch_size=${train_prompt_bsz} \
    actor_rollout_ref.rollout.n=${n_resp_per_prompt} \
    algorithm.adv_estimator=grpo \
    algorithm.use_kl_in_reward=False \
    algorithm.kl_ctrl.kl_coef=0.0 \
    actor_rollout_ref.actor.use_kl_loss=False \
    actor_rollout_ref.actor.clip_ratio_low=0.2 \
    actor_rollout_ref.actor.clip_ratio_high=0.28 \
    actor_rollout_ref.actor.clip_ratio_c=10.0 \
    algorithm.filter_groups.enable=False \
    actor_rollout_ref.model.path="${MODEL_PATH}" \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.optim.lr_warmup_steps=10 \
    actor_rollout_ref.actor.optim.weight_decay=0.1 \
    actor_rollout_ref.actor.ppo_mini_batch_size=${train_prompt_mini_bsz} \
    actor_rollout_ref.actor.loss_agg_mode=token-mean \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.85 \
    actor_rollout_ref.rollout.val_kwargs.temperature=1.0 \
    actor_rollout_ref.rollout.val_kwargs.top_p=0.7 \
    actor_rollout_ref.rollout.val_kwargs.do_sample=True \
    reward.reward_manager.name=dapo \
    reward.reward_kwargs.overlong_buffer_cfg.enable=True \
    reward.reward_kwargs.overlong_buffer_cfg.len=${overlong_buffer_len} \
    reward.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0 \
    reward.reward_kwargs.max_resp_len=${max_response_length} \
    trainer.logger='["console","tensorboard"]' \
    trainer.project_name="${project_name}" \
    trainer.experiment_name="${exp_name}" \
    trainer.test_freq=5 \
    trainer.save_freq=-1 \
    trainer.total_epochs=2 \
    trainer.resume_mode=auto
