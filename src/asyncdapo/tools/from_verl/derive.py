"""From verl's keys (the recipe's, over verl's defaults for its entry) to run-config fields.

Pure: no I/O. Reads top to bottom as the recipe families differ: what one training step is, how
stale its groups may be, how the policy loss, the reward and the learning rate are formed, how long
the run is. Every key it reads is listed in `keys.MAPPED`; a value asyncdapo cannot express is
recorded as a difference (the conversion goes on, `--strict` fails), and a recipe that cannot
train as written (GAE with a critic, LoRA, one response per group with dynamic sampling) is refused.
"""

from __future__ import annotations

from typing import Any

from asyncdapo.tools.from_verl.entries import Entry
from asyncdapo.tools.from_verl.keys import MAX_RESP_LEN_KEYS, OVERLONG_PREFIXES, REWARD_MANAGER_KEYS
from asyncdapo.tools.from_verl.probe import DataProbe
from asyncdapo.tools.from_verl.scorers import MATH_DAPO, scorer_for
from asyncdapo.tools.from_verl.view import (
    Derivation,
    Difference,
    Needed,
    Out,
    View,
    as_bool,
    as_float,
    as_int,
    as_list,
    dns_label,
    last_given,
)

A = "actor_rollout_ref.actor."
R = "actor_rollout_ref.rollout."
M = "actor_rollout_ref.model."
RC = "algorithm.rollout_correction."
FG = "algorithm.filter_groups."
AT = "async_training."


def derive(given: dict[str, Any], entry: Entry, probe: DataProbe) -> Derivation:
    d = Derivation()
    v = View(given, entry, d)
    o = Out(d, v)
    _objective(v, o)
    _model(v, o)
    _data(v, o)
    _step(v, o, entry)
    _sampling(v, o)
    _policy_loss(v, o)
    _corrections(v, o)
    _reward(v, o, entry, probe)
    _optimizer(v, o)
    _length(v, o, entry, probe)
    _workers(v, o, entry)
    _logging(v, o)
    return d


def _objective(v: View, o: Out) -> None:
    """What is trained: GRPO over groups of n responses."""
    est = v.str("algorithm.adv_estimator")
    if est != "grpo":
        what = "PPO with a critic (GAE)" if est == "gae" else f"the {est!r} advantage estimator"
        unset = "" if v.given("algorithm.adv_estimator") else " (verl's default: the recipe does not set it)"
        o.refuse(
            f"algorithm.adv_estimator={est}{unset}: {what} cannot run here; asyncdapo trains critic-free "
            "GRPO (algorithm.adv_estimator=grpo)"
        )
    o.set("algorithm.adv_estimator", "grpo", "algorithm.adv_estimator")
    o.set(
        "algorithm.norm_adv_by_std",
        v.bool("algorithm.norm_adv_by_std_in_grpo"),
        "algorithm.norm_adv_by_std_in_grpo",
    )
    n = v.int(R + "n") or 1
    o.set("rollout.n", n, R + "n")


def _model(v: View, o: Out) -> None:
    """The model."""
    path = v.str(M + "path")
    if path is None:
        o.d.needed.append(Needed("model.path", M + "path", None,
                               "the recipe sets no model (verl's default is a placeholder path)"))  # fmt: skip
    else:
        o.set("model.path", path, M + "path")
    o.set("model.trust_remote_code", v.bool(M + "trust_remote_code"), M + "trust_remote_code")
    if (v.int(M + "lora_rank") or 0) > 0:
        o.refuse(
            f"{M}lora_rank={v.raw(M + 'lora_rank')}: LoRA is not supported (asyncdapo trains every "
            f"parameter); remove the key to fine-tune the whole model"
        )
    for key, what in (
        (M + "custom_chat_template", "a custom chat template"),
        (M + "tokenizer_path", "another tokenizer"),
    ):
        if v.raw(key) is not None:
            o.differ(key, f"{what}: asyncdapo renders prompts with the model's own tokenizer and template")
    if v.given(M + "enable_gradient_checkpointing"):
        o.set("trainer.activation_checkpointing", v.bool(M + "enable_gradient_checkpointing"),
              M + "enable_gradient_checkpointing")  # fmt: skip


