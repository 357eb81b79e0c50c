#!/usr/bin/env bash
# verl's one-step-off-policy trainer: rollout on its own GPUs generates step t+1's batch while step t
# trains, so every batch is one version old, and the PPO ratio is taken against the rollout's own
# log-probs (rollout_correction.bypass_mode, the entry's default).
#   asyncdapo config from-verl docs/examples/verl/one-step-off.sh -o runs/one-step-off.yaml
set -xeuo pipefail

project_name='DAPO'
exp_name='DAPO-Qwen2.5-7b-one-step-off'

MODEL_PATH=${MODEL_PATH:-"Qwen/Qwen2.5-Math-7B"}
TRAIN_FILE=${TRAIN_FILE:-"data/dapo-math-17k.parquet"}
TEST_FILE=${TEST_FILE:-"data/aime-2024.parquet"}

max_prompt_length=$((1024 * 2))
max_response_length=$((1024 * 8))
NNODES=${NNODES:-1}
n_gpus_rollout=4
n_gpus_training=$((8 - n_gpus_rollout))

python3 -m verl.experimental.one_step_off_policy.main_ppo \
    data.train_files="${TRAIN_FILE}" \
    data.val_files="${TEST_FILE}" \
    data.prompt_key=prompt \
    data.truncation='left' \
    data.max_prompt_length=${max_prompt_length} \
    data.max_response_length=${max_response_length} \
    data.train_batch_size=256 \
    actor_rollout_ref.rollout.n=16 \
    algorithm.adv_estimator=grpo \
    actor_rollout_ref.actor.strategy=fsdp2 \
    actor_rollout_ref.actor.clip_ratio_low=0.2 \
    actor_rollout_ref.actor.clip_ratio_high=0.28 \
    actor_rollout_ref.actor.clip_ratio_c=10.0 \
    actor_rollout_ref.hybrid_engine=False \
    actor_rollout_ref.model.path="${MODEL_PATH}" \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.optim.lr_warmup_steps=10 \
    actor_rollout_ref.actor.optim.weight_decay=0.1 \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.actor.use_dynamic_bsz=True \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=$(((max_prompt_length + max_response_length) * 2)) \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.val_kwargs.temperature=1.0 \
    actor_rollout_ref.rollout.val_kwargs.top_p=0.7 \
    actor_rollout_ref.rollout.val_kwargs.do_sample=True \
    reward_model.reward_manager=dapo \
    +reward_model.reward_kwargs.overlong_buffer_cfg.enable=True \
    +reward_model.reward_kwargs.overlong_buffer_cfg.len=$((1024 * 4)) \
    +reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0 \
    +reward_model.reward_kwargs.overlong_buffer_cfg.log=False \
    +reward_model.reward_kwargs.max_resp_len=${max_response_length} \
    trainer.logger=['console','tensorboard'] \
    trainer.project_name="${project_name}" \
    trainer.experiment_name="${exp_name}" \
    trainer.test_freq=10 \
    trainer.save_freq=-1 \
    trainer.total_training_steps=400 \
    trainer.nnodes="${NNODES}" \
    trainer.n_gpus_per_node="${n_gpus_training}" \
    rollout.nnodes="${NNODES}" \
    rollout.n_gpus_per_node="${n_gpus_rollout}"
