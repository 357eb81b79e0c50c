"""The sections of a run config (`model`, `data`, `rollout`, `reward`, `algorithm`, `trainer`,
`logging`): each field, its default and its own bounds. The run config as a whole — the sections
together, the combinations no run can work with, the derived quantities and loading — is
`asyncdapo.contracts.config.RunConfig`."""

from __future__ import annotations

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_serializer,
    field_validator,
    model_validator,
)

from asyncdapo.contracts.config_enums import (
    AdmissionPolicyName,
    AdvEstimator,
    EarlyStopOrder,
    FilterMetric,
    LongTailPolicy,
    LossAggMode,
    LrSchedule,
    MetricNames,
    ModelDtype,
    OldLogProbSource,
    PauseMode,
    PromptTruncation,
    RolloutMode,
    ShardingStrategy,
    TrackingBackend,
    WandbMode,
    WeightTransport,
)


class _Strict(BaseModel):
    # Unknown keys are errors: a typo in a YAML must not silently fall back to a default.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_enum_values=False)


class ModelConfig(_Strict):
    path: str = Field("models/tiny", description="Hugging Face causal-LM directory (weights + tokenizer).")
    dtype: ModelDtype = Field(
        ModelDtype.AUTO, description="Weights dtype for training and rollout: auto|float32|bfloat16."
    )
    trust_remote_code: bool = Field(False, description="Allow custom modelling code from the model dir.")


class DataConfig(_Strict):
    train_files: list[str] = Field(
        default_factory=list, description="verl-layout parquet/JSONL files with `prompt` and ground truth."
    )
    val_files: list[str] = Field(default_factory=list, description="Held-out files for validation.")
    prompt_key: str = Field("prompt", description="Column holding the prompt (chat messages or text).")
    train_batch_size: int = Field(
        8, ge=1, le=65536, description="B: valid (non-filtered) groups per training step."
    )
    max_prompt_length: int = Field(
        512, ge=1, le=1 << 20, description="Prompt token limit; a longer prompt follows `truncation`."
    )
    max_response_length: int = Field(512, ge=1, le=1 << 20, description="max_tokens of every rollout.")
    truncation: PromptTruncation = Field(
        PromptTruncation.DROP,
        description="A prompt longer than max_prompt_length: drop it, error, or keep its left, right or "
        "middle tokens (verl: data.truncation).",
    )
    shuffle: bool = Field(True, description="Shuffle the training set each epoch (seeded).")
    seed: int = Field(1, ge=0, description="Seed of the data order.")
    apply_chat_template: bool = Field(
        True, description="Render chat-message prompts with the tokenizer's chat template when it has one."
    )
    prompt_queue_watermark: int = Field(
        256, ge=1, le=1 << 20, description="The trainer keeps at least this many prompts queued in Redis."
    )
    val_size: int = Field(0, ge=0, description="Validation prompts per evaluation (0 = all val_files).")


class OverlongBufferConfig(_Strict):
    enable: bool = Field(True, description="DAPO overlong reward shaping.")
    len: int = Field(
        128,
        ge=1,
        description="Buffer length L: responses longer than max_response_length - L are penalised linearly.",
    )
    penalty_factor: float = Field(1.0, ge=0.0, le=100.0, description="Penalty at the full buffer.")


class LongTailConfig(_Strict):
    policy: LongTailPolicy = Field(
        LongTailPolicy.NONE,
        description="none, or pdsr: every response starts on the fast pool, capped at cap_factor x L_cut; "
        "one that reaches the cap continues on the heavy pool from its partial tokens.",
    )
    offload_fraction: float = Field(
        0.2,
        gt=0.0,
        lt=1.0,
        description="L_cut is the (1 - offload_fraction) quantile of recent response lengths: about this "
        "fraction of responses (the longest) ends on the heavy pool.",
    )
    cap_factor: float = Field(
        1.5, ge=1.0, le=100.0, description="Fast-pool responses are capped at cap_factor x L_cut tokens."
    )


class AdmissionConfig(_Strict):
    policy: AdmissionPolicyName = Field(
        AdmissionPolicyName.EXPECTED_VALID,
        description="Admission policy: expected-valid (default) or greedy (never trims).",
    )
    margin: float = Field(
        1.2,
        ge=1.0,
        le=10.0,
        description="Stop admitting once valid + p_valid * in_flight >= margin * remaining-to-bound.",
    )
    min_valid_rate: float = Field(
        0.05, gt=0.0, le=1.0, description="Floor on the running valid rate used by the policy."
    )


