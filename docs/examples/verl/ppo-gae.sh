#!/usr/bin/env bash
# PPO with a critic (GAE), verl's main_ppo default estimator: asyncdapo refuses to convert it
# (it trains critic-free GRPO). Kept as the example of a refusal.
set -x

python3 -m verl.trainer.main_ppo \
    data.train_files="$HOME/data/gsm8k/train.parquet" \
    data.train_batch_size=256 \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=64 \
    critic.optim.lr=1e-5 \
    critic.model.path=Qwen/Qwen2.5-0.5B-Instruct \
    trainer.total_epochs=15
