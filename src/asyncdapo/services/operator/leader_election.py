"""**Pure** leader election on a `coordination.k8s.io/v1` Lease: what one operator replica does next,
given the Lease it read, what it knows of itself and the time. No I/O (lease_elector.py does it).

Semantics (those of client-go's leaderelection, with its default periods):

- a replica leads while the Lease names it (`holderIdentity`) and it keeps renewing it;
- another replica takes an unreleased Lease over only when the Lease has not changed for
  `leaseDurationSeconds` *as measured on its own clock* since it first saw that version (clocks of
  different nodes are never compared: `renewTime` is written for people and tools, not trusted);
- every write carries the `resourceVersion` read: of two replicas writing the same version, the API
  server accepts one and answers 409 Conflict to the other, which stands by;
- a leader that has not renewed within `renew_deadline_s` (measured from the *start* of its last
  successful write) steps down; that deadline is shorter than the lease duration, so it steps down
  before any standby can consider the Lease expired: there are never two leaders;
- a leader that stops gracefully releases the Lease (holder cleared), and a standby takes it over at
  its next retry instead of waiting for it to expire.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from asyncdapo.contracts.errors import AsyncdapoError

# client-go's defaults (k8s.io/client-go/tools/leaderelection, as kube-controller-manager uses them):
# a leader that loses the API server steps down after 10 s, a standby takes over 15 s after the last
# renewal it saw, and everyone retries every 2 s. The 5 s between the two leave room for a renewal
# in flight and the 2 s granularity of the loops, so a standby never takes over a live leader.
LEASE_DURATION_S = 15.0
RENEW_DEADLINE_S = 10.0
RETRY_PERIOD_S = 2.0
# The `leaseDurationSeconds` a graceful release writes (client-go writes 1 as well): the Lease names
# nobody, so standbys take it over at once anyway; the short duration tells tools it is free.
RELEASED_LEASE_DURATION_S = 1


class LeaderElectionError(AsyncdapoError):
    """Leader-election periods that cannot keep a single leader."""


@dataclass(frozen=True)
class Timing:
    """The election's periods, in seconds (tests shorten them; production uses the defaults)."""

    lease_duration_s: float = LEASE_DURATION_S
    renew_deadline_s: float = RENEW_DEADLINE_S
    retry_period_s: float = RETRY_PERIOD_S

    def __post_init__(self) -> None:
        if not 0 < self.retry_period_s < self.renew_deadline_s < self.lease_duration_s:
            raise LeaderElectionError(
                f"leader-election periods: retry {self.retry_period_s}s, renew deadline "
                f"{self.renew_deadline_s}s, lease duration {self.lease_duration_s}s; they must satisfy "
                "0 < retry < renew deadline < lease duration, or a standby may take over a live leader"
            )

    @property
    def lease_duration_field(self) -> int:
        """`spec.leaseDurationSeconds` (an integer in the API) for `lease_duration_s`."""
        return max(1, math.ceil(self.lease_duration_s))


@dataclass(frozen=True)
class LeaseRef:
    namespace: str
    name: str


@dataclass(frozen=True)
class ObservedLease:
    """The fields of a Lease the election reads (timestamps kept as the API wrote them)."""

    holder: str  # "" when nobody holds it (released)
    lease_duration_s: int | None
    transitions: int
    resource_version: str
    acquire_time: str | None = None
    renew_time: str | None = None

    @classmethod
    def from_manifest(cls, obj: dict[str, Any]) -> ObservedLease:
        spec = obj.get("spec") or {}
        return cls(
            holder=spec.get("holderIdentity") or "",
            lease_duration_s=spec.get("leaseDurationSeconds"),
            transitions=int(spec.get("leaseTransitions") or 0),
            resource_version=str(obj["metadata"]["resourceVersion"]),
            acquire_time=spec.get("acquireTime"),
            renew_time=spec.get("renewTime"),
        )


