"""Status of a TrainingRun: pure transitions from what the operator observed.

`next_status(prev, observation, now)` is the whole state machine; `lifecycle(spec, status)` tells
the desired state which shape the children take. Invariants:
- Succeeded and Failed are terminal (a Failed caused by an invalid or unrealisable spec is not:
  fixing the spec resumes the run);
- a condition's lastTransitionTime changes only when its status changes;
- step, policy version, reward and checkpoint never go back to "unknown": a missing progress
  sample keeps the previous values (the trainer pod may be between restarts);
- startTime is set once, when the run first leaves Preparing/Pending for work (or Suspended);
  completionTime when it reaches a terminal phase.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from asyncdapo.services.operator.objects import Lifecycle
from asyncdapo.services.operator.resource_status import Condition, ConditionType, Phase, TrainingRunStatus
from asyncdapo.services.operator.spec import TrainingRunSpec

# Reasons whose Failed phase is not terminal: the user fixes the spec, the run proceeds.
SPEC_REASONS = frozenset({"InvalidSpec", "NoRedis", "KubeRayMissing"})


@dataclass(frozen=True)
class Readiness:
    ready: int
    desired: int

    @property
    def ok(self) -> bool:
        return self.ready >= self.desired


@dataclass(frozen=True)
class JobState:
    """A batch Job or RayJob as the operator saw it."""

    active: int = 0
    succeeded: bool = False
    failed: bool = False
    suspended: bool = False  # e.g. waiting for admission by Kueue
    reason: str = ""
    message: str = ""


@dataclass(frozen=True)
class Progress:
    """Training progress from the trainer's metrics and the scheduler's GetRun (None: unknown)."""

    step: int | None = None
    policy_version: int | None = None
    reward: float | None = None
    accuracy: float | None = None
    valid_groups: int | None = None
    last_checkpoint: str | None = None


@dataclass(frozen=True)
class Observation:
    generation: int
    spec: TrainingRunSpec | None  # None: the spec did not validate
    spec_error: tuple[str, str] | None = None  # (reason, message) when the spec cannot be realised
    prepare: JobState | None = None
    scheduler: Readiness | None = None
    gateways: Readiness | None = None
    verifier: Readiness | None = None  # None: an external verifier
    redis: Readiness | None = None  # None: an external Redis
    trainer: JobState | None = None
    progress: Progress = field(default_factory=Progress)


def lifecycle(spec: TrainingRunSpec, status: TrainingRunStatus) -> Lifecycle:
    """Which shape the children take, from the spec and the stored status."""
    if status.phase is Phase.SUCCEEDED:
        return Lifecycle.SUCCEEDED
    if status.phase is Phase.FAILED and status.reason not in SPEC_REASONS:
        return Lifecycle.FAILED
    if spec.suspend:
        return Lifecycle.SUSPENDED
    if spec.prepare is not None and not status.is_true(ConditionType.PREPARED):
        return Lifecycle.PREPARING
    return Lifecycle.RUNNING


def is_terminal(status: TrainingRunStatus) -> bool:
    return status.phase is Phase.SUCCEEDED or (
        status.phase is Phase.FAILED and status.reason not in SPEC_REASONS
    )


def _set_condition(
    conditions: list[Condition],
    ctype: ConditionType,
    ok: bool,
    reason: str,
    message: str,
    gen: int,
    now: datetime,
) -> list[Condition]:
    status = "True" if ok else "False"
    prev = next((c for c in conditions if c.type == ctype.value), None)
    changed = prev is None or prev.status != status
    new = Condition(
        type=ctype.value,
        status=status,
        observed_generation=gen,
        last_transition_time=now if changed or prev is None else prev.last_transition_time,
        reason=reason,
        message=message,
    )
    return [c for c in conditions if c.type != ctype.value] + [new]


def _merge_progress(prev: TrainingRunStatus, p: Progress) -> dict[str, object]:
    def keep(new: object, old: object) -> object:
        return old if new is None else new

    return {
        "step": keep(p.step, prev.step),
        "policy_version": keep(p.policy_version, prev.policy_version),
        "reward": keep(p.reward, prev.reward),
        "accuracy": keep(p.accuracy, prev.accuracy),
        "valid_groups": keep(p.valid_groups, prev.valid_groups),
        "last_checkpoint": keep(p.last_checkpoint, prev.last_checkpoint),
    }


def _rollout_readiness(obs: Observation) -> tuple[bool, str]:
    parts = [
        ("scheduler", obs.scheduler),
        ("gateways", obs.gateways),
        ("verifier", obs.verifier),
        ("redis", obs.redis),
    ]
    waiting = [f"{name} {r.ready}/{r.desired}" for name, r in parts if r is not None and not r.ok]
    if obs.scheduler is None or obs.gateways is None:
        waiting.insert(0, "rollout not created yet")
    return not waiting, ", ".join(waiting)


def next_status(prev: TrainingRunStatus, obs: Observation, now: datetime) -> TrainingRunStatus:
    """The status after observing `obs` at `now` (pure; `prev` is not modified)."""
    gen = obs.generation
    if is_terminal(prev):
        return prev.model_copy(update={"observed_generation": gen, **_merge_progress(prev, obs.progress)})

    conds = list(prev.conditions)
    upd: dict[str, object] = {"observed_generation": gen, **_merge_progress(prev, obs.progress)}

    def finish(phase: Phase, reason: str, message: str) -> TrainingRunStatus:
        nonlocal conds
        ok = phase is Phase.SUCCEEDED
        ctype = ConditionType.SUCCEEDED if ok else ConditionType.FAILED
        if reason not in SPEC_REASONS:
            conds = _set_condition(conds, ctype, True, reason, message, gen, now)
        conds = _set_condition(conds, ConditionType.READY, False, reason, message, gen, now)
        conds = _set_condition(conds, ConditionType.TRAINER_RUNNING, False, reason, message, gen, now)
        extra: dict[str, object] = {}
        if reason not in SPEC_REASONS:
            extra["completion_time"] = now
        if ok and obs.spec is not None:
            step = upd["step"]
            assert step is None or isinstance(step, int), "Progress.step is an int"
            extra["step"] = max(step or 0, obs.spec.run.trainer.total_steps)
        return prev.model_copy(
            update={**upd, **extra, "phase": phase, "reason": reason, "message": message, "conditions": conds}
        )

    spec = obs.spec
    if spec is None or obs.spec_error is not None:
        reason, message = obs.spec_error or ("InvalidSpec", "the spec does not validate")
        return finish(Phase.FAILED, reason, message)
    upd["total_steps"] = spec.run.trainer.total_steps

    # Deadline: wall clock from startTime.
    start = prev.start_time
    deadline = spec.active_deadline_seconds
    if start is not None and deadline is not None and now - start >= timedelta(seconds=deadline):
        return finish(Phase.FAILED, "DeadlineExceeded", f"the run exceeded activeDeadlineSeconds={deadline}")

    # Prepare Job (once; Prepared stays True after success).
    prepared = spec.prepare is None or prev.is_true(ConditionType.PREPARED)
    if spec.prepare is not None and not prepared:
        p = obs.prepare or JobState()
        if p.failed:
            return finish(Phase.FAILED, "PrepareFailed", p.message or "the prepare Job failed")
        prepared = p.succeeded
        conds = _set_condition(
            conds,
            ConditionType.PREPARED,
            prepared,
            "PrepareSucceeded" if prepared else "PrepareRunning",
            "" if prepared else "the prepare Job is running",
            gen,
            now,
        )

    t = obs.trainer
    if t is not None and t.succeeded:
        return finish(Phase.SUCCEEDED, "TrainingCompleted", "the trainer finished run.trainer.total_steps")
    if t is not None and t.failed:
        return finish(Phase.FAILED, t.reason or "TrainerFailed", t.message or "the trainer Job failed")

    if spec.suspend:
        msg = "spec.suspend is true: rollout scaled to zero, trainer suspended"
        conds = _set_condition(conds, ConditionType.READY, False, "Suspended", msg, gen, now)
        conds = _set_condition(conds, ConditionType.ROLLOUT_READY, False, "Suspended", msg, gen, now)
        conds = _set_condition(conds, ConditionType.TRAINER_RUNNING, False, "Suspended", msg, gen, now)
        return prev.model_copy(
            update={
                **upd,
                "phase": Phase.SUSPENDED,
                "reason": "Suspended",
                "message": msg,
                "conditions": conds,
            }
        )

    if start is None:
        upd["start_time"] = now
    if not prepared:
        msg = "waiting for the prepare Job"
        conds = _set_condition(conds, ConditionType.READY, False, "Preparing", msg, gen, now)
        return prev.model_copy(
            update={
                **upd,
                "phase": Phase.PREPARING,
                "reason": "Preparing",
                "message": msg,
                "conditions": conds,
            }
        )

    rollout_ok, waiting = _rollout_readiness(obs)
    conds = _set_condition(
        conds,
        ConditionType.ROLLOUT_READY,
        rollout_ok,
        "RolloutReady" if rollout_ok else "Waiting",
        waiting,
        gen,
        now,
    )
    trainer_ok = t is not None and t.active > 0
    if trainer_ok:
        trainer_reason, trainer_msg = "TrainerRunning", ""
    elif t is not None and t.suspended:
        trainer_reason, trainer_msg = (
            "TrainerQueued",
            "the trainer is suspended: waiting for admission (Kueue)",
        )
    else:
        trainer_reason = "TrainerPending"
        trainer_msg = (t.message if t is not None and t.message else "") or "no active trainer pod yet"
    conds = _set_condition(
        conds, ConditionType.TRAINER_RUNNING, trainer_ok, trainer_reason, trainer_msg, gen, now
    )
    running = rollout_ok and trainer_ok
    reason = "Running" if running else ("WaitingForRollout" if not rollout_ok else "WaitingForTrainer")
    message = "" if running else (waiting or trainer_msg)
    conds = _set_condition(conds, ConditionType.READY, running, reason, message, gen, now)
    return prev.model_copy(
        update={
            **upd,
            "phase": Phase.RUNNING if running else Phase.PENDING,
            "reason": reason,
            "message": message,
            "conditions": conds,
        }
    )


@dataclass(frozen=True)
class PhaseEvent:
    """A Kubernetes Event to post on the TrainingRun: `type` Normal or Warning."""

    type: str
    reason: str
    message: str


def phase_event(prev: TrainingRunStatus, new: TrainingRunStatus) -> PhaseEvent | None:
    """The Event a status change deserves: one per phase change (and per new reason of a Failed
    run, e.g. a spec fixed into another error); Warning for Failed, Normal otherwise."""
    if new.phase is None:
        return None
    failed = new.phase is Phase.FAILED
    if new.phase is prev.phase and not (failed and new.reason != prev.reason):
        return None
    was = prev.phase.value if prev.phase is not None else "new"
    detail = f": {new.message}" if new.message else ""
    return PhaseEvent(
        type="Warning" if failed else "Normal",
        reason=new.reason or new.phase.value,
        message=f"{was} -> {new.phase.value}{detail}"[:1024],
    )
