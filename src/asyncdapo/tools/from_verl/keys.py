"""What each verl key becomes in asyncdapo: set a run-config field, only matter for how verl runs,
have no effect on what verl trains, or change what verl trains in a way asyncdapo cannot express.

The keys a conversion reads (`MAPPED`, each with the asyncdapo field it sets) are turned into
values by `derive.py`; every other key is classified by the first rule of `RULES` that matches it
(exact keys before the family they belong to). `docs/coming-from-verl.md` holds the tables
generated from both (`keys_table()`); a test keeps them equal.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class Kind(StrEnum):
    MAPPED = "mapped"  # read by the conversion: sets a run-config field
    PERFORMANCE = (
        "performance"  # how verl runs (engine, sharding, memory, cluster, logging): not the algorithm
    )
    NO_EFFECT = "no effect"  # verl itself ignores it in this configuration
    DIFFERENT = "different"  # changes what verl trains; asyncdapo cannot express it (--strict fails)


@dataclass(frozen=True)
class Rule:
    verl: str  # dotted key; a trailing "." matches the whole family under it
    kind: Kind
    note: str = ""
    # For DIFFERENT rules: values that change nothing (verl's defaults); the key is then NO_EFFECT.
    harmless: tuple[Any, ...] = ()
    ours: str | None = None  # MAPPED only: the asyncdapo field it sets

    def matches(self, key: str) -> bool:
        return key.startswith(self.verl) if self.verl.endswith(".") else key == self.verl


@dataclass(frozen=True)
class Mapped:
    verl: str
    ours: str  # the asyncdapo field(s) it sets, as written in the docs
    note: str = ""


_ARR = "actor_rollout_ref."
_ACTOR = _ARR + "actor."
_ROLLOUT = _ARR + "rollout."
OVERLONG_PREFIXES = (
    "reward_model.overlong_buffer.",  # recipe/dapo's config
    "reward_model.reward_kwargs.overlong_buffer_cfg.",  # scripts passing the reward manager's kwargs
    "reward.reward_kwargs.overlong_buffer_cfg.",  # verl-recipe's layout (2026)
    "custom_reward_function.overlong_buffer.",  # early DAPO scripts
)
MAX_RESP_LEN_KEYS = ("reward_model.reward_kwargs.max_resp_len", "reward.reward_kwargs.max_resp_len")
REWARD_MANAGER_KEYS = ("reward_model.reward_manager", "reward.reward_manager.name")

# fmt: off
MAPPED: list[Mapped] = [
    Mapped("data.train_files", "data.train_files"),
    Mapped("data.val_files", "data.val_files"),
    Mapped("data.prompt_key", "data.prompt_key"),
    Mapped("data.train_batch_size", "data.train_batch_size",
           "fully-async: unused by verl (B comes from require_batches x ppo_mini_batch_size)"),
    Mapped("data.gen_batch_size", "rollout.max_concurrent_prompts",
           "prompts generated together: verl's generation batch, asyncdapo's prompts in flight"),
    Mapped("data.max_prompt_length", "data.max_prompt_length"),
    Mapped("data.max_response_length", "data.max_response_length"),
    Mapped("data.shuffle", "data.shuffle"),
    Mapped("data.seed", "data.seed", "null: asyncdapo's default seed"),
    Mapped("data.filter_overlong_prompts", "data.truncation", "true: drop"),
    Mapped("data.truncation", "data.truncation", "error, left, right, middle"),
    Mapped("data.val_max_samples", "data.val_size", "-1: every validation prompt"),
    Mapped("data.train_max_samples", "—", "-1 only: a subset of the training set cannot be expressed"),
    Mapped("data.apply_chat_template_kwargs", "—", "empty only: the chat template is rendered without kwargs"),
    Mapped(_ARR + "model.path", "model.path", "required"),
    Mapped(_ARR + "model.trust_remote_code", "model.trust_remote_code"),
    Mapped(_ARR + "model.enable_gradient_checkpointing", "trainer.activation_checkpointing"),
    Mapped(_ARR + "model.use_remove_padding", "trainer.packing", "padding-free micro-batches"),
    Mapped(_ARR + "model.lora_rank", "—", "0 only: LoRA is refused (asyncdapo trains every parameter)"),
    Mapped(_ARR + "model.custom_chat_template", "—", "null only: asyncdapo renders the tokenizer's template"),
    Mapped(_ARR + "model.tokenizer_path", "—", "null only: the tokenizer is the model's"),
    Mapped(_ROLLOUT + "n", "rollout.n", "1 with dynamic sampling is refused: no group could ever be valid"),
    Mapped(_ROLLOUT + "temperature", "rollout.temperature"),
    Mapped(_ROLLOUT + "top_p", "rollout.top_p"),
    Mapped(_ROLLOUT + "top_k", "rollout.top_k"),
    Mapped(_ROLLOUT + "do_sample", "rollout.temperature", "false: greedy rollouts (temperature 0)"),
    Mapped(_ROLLOUT + "ignore_eos", "—", "false only"),
    Mapped(_ROLLOUT + "over_sample_rate", "—", "0 only"),
    Mapped(_ROLLOUT + "multi_turn.enable", "—", "false only: single-turn math"),
    Mapped(_ROLLOUT + "tensor_model_parallel_size", "rollout.max_concurrent_prompts",
           "fully-async: engines = rollout GPUs / TP, 16 prompts each (verl's rollouter)"),
    Mapped(_ROLLOUT + "max_num_seqs", "rollout.max_concurrent_per_gateway", "requests in flight per engine"),
    Mapped(_ROLLOUT + "val_kwargs.n", "rollout.val_n"),
    Mapped(_ROLLOUT + "val_kwargs.do_sample", "rollout.val_temperature", "false: greedy validation"),
    Mapped(_ROLLOUT + "val_kwargs.temperature", "rollout.val_temperature"),
    Mapped(_ROLLOUT + "val_kwargs.top_p", "rollout.val_top_p"),
    Mapped(_ROLLOUT + "val_kwargs.top_k", "rollout.val_top_k"),
    Mapped(_ACTOR + "strategy", "trainer.sharding", "fsdp/fsdp2 on more than one GPU: fsdp"),
    Mapped(_ACTOR + "ulysses_sequence_parallel_size", "trainer.workers",
           "training GPUs / sp: the data-parallel workers (asyncdapo has no sequence parallelism)"),
    Mapped(_ACTOR + "ppo_mini_batch_size", "trainer.ppo_mini_batch_size", "fully-async: also B"),
    Mapped(_ACTOR + "ppo_micro_batch_size_per_gpu", "trainer.micro_batch_size"),
    Mapped(_ACTOR + "use_dynamic_bsz", "trainer.micro_batch_tokens",
           "true: micro-batches by ppo_max_token_len_per_gpu tokens; false: null (micro_batch_size rows)"),
    Mapped(_ACTOR + "ppo_max_token_len_per_gpu", "trainer.micro_batch_tokens",
           "with use_dynamic_bsz; per worker (verl multiplies it by ulysses_sequence_parallel_size)"),
    Mapped(_ACTOR + "ppo_epochs", "trainer.ppo_epochs"),
    Mapped(_ACTOR + "shuffle", "—", "false only: mini-batches in order"),
    Mapped(_ACTOR + "clip_ratio", "algorithm.clip_ratio_low/high",
           "only where clip_ratio_low/high are null (verl sets both to 0.2 by default)"),
    Mapped(_ACTOR + "clip_ratio_low", "algorithm.clip_ratio_low"),
    Mapped(_ACTOR + "clip_ratio_high", "algorithm.clip_ratio_high"),
    Mapped(_ACTOR + "clip_ratio_c", "algorithm.clip_ratio_c"),
    Mapped(_ACTOR + "loss_agg_mode", "algorithm.loss_agg_mode"),
    Mapped(_ACTOR + "loss_scale_factor", "—", "null, or data.max_response_length (seq-mean-token-sum-norm)"),
    Mapped(_ACTOR + "policy_loss.loss_mode", "—", "vanilla only (PPO clip with dual-clip)"),
    Mapped(_ACTOR + "entropy_coeff", "algorithm.entropy_coeff"),
    Mapped(_ACTOR + "use_kl_loss", "algorithm.kl_coef", "false: 0"),
    Mapped(_ACTOR + "kl_loss_coef", "algorithm.kl_coef", "with use_kl_loss"),
    Mapped(_ACTOR + "kl_loss_type", "—", "low_var_kl (k3) only"),
    Mapped(_ACTOR + "grad_clip", "trainer.grad_clip"),
    Mapped(_ACTOR + "tis_imp_ratio_cap", "algorithm.tis_cap", "verl 0.5-0.6's truncated IS; <= 0: off"),
    Mapped(_ACTOR + "optim.optimizer", "—", "AdamW only"),
    Mapped(_ACTOR + "optim.lr", "trainer.lr"),
    Mapped(_ACTOR + "optim.weight_decay", "trainer.weight_decay"),
    Mapped(_ACTOR + "optim.betas", "trainer.betas"),
    Mapped(_ACTOR + "optim.lr_warmup_steps", "trainer.warmup_steps", "-1: lr_warmup_steps_ratio x total steps"),
    Mapped(_ACTOR + "optim.lr_warmup_steps_ratio", "trainer.warmup_steps"),
    Mapped(_ACTOR + "optim.lr_scheduler_type", "trainer.lr_schedule", "constant or cosine"),
    Mapped(_ACTOR + "optim.warmup_style", "trainer.lr_schedule", "older name of lr_scheduler_type"),
    Mapped(_ACTOR + "optim.min_lr_ratio", "trainer.min_lr_ratio"),
    Mapped(_ACTOR + "optim.num_cycles", "trainer.lr_num_cycles"),
    Mapped("algorithm.adv_estimator", "algorithm.adv_estimator",
           "grpo only; gae (PPO with a critic) and the other estimators are refused"),
    Mapped("algorithm.norm_adv_by_std_in_grpo", "algorithm.norm_adv_by_std"),
    Mapped("algorithm.use_kl_in_reward", "—", "false only"),
    Mapped("algorithm.use_pf_ppo", "—", "false only"),
    Mapped("algorithm.filter_groups.enable", "reward.filter_groups", "read by recipe.dapo only"),
    Mapped("algorithm.filter_groups.metric", "reward.filter_metric", "acc, score; seq_reward, seq_final_reward: reward"),
    Mapped("algorithm.filter_groups.max_num_gen_batches", "rollout.max_num_gen_batches"),
    Mapped("algorithm.rollout_correction.bypass_mode", "algorithm.old_log_prob", "true: rollout"),
    Mapped("algorithm.rollout_correction.rollout_is", "algorithm.tis_cap", "token: TIS at rollout_is_threshold"),
    Mapped("algorithm.rollout_correction.rollout_is_threshold", "algorithm.tis_cap"),
    Mapped("algorithm.rollout_correction.rollout_rs", "—", "null only (no rejection sampling)"),
    Mapped("algorithm.rollout_correction.rollout_token_veto_threshold", "—", "null only"),
    Mapped("algorithm.rollout_correction.loss_type", "—", "ppo_clip only"),
    Mapped("algorithm.rollout_correction.rollout_is_batch_normalize", "—", "false only"),
    *[Mapped(p + "enable", "reward.overlong_buffer.enable") for p in OVERLONG_PREFIXES],
    *[Mapped(p + "len", "reward.overlong_buffer.len") for p in OVERLONG_PREFIXES],
    *[Mapped(p + "penalty_factor", "reward.overlong_buffer.penalty_factor") for p in OVERLONG_PREFIXES],
    *[Mapped(k, "—", "must equal data.max_response_length (the penalty is measured against it)")
      for k in MAX_RESP_LEN_KEYS],
    *[Mapped(k, "reward.correct_reward/incorrect_reward", "naive, dapo, prime, batch: verl's scorer per data_source")
      for k in REWARD_MANAGER_KEYS],
    Mapped("reward_model.enable", "—", "false only: model-based rewards are not supported"),
    Mapped("custom_reward_function.path", "—", "null only: the verifier scores with math-verify"),
    Mapped("trainer.total_training_steps", "trainer.total_steps"),
    Mapped("trainer.total_epochs", "trainer.total_steps", "epochs x rows / generation batch, where the train files are here"),
    Mapped("trainer.test_freq", "trainer.val_every", "-1 (never): 0"),
    Mapped("trainer.save_freq", "trainer.checkpoint_every", "-1 (never): total_steps (the final one)"),
    Mapped("trainer.val_only", "—", "false only"),
    Mapped("trainer.default_local_dir", "trainer.checkpoint_dir"),
    Mapped("trainer.logger", "logging.backends", "console is always on; file: jsonl"),
    Mapped("trainer.project_name", "logging.project"),
    Mapped("trainer.experiment_name", "logging.experiment, name", "the run name as a DNS label"),
    Mapped("trainer.n_gpus_per_node", "trainer.workers", "x trainer.nnodes: training GPUs"),
    Mapped("trainer.nnodes", "trainer.workers"),
    Mapped("rollout.nnodes", "rollout.max_concurrent_prompts", "fully-async: rollout GPUs (with n_gpus_per_node)"),
    Mapped("rollout.n_gpus_per_node", "rollout.max_concurrent_prompts"),
    Mapped("rollout.total_rollout_steps", "trainer.total_steps", "fully-async: samples / B"),
    Mapped("rollout.test_freq", "trainer.val_every", "fully-async: parameter syncs between validations"),
    Mapped("async_training.staleness_threshold", "rollout.max_staleness",
           "s = trigger_parameter_sync_step x (1 + threshold) - 1 (asyncdapo steps)"),
    Mapped("async_training.trigger_parameter_sync_step", "trainer.publish_every"),
    Mapped("async_training.require_batches", "data.train_batch_size", "B = require_batches x ppo_mini_batch_size"),
    Mapped("async_training.partial_rollout", "rollout.weight_update_mode", "true: keep; false: wait"),
    Mapped("async_training.use_rollout_log_probs", "algorithm.old_log_prob", "true: rollout"),
    Mapped("async_training.compute_prox_log_prob", "algorithm.old_log_prob", "true: recompute"),
]

_PERF = "how verl runs it (workers, memory, kernels, engine): no effect on what is trained"
_ENGINE = "vLLM engine setting: a gateway flag (`asyncdapo gateway --help`, Helm `gateway.*` values)"
_CLUSTER = "cluster size: asyncdapo sizes gateways apart (`asyncdapo up --gateways`, Helm `gateway.replicas`)"
_LOGGING = "logging and profiling: no effect on what is trained"

RULES: list[Rule] = [
    # data
    Rule("data.return_raw_chat", Kind.PERFORMANCE, _PERF),
    Rule("data.tokenizer", Kind.DIFFERENT, "the tokenizer is the model's", harmless=(None,)),
    Rule("data.reward_fn_key", Kind.DIFFERENT, "the reward is keyed by data_source", harmless=("data_source",)),
    Rule("data.custom_cls.", Kind.DIFFERENT, "a custom dataset class", harmless=(None,)),
    Rule("data.sampler.", Kind.DIFFERENT, "a custom sampler (curriculum)", harmless=(None,)),
    Rule("data.datagen.", Kind.DIFFERENT, "generated data", harmless=(None,)),
    Rule("data.", Kind.PERFORMANCE, "data loading (workers, shared memory, batch of validation)"),
    # model
    Rule(_ARR + "model.external_lib", Kind.PERFORMANCE, "a module imported for custom model code"),
    Rule(_ARR + "model.lora_alpha", Kind.NO_EFFECT, "only with lora_rank > 0"),
    Rule(_ARR + "model.target_modules", Kind.NO_EFFECT, "only with lora_rank > 0"),
    Rule(_ARR + "model.exclude_modules", Kind.NO_EFFECT, "only with lora_rank > 0"),
    Rule(_ARR + "model.lora_adapter_path", Kind.DIFFERENT, "starts from a LoRA adapter", harmless=(None,)),
    Rule(_ARR + "model.", Kind.PERFORMANCE, _PERF),
    # rollout
    Rule(_ROLLOUT + "name", Kind.PERFORMANCE, "asyncdapo's gateways run vLLM"),
    Rule(_ROLLOUT + "mode", Kind.PERFORMANCE, "asyncdapo's engines are always served (async)"),
    Rule(_ROLLOUT + "calculate_log_probs", Kind.PERFORMANCE, "asyncdapo's gateways always return log-probs"),
    Rule(_ROLLOUT + "max_model_len", Kind.PERFORMANCE,
         "derived: data.max_prompt_length + data.max_response_length (`asyncdapo up --max-model-len`)"),
    Rule(_ROLLOUT + "prompt_length", Kind.NO_EFFECT, "data.max_prompt_length"),
    Rule(_ROLLOUT + "response_length", Kind.NO_EFFECT, "data.max_response_length"),
    Rule(_ROLLOUT + "val_kwargs.", Kind.NO_EFFECT, "not read by verl's validation"),
    Rule(_ROLLOUT + "agent.", Kind.PERFORMANCE, _PERF),
    Rule(_ROLLOUT + "multi_turn.", Kind.NO_EFFECT, "only with multi_turn.enable"),
    Rule(_ROLLOUT + "trace.", Kind.PERFORMANCE, _LOGGING),
    Rule(_ROLLOUT + "profiler.", Kind.PERFORMANCE, _LOGGING),
    Rule(_ROLLOUT + "prometheus.", Kind.PERFORMANCE, _LOGGING),
    Rule(_ROLLOUT + "skip_rollout", Kind.DIFFERENT, "replays dumped rollouts", harmless=(False,)),
    Rule(_ROLLOUT, Kind.PERFORMANCE, _ENGINE),
    # actor
    Rule(_ACTOR + "policy_loss.", Kind.NO_EFFECT, "only for policy_loss.loss_mode other than vanilla"),
    Rule(_ACTOR + "tau_pos", Kind.NO_EFFECT, "only for policy_loss.loss_mode sapo"),
    Rule(_ACTOR + "tau_neg", Kind.NO_EFFECT, "only for policy_loss.loss_mode sapo"),
    Rule(_ACTOR + "use_rollout_log_probs", Kind.NO_EFFECT, "read through async_training.use_rollout_log_probs"),
    Rule(_ACTOR + "optim.clip_grad", Kind.NO_EFFECT, "verl's FSDP actor clips at actor.grad_clip"),
    Rule(_ACTOR + "optim.total_training_steps", Kind.NO_EFFECT, "filled in by verl from trainer settings"),
    Rule(_ACTOR + "optim.override_optimizer_config", Kind.DIFFERENT, "optimizer arguments", harmless=(None,)),
    Rule(_ACTOR + "optim.init_lr_ratio", Kind.DIFFERENT, "warm-up from a non-zero LR", harmless=(None, 0, 0.0)),
    Rule(_ACTOR + "optim.", Kind.PERFORMANCE, _PERF),
    Rule(_ACTOR + "checkpoint.", Kind.PERFORMANCE, "what checkpoints hold"),
    Rule(_ACTOR + "profiler.", Kind.PERFORMANCE, _LOGGING),
    Rule(_ACTOR + "router_replay.", Kind.PERFORMANCE, "MoE router replay (off)"),
    Rule(_ACTOR + "freeze_vision_tower", Kind.NO_EFFECT, "vision models only"),
    Rule(_ACTOR, Kind.PERFORMANCE, _PERF),
    Rule(_ARR + "ref.", Kind.PERFORMANCE, "the reference model's workers (asyncdapo's is the initial model)"),
    Rule(_ARR + "hybrid_engine", Kind.PERFORMANCE, "rollout and training are separate services"),
    Rule(_ARR + "nccl_timeout", Kind.PERFORMANCE, _PERF),
    Rule(_ARR + "checkpoint_engine", Kind.PERFORMANCE, "weight transfer to the engines"),
    Rule(_ARR, Kind.PERFORMANCE, _PERF),
    Rule("critic.", Kind.NO_EFFECT, "the critic is only used with adv_estimator gae"),
    # algorithm
    Rule("algorithm.gamma", Kind.NO_EFFECT, "GRPO's advantage does not discount"),
    Rule("algorithm.lam", Kind.NO_EFFECT, "GRPO's advantage does not use GAE's lambda"),
    Rule("algorithm.kl_penalty", Kind.NO_EFFECT, "only with use_kl_in_reward"),
    Rule("algorithm.kl_ctrl.", Kind.NO_EFFECT, "only with use_kl_in_reward"),
    Rule("algorithm.pf_ppo.", Kind.NO_EFFECT, "only with use_pf_ppo"),
    Rule("algorithm.rollout_correction.", Kind.DIFFERENT, "rollout correction beyond token-level TIS",
         harmless=(None, False)),
    Rule("algorithm._target_", Kind.NO_EFFECT, "verl's config class"),
    Rule("algorithm.filter_groups._target_", Kind.NO_EFFECT, "verl's config class"),
    Rule("algorithm.", Kind.DIFFERENT, "an algorithm option asyncdapo does not have"),
    # reward
    *[Rule(p + "log", Kind.PERFORMANCE, "the penalty is always in the step metrics") for p in OVERLONG_PREFIXES],
    Rule("reward_model.launch_reward_fn_async", Kind.PERFORMANCE, "the verifier is always a separate service"),
    Rule("reward_model.use_reward_loop", Kind.PERFORMANCE, "the verifier is always a separate service"),
    Rule("reward_model.num_workers", Kind.PERFORMANCE, "verifier workers: `asyncdapo up --verifier-workers`, Helm"),
    Rule("reward_model.sandbox_fusion.", Kind.NO_EFFECT, "code rewards only"),
    Rule("reward_model.reward_kwargs.", Kind.DIFFERENT, "an argument of a custom reward manager", harmless=(None,)),
    Rule("reward_model.", Kind.NO_EFFECT, "the reward model's workers: only with reward_model.enable"),
    Rule("reward.reward_kwargs.", Kind.DIFFERENT, "an argument of a custom reward manager", harmless=(None,)),
    Rule("reward.", Kind.PERFORMANCE, "how verl runs its reward workers"),
    Rule("reward_manager.", Kind.PERFORMANCE, "verl's reward manager registry (reward_model.reward_manager names it)"),
    Rule("custom_reward_function.name", Kind.NO_EFFECT, "only with custom_reward_function.path"),
    # trainer
    Rule("trainer.val_before_train", Kind.PERFORMANCE, "`asyncdapo up` validates before training when data.val_files is set"),
    Rule("trainer.resume_mode", Kind.PERFORMANCE, "the trainer always resumes from its newest checkpoint"),
    Rule("trainer.resume_from_path", Kind.PERFORMANCE, "the trainer resumes from trainer.checkpoint_dir"),
    Rule("trainer.balance_batch", Kind.PERFORMANCE, "reorders sequences across GPUs; the update is the same"),
    Rule("trainer.critic_warmup", Kind.NO_EFFECT, "only with a critic"),
    Rule("trainer.device", Kind.PERFORMANCE, _PERF),
    Rule("trainer.", Kind.PERFORMANCE, "logging, checkpoint housekeeping and cluster settings"),
    # fully-async and one-step-off
    Rule("rollout.total_epochs", Kind.NO_EFFECT, "the run ends after rollout.total_rollout_steps samples"),
    Rule("rollout.n", Kind.NO_EFFECT, "the group size is actor_rollout_ref.rollout.n"),
    Rule("rollout.", Kind.PERFORMANCE, _CLUSTER),
    Rule("async_training.checkpoint_engine.", Kind.PERFORMANCE, "weight transfer to the engines"),
    Rule("async_training.", Kind.PERFORMANCE, _PERF),
    # everywhere else
    Rule("global_profiler.", Kind.PERFORMANCE, _LOGGING),
    Rule("ray_kwargs.", Kind.PERFORMANCE, "Ray cluster settings"),
    Rule("ray_init.", Kind.PERFORMANCE, "Ray cluster settings"),
    Rule("transfer_queue.", Kind.PERFORMANCE, _PERF),
    Rule("hydra.", Kind.NO_EFFECT, "Hydra's own settings"),
]
# fmt: on


def rule_for(key: str) -> Rule | None:
    """How `key` is treated: MAPPED (with `ours`, the field it sets) for a key the conversion reads,
    else the first rule of RULES that matches it; None for a key asyncdapo does not know."""
    key = key.lstrip("+")
    m = mapped_for(key)
    if m is not None:
        return Rule(m.verl, Kind.MAPPED, m.note, ours=m.ours if m.ours != "—" else None)
    return next((r for r in RULES if r.matches(key)), None)


def mapped_for(key: str) -> Mapped | None:
    return next((m for m in MAPPED if m.verl == key), None)


def classify(key: str, value: Any) -> tuple[Kind, str]:
    """How a verl key the conversion does not read is treated, and why."""
    rule = next((r for r in RULES if r.matches(key)), None)
    if rule is None:
        return Kind.DIFFERENT, "not a verl key asyncdapo knows: it may change what verl trains"
    if rule.kind is Kind.DIFFERENT and value in rule.harmless:
        return Kind.NO_EFFECT, f"{value!r} is verl's default"
    return rule.kind, rule.note


def keys_table() -> str:
    """The markdown tables of docs/coming-from-verl.md: the keys a conversion reads, then the rest."""
    lines = ["| verl key | asyncdapo | note |", "|---|---|---|"]
    lines += [f"| `{m.verl}` | {'`' + m.ours + '`' if m.ours != '—' else '—'} | {m.note} |" for m in MAPPED]
    lines += ["", "| verl key | treated as | why |", "|---|---|---|"]
    for r in RULES:
        key = f"`{r.verl}*`" if r.verl.endswith(".") else f"`{r.verl}`"
        lines.append(f"| {key} | {r.kind.value} | {r.note} |")
    return "\n".join(lines) + "\n"
