"""verl config keys and what they become in a RunConfig: one rule per key (or key family).

A rule maps a verl key to an asyncdapo field (`ours`), optionally through a conversion of its
value, or says why it has no equivalent (`ours=None`, the note says where the equivalent lives or
why none is needed). `docs/coming-from-verl.md` holds the table generated from these rules
(`keys_table()`); a test keeps the two equal.
Keys follow verl's DAPO recipe (recipe/dapo) and its ppo_trainer config; the overlong buffer is
accepted under each of the three places verl versions have put it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class Unmappable(ValueError):
    """This value of a mappable key has no equivalent (e.g. adv_estimator=gae)."""


@dataclass(frozen=True)
class Rule:
    verl: str  # dotted key; a trailing "." matches the whole family under it
    ours: str | None  # dotted RunConfig field, or None: no equivalent
    note: str = ""
    convert: Callable[[Any], Any] | None = None

    def matches(self, key: str) -> bool:
        return key.startswith(self.verl) if self.verl.endswith(".") else key == self.verl


def _bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in ("true", "1", "yes"):
        return True
    if s in ("false", "0", "no"):
        return False
    raise Unmappable(f"not a boolean: {v!r}")


def _files(v: Any) -> list[str]:
    if isinstance(v, list | tuple):
        return [str(x) for x in v]
    s = str(v).strip()
    if s.startswith("[") and s.endswith("]"):
        return [x.strip().strip("'\"") for x in s[1:-1].split(",") if x.strip()]
    return [s]


def _grpo(v: Any) -> str:
    if str(v) != "grpo":
        raise Unmappable(f"adv_estimator {v!r}: asyncdapo computes GRPO advantages only (grpo)")
    return "grpo"


def _filter_metric(v: Any) -> str:
    if str(v) not in ("acc", "score"):
        raise Unmappable(f"filter metric {v!r}: asyncdapo filters on acc or score")
    return str(v)


def _test_freq(v: Any) -> int:
    return max(int(v), 0)  # verl: -1 = never; ours: 0 = never


def _save_freq(v: Any) -> int:
    if int(v) < 1:
        raise Unmappable(
            "save_freq <= 0 (never): asyncdapo checkpoints every step (trainer.checkpoint_every)"
        )
    return int(v)


def _warmup(v: Any) -> int:
    if int(v) < 0:
        raise Unmappable("lr_warmup_steps < 0 defers to lr_warmup_steps_ratio: set trainer.warmup_steps")
    return int(v)


_LOGGERS = {"wandb": "wandb", "tensorboard": "tensorboard", "mlflow": "mlflow", "file": "jsonl"}


def _loggers(v: Any) -> list[str]:
    names = _files(v)  # the same list syntax: ['console','wandb']
    unknown = [n for n in names if n not in _LOGGERS and n != "console"]
    if unknown:
        raise Unmappable(f"logger(s) {unknown}: asyncdapo writes tensorboard, wandb, mlflow, jsonl (file)")
    return [_LOGGERS[n] for n in names if n in _LOGGERS]


def dns_label(v: Any) -> str:
    """An experiment name as a run name (a DNS label): 'DAPO-Qwen2.5-7B' -> 'dapo-qwen2-5-7b'."""
    label = re.sub(r"[^a-z0-9-]+", "-", str(v).lower()).strip("-")[:53].strip("-")
    if not label:
        raise Unmappable(f"{v!r} has no letters or digits to make a run name of")
    return label


_ARR = "actor_rollout_ref."
_ACTOR = _ARR + "actor."
_ROLLOUT = _ARR + "rollout."
_OVERLONG = ("reward_model.overlong_buffer.", "custom_reward_function.overlong_buffer.",
             "reward_model.reward_kwargs.overlong_buffer_cfg.")  # fmt: skip
_PERF = (
    "verl performance setting of its FSDP/Megatron workers; no equivalent (the trainer is plain torch DDP)"
)
_ENGINE = "vLLM engine setting: a gateway flag (`asyncdapo gateway --help`, Helm `gateway.*` values)"
_SIZE = "cluster size: asyncdapo sizes gateways (`asyncdapo up --gateways`, Helm) and trainer.workers apart"

# fmt: off
RULES: list[Rule] = [
    # data
    Rule("data.train_files", "data.train_files", convert=_files),
    Rule("data.val_files", "data.val_files", convert=_files),
    Rule("data.prompt_key", "data.prompt_key"),
    Rule("data.max_prompt_length", "data.max_prompt_length"),
    Rule("data.max_response_length", "data.max_response_length"),
    Rule("data.train_batch_size", "data.train_batch_size"),
    Rule("data.shuffle", "data.shuffle", convert=_bool),
    Rule("data.seed", "data.seed"),
    Rule("data.gen_batch_size", None,
         "async admission replaces generation batches: prompts stream in (rollout.max_concurrent_prompts)"),
    Rule("data.filter_overlong_prompts", None, "always on: prompts over data.max_prompt_length are dropped"),
    Rule("data.truncation", None, "prompts over data.max_prompt_length are dropped, never truncated"),
    Rule("data.", None, "no equivalent data option"),
    # model
    Rule(_ARR + "model.path", "model.path", "a local directory or a Hugging Face Hub id"),
    Rule(_ARR + "model.trust_remote_code", "model.trust_remote_code", convert=_bool),
    Rule(_ARR + "model.", None, _PERF),
    # rollout
    Rule(_ROLLOUT + "n", "rollout.n"),
    Rule(_ROLLOUT + "temperature", "rollout.temperature"),
    Rule(_ROLLOUT + "top_p", "rollout.top_p"),
    Rule(_ROLLOUT + "top_k", "rollout.top_k"),
    Rule(_ROLLOUT + "dtype", "model.dtype", "one dtype for rollout and training"),
    Rule(_ROLLOUT + "max_num_seqs", "rollout.max_concurrent_per_gateway", "requests in flight per engine"),
    Rule(_ROLLOUT + "val_kwargs.n", "rollout.val_n"),
    Rule(_ROLLOUT + "val_kwargs.temperature", "rollout.val_temperature"),
    Rule(_ROLLOUT + "val_kwargs.do_sample", "rollout.val_temperature",
         "false: greedy validation (val_temperature 0)",
         convert=lambda v: None if _bool(v) else 0.0),
    Rule(_ROLLOUT + "val_kwargs.", None, "validation uses rollout.top_p / top_k"),
    Rule(_ROLLOUT + "max_model_len", None, "derived: data.max_prompt_length + data.max_response_length"),
    Rule(_ROLLOUT + "mode", None, "asyncdapo's rollout is always served asynchronously (rollout.mode: async|sync "
         "is the training loop)"),
    Rule(_ROLLOUT, None, _ENGINE),
    # actor
    Rule(_ACTOR + "ppo_mini_batch_size", "trainer.ppo_mini_batch_size"),
    Rule(_ACTOR + "ppo_micro_batch_size_per_gpu", "trainer.micro_batch_size"),
    Rule(_ACTOR + "ppo_epochs", "trainer.ppo_epochs"),
    Rule(_ACTOR + "grad_clip", "trainer.grad_clip"),
    Rule(_ACTOR + "clip_ratio_low", "algorithm.clip_ratio_low"),
    Rule(_ACTOR + "clip_ratio_high", "algorithm.clip_ratio_high"),
    Rule(_ACTOR + "clip_ratio_c", "algorithm.clip_ratio_c"),
    Rule(_ACTOR + "clip_ratio", "algorithm.clip_ratio_low",
         "sets clip_ratio_low and clip_ratio_high where they are not given"),
    Rule(_ACTOR + "loss_agg_mode", "algorithm.loss_agg_mode"),
    Rule(_ACTOR + "use_token_level_loss", "algorithm.loss_agg_mode", "older verl: true = token-mean",
         convert=lambda v: "token-mean" if _bool(v) else "seq-mean-token-mean"),
    Rule(_ACTOR + "entropy_coeff", "algorithm.entropy_coeff"),
    Rule(_ACTOR + "kl_loss_coef", "algorithm.kl_coef", "only with use_kl_loss=True (else 0)"),
    Rule(_ACTOR + "use_kl_loss", None, "read with kl_loss_coef"),
    Rule(_ACTOR + "kl_loss_type", None, "asyncdapo's KL loss is low_var_kl (k3)"),
    Rule(_ACTOR + "optim.lr", "trainer.lr"),
    Rule(_ACTOR + "optim.weight_decay", "trainer.weight_decay"),
    Rule(_ACTOR + "optim.betas", "trainer.betas"),
    Rule(_ACTOR + "optim.lr_warmup_steps", "trainer.warmup_steps", convert=_warmup),
    Rule(_ACTOR + "optim.", None, "linear warm-up then constant LR (trainer.warmup_steps)"),
    Rule(_ACTOR, None, _PERF),
    Rule(_ARR + "ref.", None, _PERF),
    Rule(_ARR + "hybrid_engine", None, "rollout and training are separate services"),
    # algorithm
    Rule("algorithm.adv_estimator", "algorithm.adv_estimator", convert=_grpo),
    Rule("algorithm.norm_adv_by_std_in_grpo", "algorithm.norm_adv_by_std", convert=_bool),
    Rule("algorithm.filter_groups.enable", "reward.filter_groups", convert=_bool),
    Rule("algorithm.filter_groups.metric", "reward.filter_metric", convert=_filter_metric),
    Rule("algorithm.filter_groups.max_num_gen_batches", None,
         "no generation batches to count: async rollout runs until B valid groups exist"),
    Rule("algorithm.use_kl_in_reward", None, "KL in the reward is not implemented (DAPO: false)"),
    Rule("algorithm.kl_ctrl.", None, "KL in the reward is not implemented (DAPO: kl_coef 0)"),
    Rule("algorithm.", None, "no equivalent (GRPO: gamma = lam = 1)"),
    # reward
    *[Rule(p + "enable", "reward.overlong_buffer.enable", convert=_bool) for p in _OVERLONG],
    *[Rule(p + "len", "reward.overlong_buffer.len") for p in _OVERLONG],
    *[Rule(p + "penalty_factor", "reward.overlong_buffer.penalty_factor") for p in _OVERLONG],
    *[Rule(p + "log", None, "the penalty is always in the step metrics") for p in _OVERLONG],
    Rule("reward_model.reward_kwargs.max_resp_len", None, "always data.max_response_length"),
    Rule("reward_model.reward_manager", None, "the reward is DAPO's: math-verify score + overlong shaping"),
    Rule("reward_model.", None, "model-based rewards are not supported (math-verify)"),
    Rule("custom_reward_function.", None, "the verifier service scores with math-verify"),
    # trainer
    Rule("trainer.total_training_steps", "trainer.total_steps"),
    Rule("trainer.total_epochs", None, "set trainer.total_steps (epochs x prompts / train_batch_size)"),
    Rule("trainer.test_freq", "trainer.val_every", "-1 (never) becomes 0", convert=_test_freq),
    Rule("trainer.save_freq", "trainer.checkpoint_every", convert=_save_freq),
    Rule("trainer.default_local_dir", "trainer.checkpoint_dir"),
    Rule("trainer.logger", "logging.backends", "console is always on; file becomes jsonl", convert=_loggers),
    Rule("trainer.project_name", "logging.project"),
    Rule("trainer.experiment_name", "logging.experiment", "also the run name, as a DNS label"),
    Rule("trainer.seed", "trainer.seed"),
    Rule("trainer.val_before_train", None, "`asyncdapo up` validates before training when data.val_files is set"),
    Rule("trainer.resume_mode", None, "`asyncdapo up --resume` (the trainer always resumes from its checkpoint)"),
    Rule("trainer.n_gpus_per_node", None, _SIZE),
    Rule("trainer.nnodes", None, _SIZE),
    Rule("trainer.", None, "no equivalent trainer option"),
]
# fmt: on


def rule_for(key: str) -> Rule | None:
    """The first rule that matches `key` (exact rules come before their family)."""
    return next((r for r in RULES if r.matches(key)), None)


def keys_table() -> str:
    """The markdown table of every rule, as in docs/coming-from-verl.md."""
    lines = ["| verl key | asyncdapo | note |", "|---|---|---|"]
    for r in RULES:
        key = f"`{r.verl}*`" if r.verl.endswith(".") else f"`{r.verl}`"
        ours = f"`{r.ours}`" if r.ours else "— (not mapped)"
        lines.append(f"| {key} | {ours} | {r.note} |")
    return "\n".join(lines) + "\n"
