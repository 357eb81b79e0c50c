"""The long-tail policy `pdsr`: probe window, L_cut, routing and the fast-pool cap."""

from __future__ import annotations

from asyncdapo.scheduler.policy.long_tail import FAST, HEAVY, ProbeWindow, capped, route


def test_l_cut_is_the_quantile_of_recent_probes_after_warm_up() -> None:
    w = ProbeWindow(size=10, min_probes=5)
    for x in (10, 20, 30, 40):
        w.add(x)
    assert w.l_cut(0.2) is None  # warming up: nothing offloaded or capped
    for x in (50, 60, 70, 80, 90, 100):
        w.add(x)
    assert w.l_cut(0.2) == 80.0  # top 20 % of 10 probes: 90 and 100 are beyond it
    for x in (1,) * 10:  # the window slides
        w.add(x)
    assert w.l_cut(0.2) == 1.0


def test_route_offloads_long_probes_and_caps_the_rest() -> None:
    assert route(500, None, 1.5, 1024) == route(5, None, 1.5, 1024)
    assert route(5, None, 1.5, 1024).pool == FAST and route(5, None, 1.5, 1024).max_tokens == 1024
    long = route(101, 100.0, 1.5, 1024)
    assert (long.pool, long.max_tokens, long.offloaded) == (HEAVY, 1024, True)
    short = route(100, 100.0, 1.5, 1024)
    assert (short.pool, short.max_tokens, short.offloaded) == (FAST, 150, False)
    assert route(10, 1000.0, 1.5, 1024).max_tokens == 1024  # the cap never exceeds max_tokens


def test_capped_only_when_the_cap_not_eos_or_max_tokens_stopped_it() -> None:
    assert capped(150, 150, 1024)
    assert not capped(149, 150, 1024)  # ended by EOS before the cap
    assert not capped(1024, 1024, 1024)  # the run's own limit: final
