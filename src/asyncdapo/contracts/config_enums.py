"""The closed vocabularies of `RunConfig` (config.py): each option a field takes, as an enum that
services use end to end and metrics use as labels."""

from __future__ import annotations

from enum import StrEnum


class LossAggMode(StrEnum):
    TOKEN_MEAN = "token-mean"
    SEQ_MEAN_TOKEN_SUM = "seq-mean-token-sum"
    SEQ_MEAN_TOKEN_MEAN = "seq-mean-token-mean"
    SEQ_MEAN_TOKEN_SUM_NORM = "seq-mean-token-sum-norm"  # Dr. GRPO: token sums / data.max_response_length


class OldLogProbSource(StrEnum):
    RECOMPUTE = "recompute"  # a forward pass of the current weights before the update (verl's default)
    ROLLOUT = "rollout"  # the engine's log-prob of each sampled token (verl's bypass mode)


class LrSchedule(StrEnum):
    CONSTANT = "constant"  # linear warm-up, then lr
    COSINE = "cosine"  # linear warm-up, then cosine decay to min_lr_ratio * lr over total_steps


# What a prompt longer than data.max_prompt_length becomes (verl: data.truncation, filter_overlong_prompts).
class PromptTruncation(StrEnum):
    DROP = "drop"  # left out of training and validation (verl: filter_overlong_prompts)
    ERROR = "error"  # the run stops, naming the row (verl's default)
    LEFT = "left"  # keep the last max_prompt_length tokens
    RIGHT = "right"  # keep the first max_prompt_length tokens
    MIDDLE = "middle"  # keep the first floor(max/2) and the last ceil(max/2) tokens (as verl)


class FilterMetric(StrEnum):
    ACC = "acc"
    SCORE = "score"  # correct_reward / incorrect_reward
    REWARD = (
        "reward"  # score + overlong penalty (verl's seq_reward; seq_final_reward without KL in the reward)
    )


# What in-flight requests do while weights change: the one enum for config, engine and wire (the
# proto conversion is `asyncdapo.contracts.wire_enums`). No docstring: it would become the CRD's description.
class PauseMode(StrEnum):
    KEEP = "keep"  # freeze in-flight requests; they continue on the new weights
    ABORT = "abort"  # abort in-flight requests (they return partial tokens)
    WAIT = "wait"  # let in-flight requests finish (or abort them at the deadline)


class WeightTransport(StrEnum):
    STREAM = "stream"  # trainer -> gateways over gRPC in checksummed chunks, gateways relaying
    SNAPSHOT = "snapshot"  # a safetensors directory on a volume every gateway mounts


class RolloutMode(StrEnum):
    ASYNC = "async"
    SYNC = "sync"


class EarlyStopOrder(StrEnum):
    ANY = "any"
    FIFO = "fifo"


class LongTailPolicy(StrEnum):
    NONE = "none"
    PDSR = "pdsr"


class TrackingBackend(StrEnum):
    TENSORBOARD = "tensorboard"
    WANDB = "wandb"
    MLFLOW = "mlflow"
    JSONL = "jsonl"


class MetricNames(StrEnum):
    VERL = "verl"  # verl's name where verl logs the same quantity (docs/metrics.md), ours elsewhere
    ASYNCDAPO = "asyncdapo"  # the names of metrics.jsonl


class WandbMode(StrEnum):
    OFFLINE = "offline"
    ONLINE = "online"


class ModelDtype(StrEnum):
    AUTO = "auto"  # bfloat16 on GPU, float32 on CPU
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"


class AdvEstimator(StrEnum):
    GRPO = "grpo"  # group-relative: (score - group mean) [/ group std]


class AdmissionPolicyName(StrEnum):
    EXPECTED_VALID = "expected-valid"  # stop admitting once the expected valid groups cover the bound
    GREEDY = "greedy"  # never trims: admit whenever there is room


class ShardingStrategy(StrEnum):
    DDP = "ddp"  # every worker holds the whole model and optimizer state
    FSDP = "fsdp"  # FSDP2: parameters, gradients and optimizer state sharded over the workers
