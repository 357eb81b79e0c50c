"""The long-tail policy `pdsr`: the length window (final and right-censored), L_cut, routing and the
fast-pool cap."""

from __future__ import annotations

import math
import random

from asyncdapo.services.scheduler.policy.long_tail import FAST, HEAVY, ProbeWindow, capped, km_quantile, route


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


def test_l_cut_is_the_kaplan_meier_quantile_over_final_and_censored_lengths() -> None:
    # by hand: 10 final (5 at risk, S = 4/5); 20 censored (3 left); 30 final (S = 4/5 · 2/3 = 8/15);
    # 40 final (S = 8/15 · 1/2 = 4/15); 50 censored
    obs = [(10, True), (20, False), (30, True), (40, True), (50, False)]
    assert km_quantile(obs, 0.2) == 10.0  # S(10) = 0.8 ≤ 0.8
    assert km_quantile(obs, 0.4) == 30.0  # S(30) = 0.533 ≤ 0.6
    assert km_quantile(obs, 0.5) == 40.0  # S(40) = 0.267 ≤ 0.5 (30 is not: 0.533)
    # S never falls to 0.2: the quantile lies beyond the data; the largest length is a lower bound
    assert km_quantile(obs, 0.8) == 50.0
    # a censored length tied with a final one is still at risk there (events first): S(10) = 2/3
    assert km_quantile([(10, False), (10, True), (20, True)], 0.3) == 10.0
    assert km_quantile([(10, False), (10, True), (20, True)], 0.4) == 20.0
    assert km_quantile([], 0.5) is None
    w = ProbeWindow(size=8, min_probes=2)
    for x, final in obs:
        (w.add if final else w.add_censored)(x)
    assert w.l_cut(0.6) == 30.0 and w.l_cut(0.5) == 40.0  # the window is the same estimate


def test_without_censored_lengths_l_cut_is_the_old_nearest_rank_quantile() -> None:
    rng = random.Random(7)
    for n in (1, 2, 5, 10, 37, 100):
        xs = [rng.randint(1, 500) for _ in range(n)]
        for f in (0.1, 0.2, 0.25, 0.5):
            w = ProbeWindow(size=n, min_probes=1)
            for x in xs:
                w.add(x)
            rank = max(0, math.ceil((1.0 - f) * n) - 1)
            assert w.l_cut(f) == float(sorted(xs)[rank]), (n, f)


def test_censored_lengths_do_not_count_toward_min_probes_and_slide_out_like_finals() -> None:
    w = ProbeWindow(size=4, min_probes=3)
    w.add_censored(0)  # "≥ 0 tokens" says nothing: not kept
    assert not w.obs
    for x in (100, 200, 300):
        w.add_censored(x)
    w.add(5)
    w.add(6)
    assert w.l_cut(0.2) is None  # 2 final lengths: still warming up, however many censored
    w.add(7)  # pushes censored 100 out: finals 5, 6, 7, censored 200, 300
    assert w.finals == 3 and w.lengths == [5, 6, 7]
    # KM over 5, 6, 7 final and 200, 300 censored: S(7) = 2/5, never ≤ 0.2 → beyond the data
    assert w.l_cut(0.5) == 6.0 and w.l_cut(0.2) == 300.0
    for x in (1, 2, 3, 4):  # only finals now
        w.add(x)
    assert w.finals == 4 and w.l_cut(0.25) == 3.0


def _censored_sample(seed: int) -> tuple[list[int], list[tuple[int, bool]]]:
    """A heavy-tailed (Pareto, α = 1.5) length sample with a known truth, observed the way a rollout
    window sees it: each response started at an independent random time before an early stop
    aborts what still runs (one token per tick): finished ones give their length, running ones
    'length ≥ tokens so far'."""
    rng = random.Random(seed)
    truth = [min(2048, int(16 * rng.paretovariate(1.5))) for _ in range(4000)]
    horizon = 100  # ticks: about twice the true p80, so a third of the responses are still running
    obs = []
    for length in truth:
        ran = rng.uniform(0, horizon)  # ticks it had before the abort
        obs.append((length, True) if length <= ran else (int(ran), False))
    return truth, obs


def test_censoring_removes_the_survivorship_bias_of_final_lengths_only() -> None:
    for seed in (1, 2, 3):
        truth, obs = _censored_sample(seed)
        true_p80 = sorted(truth)[math.ceil(0.8 * len(truth)) - 1]
        old = ProbeWindow(size=len(obs), min_probes=8)
        new = ProbeWindow(size=len(obs), min_probes=8)
        for x, final in obs:
            if final:
                old.add(x)
                new.add(x)
            else:
                new.add_censored(x)
        old_cut, new_cut = old.l_cut(0.2), new.l_cut(0.2)
        assert old_cut is not None and new_cut is not None
        assert old_cut < 0.8 * true_p80  # final lengths only: biased low
        assert abs(new_cut / true_p80 - 1) < 0.1, (seed, true_p80, old_cut, new_cut)


def test_responses_running_past_the_cap_count_as_censored_until_they_end() -> None:
    w = ProbeWindow(size=16, min_probes=4)
    for x in (10, 20, 30, 40):
        w.add(x)
    assert w.l_cut(0.25) == 30.0
    # three responses reached a cap of 45 and run on: 3 of 7 are ≥ 45, more than the 25 % the
    # cut leaves above it, so the quantile is beyond the finals (the cap a lower bound of it)
    for key in ("a", "b", "c"):
        w.continuing(key, 45)
    assert w.l_cut(0.25) == 45.0 and len(w.obs) == 4
    w.add(300, "a")  # one ends: final, and no longer running
    w.add_censored(50, "b")  # one aborted after 50 tokens: censored, no longer running
    assert w.running == {"c": 45} and list(w.obs)[-2:] == [(300, True), (50, False)]
    # KM: 10, 20, 30, 40 → S = 3/7; 45 (c) and 50 censored; 300 → S = 0 ≤ 0.25
    assert w.l_cut(0.25) == 300.0 and w.l_cut(0.5) == 40.0
    w.forget_running()
    assert not w.running and w.l_cut(0.25) == 300.0