class RolloutConfig(_Strict):
    n: int = Field(8, ge=1, le=1024, description="Responses per prompt (the group size).")
    temperature: float = Field(1.0, ge=0.0, le=10.0, description="Sampling temperature.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling.")
    top_k: int = Field(-1, ge=-1, description="Top-k sampling (-1 disables).")
    mode: RolloutMode = Field(
        RolloutMode.ASYNC,
        description="async (streaming filter + early stop) or sync (verl's loop, baseline).",
    )
    max_staleness: float = Field(
        0,
        ge=0,
        le=64,
        description="s, may be fractional: at policy version v at most floor((v+1+s)*B) valid groups "
        "exist in total, and a group produced under version v may train at step t only if t-v <= ceil(s) "
        "(verl fully-async: trigger_parameter_sync_step*(1+staleness_threshold)-1).",
    )
    weight_update_mode: PauseMode = Field(
        PauseMode.KEEP, description="What in-flight requests do while weights change: keep|abort|wait."
    )
    weight_sync_timeout_s: float = Field(
        60.0,
        gt=0.0,
        le=3600.0,
        description="Bound on one gateway's weight update (fetch, pause, load, resume); a gateway that "
        "fails or exceeds it gets no work until a background re-sync brings it to the current version.",
    )
    weight_relay_fanout: int = Field(
        2,
        ge=1,
        le=64,
        description="trainer.weight_transport stream: gateways one WeightStore server (the trainer, then "
        "each gateway) feeds a new version to, as a tree: the trainer sends this many copies whatever "
        "the number of gateways; each gateway relays the chunks it has while it still receives.",
    )
    max_concurrent_prompts: int = Field(
        32, ge=1, le=1 << 16, description="Prompt-level FIFO: at most this many prompts in flight."
    )
    max_concurrent_per_gateway: int = Field(
        256, ge=1, le=1 << 16, description="Dispatch filter: requests in flight per gateway."
    )
    requeue_aborted: bool = Field(
        True, description="Put prompts aborted by early stop back at the queue head."
    )
    max_num_gen_batches: int = Field(
        0,
        ge=0,
        le=1 << 16,
        description="sync mode (verl's algorithm.filter_groups.max_num_gen_batches): generation batches "
        "per step before giving up for lack of valid groups (0: no limit).",
    )
    early_stop_order: EarlyStopOrder = Field(
        EarlyStopOrder.ANY,
        description="any: stop at B valid groups; fifo: also wait for prompts admitted before the B-th.",
    )
    admission: AdmissionConfig = Field(default_factory=AdmissionConfig)
    long_tail: LongTailConfig = Field(default_factory=LongTailConfig)
    val_n: int = Field(1, ge=1, le=1024, description="Responses per prompt in validation.")
    val_temperature: float = Field(0.0, ge=0.0, le=10.0, description="Validation sampling temperature.")
    val_top_p: float = Field(1.0, gt=0.0, le=1.0, description="Validation nucleus sampling.")
    val_top_k: int = Field(-1, ge=-1, description="Validation top-k sampling (-1 disables).")
    seed: int | None = Field(None, description="Base sampling seed (None: nondeterministic).")

    @field_validator("max_staleness")
    @classmethod
    def _integral_staleness_is_int(cls, s: float) -> float:
        # an integral s stays 0 / 1 as written (messages say "1 given", not "1.0 given")
        return int(s) if float(s).is_integer() else s

    @field_serializer("max_staleness")
    def _integral_staleness(self, s: float) -> int | float:
        # an integral s prints as 0 / 1, as it is written in run configs, not as 0.0 / 1.0
        return int(s) if float(s).is_integer() else s


