"""The eligible-gateway index (pure): it holds exactly what `dispatch.reject_reason` accepts as the
gateways change, and its candidates make `pick` exact on small fleets and bounded on large ones."""

from __future__ import annotations

import random
from dataclasses import dataclass

from asyncdapo.services.scheduler.eligible import EligibleIndex
from asyncdapo.services.scheduler.policy.dispatch import DispatchPolicy, pick, reject_reason


@dataclass
class Gw:
    """A mutable gateway view (pool.Gateway's dispatch attributes)."""

    address: str
    up: bool = True
    draining: bool = False
    paused: bool = False
    pool: str = ""
    in_flight: int = 0
    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0
    capacity: int = 8
    weight_version: int = 0


POLICY = DispatchPolicy(max_in_flight=4)


def test_membership_follows_every_dispatch_input() -> None:
    gws = [Gw(f"g{i}") for i in range(6)]
    idx = EligibleIndex(POLICY)
    for g in gws:
        idx.update(g)
    assert idx.count() == 6
    gws[0].up = False
    gws[1].draining = True
    gws[2].paused = True
    gws[3].in_flight = 4  # full
    for g in gws[:4]:
        idx.update(g)
    assert {g.address for g in idx.candidates("")} == {"g4", "g5"}
    # a new weight version rebuilds: g5 reports an old one
    gws[5].weight_version = 0
    gws[4].weight_version = 1
    idx.set_policy(DispatchPolicy(max_in_flight=4, min_weight_version=1))
    assert [g.address for g in idx.candidates("")] == ["g4"]
    gws[3].in_flight, gws[3].weight_version = 3, 1  # a slot freed, and caught up
    idx.update(gws[3])
    assert [g.address for g in idx.candidates("")] == ["g3", "g4"]  # first-seen order


def test_random_changes_keep_the_index_equal_to_the_filter() -> None:
    rng = random.Random(7)
    gws = [Gw(f"g{i}", pool=rng.choice(["", "fast", "heavy"])) for i in range(200)]
    idx = EligibleIndex(POLICY, seed=1)
    for g in gws:
        idx.update(g)
    for _ in range(5000):
        g = rng.choice(gws)
        field = rng.choice(["up", "draining", "paused", "in_flight", "weight_version"])
        if field == "in_flight":
            g.in_flight = rng.randint(0, 4)
        elif field == "weight_version":
            g.weight_version = rng.randint(0, 2)
        else:
            setattr(g, field, rng.random() < 0.3)
        idx.update(g)
        if rng.random() < 0.01:
            idx.set_policy(DispatchPolicy(max_in_flight=4, min_weight_version=rng.randint(0, 2)))
    for label in ("", "fast", "heavy"):
        policy = idx.policy_for(label)
        want = {g.address for g in gws if reject_reason(g, policy) is None}
        got = {g.address for g in idx._slots(label)[1].items}
        assert got == want


def test_small_fleets_are_scored_exactly_large_ones_by_a_bounded_sample_with_affinity() -> None:
    small = [Gw(f"g{i}", in_flight=i % 3) for i in range(8)]
    idx = EligibleIndex(POLICY, seed=0)
    for g in small:
        idx.update(g)
    # exact: the same decision as scoring the whole pool
    assert pick(idx.candidates(""), POLICY, 3).addresses == pick(small, POLICY, 3).addresses
    big = [Gw(f"h{i}", in_flight=2) for i in range(512)]
    big[300].in_flight = 0  # the least loaded one
    idx = EligibleIndex(POLICY, seed=0)
    for g in big:
        idx.update(g)
    cands = idx.candidates("", affinity={"h300", "nowhere"})
    assert 16 <= len(cands) <= 17 and "h300" in {g.address for g in cands}
    # the prompt's own gateway (prefix affinity) is always among the candidates, and wins here
    assert pick(cands, POLICY, 1, frozenset({"h300"})).addresses == ["h300"]


def test_power_of_d_choices_keeps_a_large_fleet_balanced() -> None:
    """1,000 placements over 512 gateways with completions in between: the busiest gateway stays
    within a few requests of the mean (with a uniform random pick it drifts much further)."""
    rng = random.Random(3)
    gws = [Gw(f"g{i}", capacity=64) for i in range(512)]
    policy = DispatchPolicy(max_in_flight=64)
    idx = EligibleIndex(policy, seed=3)
    for g in gws:
        idx.update(g)
    busy: list[Gw] = []
    for _ in range(20_000):
        (addr,) = pick(idx.candidates(""), policy, 1).addresses
        g = gws[int(addr[1:])]
        g.in_flight += 1
        idx.update(g)
        busy.append(g)
        if len(busy) > 2048:  # a steady state of ~2,048 in flight: 4 per gateway on average
            done = busy.pop(rng.randrange(len(busy)))
            done.in_flight -= 1
            idx.update(done)
    loads = [g.in_flight for g in gws]
    assert sum(loads) == 2048 and max(loads) <= 8, max(loads)


def test_an_update_with_a_new_snapshot_replaces_the_old_one() -> None:
    """`GatewayView`s are frozen snapshots: a gateway updated with a new one must be scored by it
    (the simulator passes snapshots; with the first one kept, every prompt of a version went to
    the same gateway)."""
    from asyncdapo.services.scheduler.policy.dispatch import GatewayView

    policy = DispatchPolicy(max_in_flight=256)
    index = EligibleIndex(policy)
    for a in ("g0", "g1"):
        index.update(GatewayView(address=a))
    assert [v.in_flight for v in index.candidates("")] == [0, 0]
    index.update(GatewayView(address="g0", in_flight=8))
    views = index.candidates("")
    assert sorted((v.address, v.in_flight) for v in views) == [("g0", 8), ("g1", 0)]
    assert pick(views, index.policy_for(""), 8).addresses == ["g1"] * 8
