"""Dispatch pipeline: filter (with reasons) → score → pick."""

from __future__ import annotations

from asyncdapo.services.scheduler.policy.dispatch import (
    DispatchPolicy,
    GatewayView,
    RejectReason,
    filter_gateways,
    pick,
    score,
)

POLICY = DispatchPolicy(max_in_flight=4, pool="fast", min_weight_version=2)


def gw(addr: str, **kw: object) -> GatewayView:
    base = {"pool": "fast", "weight_version": 2, "capacity": 4}
    base.update(kw)
    return GatewayView(addr, **base)  # type: ignore[arg-type]


def test_each_filter_says_why() -> None:
    views = [
        gw("down", up=False),
        gw("drain", draining=True),
        gw("paused", paused=True),
        gw("heavy", pool="heavy"),
        gw("old", weight_version=1),
        gw("full", in_flight=4),
        gw("ok"),
    ]
    eligible, rejected = filter_gateways(views, POLICY)
    assert [v.address for v in eligible] == ["ok"]
    assert rejected == {
        "down": RejectReason.DOWN,
        "drain": RejectReason.DRAINING,
        "paused": RejectReason.PAUSED,
        "heavy": RejectReason.POOL,
        "old": RejectReason.STALE_WEIGHTS,
        "full": RejectReason.FULL,
    }


def test_empty_pool_label_accepts_every_pool() -> None:
    eligible, _ = filter_gateways([gw("a", pool="heavy"), gw("b", pool="")], DispatchPolicy(max_in_flight=4))
    assert len(eligible) == 2


def test_least_loaded_wins_and_lagging_reports_do_not_hide_our_load() -> None:
    # "a" reports idle (stale report) but we have 3 in flight there: our count wins
    views = [gw("a", in_flight=3, running=0), gw("b", in_flight=1, running=1, waiting=1)]
    assert pick(views, POLICY).addresses == ["b"]
    # KV pressure breaks a tie in busy-ness
    views = [gw("a", in_flight=1, kv_cache_usage=0.9), gw("b", in_flight=1, kv_cache_usage=0.1)]
    assert pick(views, POLICY).addresses == ["b"]


def test_affinity_bonus_prefers_the_gateway_serving_the_prompt_when_loads_are_close() -> None:
    views = [gw("a", in_flight=1), gw("b", in_flight=1)]
    assert pick(views, POLICY, affinity=frozenset({"b"})).addresses == ["b"]
    # but not when it is much busier
    views = [gw("a", in_flight=0), gw("b", in_flight=3)]
    assert pick(views, POLICY, affinity=frozenset({"b"})).addresses == ["a"]


def test_pick_many_spreads_by_load_and_stops_at_capacity() -> None:
    views = [gw("a", in_flight=2), gw("b", in_flight=0), gw("c", up=False)]
    d = pick(views, POLICY, count=8)
    # a has 2 free slots, b has 4: six placements in total, never over max_in_flight
    assert sorted(d.addresses) == ["a", "a", "b", "b", "b", "b"]
    assert d.rejected["a"] is RejectReason.FULL and d.rejected["c"] is RejectReason.DOWN


def test_deterministic_tie_break_by_order() -> None:
    views = [gw("x"), gw("y")]
    assert pick(views, POLICY).addresses == ["x"]
    assert score(views[0], POLICY, affinity=False) == score(views[1], POLICY, affinity=False)


def test_gateway_spec_parsing_names_the_flag() -> None:
    import pytest

    from asyncdapo.services.scheduler.gateway_pool import GatewaySpec, GatewaySpecError

    assert GatewaySpec.parse("a:1, b:2").static == ("a:1", "b:2")
    spec = GatewaySpec.parse("dns:gw-headless.ns.svc:50051")
    assert (spec.dns_name, spec.dns_port) == ("gw-headless.ns.svc", 50051)
    for bad in ("", "dns:nope", "host-without-port", "dns::1"):
        with pytest.raises(GatewaySpecError, match="--gateways"):
            GatewaySpec.parse(bad)