class RewardConfig(_Strict):
    correct_reward: float = Field(
        1.0, ge=-100.0, le=100.0, description="Score of a correct answer (verl's DAPO: 1)."
    )
    incorrect_reward: float = Field(
        -1.0,
        ge=-100.0,
        le=100.0,
        description="Score of an incorrect or unparsable answer (verl's DAPO: -1; its GSM8K/MATH scorers: 0).",
    )
    overlong_buffer: OverlongBufferConfig = Field(default_factory=OverlongBufferConfig)
    filter_groups: bool = Field(True, description="DAPO dynamic sampling: drop zero-variance groups.")
    filter_metric: FilterMetric = Field(
        FilterMetric.ACC, description="Metric whose group std must exceed eps."
    )
    filter_eps: float = Field(1e-6, ge=0.0, description="A group is valid when its std > eps.")
    verifier_timeout_s: float = Field(5.0, gt=0.0, le=600.0, description="Per-item math-verify timeout.")
    verifier_batch_size: int = Field(32, ge=1, le=4096, description="Responses per /v1/score call.")
    verifier_concurrency: int = Field(8, ge=1, le=1024, description="Concurrent verifier calls.")
    verifier_max_retries: int | None = Field(
        None,
        ge=0,
        le=100000,
        description="Retries of a failed verifier call (capped backoff, 2 s) before its prompts are dropped "
        "as `verifier_error`; null (default): wait for the verifier as long as it takes.",
    )

    @model_validator(mode="after")
    def _correct_above_incorrect(self) -> RewardConfig:
        if self.correct_reward <= self.incorrect_reward:
            raise ValueError(
                f"correct_reward ({self.correct_reward}) must be greater than incorrect_reward "
                f"({self.incorrect_reward}): a correct answer must earn more than a wrong one. Use 1 and -1 "
                "(verl's DAPO) or 1 and 0 (verl's GSM8K/MATH scorers)"
            )
        return self


class AlgorithmConfig(_Strict):
    adv_estimator: AdvEstimator = Field(AdvEstimator.GRPO, description="Advantage estimator (grpo).")
    norm_adv_by_std: bool = Field(True, description="GRPO divides by the group std; false is Dr. GRPO.")
    clip_ratio_low: float = Field(0.2, ge=0.0, le=1.0, description="PPO clip: 1 - low.")
    clip_ratio_high: float = Field(0.28, ge=0.0, le=10.0, description="DAPO clip-higher: 1 + high.")
    clip_ratio_c: float = Field(
        10.0, gt=1.0, le=1000.0, description="Dual-clip bound for negative advantages."
    )
    loss_agg_mode: LossAggMode = Field(
        LossAggMode.TOKEN_MEAN,
        description="Loss aggregation: token-mean | seq-mean-token-sum | seq-mean-token-mean | "
        "seq-mean-token-sum-norm (Dr. GRPO: each response's token sum / data.max_response_length, "
        "averaged over responses).",
    )
    old_log_prob: OldLogProbSource = Field(
        OldLogProbSource.RECOMPUTE,
        description="Log-probs the PPO ratio is taken against: recompute (the current weights, a forward "
        "pass before the update) or rollout (the engine's log-prob of each sampled token; no extra pass; "
        "verl's rollout_correction.bypass_mode / use_rollout_log_probs).",
    )
    tis_cap: float | None = Field(
        None, gt=0.0, description="Truncated importance weight cap vs. behaviour log-probs (None: off)."
    )
    entropy_coeff: float = Field(0.0, ge=0.0, le=1.0, description="Entropy bonus.")
    kl_coef: float = Field(0.0, ge=0.0, le=10.0, description="KL-loss coefficient (DAPO: 0).")

    @model_validator(mode="after")
    def _tis_needs_recomputed_old_log_probs(self) -> AlgorithmConfig:
        if self.tis_cap is not None and self.old_log_prob is OldLogProbSource.ROLLOUT:
            raise ValueError(
                f"tis_cap ({self.tis_cap}) cannot be used with old_log_prob: rollout: the importance weight "
                "pi_old / pi_behaviour is then 1 for every token. Remove tis_cap, or set old_log_prob: "
                "recompute to correct the rollout/trainer mismatch with TIS"
            )
        return self