def _data(v: View, o: Out) -> None:
    """Data."""
    for key in ("data.train_files", "data.val_files"):
        if (files := v.raw(key)) is not None:
            o.set(key, as_list(files), key)
    if "data.train_files" not in o.d.fields:
        o.note("data.train_files is not set: set it before `asyncdapo up`")
    o.set("data.prompt_key", v.str("data.prompt_key"), "data.prompt_key")
    max_prompt = v.int("data.max_prompt_length")
    max_resp = v.int("data.max_response_length")
    o.set("data.max_prompt_length", max_prompt, "data.max_prompt_length")
    o.set("data.max_response_length", max_resp, "data.max_response_length")
    o.set("data.shuffle", v.bool("data.shuffle"), "data.shuffle")
    if (seed := v.int("data.seed")) is not None:
        o.set("data.seed", seed, "data.seed")
    trunc = v.str("data.truncation")
    if v.bool("data.filter_overlong_prompts"):
        o.set("data.truncation", "drop", "data.filter_overlong_prompts")
        o.ignored("data.truncation", "prompts over data.max_prompt_length are filtered out first")
    elif trunc in ("error", "left", "right", "middle"):
        o.set("data.truncation", trunc, "data.truncation", "data.filter_overlong_prompts")
    else:
        o.differ("data.truncation", f"truncation {trunc!r}: asyncdapo has drop, error, left, right, middle")
    if (val_max := v.int("data.val_max_samples")) is not None and val_max > 0:
        o.set("data.val_size", val_max, "data.val_max_samples")
    if (train_max := v.int("data.train_max_samples")) is not None and train_max > 0:
        o.differ("data.train_max_samples", "training on a subset of the training set")
    if v.raw("data.apply_chat_template_kwargs"):
        o.differ("data.apply_chat_template_kwargs", "chat-template arguments (e.g. enable_thinking)")
    for key in [k for k in v.given_values if k.startswith("data.apply_chat_template_kwargs.")]:
        o.d.read.add(key)
        o.differ(key, "a chat-template argument: asyncdapo renders the template without arguments")


