"""The combinations of run-config values that can never make a run (not merely unusual ones): the
run would wait forever, never train, or be refused by the trainer. `RunConfig` checks them when it
is validated, so `config check`, `asyncdapo up`, the services and the operator all refuse them, each
problem naming its field (`asyncdapo.config_problems`).
"""

from __future__ import annotations

from asyncdapo.config import RolloutMode, RunConfig
from asyncdapo.config_problems import Problem


def impossible_combinations(cfg: RunConfig) -> list[Problem]:
    """Values that are each fine alone but can never make a run together (not merely unusual
    ones): the run would wait forever, never train, or be refused by the trainer."""
    out: list[Problem] = []
    d, ro, t = cfg.data, cfg.rollout, cfg.trainer
    buf = cfg.reward.overlong_buffer
    if buf.enable and buf.len > d.max_response_length:
        out.append(
            Problem(
                "reward.overlong_buffer.len",
                f"{buf.len} given",
                f"must be <= data.max_response_length ({d.max_response_length}): the buffer is the end of "
                "the longest response",
                "lower it, or set reward.overlong_buffer.enable: false",
            )
        )
    if d.train_batch_size % t.ppo_mini_batch_size:
        out.append(
            Problem(
                "trainer.ppo_mini_batch_size",
                f"{t.ppo_mini_batch_size} given",
                f"must divide data.train_batch_size ({d.train_batch_size})",
            )
        )
    if ro.mode is RolloutMode.SYNC and ro.max_staleness:
        out.append(
            Problem(
                "rollout.max_staleness",
                f"{ro.max_staleness} given",
                "must be 0 in rollout.mode sync (verl's loop trains on what the current weights generated)",
                "set rollout.mode: async for off-policy groups",
            )
        )
    if ro.n == 1 and cfg.reward.filter_groups:
        out.append(
            Problem(
                "rollout.n",
                "1 given",
                "must be >= 2 with reward.filter_groups (DAPO dynamic sampling keeps only groups whose "
                "rewards vary; a group of one response has zero variance, so no group would ever be valid "
                "and no step would train)",
                "set rollout.n to 2 or more (DAPO uses 16), or reward.filter_groups: false",
            )
        )
    if ro.mode is RolloutMode.SYNC and ro.max_num_gen_batches:
        most = ro.max_num_gen_batches * ro.max_concurrent_prompts
        if most < d.train_batch_size:
            need = -(-d.train_batch_size // ro.max_concurrent_prompts)
            out.append(
                Problem(
                    "rollout.max_num_gen_batches",
                    f"{ro.max_num_gen_batches} given",
                    f"in rollout.mode sync a step generates at most max_num_gen_batches x "
                    f"rollout.max_concurrent_prompts ({ro.max_concurrent_prompts}) = {most} groups, fewer "
                    f"than the data.train_batch_size ({d.train_batch_size}) valid groups it needs",
                    f"set it to {need} or more, or 0 (no limit)",
                )
            )
    # The trainer's own start-up checks (asyncdapo.trainer.loop.check_config), here so that a run
    # is refused before anything starts rather than when its trainer does.
    if t.publish_every > 1 and ro.max_staleness < t.publish_every - 1:
        out.append(
            Problem(
                "trainer.publish_every",
                f"{t.publish_every} given",
                f"needs rollout.max_staleness >= {t.publish_every - 1} ({ro.max_staleness} given): groups "
                "come from published versions only, so the trainer would wait forever",
                f"set rollout.max_staleness: {t.publish_every - 1}, or trainer.publish_every: 1",
            )
        )
    rows = t.ppo_mini_batch_size * ro.n
    if t.workers > rows:
        out.append(
            Problem(
                "trainer.workers",
                f"{t.workers} given",
                f"must be <= the {rows} responses of a mini-batch (trainer.ppo_mini_batch_size x "
                "rollout.n): a worker would get none",
            )
        )
    return out
