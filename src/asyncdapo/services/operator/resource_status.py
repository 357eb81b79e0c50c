"""The TrainingRun's status subresource: its phase, its conditions (metav1.Condition) and the
run's progress the operator reports."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import Field

from asyncdapo.services.operator.spec import K8sModel


class Phase(StrEnum):
    PENDING = "Pending"
    PREPARING = "Preparing"
    RUNNING = "Running"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class ConditionType(StrEnum):
    READY = "Ready"
    PREPARED = "Prepared"
    ROLLOUT_READY = "RolloutReady"
    TRAINER_RUNNING = "TrainerRunning"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class Condition(K8sModel):
    """metav1.Condition."""

    type: str = Field(max_length=316)
    status: Literal["True", "False", "Unknown"]
    observed_generation: int | None = Field(None, ge=0)
    last_transition_time: datetime
    reason: str = Field(min_length=1, max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
    message: str = Field("", max_length=32768)


class TrainingRunStatus(K8sModel):
    observed_generation: int | None = Field(None, ge=0)
    phase: Phase | None = None
    reason: str | None = Field(None, max_length=1024)
    message: str | None = Field(None, max_length=32768)
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=16,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    step: int | None = Field(None, ge=0, description="Policy updates done.")
    total_steps: int | None = Field(None, ge=0)
    policy_version: int | None = Field(None, ge=0, description="Version of the weights the gateways serve.")
    reward: float | None = Field(None, description="Mean reward of the last training batch.")
    accuracy: float | None = Field(None, description="Mean accuracy of the last training batch.")
    valid_groups: int | None = Field(None, ge=0, description="Valid groups produced by the scheduler.")
    last_checkpoint: str | None = Field(None, max_length=4096)
    start_time: datetime | None = None
    completion_time: datetime | None = None

    def condition(self, ctype: ConditionType) -> Condition | None:
        return next((c for c in self.conditions if c.type == ctype.value), None)

    def is_true(self, ctype: ConditionType) -> bool:
        c = self.condition(ctype)
        return c is not None and c.status == "True"


def parse_status(status: dict[str, Any] | None) -> TrainingRunStatus:
    """The stored status; fields written by other tools (e.g. kopf's bookkeeping) are ignored."""
    known = set(TrainingRunStatus.model_fields) | {
        f.alias for f in TrainingRunStatus.model_fields.values() if f.alias
    }
    return TrainingRunStatus.model_validate({k: v for k, v in (status or {}).items() if k in known})
