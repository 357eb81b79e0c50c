"""Status transitions of a TrainingRun (pure: observation + time → status)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml

from asyncdapo.services.operator.desired import Lifecycle
from asyncdapo.services.operator.resource_status import ConditionType, Phase, TrainingRunStatus, parse_status
from asyncdapo.services.operator.service_progress import parse_trainer_metrics
from asyncdapo.services.operator.spec import TrainingRunSpec, parse_spec
from asyncdapo.services.operator.status_machine import (
    JobState,
    Observation,
    Progress,
    Readiness,
    lifecycle,
    next_status,
)

REPO = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _spec(**changes: object) -> TrainingRunSpec:
    raw = yaml.safe_load((REPO / "deploy" / "k8s" / "examples" / "tiny-math-cpu.yaml").read_text())["spec"]
    raw.update(changes)
    return parse_spec(raw, "tiny-math")


UP = Readiness(1, 1)


def _obs(spec: TrainingRunSpec, gen: int = 1, **kw: object) -> Observation:
    base: dict[str, object] = {
        "prepare": JobState(succeeded=True),
        "scheduler": UP,
        "gateways": UP,
        "verifier": UP,
        "redis": UP,
        "trainer": JobState(active=1),
    }
    base.update(kw)
    return Observation(gen, spec, None, **base)  # type: ignore[arg-type]


def _cond(st: TrainingRunStatus, ctype: ConditionType) -> tuple[str, str]:
    c = st.condition(ctype)
    assert c is not None, ctype
    return c.status, c.reason


def test_happy_path_prepare_pending_running_succeeded() -> None:
    spec = _spec()
    st = TrainingRunStatus()
    assert lifecycle(spec, st) is Lifecycle.PREPARING

    st = next_status(
        st, _obs(spec, prepare=JobState(active=1), scheduler=None, gateways=None, trainer=None), T0
    )
    assert st.phase is Phase.PREPARING and st.start_time == T0 and st.observed_generation == 1
    assert _cond(st, ConditionType.PREPARED) == ("False", "PrepareRunning")
    assert lifecycle(spec, st) is Lifecycle.PREPARING

    t1 = T0 + timedelta(minutes=2)
    st = next_status(st, _obs(spec, gateways=Readiness(0, 1), trainer=JobState(active=0)), t1)
    assert _cond(st, ConditionType.PREPARED) == ("True", "PrepareSucceeded")
    assert lifecycle(spec, st) is Lifecycle.RUNNING
    assert (
        st.phase is Phase.PENDING
        and st.reason == "WaitingForRollout"
        and "gateways 0/1" in (st.message or "")
    )
    assert _cond(st, ConditionType.ROLLOUT_READY) == ("False", "Waiting")
    assert st.start_time == T0  # set once

    t2 = t1 + timedelta(minutes=1)
    progress = Progress(
        step=3, policy_version=3, reward=0.25, accuracy=0.5, last_checkpoint="checkpoints/step-3"
    )
    st = next_status(st, _obs(spec, progress=progress), t2)
    assert st.phase is Phase.RUNNING and st.reason == "Running"
    assert _cond(st, ConditionType.READY) == ("True", "Running")
    assert _cond(st, ConditionType.TRAINER_RUNNING) == ("True", "TrainerRunning")
    assert (st.step, st.policy_version, st.reward, st.total_steps) == (3, 3, 0.25, 20)
    ready_since = st.condition(ConditionType.READY).last_transition_time  # type: ignore[union-attr]
    assert ready_since == t2

    # No progress sample (trainer between restarts): values are kept, transition times too.
    st = next_status(st, _obs(spec), t2 + timedelta(seconds=30))
    assert (st.step, st.reward, st.last_checkpoint) == (3, 0.25, "checkpoints/step-3")
    assert st.condition(ConditionType.READY).last_transition_time == ready_since  # type: ignore[union-attr]

    t3 = t2 + timedelta(hours=1)
    st = next_status(st, _obs(spec, trainer=JobState(succeeded=True)), t3)
    assert st.phase is Phase.SUCCEEDED and st.completion_time == t3 and st.step == 20
    assert _cond(st, ConditionType.SUCCEEDED) == ("True", "TrainingCompleted")
    assert _cond(st, ConditionType.READY)[0] == "False"
    assert lifecycle(spec, st) is Lifecycle.SUCCEEDED

    # Terminal: a later observation (pods gone) changes nothing but observedGeneration.
    later = next_status(
        st, _obs(spec, gen=2, trainer=None, scheduler=Readiness(0, 0)), t3 + timedelta(hours=1)
    )
    assert later.phase is Phase.SUCCEEDED and later.completion_time == t3 and later.observed_generation == 2


def test_trainer_failure_is_terminal_and_stops_everything() -> None:
    spec = _spec()
    st = next_status(TrainingRunStatus(), _obs(spec), T0)
    st = next_status(
        st, _obs(spec, trainer=JobState(failed=True, reason="BackoffLimitExceeded", message="3 retries")), T0
    )
    assert st.phase is Phase.FAILED and st.reason == "BackoffLimitExceeded" and st.message == "3 retries"
    assert _cond(st, ConditionType.FAILED) == ("True", "BackoffLimitExceeded")
    assert lifecycle(spec, st) is Lifecycle.FAILED
    assert lifecycle(_spec(suspend=True), st) is Lifecycle.FAILED  # terminal beats suspend


def test_prepare_failure_fails_the_run() -> None:
    st = next_status(
        TrainingRunStatus(), _obs(_spec(), prepare=JobState(failed=True, message="no space")), T0
    )
    assert st.phase is Phase.FAILED and st.reason == "PrepareFailed" and st.message == "no space"


def test_suspend_and_resume() -> None:
    spec = _spec()
    st = next_status(TrainingRunStatus(), _obs(spec), T0)
    assert st.phase is Phase.RUNNING
    suspended_spec = _spec(suspend=True)
    st = next_status(st, _obs(suspended_spec, gen=2, trainer=JobState(active=0)), T0 + timedelta(minutes=1))
    assert st.phase is Phase.SUSPENDED and st.reason == "Suspended" and st.observed_generation == 2
    assert _cond(st, ConditionType.READY) == ("False", "Suspended")
    assert _cond(st, ConditionType.TRAINER_RUNNING) == ("False", "Suspended")
    assert lifecycle(suspended_spec, st) is Lifecycle.SUSPENDED
    assert st.condition(ConditionType.PREPARED).status == "True"  # type: ignore[union-attr]  # not redone

    resumed = next_status(st, _obs(spec, gen=3), T0 + timedelta(minutes=5))
    assert resumed.phase is Phase.RUNNING and lifecycle(spec, resumed) is Lifecycle.RUNNING
    assert resumed.start_time == T0


def test_deadline_counts_from_start() -> None:
    spec = _spec(activeDeadlineSeconds=60)
    st = next_status(TrainingRunStatus(), _obs(spec), T0)
    st = next_status(st, _obs(spec), T0 + timedelta(seconds=59))
    assert st.phase is Phase.RUNNING
    st = next_status(st, _obs(spec), T0 + timedelta(seconds=60))
    assert st.phase is Phase.FAILED and st.reason == "DeadlineExceeded"
    assert lifecycle(spec, st) is Lifecycle.FAILED


def test_spec_problems_fail_without_being_terminal() -> None:
    spec = _spec()
    bad = next_status(TrainingRunStatus(), Observation(1, None, ("InvalidSpec", "spec.run.x: bad")), T0)
    assert bad.phase is Phase.FAILED and bad.reason == "InvalidSpec" and bad.completion_time is None
    assert bad.condition(ConditionType.FAILED) is None
    assert lifecycle(spec, bad) is not Lifecycle.FAILED  # fixing the spec resumes the run
    kuberay = next_status(bad, Observation(2, spec, ("KubeRayMissing", "install KubeRay")), T0)
    assert kuberay.reason == "KubeRayMissing"
    fixed = next_status(kuberay, _obs(spec, gen=3), T0 + timedelta(minutes=1))
    assert fixed.phase is Phase.RUNNING and fixed.reason == "Running"


def test_status_round_trips_through_the_api_shape() -> None:
    st = next_status(TrainingRunStatus(), _obs(_spec(), progress=Progress(step=2, reward=0.5)), T0)
    body = st.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert body["phase"] == "Running" and body["step"] == 2 and body["totalSteps"] == 20
    assert "policyVersion" not in body  # unknown values are left out, not written as null
    assert body["conditions"][0]["lastTransitionTime"].startswith("2026-01-01T00:00:00")
    again = parse_status({**body, "kopf": {"progress": {}}})  # foreign keys are ignored
    assert again == st


def test_parse_trainer_metrics() -> None:
    text = """\
# HELP asyncdapo_trainer_step Policy updates done.
# TYPE asyncdapo_trainer_step gauge
asyncdapo_trainer_step 12.0
# TYPE asyncdapo_trainer_reward_mean gauge
asyncdapo_trainer_reward_mean 0.375
# TYPE asyncdapo_trainer_acc_mean gauge
asyncdapo_trainer_acc_mean 0.5
# TYPE asyncdapo_trainer_version gauge
asyncdapo_trainer_version 12.0
# TYPE asyncdapo_trainer_checkpoint_info gauge
asyncdapo_trainer_checkpoint_info{path="checkpoints/step-10"} 10.0
asyncdapo_trainer_checkpoint_info{path="checkpoints/step-12"} 12.0
# TYPE asyncdapo_trainer_trained_groups_total counter
asyncdapo_trainer_trained_groups_total{staleness="0"} 3.0
"""
    p = parse_trainer_metrics(text)
    assert p == Progress(
        step=12, policy_version=12, reward=0.375, accuracy=0.5, last_checkpoint="checkpoints/step-12"
    )
    assert parse_trainer_metrics("") == Progress()