class TrainerConfig(_Strict):
    total_steps: int = Field(100, ge=1, description="Policy updates to run.")
    ppo_mini_batch_size: int = Field(8, ge=1, description="Groups per optimizer step (divides B).")
    micro_batch_size: int = Field(
        8, ge=1, description="Sequences per forward/backward pass (unless micro_batch_tokens sets a budget)."
    )
    packing: bool = Field(
        True,
        description="Padding-free: a micro-batch's sequences are packed into one row with position ids "
        "restarting per sequence; no pad token is computed (verl's use_remove_padding). Models that "
        "transformers ships only; another model's code trains padded.",
    )
    micro_batch_tokens: int | None = Field(
        None,
        ge=1,
        description="Token budget of one micro-batch (prompt + response tokens; without packing each "
        "sequence counts the batch's padded width); None: `micro_batch_size` sequences per micro-batch. "
        "Sequences are grouped longest first; one longer than the budget goes alone in its micro-batch, "
        "so a budget below data.max_prompt_length + data.max_response_length is allowed (verl's "
        "use_dynamic_bsz with ppo_max_token_len_per_gpu).",
    )
    ppo_epochs: int = Field(1, ge=1, le=100, description="Passes over each batch.")
    lr: float = Field(1e-6, gt=0.0, le=1.0, description="AdamW learning rate.")
    weight_decay: float = Field(0.1, ge=0.0, le=1.0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    warmup_steps: int = Field(
        10,
        ge=0,
        description="Linear LR warm-up steps: update k (from 0) uses lr * min(1, (k + 1) / warmup_steps).",
    )
    lr_schedule: LrSchedule = Field(
        LrSchedule.CONSTANT,
        description="LR after warm-up: constant, or cosine (verl's lr_scheduler_type) from lr down to "
        "min_lr_ratio * lr over total_steps.",
    )
    min_lr_ratio: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="cosine: the lowest LR as a fraction of lr (verl's optim.min_lr_ratio).",
    )
    lr_num_cycles: float = Field(
        0.5,
        gt=0.0,
        description="cosine: waves over the decay; 0.5 = one half-cosine (verl's optim.num_cycles).",
    )
    grad_clip: float = Field(1.0, gt=0.0, description="Max gradient norm.")
    publish_every: int = Field(1, ge=1, description="Publish weights every k steps.")
    weight_transport: WeightTransport = Field(
        WeightTransport.STREAM,
        description="stream: the trainer serves each published version from memory (its WeightStore) "
        "and gateways pull it in checksummed chunks, relaying to each other; no shared volume. "
        "snapshot: a safetensors directory under checkpoint_dir/weights that every gateway must be able to read.",
    )
    weight_store_dir: str = Field(
        "",
        max_length=4096,
        description="stream: where the trainer keeps the versions it serves (one or two model copies); "
        "'' is /dev/shm when writable (memory), else the temporary directory.",
    )
    checkpoint_every: int = Field(1, ge=1, description="Checkpoint every k steps.")
    val_every: int = Field(0, ge=0, description="Validate every k steps (0: never).")
    workers: int = Field(1, ge=1, le=4096, description="Data-parallel workers (>1 uses Ray Train).")
    gpus_per_worker: int | None = Field(
        None,
        ge=0,
        le=64,
        description="GPUs per worker (>1 workers). None: 1 if the driver sees CUDA, else 0 (local runs); "
        "a TrainingRun sets it from spec.trainer.gpusPerWorker.",
    )
    sharding: ShardingStrategy = Field(
        ShardingStrategy.DDP,
        description="ddp (replicas) or fsdp (FSDP2: fp32 master weights and optimizer state sharded over "
        "the workers; model.dtype bfloat16 computes in bf16).",
    )
    activation_checkpointing: bool = Field(
        False,
        description="Recompute each decoder layer's activations in backward (less memory, ~+30% compute).",
    )
    seed: int = Field(1, ge=0, description="Training seed.")
    checkpoint_dir: str = Field("checkpoints", description="Where checkpoints and weight snapshots go.")

    @field_validator("betas")
    @classmethod
    def _betas_in_range(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= b < 1.0 for b in v):
            raise ValueError("each beta must be in [0, 1)")
        return v


class LoggingConfig(_Strict):
    """Experiment tracking: what the trainer writes besides metrics.jsonl and Prometheus."""

    backends: list[TrackingBackend] = Field(
        default_factory=lambda: [TrackingBackend.TENSORBOARD],
        description="Tracking backends the trainer writes every step to: tensorboard, wandb, mlflow, "
        "jsonl (verl: trainer.logger).",
    )
    dir: str | None = Field(
        None,
        description="Directory of the local backends (tensorboard/, wandb/, mlruns/, tracking.jsonl); "
        "default: tracking/ in the trainer's output directory.",
    )
    project: str = Field(
        "asyncdapo",
        min_length=1,
        description="W&B project and MLflow experiment (verl: trainer.project_name).",
    )
    experiment: str | None = Field(
        None, description="Run name in W&B and MLflow (verl: trainer.experiment_name); default: the run name."
    )
    metric_names: MetricNames = Field(
        MetricNames.VERL, description="verl: verl's metric names where verl has one; asyncdapo: ours."
    )
    wandb_mode: WandbMode = Field(
        WandbMode.OFFLINE,
        description="offline: run files under dir (upload later with `wandb sync`); online needs a login.",
    )
    mlflow_tracking_uri: str | None = Field(
        None, description="MLflow tracking URI; default: a local file store, dir/mlruns."
    )

    @field_validator("backends")
    @classmethod
    def _unique(cls, v: list[TrackingBackend]) -> list[TrackingBackend]:
        if len(set(v)) != len(v):
            raise ValueError("each backend at most once")
        return v
