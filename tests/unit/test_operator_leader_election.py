"""The operator replicas' leader election as pure decisions (leader_election.py): every branch on a
fake clock (`now` in seconds), the Lease bodies a replica would write, and the periods' rules."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone

import pytest

from asyncdapo.services.operator.leader_election import (
    LEASE_DURATION_S,
    RENEW_DEADLINE_S,
    RETRY_PERIOD_S,
    Candidate,
    Decision,
    LeaderElectionError,
    LeaseRef,
    ObservedLease,
    Step,
    Timing,
    Transition,
    WriteResult,
    after_write,
    decide,
    micro_time,
    observe,
    release_body,
    stepped_down,
)

REF = LeaseRef("asyncdapo", "asyncdapo-operator")
T = Timing()
STAMP = datetime(2025, 5, 1, 12, 0, 0, 250000, tzinfo=UTC)
WRITTEN = "2025-05-01T12:00:00.250000Z"


def lease(holder: str, rv: str = "7", transitions: int = 2, duration: int | None = 15) -> ObservedLease:
    return ObservedLease.from_manifest(
        {
            "metadata": {"name": REF.name, "namespace": REF.namespace, "resourceVersion": rv},
            "spec": {
                "holderIdentity": holder or None,
                "leaseDurationSeconds": duration,
                "leaseTransitions": transitions,
                "acquireTime": "2025-05-01T11:00:00.000000Z",
                "renewTime": "2025-05-01T11:59:58.000000Z",
            },
        }
    )


def test_the_default_periods_are_client_gos() -> None:
    assert (LEASE_DURATION_S, RENEW_DEADLINE_S, RETRY_PERIOD_S) == (15.0, 10.0, 2.0)
    assert T.lease_duration_field == 15


@pytest.mark.parametrize(
    "periods", [(15.0, 15.0, 2.0), (15.0, 10.0, 10.0), (10.0, 15.0, 2.0), (15.0, 10.0, 0.0)]
)
def test_periods_that_could_make_two_leaders_are_refused(periods: tuple[float, float, float]) -> None:
    with pytest.raises(LeaderElectionError, match="retry < renew deadline < lease duration"):
        Timing(*periods)


def test_no_lease_yet_creates_one_naming_this_replica() -> None:
    me = observe(Candidate("a", REF), None, 100.0)
    step = decide(me, None, 100.0, STAMP, T)
    assert step.decision is Decision.ACQUIRE and step.creates
    assert step.body == {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "asyncdapo-operator", "namespace": "asyncdapo"},  # no resourceVersion: create
        "spec": {
            "holderIdentity": "a",
            "leaseDurationSeconds": 15,
            "leaseTransitions": 0,
            "acquireTime": WRITTEN,
            "renewTime": WRITTEN,
        },
    }
    after, gained = after_write(
        me, step, WriteResult.WRITTEN, 100.0, lease("a", rv="1", transitions=0), 100.1
    )
    assert gained is Transition.ACQUIRED and after.leading and after.renewed_at == 100.0


def test_own_lease_is_renewed_keeping_acquire_time_and_transitions() -> None:
    me = replace(observe(Candidate("a", REF), lease("a"), 100.0), renewed_at=99.0)
    step = decide(me, lease("a"), 101.0, STAMP, T)
    assert step.decision is Decision.RENEW and not step.creates
    assert step.body is not None
    assert step.body["metadata"]["resourceVersion"] == "7"  # optimistic concurrency
    assert step.body["spec"] == {
        "holderIdentity": "a",
        "leaseDurationSeconds": 15,
        "leaseTransitions": 2,
        "acquireTime": "2025-05-01T11:00:00.000000Z",
        "renewTime": WRITTEN,
    }
    after, gained = after_write(me, step, WriteResult.WRITTEN, 101.0, lease("a", rv="8"), 101.2)
    assert gained is None  # already leading: a renewal is no transition
    assert after.renewed_at == 101.0 and after.seen_version == "8"


def test_a_foreign_live_lease_means_standby_until_it_has_not_changed_for_its_duration() -> None:
    me = observe(Candidate("b", REF), lease("a"), 100.0)
    for now in (100.0, 107.0, 114.9):
        assert decide(observe(me, lease("a"), now), lease("a"), now, STAMP, T) == Step(Decision.STANDBY)
    # a renewal (new resourceVersion) restarts the count: only this replica's own clock is trusted
    me = observe(observe(me, lease("a"), 114.9), lease("a", rv="8"), 114.9)
    assert decide(me, lease("a", rv="8"), 129.0, STAMP, T).decision is Decision.STANDBY


def test_a_foreign_expired_lease_is_taken_over_with_one_more_transition() -> None:
    me = observe(Candidate("b", REF), lease("a"), 100.0)
    step = decide(observe(me, lease("a"), 115.0), lease("a"), 115.0, STAMP, T)
    assert step.decision is Decision.TAKE_OVER_EXPIRED
    assert step.body is not None
    assert step.body["metadata"]["resourceVersion"] == "7"
    assert step.body["spec"] == {
        "holderIdentity": "b",
        "leaseDurationSeconds": 15,
        "leaseTransitions": 3,
        "acquireTime": WRITTEN,
        "renewTime": WRITTEN,
    }
    after, gained = after_write(
        me, step, WriteResult.WRITTEN, 115.0, lease("b", rv="8", transitions=3), 115.1
    )
    assert gained is Transition.TOOK_OVER_EXPIRED and after.leading


def test_the_lease_advertises_its_duration_to_the_standbys() -> None:
    me = observe(Candidate("b", REF), lease("a", duration=30), 100.0)
    assert decide(me, lease("a", duration=30), 120.0, STAMP, T).decision is Decision.STANDBY
    assert decide(me, lease("a", duration=30), 130.0, STAMP, T).decision is Decision.TAKE_OVER_EXPIRED


def test_a_released_lease_is_taken_over_at_once() -> None:
    released = lease("", duration=1)
    me = observe(Candidate("b", REF), released, 100.0)
    step = decide(me, released, 100.0, STAMP, T)
    assert step.decision is Decision.TAKE_OVER_RELEASED
    assert step.body is not None and step.body["spec"]["leaseTransitions"] == 3
    _, gained = after_write(me, step, WriteResult.WRITTEN, 100.0, lease("b", rv="8"), 100.1)
    assert gained is Transition.TOOK_OVER_RELEASED


@pytest.mark.parametrize("result", [WriteResult.CONFLICT, WriteResult.FAILED])
def test_a_lost_race_or_failed_write_leaves_a_standby_standing_by(result: WriteResult) -> None:
    me = observe(Candidate("b", REF), None, 100.0)
    step = decide(me, None, 100.0, STAMP, T)
    after, gained = after_write(me, step, result, 100.0, None, 100.1)
    assert gained is None and not after.leading and after == me


def test_a_leader_whose_renewal_conflicts_keeps_its_deadline_and_sees_the_new_holder_next() -> None:
    me = replace(observe(Candidate("a", REF), lease("a"), 100.0), renewed_at=100.0)
    step = decide(me, lease("a"), 102.0, STAMP, T)
    after, gained = after_write(me, step, WriteResult.CONFLICT, 102.0, None, 102.1)
    assert gained is None and after.renewed_at == 100.0  # no renewal counted
    taken = lease("b", rv="9", transitions=3)
    step = decide(observe(after, taken, 104.0), taken, 104.0, STAMP, T)
    assert step == Step(Decision.STEP_DOWN, transition=Transition.LEASE_LOST)


def test_a_leader_that_finds_the_lease_released_by_someone_else_steps_down() -> None:
    me = replace(observe(Candidate("a", REF), lease(""), 100.0), renewed_at=100.0)
    assert decide(me, lease(""), 101.0, STAMP, T).transition is Transition.LEASE_LOST


def test_a_leader_past_its_renew_deadline_steps_down_whatever_the_lease_says() -> None:
    me = replace(observe(Candidate("a", REF), lease("a"), 100.0), renewed_at=100.0)
    assert decide(me, lease("a"), 109.9, STAMP, T).decision is Decision.RENEW
    for observed in (lease("a"), None):
        step = decide(me, observed, 110.0, STAMP, T)
        assert step == Step(Decision.STEP_DOWN, transition=Transition.RENEW_DEADLINE_PASSED)
    assert not stepped_down(me).leading


def test_the_leader_steps_down_before_any_standby_may_take_over() -> None:
    """The deadline runs from the start of the leader's write; a standby's expiry from when it saw
    the result, which is later: the leader has stopped before the standby takes over."""
    a = replace(Candidate("a", REF), renewed_at=None)
    step = decide(observe(a, lease("a"), 0.0), lease("a"), 0.0, STAMP, T)
    a, _ = after_write(a, step, WriteResult.WRITTEN, 0.0, lease("a", rv="8"), 0.3)
    b = observe(Candidate("b", REF), lease("a", rv="8"), 0.3)  # b sees the renewal after it landed
    stop = next(t / 10 for t in range(1000) if decide(a, lease("a", rv="8"), t / 10, STAMP, T).transition)
    take = next(
        t / 10
        for t in range(1000)
        if decide(b, lease("a", rv="8"), t / 10, STAMP, T).decision is not Decision.STANDBY
    )
    assert stop == RENEW_DEADLINE_S and take == pytest.approx(0.3 + LEASE_DURATION_S)
    assert take - stop >= LEASE_DURATION_S - RENEW_DEADLINE_S


def test_a_graceful_stop_clears_the_holder_and_keeps_the_transitions() -> None:
    me = replace(observe(Candidate("a", REF), lease("a"), 100.0), renewed_at=100.0)
    body = release_body(me, lease("a"), STAMP)
    assert body is not None
    assert body["metadata"]["resourceVersion"] == "7"
    assert body["spec"] == {
        "leaseDurationSeconds": 1,
        "leaseTransitions": 2,
        "acquireTime": WRITTEN,
        "renewTime": WRITTEN,
    }  # no holderIdentity: the next standby's read takes it over (test above)
    assert release_body(me, lease("b"), STAMP) is None  # not ours (any more): nothing to release
    assert release_body(stepped_down(me), lease("a"), STAMP) is None


def test_micro_time_is_utc_with_microseconds() -> None:
    cest = STAMP.astimezone(timezone(timedelta(hours=2)))
    assert micro_time(cest) == WRITTEN