@dataclass(frozen=True)
class Candidate:
    """What one replica knows: its identity, when it last renewed (None: it does not lead), and
    which version of the Lease it saw first when (its own clock; expiry is measured from there)."""

    identity: str
    lease: LeaseRef
    renewed_at: float | None = None
    seen_version: str | None = None
    seen_at: float | None = None

    @property
    def leading(self) -> bool:
        return self.renewed_at is not None


class Decision(StrEnum):
    ACQUIRE = "acquire"  # no Lease yet: create it naming this replica
    RENEW = "renew"  # the Lease names this replica: write a new renewTime
    STANDBY = "standby"  # another replica holds a live Lease: wait
    TAKE_OVER_EXPIRED = "take_over_expired"  # its holder stopped renewing: take it, transitions + 1
    TAKE_OVER_RELEASED = "take_over_released"  # its holder released it: take it, transitions + 1
    STEP_DOWN = "step_down"  # this replica led but may no longer: stop everything a leader does


class Transition(StrEnum):
    """Why this replica started or stopped leading (the metric's `reason` label)."""

    ACQUIRED = "acquired"  # created the Lease, or it already named this replica
    TOOK_OVER_EXPIRED = "took_over_expired"
    TOOK_OVER_RELEASED = "took_over_released"
    RENEW_DEADLINE_PASSED = "renew_deadline_passed"  # could not renew in time (API unreachable, slow)
    LEASE_LOST = "lease_lost"  # the Lease names another replica or nobody
    RELEASED = "released"  # graceful shutdown

    @property
    def leads(self) -> bool:
        """True when this replica leads after the transition."""
        return self in (Transition.ACQUIRED, Transition.TOOK_OVER_EXPIRED, Transition.TOOK_OVER_RELEASED)


_GAINS = {
    Decision.ACQUIRE: Transition.ACQUIRED,
    Decision.RENEW: Transition.ACQUIRED,
    Decision.TAKE_OVER_EXPIRED: Transition.TOOK_OVER_EXPIRED,
    Decision.TAKE_OVER_RELEASED: Transition.TOOK_OVER_RELEASED,
}


class WriteResult(StrEnum):
    WRITTEN = "written"
    CONFLICT = "conflict"  # 409: another replica wrote the version read (or created the Lease) first
    FAILED = "failed"  # any other error or a timeout: nothing is known to have changed


@dataclass(frozen=True)
class Step:
    decision: Decision
    # the Lease to create (ACQUIRE) or to replace (with the resourceVersion read); None: write nothing
    body: dict[str, Any] | None = None
    # set for STEP_DOWN: why
    transition: Transition | None = None

    @property
    def creates(self) -> bool:
        return self.decision is Decision.ACQUIRE


