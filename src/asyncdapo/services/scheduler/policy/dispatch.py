"""Dispatch decisions, pure: filter → score → pick.

No I/O here: the pool turns live gateway state into `GatewayView`s, the rollout loop asks `pick`
where each request goes and does the RPC itself. Invariants:
- a gateway that is down, draining, paused, in another pool, serving stale weights or at its
  concurrency limit is never picked, and `filter_gateways` says why for each one it rejects;
- among the rest the lowest score wins; ties go to the first gateway in `views` order, so a
  decision is a function of its inputs only (reproducible in tests and in the simulator).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, TypeVar


class RejectReason(StrEnum):
    DOWN = "down"
    DRAINING = "draining"
    PAUSED = "paused"
    POOL = "pool"
    STALE_WEIGHTS = "stale_weights"
    FULL = "full"


class DispatchView(Protocol):
    """What dispatch reads of one gateway: a `GatewayView` snapshot, or the pool's live
    `gateway_pool.Gateway`, which keeps these attributes current."""

    @property
    def address(self) -> str: ...
    @property
    def up(self) -> bool: ...
    @property
    def draining(self) -> bool: ...
    @property
    def paused(self) -> bool: ...
    @property
    def pool(self) -> str: ...
    @property
    def in_flight(self) -> int: ...
    @property
    def running(self) -> int: ...
    @property
    def waiting(self) -> int: ...
    @property
    def kv_cache_usage(self) -> float: ...
    @property
    def capacity(self) -> int: ...
    @property
    def weight_version(self) -> int: ...


V = TypeVar("V", bound=DispatchView)


@dataclass(slots=True)
class GatewayView:
    """What the dispatcher knows about one gateway at decision time. Read-only by convention (the
    simulator builds one per gateway update)."""

    address: str
    up: bool = True
    draining: bool = False
    paused: bool = False
    pool: str = ""
    in_flight: int = 0  # requests this scheduler has in flight there (exact)
    running: int = 0  # last reported by the gateway (lags by one WatchLoad interval)
    waiting: int = 0
    kv_cache_usage: float = 0.0
    capacity: int = 0  # the gateway's configured concurrency (0: unknown)
    weight_version: int = 0


@dataclass(frozen=True, slots=True)
class DispatchPolicy:
    max_in_flight: int  # cfg.rollout.max_concurrent_per_gateway
    pool: str = ""  # "" accepts every pool
    min_weight_version: int = 0  # gateways reporting an older version are skipped
    kv_weight: float = 0.5  # score units per unit of KV-cache usage
    affinity_bonus: float = 0.1  # score units saved by landing next to the same prompt


def reject_reason(view: DispatchView, policy: DispatchPolicy) -> RejectReason | None:
    if not view.up:
        return RejectReason.DOWN
    if view.draining:
        return RejectReason.DRAINING
    if view.paused:
        return RejectReason.PAUSED
    if policy.pool and view.pool and view.pool != policy.pool:
        return RejectReason.POOL
    if view.weight_version < policy.min_weight_version:
        return RejectReason.STALE_WEIGHTS
    if view.in_flight >= policy.max_in_flight:
        return RejectReason.FULL
    return None


def filter_gateways(views: Iterable[V], policy: DispatchPolicy) -> tuple[list[V], dict[str, RejectReason]]:
    """The eligible gateways, and the reason each other one was rejected."""
    eligible: list[V] = []
    rejected: dict[str, RejectReason] = {}
    for v in views:
        reason = reject_reason(v, policy)
        if reason is None:
            eligible.append(v)
        else:
            rejected[v.address] = reason
    return eligible, rejected


def load_score(view: DispatchView, policy: DispatchPolicy, extra_in_flight: int = 0) -> float:
    """Lower is better. Our own in-flight count is exact and current; the gateway's reported
    running + waiting also covers other clients but lags, so the larger of the two is used.
    Normalised by capacity so gateways of different sizes compare fairly."""
    busy = max(view.in_flight + extra_in_flight, view.running + view.waiting + extra_in_flight)
    scale = view.capacity if view.capacity > 0 else policy.max_in_flight
    return busy / scale + policy.kv_weight * view.kv_cache_usage


def score(view: DispatchView, policy: DispatchPolicy, affinity: bool, extra_in_flight: int = 0) -> float:
    s = load_score(view, policy, extra_in_flight)
    return s - policy.affinity_bonus if affinity else s


@dataclass(slots=True)
class Decision:
    """Read-only by convention: one per dispatched prompt."""

    addresses: list[str]  # one per placed request, in order; shorter than asked when capacity ran out
    rejected: dict[str, RejectReason]


def pick(
    views: Sequence[DispatchView],
    policy: DispatchPolicy,
    count: int = 1,
    affinity: frozenset[str] = frozenset(),
) -> Decision:
    """Place `count` requests of one prompt. Each placement adds one in-flight request to the
    chosen gateway before the next is scored, so a prompt's n requests spread by load, and the
    affinity bonus (gateways already serving this prompt share its prefix cache) applies to
    gateways in `affinity` and to the ones chosen earlier in this call."""
    rejected: dict[str, RejectReason] = {}
    heap: list[tuple[float, int, int]] = []
    for i, v in enumerate(views):  # filter and score in one pass: this runs once per prompt
        reason = reject_reason(v, policy)
        if reason is None:
            heap.append((score(v, policy, v.address in affinity), i, 0))
        else:
            rejected[v.address] = reason
    heapq.heapify(heap)
    chosen: list[str] = []
    while heap and len(chosen) < count:
        _, i, extra = heapq.heappop(heap)
        v = views[i]
        chosen.append(v.address)
        extra += 1
        if v.in_flight + extra < policy.max_in_flight:
            heapq.heappush(heap, (score(v, policy, True, extra), i, extra))
        else:
            rejected[v.address] = RejectReason.FULL
    return Decision(chosen, rejected)
