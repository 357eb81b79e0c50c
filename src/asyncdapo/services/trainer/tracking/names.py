"""Metric names: ours (metrics.jsonl, the report, Prometheus) and verl's, for the tracking backends.

With `logging.metric_names: verl` (the default) a tracker logs each metric under verl's name where
verl logs the same quantity, so dashboards and habits carry over; every other metric keeps its own
name. `METRICS` is the whole table (docs/metrics.md is generated from it and a test keeps the two
equal); a key that ends with "/" stands for a family (`staleness/0`, `staleness/1`, …).
"""

from __future__ import annotations

from dataclasses import dataclass

from asyncdapo.contracts.config import MetricNames, RunConfig


@dataclass(frozen=True)
class Metric:
    ours: str
    verl: str | None  # None: verl logs no such quantity
    meaning: str


# fmt: off
METRICS: list[Metric] = [
    Metric("step", "training/global_step", "policy updates done (the x axis of every backend)"),
    Metric("version", None, "policy version after this step (= step)"),
    Metric("lr", "actor/lr", "learning rate of this step's updates"),
    Metric("workers", None, "data-parallel trainer workers"),
    Metric("batch/groups", None, "groups in the batch (= data.train_batch_size)"),
    Metric("batch/responses", None, "responses in the batch"),
    Metric("reward/mean", "critic/rewards/mean", "reward: score + overlong shaping (no KL in the reward)"),
    Metric("reward/std", None, "reward standard deviation over the batch"),
    Metric("score/mean", None,
           "score before overlong shaping: reward.correct_reward or incorrect_reward per response "
           "(verl's critic/score includes the shaping)"),
    Metric("acc/mean", None, "fraction of correct answers in the batch"),
    Metric("response_length/mean", "response_length/mean", "response tokens"),
    Metric("response_length/max", "response_length/max", "longest response"),
    Metric("response_length/clip_ratio", "response_length/clip_ratio", "fraction cut at max_response_length"),
    Metric("prompt_length/mean", "prompt_length/mean", "prompt tokens"),
    Metric("actor/entropy", "actor/entropy", "token entropy of the policy on the batch"),
    Metric("actor/pg_loss", "actor/pg_loss", "policy-gradient loss (mean over mini-batches)"),
    Metric("actor/kl_loss", "actor/kl_loss", "KL loss vs. the reference (algorithm.kl_coef > 0)"),
    Metric("actor/entropy_loss", "actor/entropy_loss", "entropy bonus term"),
    Metric("actor/pg_clipfrac", "actor/pg_clipfrac", "fraction of tokens clipped (upper)"),
    Metric("actor/pg_clipfrac_lower", "actor/pg_clipfrac_lower", "fraction clipped by dual-clip (lower)"),
    Metric("actor/ppo_kl", "actor/ppo_kl", "KL(old || new) over the update"),
    Metric("actor/grad_norm", "actor/grad_norm", "gradient norm before clipping (mean over optimizer steps)"),
    Metric("actor/grad_norm_max", None, "largest gradient norm of the step"),
    Metric("actor/skipped_steps", None, "optimizer steps skipped for a non-finite gradient"),
    Metric("actor/optimizer_steps", None, "optimizer steps in this policy update"),
    Metric("rollout/kl", "rollout_corr/kl", "KL(rollout engine || trainer) on the sampled tokens (k1)"),
    Metric("rollout/logprob_coverage", None, "fraction of tokens with engine log-probs"),
    Metric("rollout/token_staleness_mean", None, "mean policy lag of the trained tokens"),
    Metric("tis/mean_weight", None, "truncated importance weight, mean (algorithm.tis_cap)"),
    Metric("tis/capped_frac", None, "fraction of tokens whose weight was capped"),
    Metric("staleness/", None, "groups trained at each staleness (step - version made)"),
    Metric("dropped/", None, "groups dropped instead of trained, by reason"),
    Metric("groups/credited", None, "dropped groups credited back to the scheduler's bound (run total)"),
    Metric("groups/redelivered", None, "stream entries delivered again after being processed (never retrained)"),
    Metric("timing/wait_s", "timing_s/gen", "waiting for B trainable groups (rollout, as seen by the trainer)"),
    Metric("timing/compute_s", "timing_s/update_actor", "old log-probs, advantages and the update"),
    Metric("timing/checkpoint_s", "timing_s/save_checkpoint", "checkpoint write"),
    Metric("timing/publish_s", "timing_s/update_weights", "weight snapshot + publish to the gateways"),
    Metric("timing/snapshot_s", None, "weight snapshot write"),
    Metric("timing/step_s", "timing_s/step", "whole step"),
    Metric("timing/wait_frac", None, "wait_s / step_s"),
    Metric("val/accuracy", "val-core/all/acc/mean@{val_n}",
           "validation accuracy over rollout.val_n samples per prompt (not split by data source)"),
    Metric("val/mean_response_length", None, "validation response tokens"),
    Metric("val/policy_version", None, "version validated"),
    Metric("val/prompts", None, "validation prompts"),
    Metric("val/failed", None, "1 when validation failed (logged, training goes on)"),
    Metric("rollout/policy_version", None, "scheduler: version the gateways run"),
    Metric("rollout/valid_groups", None, "scheduler: valid groups produced in total"),
    Metric("rollout/valid_group_ratio", None, "scheduler: valid / finished groups (DAPO dynamic sampling)"),
    Metric("rollout/early_stops", None, "scheduler: early stops (abort fan-outs) in total"),
    Metric("rollout/aborted_requests", None, "scheduler: requests aborted by early stops"),
    Metric("rollout/aborted_tokens", None, "scheduler: tokens those requests had generated"),
    Metric("rollout/generated_tokens", None, "scheduler: tokens generated in total"),
    Metric("rollout/completions", None, "scheduler: responses completed in total"),
    Metric("rollout/queue_depth", None, "scheduler: prompts waiting in the queue"),
]
# fmt: on

_BY_KEY = {m.ours: m for m in METRICS if not m.ours.endswith("/")}
_FAMILIES = [m for m in METRICS if m.ours.endswith("/")]


def lookup(key: str) -> Metric | None:
    return _BY_KEY.get(key) or next((m for m in _FAMILIES if key.startswith(m.ours)), None)


def tracked_name(key: str, cfg: RunConfig) -> str:
    """The name a tracking backend logs `key` under."""
    if cfg.logging.metric_names is MetricNames.ASYNCDAPO:
        return key
    m = lookup(key)
    if m is None or m.verl is None:
        return key
    return m.verl.format(val_n=cfg.rollout.val_n)


def metrics_table() -> str:
    """The markdown table in docs/metrics.md."""
    lines = ["| ours (metrics.jsonl) | verl | meaning |", "|---|---|---|"]
    for m in METRICS:
        ours = f"`{m.ours}*`" if m.ours.endswith("/") else f"`{m.ours}`"
        lines.append(f"| {ours} | {f'`{m.verl}`' if m.verl else '—'} | {m.meaning} |")
    return "\n".join(lines) + "\n"