def micro_time(stamp: datetime) -> str:
    """A Lease's MicroTime (RFC 3339, microseconds, UTC)."""
    return stamp.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease_body(
    ref: LeaseRef,
    *,
    holder: str | None,
    duration_s: int,
    transitions: int,
    acquire_time: str | None,
    renew_time: str,
    resource_version: str | None,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": ref.name, "namespace": ref.namespace}
    if resource_version is not None:
        metadata["resourceVersion"] = resource_version  # optimistic concurrency: 409 if it moved on
    spec: dict[str, Any] = {
        "leaseDurationSeconds": duration_s,
        "leaseTransitions": transitions,
        "renewTime": renew_time,
    }
    if holder:
        spec["holderIdentity"] = holder
    if acquire_time is not None:
        spec["acquireTime"] = acquire_time
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": spec}


def observe(me: Candidate, lease: ObservedLease | None, now: float) -> Candidate:
    """Note when this replica first saw the Lease's current version (expiry counts from there)."""
    if lease is None:
        return replace(me, seen_version=None, seen_at=None)
    if lease.resource_version != me.seen_version:
        return replace(me, seen_version=lease.resource_version, seen_at=now)
    return me


def renew_overdue(me: Candidate, now: float, timing: Timing) -> bool:
    """True when this replica leads but has not renewed within the renew deadline."""
    return me.renewed_at is not None and now - me.renewed_at >= timing.renew_deadline_s


def expired(me: Candidate, lease: ObservedLease, now: float, timing: Timing) -> bool:
    """The Lease has not changed for its duration, by this replica's clock, since it first saw it."""
    duration = lease.lease_duration_s or timing.lease_duration_s
    seen_at = now if me.seen_at is None or me.seen_version != lease.resource_version else me.seen_at
    return now - seen_at >= duration


def decide(me: Candidate, lease: ObservedLease | None, now: float, stamp: datetime, timing: Timing) -> Step:
    """What this replica does with the Lease it has just read (after `observe`); `now` is its
    monotonic clock, `stamp` the wall-clock time written into the Lease."""
    if renew_overdue(me, now, timing):
        return Step(Decision.STEP_DOWN, transition=Transition.RENEW_DEADLINE_PASSED)
    written = micro_time(stamp)
    duration = timing.lease_duration_field
    if lease is None:
        # nobody created it yet (or it was deleted): create it; of two creators one gets a 409
        body = lease_body(
            me.lease,
            holder=me.identity,
            duration_s=duration,
            transitions=0,
            acquire_time=written,
            renew_time=written,
            resource_version=None,
        )
        return Step(Decision.ACQUIRE, body)
    if lease.holder == me.identity:
        body = lease_body(
            me.lease,
            holder=me.identity,
            duration_s=duration,
            transitions=lease.transitions,
            acquire_time=lease.acquire_time or written,
            renew_time=written,
            resource_version=lease.resource_version,
        )
        return Step(Decision.RENEW, body)
    if me.leading:
        # Someone else wrote the Lease: a leader never argues, it stops.
        return Step(Decision.STEP_DOWN, transition=Transition.LEASE_LOST)
    if lease.holder and not expired(me, lease, now, timing):
        return Step(Decision.STANDBY)
    take_over = Decision.TAKE_OVER_EXPIRED if lease.holder else Decision.TAKE_OVER_RELEASED
    body = lease_body(
        me.lease,
        holder=me.identity,
        duration_s=duration,
        transitions=lease.transitions + 1,
        acquire_time=written,
        renew_time=written,
        resource_version=lease.resource_version,
    )
    return Step(take_over, body)


def after_write(
    me: Candidate, step: Step, result: WriteResult, started: float, written: ObservedLease | None, now: float
) -> tuple[Candidate, Transition | None]:
    """This replica's state after writing `step.body`, and the transition (if it started leading).

    A successful write counts as a renewal from the moment the request *started* (`started`): a
    standby's expiry counts from when it saw the result, which is later, so the leader's deadline
    always comes first. A conflict or failure changes nothing: a standby stays one, a leader keeps
    its old deadline (the next read shows who holds the Lease).
    """
    if result is not WriteResult.WRITTEN or step.body is None:
        return me, None
    gained = None if me.leading else _GAINS.get(step.decision)
    seen_version = written.resource_version if written is not None else me.seen_version
    return replace(me, renewed_at=started, seen_version=seen_version, seen_at=now), gained


def stepped_down(me: Candidate) -> Candidate:
    return replace(me, renewed_at=None)


def release_body(me: Candidate, lease: ObservedLease | None, stamp: datetime) -> dict[str, Any] | None:
    """The Lease a leader writes on a graceful stop: holder cleared (standbys take it at once),
    transitions kept; None when the Lease (as last seen) does not name this replica."""
    if not me.leading or lease is None or lease.holder != me.identity:
        return None
    written = micro_time(stamp)
    return lease_body(
        me.lease,
        holder=None,
        duration_s=RELEASED_LEASE_DURATION_S,
        transitions=lease.transitions,
        acquire_time=written,
        renew_time=written,
        resource_version=lease.resource_version,
    )