def _step(v: View, o: Out, entry: Entry) -> None:
    """One training step, staleness, and what rollout does while weights change."""
    mini = v.int(A + "ppo_mini_batch_size") or 1
    o.set("rollout.mode", "async")
    if entry is Entry.FULLY_ASYNC:
        # verl's trainer updates every require_batches x ppo_mini_batch_size samples (one asyncdapo
        # step) and syncs weights every trigger_parameter_sync_step updates (publish_every); between
        # two syncs the rollouter may produce (1 + threshold) x trigger x B samples, which is the
        # bound floor((v + 1 + s) x B) with s = trigger x (1 + threshold) - 1.
        require = v.int(AT + "require_batches") or 1
        trigger = v.int(AT + "trigger_parameter_sync_step") or 1
        threshold = v.float(AT + "staleness_threshold") or 0.0
        batch = require * mini
        o.set("data.train_batch_size", batch, AT + "require_batches", A + "ppo_mini_batch_size")
        o.ignored(
            "data.train_batch_size", "verl's fully-async trainer takes require_batches x ppo_mini_batch_size"
        )
        o.set("trainer.publish_every", trigger, AT + "trigger_parameter_sync_step")
        o.set("rollout.max_staleness", round(trigger * (1 + threshold) - 1, 6),
              AT + "staleness_threshold", AT + "trigger_parameter_sync_step")  # fmt: skip
        partial = v.bool(AT + "partial_rollout")
        keep = partial and threshold > 0  # verl: partial rollout only acts with a threshold > 0
        o.set("rollout.weight_update_mode", "keep" if keep else "wait", AT + "partial_rollout")
        old = (
            "rollout"
            if v.bool(AT + "use_rollout_log_probs") and not v.bool(AT + "compute_prox_log_prob")
            else "recompute"
        )
        o.set("algorithm.old_log_prob", old, AT + "use_rollout_log_probs", AT + "compute_prox_log_prob")
        o.set(
            "rollout.early_stop_order", "any"
        )  # groups train in the order they finish, as verl streams them
        # verl's rollouter: 16 samples in flight per engine (rollout GPUs / TP), at most what may be produced
        gpus = (v.int("rollout.nnodes") or 1) * (v.int("rollout.n_gpus_per_node") or 1)
        engines = max(1, gpus // (v.int(R + "tensor_model_parallel_size") or 1))
        o.set("rollout.max_concurrent_prompts", max(1, min(16 * engines, int(batch * trigger * (1 + threshold)))),
              "rollout.nnodes", "rollout.n_gpus_per_node", R + "tensor_model_parallel_size")  # fmt: skip
        v.raw("data.gen_batch_size")  # verl requires 1: streaming, one sample at a time
    else:
        batch = v.int("data.train_batch_size") or 1
        o.set("data.train_batch_size", batch, "data.train_batch_size")
        if entry is Entry.ONE_STEP_OFF:
            # generation of step t+1's batch overlaps step t's update: every group is one version old,
            # generated whole by one version (in-flight requests finish before the weights change)
            o.set("rollout.max_staleness", 1)
            o.set("rollout.weight_update_mode", "wait")
            o.set("rollout.max_concurrent_prompts", batch, "data.train_batch_size")
            o.ignored(
                "data.gen_batch_size", "verl's one-step-off trainer generates data.train_batch_size prompts"
            )
        else:
            gen = v.int("data.gen_batch_size") if entry is Entry.MAIN_DAPO else None
            o.set("rollout.max_staleness", 0)
            o.set(
                "rollout.max_concurrent_prompts", gen or batch, "data.gen_batch_size", "data.train_batch_size"
            )
            if entry is Entry.MAIN_PPO:
                o.ignored(
                    "data.gen_batch_size", "verl.trainer.main_ppo generates data.train_batch_size prompts"
                )
        # verl keeps the first B valid groups in the order the prompts were drawn, not the first to finish
        o.set("rollout.early_stop_order", "fifo")
        bypass = v.bool(RC + "bypass_mode")
        o.set("algorithm.old_log_prob", "rollout" if bypass else "recompute", RC + "bypass_mode")
    o.set("trainer.ppo_mini_batch_size", mini, A + "ppo_mini_batch_size")
    if (micro := v.int(A + "ppo_micro_batch_size_per_gpu")) is not None:
        o.set("trainer.micro_batch_size", micro, A + "ppo_micro_batch_size_per_gpu")
    o.set("trainer.packing", v.bool(M + "use_remove_padding"), M + "use_remove_padding")
    # dynamic batch size: micro-batches sized by a token budget (verl ignores the budget otherwise)
    dynamic, budget = v.bool(A + "use_dynamic_bsz"), v.int(A + "ppo_max_token_len_per_gpu")
    o.set("trainer.micro_batch_tokens", budget if dynamic else None, A + "use_dynamic_bsz",
          A + "ppo_max_token_len_per_gpu")  # fmt: skip
    if not dynamic:
        o.ignored(A + "ppo_max_token_len_per_gpu", "only with use_dynamic_bsz")
    o.set("trainer.ppo_epochs", v.int(A + "ppo_epochs"), A + "ppo_epochs")
    if v.bool(A + "shuffle"):
        o.differ(A + "shuffle", "mini-batches drawn in random order: asyncdapo takes them in order")


def _sampling(v: View, o: Out) -> None:
    """Sampling."""
    temperature = v.float(R + "temperature")
    if not v.bool(R + "do_sample"):
        temperature = 0.0
    o.set("rollout.temperature", temperature, R + "temperature", R + "do_sample")
    o.set("rollout.top_p", v.float(R + "top_p"), R + "top_p")
    o.set("rollout.top_k", v.int(R + "top_k"), R + "top_k")
    if v.given(R + "max_num_seqs"):
        o.set("rollout.max_concurrent_per_gateway", v.int(R + "max_num_seqs"), R + "max_num_seqs")
    if v.bool(R + "ignore_eos"):
        o.differ(R + "ignore_eos", "responses that never stop at EOS")
    if (v.float(R + "over_sample_rate") or 0) > 0:
        o.differ(R + "over_sample_rate", "over-sampling then cancelling the slowest responses")
    if v.bool(R + "multi_turn.enable"):
        o.differ(
            R + "multi_turn.enable", "multi-turn rollouts with tools: asyncdapo rolls out single-turn math"
        )
    o.set("rollout.val_n", v.int(R + "val_kwargs.n"), R + "val_kwargs.n")
    if v.bool(R + "val_kwargs.do_sample"):
        o.set("rollout.val_temperature", v.float(R + "val_kwargs.temperature"),
              R + "val_kwargs.temperature", R + "val_kwargs.do_sample")  # fmt: skip
        o.set("rollout.val_top_p", v.float(R + "val_kwargs.top_p"), R + "val_kwargs.top_p")
        o.set("rollout.val_top_k", v.int(R + "val_kwargs.top_k"), R + "val_kwargs.top_k")
    else:
        o.set("rollout.val_temperature", 0.0, R + "val_kwargs.do_sample")
        for key in (R + "val_kwargs.temperature", R + "val_kwargs.top_p", R + "val_kwargs.top_k"):
            o.ignored(key, "val_kwargs.do_sample is false: validation is greedy")


def _policy_loss(v: View, o: Out) -> None:
    """The policy loss."""
    clip = v.float(A + "clip_ratio")
    low, high = v.float(A + "clip_ratio_low"), v.float(A + "clip_ratio_high")
    if low is not None and high is not None:
        o.ignored(
            A + "clip_ratio",
            "verl uses it only where clip_ratio_low/high are null; both are set (0.2 by default)",
        )
    o.set(
        "algorithm.clip_ratio_low", low if low is not None else clip, A + "clip_ratio_low", A + "clip_ratio"
    )
    o.set(
        "algorithm.clip_ratio_high",
        high if high is not None else clip,
        A + "clip_ratio_high",
        A + "clip_ratio",
    )
    o.set("algorithm.clip_ratio_c", v.float(A + "clip_ratio_c"), A + "clip_ratio_c")
    agg = v.str(A + "loss_agg_mode")
    if agg in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        o.set("algorithm.loss_agg_mode", agg, A + "loss_agg_mode")
        if agg == "seq-mean-token-sum-norm":
            o.note(
                "seq-mean-token-sum-norm: asyncdapo's loss is the mean over responses of (token-loss sum / "
                "data.max_response_length); verl's equals it times ppo_micro_batch_size_per_gpu (a constant "
                "that AdamW absorbs but gradient clipping sees)"
            )
    else:
        o.differ(A + "loss_agg_mode", f"loss aggregation {agg!r}")
    scale = v.float(A + "loss_scale_factor")
    if scale is not None and not (
        agg == "seq-mean-token-sum-norm" and scale == o.d.fields["data.max_response_length"]
    ):
        o.differ(A + "loss_scale_factor", "a loss scale other than data.max_response_length")
    if (mode := v.str(A + "policy_loss.loss_mode")) != "vanilla":
        o.differ(
            A + "policy_loss.loss_mode",
            f"policy loss {mode!r}: asyncdapo's is PPO clip with dual-clip (vanilla)",
        )
    o.set("algorithm.entropy_coeff", v.float(A + "entropy_coeff"), A + "entropy_coeff")
    if v.bool(A + "use_kl_loss"):
        o.set("algorithm.kl_coef", v.float(A + "kl_loss_coef"), A + "use_kl_loss", A + "kl_loss_coef")
        if (kl_type := v.str(A + "kl_loss_type")) not in ("low_var_kl", "k3"):
            o.differ(A + "kl_loss_type", f"KL estimator {kl_type!r}: asyncdapo's KL loss is low_var_kl (k3)")
    else:
        o.set("algorithm.kl_coef", 0.0, A + "use_kl_loss")
        for key in (A + "kl_loss_coef", A + "kl_loss_type"):
            o.ignored(key, "use_kl_loss is false")
    if v.bool("algorithm.use_kl_in_reward"):
        o.differ("algorithm.use_kl_in_reward", "a KL penalty in the reward: asyncdapo has the KL loss only")
    if v.bool("algorithm.use_pf_ppo"):
        o.differ("algorithm.use_pf_ppo", "policy-filtered PPO (reweighting samples)")
    o.set("trainer.grad_clip", v.float(A + "grad_clip"), A + "grad_clip")


def _corrections(v: View, o: Out) -> None:
    """Off-policy corrections: truncated importance sampling against the engines' log-probs."""
    old = o.d.fields["algorithm.old_log_prob"]
    level = v.str(RC + "rollout_is")
    threshold_is = v.float(RC + "rollout_is_threshold")
    legacy_cap = v.float(A + "tis_imp_ratio_cap")
    if level is None:
        o.ignored(RC + "rollout_is_threshold", "rollout_is is null")
    elif level == "token" and old == "recompute":
        o.set("algorithm.tis_cap", threshold_is, RC + "rollout_is", RC + "rollout_is_threshold")
    else:
        why = "with old log-probs from the rollout (bypass)" if level == "token" else f"level {level!r}"
        o.differ(RC + "rollout_is", f"rollout importance sampling {why}: asyncdapo has token-level TIS only")
    if legacy_cap is not None and legacy_cap > 0:
        if old == "recompute" and "algorithm.tis_cap" not in o.d.fields:
            o.set("algorithm.tis_cap", legacy_cap, A + "tis_imp_ratio_cap")
        else:
            o.differ(A + "tis_imp_ratio_cap", "truncated IS together with another correction")
    for key, fine in ((RC + "rollout_rs", None), (RC + "rollout_token_veto_threshold", None),
                      (RC + "loss_type", "ppo_clip"), (RC + "rollout_is_batch_normalize", False)):  # fmt: skip
        value = v.raw(key)
        if isinstance(fine, bool):
            value = as_bool(value) if value is not None else False
        if value != fine:
            o.differ(key, "a rollout correction asyncdapo does not have")


def _reward(v: View, o: Out, entry: Entry, probe: DataProbe) -> None:
    """The reward."""
    if entry is Entry.MAIN_DAPO:
        filtering = v.bool(FG + "enable")
        o.set("reward.filter_groups", filtering, FG + "enable")
        if filtering:
            metric = v.str(FG + "metric")
            if metric is None:
                o.refuse(
                    f"{FG}enable=True without {FG}metric: verl's DAPO fails at its first step; set acc or score"
                )
            elif metric in ("acc", "score"):
                o.set("reward.filter_metric", metric, FG + "metric")
            elif metric == "seq_reward" or (
                metric == "seq_final_reward" and not v.bool("algorithm.use_kl_in_reward")
            ):
                o.set("reward.filter_metric", "reward", FG + "metric")  # score + overlong penalty
            else:
                o.differ(
                    FG + "metric", f"filter metric {metric!r}: asyncdapo filters on acc, score or reward"
                )
            o.set("rollout.max_num_gen_batches", max(v.int(FG + "max_num_gen_batches") or 0, 0),
                  FG + "max_num_gen_batches")  # fmt: skip
        else:
            for key in (FG + "metric", FG + "max_num_gen_batches"):
                o.ignored(key, "filter_groups.enable is false")
    else:
        o.set("reward.filter_groups", False)
        for key in [k for k in v.given_values if k.startswith(FG)]:
            o.ignored(
                key, f"verl's {entry.value} trainer has no dynamic sampling (only recipe.dapo reads it)"
            )
    if o.d.fields.get("reward.filter_groups") and o.d.fields["rollout.n"] == 1:
        o.refuse(
            f"{R}n=1 with {FG}enable=True: a group of one response has zero variance, so dynamic "
            "sampling would drop every group; set n >= 2 or disable filter_groups"
        )
    manager_key = last_given(v, REWARD_MANAGER_KEYS) or "reward_model.reward_manager"
    manager = v.str(manager_key) or "naive"
    for key in REWARD_MANAGER_KEYS:
        o.d.read.add(key)
    if manager not in ("naive", "dapo", "prime", "batch"):
        o.differ(manager_key, f"reward manager {manager!r}")
    over: dict[str, Any] = {}
    for part in ("enable", "len", "penalty_factor"):
        key = last_given(v, [p + part for p in OVERLONG_PREFIXES]) or OVERLONG_PREFIXES[0] + part
        for p in OVERLONG_PREFIXES:
            o.d.read.add(p + part)
        over[part] = (key, v.raw(key))
    enabled = over["enable"][1] is not None and as_bool(over["enable"][1])
    if enabled and manager != "dapo":
        for key, _ in over.values():
            o.ignored(key, f"verl's {manager!r} reward manager does not shape overlong responses (dapo does)")
        enabled = False
    o.set("reward.overlong_buffer.enable", enabled, over["enable"][0], manager_key)
    if enabled:
        length = as_int(over["len"][1]) if over["len"][1] is not None else 0
        if length <= 0:
            o.refuse(
                f"{over['enable'][0]}=True with {over['len'][0]}={over['len'][1]}: the buffer must be > 0 tokens"
            )
        o.set("reward.overlong_buffer.len", length, over["len"][0])
        factor = over["penalty_factor"][1]
        o.set("reward.overlong_buffer.penalty_factor", as_float(factor) if factor is not None else 0.0,
              over["penalty_factor"][0])  # fmt: skip
        for key in MAX_RESP_LEN_KEYS:
            if (value := v.raw(key)) is not None and as_int(value) != o.d.fields["data.max_response_length"]:
                o.differ(key, f"the overlong penalty measured against {value} tokens; asyncdapo measures it "
                              f"against data.max_response_length ({o.d.fields['data.max_response_length']})")  # fmt: skip
    else:
        for key in [*(over[p][0] for p in ("len", "penalty_factor")), *MAX_RESP_LEN_KEYS]:
            o.ignored(key, "overlong shaping is off")
    if v.bool("reward_model.enable"):
        o.differ("reward_model.enable", "a reward model: asyncdapo rewards with math-verify")
    if (custom := v.str("custom_reward_function.path")) is not None:
        o.differ(
            "custom_reward_function.path",
            f"a custom reward function ({custom}): asyncdapo rewards with math-verify",
        )
    # GRPO's std normalisation makes +1/-1 and 1/0 the same advantages: the values matter only
    # with overlong shaping or without the normalisation (Dr. GRPO)
    _reward_values(o, probe, material=enabled or not o.d.fields["algorithm.norm_adv_by_std"])


def _optimizer(v: View, o: Out) -> None:
    """Learning rate."""
    if (opt := v.str(A + "optim.optimizer")) not in ("AdamW", "adamw"):
        o.differ(A + "optim.optimizer", f"optimizer {opt!r}: asyncdapo uses AdamW")
    o.set("trainer.lr", v.float(A + "optim.lr"), A + "optim.lr")
    o.set("trainer.weight_decay", v.float(A + "optim.weight_decay"), A + "optim.weight_decay")
    betas = v.raw(A + "optim.betas")
    o.set("trainer.betas", [float(b) for b in as_list(betas)], A + "optim.betas")
    style_key = (
        A + "optim.warmup_style"
        if v.raw(A + "optim.warmup_style") is not None
        else A + "optim.lr_scheduler_type"
    )
    o.d.read.update({A + "optim.warmup_style", A + "optim.lr_scheduler_type"})
    schedule = v.str(style_key)
    if schedule in ("constant", "cosine"):
        o.set("trainer.lr_schedule", schedule, style_key)
    else:
        o.differ(style_key, f"LR schedule {schedule!r}: asyncdapo has constant and cosine")
    if schedule == "cosine":
        o.set("trainer.min_lr_ratio", v.float(A + "optim.min_lr_ratio"), A + "optim.min_lr_ratio")
        o.set("trainer.lr_num_cycles", v.float(A + "optim.num_cycles"), A + "optim.num_cycles")
    else:
        for key in (A + "optim.min_lr_ratio", A + "optim.num_cycles"):
            o.ignored(key, "the LR schedule is constant")


def _length(v: View, o: Out, entry: Entry, probe: DataProbe) -> None:
    """How long, how often."""
    steps = _total_steps(v, o, entry, o.d.fields["data.train_batch_size"], probe)
    warmup = v.int(A + "optim.lr_warmup_steps")
    if warmup is not None and warmup >= 0:
        o.set("trainer.warmup_steps", warmup, A + "optim.lr_warmup_steps")
        o.ignored(A + "optim.lr_warmup_steps_ratio", "lr_warmup_steps is set")
    else:
        ratio = v.float(A + "optim.lr_warmup_steps_ratio") or 0.0
        if ratio == 0.0:
            o.set("trainer.warmup_steps", 0, A + "optim.lr_warmup_steps", A + "optim.lr_warmup_steps_ratio")
        elif steps is not None:
            o.set("trainer.warmup_steps", int(ratio * steps), A + "optim.lr_warmup_steps_ratio")
        else:
            o.d.needed.append(Needed("trainer.warmup_steps", A + "optim.lr_warmup_steps_ratio", ratio,
                                   f"{ratio} x the total steps, which are not known here"))  # fmt: skip
    if entry is Entry.FULLY_ASYNC:
        freq = v.int("rollout.test_freq") or 0
        trigger = o.d.fields["trainer.publish_every"]
        o.set("trainer.val_every", freq * trigger if freq > 0 else 0, "rollout.test_freq")
        o.ignored("trainer.test_freq", "verl's fully-async trainer validates every rollout.test_freq syncs")
    else:
        freq = v.int("trainer.test_freq") or 0
        o.set("trainer.val_every", max(freq, 0), "trainer.test_freq")
    save = v.int("trainer.save_freq") or 0
    if save > 0:
        o.set("trainer.checkpoint_every", save, "trainer.save_freq")
    elif steps is not None:
        o.set("trainer.checkpoint_every", steps, "trainer.save_freq")
        o.note("trainer.save_freq <= 0 (verl: never): asyncdapo checkpoints at the final step only "
               "(trainer.checkpoint_every = total_steps); a lower value lets a run resume mid-way")  # fmt: skip
    if v.bool("trainer.val_only"):
        o.differ("trainer.val_only", "a validation-only run: use `asyncdapo up` with trainer.total_steps: 1")
    if (ckpt := v.str("trainer.default_local_dir")) is not None:
        o.set("trainer.checkpoint_dir", ckpt, "trainer.default_local_dir")


def _workers(v: View, o: Out, entry: Entry) -> None:
    """Training workers."""
    if v.given("trainer.n_gpus_per_node") or v.given("trainer.nnodes"):
        gpus = (v.int("trainer.n_gpus_per_node") or 1) * (v.int("trainer.nnodes") or 1)
        # Ulysses sequence parallelism: sp GPUs share each sequence, so gpus / sp train data-parallel
        sp = max(v.int(A + "ulysses_sequence_parallel_size") or 1, 1)
        workers = max(gpus // sp, 1)
        o.set(
            "trainer.workers",
            workers,
            "trainer.n_gpus_per_node",
            "trainer.nnodes",
            A + "ulysses_sequence_parallel_size",
        )
        if sp > 1:
            o.note(f"{A}ulysses_sequence_parallel_size={sp}: verl splits each sequence over {sp} of the {gpus} "
                   f"training GPUs; asyncdapo has no sequence parallelism: {workers} data-parallel worker(s) "
                   "(trainer.gpus_per_worker to give each more GPUs)")  # fmt: skip
        gpus = workers
        strategy = v.str(A + "strategy")
        o.set("trainer.sharding", "fsdp" if gpus > 1 and strategy != "ddp" else "ddp", A + "strategy")
        if entry in (Entry.MAIN_PPO, Entry.MAIN_DAPO):
            o.note(f"trainer.workers={gpus}: verl colocates rollout and training on these GPUs; asyncdapo's "
                   "gateways are separate (`asyncdapo up --gateways`, Helm gateway.replicas)")  # fmt: skip
    else:
        o.d.read.update({A + "strategy", A + "ulysses_sequence_parallel_size"})


def _logging(v: View, o: Out) -> None:
    """Logging."""
    backends = []
    for name in as_list(v.raw("trainer.logger") or []):
        mapped = {"wandb": "wandb", "tensorboard": "tensorboard", "mlflow": "mlflow", "file": "jsonl"}.get(
            name
        )
        if mapped:
            backends.append(mapped)
        elif name != "console":
            o.note(
                f"trainer.logger {name!r}: not a tracking backend of asyncdapo (tensorboard, wandb, mlflow, jsonl)"
            )
    o.set("logging.backends", backends, "trainer.logger")
    o.set("logging.project", v.str("trainer.project_name"), "trainer.project_name")
    experiment = v.str("trainer.experiment_name") or ""
    o.set("logging.experiment", experiment, "trainer.experiment_name")
    if label := dns_label(experiment):
        o.set("name", label, "trainer.experiment_name")


def _reward_values(o: Out, probe: DataProbe, *, material: bool) -> None:
    """The reward for a correct and a wrong answer: verl's scorer for the data's data_source."""
    if probe.rows is None:
        o.set("reward.correct_reward", MATH_DAPO.correct)
        o.set("reward.incorrect_reward", MATH_DAPO.incorrect)
        why = (
            f"verl's reward depends on the rows' data_source (+1 / -1 for math_dapo and aime*, 1 / 0 for "
            f"GSM8K and MATH) and {probe.why_unread}"
        )
        if material:
            o.d.needed.append(Needed("reward.incorrect_reward", "data_source", None,
                                     f"{why}; with overlong shaping or without std normalisation the values "
                                     "change the advantages: convert where the train files are, or"))  # fmt: skip
        else:
            o.note(f"reward values +1 / -1: {why}; immaterial here (GRPO's std normalisation gives "
                   "the same advantages for either)")  # fmt: skip
        return
    scorers = {s: scorer_for(s) for s in sorted(probe.data_sources)}
    unknown = [s for s, sc in scorers.items() if sc is None]
    values = {(sc.correct, sc.incorrect) for sc in scorers.values() if sc is not None}
    if unknown:
        o.note(f"verl has no scorer for data_source {', '.join(map(repr, unknown))} (it needs custom_reward_function "
               "there); asyncdapo judges them with math-verify like the rest")  # fmt: skip
    if len(values) > 1:
        o.d.different.append(Difference("data_source", sorted(probe.data_sources),
                                        "verl rewards these data sources on different scales; a run has one"))  # fmt: skip
    correct, incorrect = min(values) if values else (MATH_DAPO.correct, MATH_DAPO.incorrect)
    names = ", ".join(sorted({sc.name for sc in scorers.values() if sc is not None})) or MATH_DAPO.name
    o.set("reward.correct_reward", correct)
    o.set("reward.incorrect_reward", incorrect)
    o.note(f"reward values {correct:+g} / {incorrect:+g}: verl's {names} scorer for the train files' data_source "
           f"({', '.join(sorted(probe.data_sources))}); asyncdapo judges answers with math-verify")  # fmt: skip


def _total_steps(v: View, o: Out, entry: Entry, batch: int, probe: DataProbe) -> int | None:
    if entry is Entry.FULLY_ASYNC:
        samples = v.int("rollout.total_rollout_steps") or 0
        steps = samples // batch
        if steps < 1:
            o.refuse(
                f"rollout.total_rollout_steps={samples} is less than one training batch ({batch} samples)"
            )
            return None
        o.set("trainer.total_steps", steps, "rollout.total_rollout_steps")
        for key in ("trainer.total_training_steps", "trainer.total_epochs"):
            o.ignored(key, "verl's fully-async run ends after rollout.total_rollout_steps samples")
        return steps
    if (fixed := v.int("trainer.total_training_steps")) is not None:
        o.set("trainer.total_steps", fixed, "trainer.total_training_steps")
        o.ignored("trainer.total_epochs", "trainer.total_training_steps is set")
        return fixed
    epochs = v.int("trainer.total_epochs") or 1
    gen = o.d.fields.get("rollout.max_concurrent_prompts") if entry is Entry.MAIN_DAPO else batch
    gen = gen or batch
    if probe.rows is not None:
        per_epoch = probe.rows // gen  # verl's dataloader drops the last partial batch
        if per_epoch < 1:
            o.refuse(f"the train files hold {probe.rows} rows, fewer than one batch of {gen} prompts")
            return None
        o.set("trainer.total_steps", epochs * per_epoch, "trainer.total_epochs")
        o.note(f"trainer.total_steps = {epochs} epoch(s) x ({probe.rows} rows // {gen} prompts per batch), as verl "
               "counts them (before it filters overlong prompts)")  # fmt: skip
        return epochs * per_epoch
    o.d.read.add("trainer.total_epochs")
    o.d.needed.append(Needed("trainer.total_steps", "trainer.total_epochs", epochs,
                             f"verl runs {epochs} epoch(s) x (train rows // {gen}); {probe.why_unread}"))  # fmt: skip
    return None
