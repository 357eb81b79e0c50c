"""`RunConfig`: the single source of configuration for a training run.

Loaded from YAML locally (`asyncdapo up RUN.yaml`) and from the `spec.run` of a `TrainingRun`
custom resource in Kubernetes, whose OpenAPI schema is generated from this model
(`RunConfig.model_json_schema()`), so the two can never drift.

Defaults are the DAPO paper's recipe, as verl's recipe/dapo scripts set it (`config from-verl`
starts from verl's own defaults instead). Combinations no run can work with are refused when a
config is validated (`asyncdapo.contracts.config`), so that no service has to re-check them; every
mistake reads `field.path: <what was given>; <what is allowed>` (asyncdapo.contracts.config_problems). The
options of each closed field are enums in asyncdapo.contracts.config_enums.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    Field,
    ValidationError,
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
from asyncdapo.contracts.config_problems import Problem, conflict, problems_of, render
from asyncdapo.contracts.config_sections import (
    AdmissionConfig,
    AlgorithmConfig,
    DataConfig,
    LoggingConfig,
    LongTailConfig,
    ModelConfig,
    OverlongBufferConfig,
    RewardConfig,
    RolloutConfig,
    TrainerConfig,
    _Strict,
)
from asyncdapo.contracts.errors import AsyncdapoError

# what `asyncdapo.contracts.config` offers: the run config, its sections and the enums of their fields
__all__ = [
    "AdmissionConfig",
    "AdmissionPolicyName",
    "AdvEstimator",
    "AlgorithmConfig",
    "ConfigError",
    "DataConfig",
    "EarlyStopOrder",
    "FilterMetric",
    "LoggingConfig",
    "LongTailConfig",
    "LongTailPolicy",
    "LossAggMode",
    "LrSchedule",
    "MetricNames",
    "ModelConfig",
    "ModelDtype",
    "OldLogProbSource",
    "OverlongBufferConfig",
    "PauseMode",
    "PromptTruncation",
    "RewardConfig",
    "RolloutConfig",
    "RolloutMode",
    "RunConfig",
    "ShardingStrategy",
    "TrackingBackend",
    "TrainerConfig",
    "WandbMode",
    "WeightTransport",
    "dump_run_config",
    "impossible_combinations",
    "load_run_config",
    "parse_run_config",
    "run_config_json_schema",
]

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class RunConfig(_Strict):
    """One training run: everything every service needs to agree on."""

    name: str = Field("tiny-math", description="Run name: a DNS label, used in Redis keys and K8s names.")
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)

    @field_validator("name")
    @classmethod
    def _dns_label(cls, v: str) -> str:
        if len(v) > 53 or not _DNS_LABEL.match(v):
            raise ValueError("must be a DNS label: lowercase letters, digits and '-', at most 53 characters")
        return v

    @model_validator(mode="after")
    def _cross_field(self) -> RunConfig:
        problems = impossible_combinations(self)
        if problems:
            raise conflict(problems)  # every one at once, each naming its field
        return self

    # --- derived quantities (one definition for every service) ---

    def valid_group_bound(self, version: int) -> int:
        """Valid groups that may exist in total while the policy is at `version`: floor((v + 1 + s) * B)
        ((v + s + 1) * B for an integral s)."""
        # rounded first: (1 + 0.7) * 10 is 16.999999999999996 in binary floating point
        return math.floor(round((version + 1 + self.rollout.max_staleness) * self.data.train_batch_size, 6))

    @property
    def staleness_window(self) -> int:
        """ceil(s): a group produced under version v may train at step t only if t - v <= this. Every
        group the bound admits at version v trains by step v + ceil(s)."""
        return math.ceil(round(self.rollout.max_staleness, 6))

    def overlong_penalty(self, length: int) -> float:
        """DAPO overlong shaping: -min(max(length - expected, 0) / L, 1) * factor, expected = max - L."""
        buf = self.reward.overlong_buffer
        if not buf.enable:
            return 0.0
        expected = self.data.max_response_length - buf.len
        return -min(max(length - expected, 0) / buf.len, 1.0) * buf.penalty_factor

    def reward_of(self, acc: bool, length: int) -> tuple[float, float]:
        """A verifier verdict → (score, overlong penalty); the reward is their sum. score is
        reward.correct_reward or reward.incorrect_reward, the penalty `overlong_penalty(length)`."""
        r = self.reward
        return (r.correct_reward if acc else r.incorrect_reward), self.overlong_penalty(length)


class ConfigError(AsyncdapoError, ValueError):
    """A configuration could not be loaded; the message names the file and each wrong field.
    `problems` holds them as data (empty where the file itself is the problem), so that a tool can
    add to what a problem says (`asyncdapo.tools.config_cli.explain_verl_keys`)."""

    def __init__(self, message: str, problems: Sequence[Problem] = (), source: str = "") -> None:
        super().__init__(message)
        self.problems = tuple(problems)
        self.source = source

    @classmethod
    def of(cls, source: str, problems: Sequence[Problem]) -> ConfigError:
        return cls(
            render(f"{source}: invalid run config ({len(problems)} problem(s))", problems), problems, source
        )


def _with_origin(problems: list[Problem], from_override: dict[str, str]) -> list[Problem]:
    """Each problem with the override that set its field (or a section above or below it), so the
    user knows where to look."""

    def origin(field: str) -> str:
        f = re.sub(r"\[\d+\]", "", field)
        return next(
            (a for k, a in from_override.items() if f == k or f.startswith(k + ".") or k.startswith(f + ".")),
            "",
        )

    return [dataclasses.replace(p, origin=origin(p.field)) for p in problems]


def _format_errors(
    source: str, err: ValidationError, from_override: dict[str, str] | None = None
) -> ConfigError:
    return ConfigError.of(source, _with_origin(problems_of(err, RunConfig), from_override or {}))


def parse_run_config(data: Any, source: str = "<config>", overrides: Sequence[str] = ()) -> RunConfig:
    """Validate a mapping (with `key=value` overrides applied first, see asyncdapo.contracts.overrides)."""
    from asyncdapo.contracts.overrides import OverrideError, apply_overrides, override_keys

    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a run config must be a mapping, got {type(data).__name__}")
    if overrides:
        source = f"{source} with {len(overrides)} override(s)"
        try:
            data = apply_overrides(data, overrides, RunConfig)
        except OverrideError as err:
            raise ConfigError.of(source, [err.problem]) from None
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise _format_errors(source, err, override_keys(overrides)) from None


def load_run_config(path: str | Path, overrides: Sequence[str] = ()) -> RunConfig:
    """Load a YAML run config, then apply `key=value` overrides; errors name the file and the
    dotted path of every wrong field (and the override that set it)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise ConfigError(f"{path}: cannot read run config: {err.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    return parse_run_config(data, str(path), overrides)


def dump_run_config(cfg: RunConfig) -> str:
    """The resolved config as YAML (every field, defaults included): loads back to an equal config."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


def run_config_json_schema() -> dict[str, Any]:
    """JSON schema of RunConfig, the source of the TrainingRun CRD's `spec.run` schema."""
    return RunConfig.model_json_schema(mode="validation")


# The combinations of values that can never make a run (not merely unusual ones): the run would
# wait forever, never train, or be refused by the trainer. RunConfig checks them when it is
# validated, so `config check`, `asyncdapo up`, the services and the operator all refuse them.
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
    # The trainer's own start-up checks (asyncdapo.services.trainer.loop.check_config), here so that a run
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
