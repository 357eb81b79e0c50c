"""The simulator's transport latencies (`ClusterProfile.dispatch_s`, `dispatch_per_request_s`,
`reply_s`, `abort_s`): a request reaches its engine, a finished response the scheduler, an abort
the engine, that much later (a burst of requests to one gateway together, after its frontend took
in all of them); a request aborted on its way never reaches its engine, a response finished while its group
was aborted is dropped (its tokens counted as aborted) — and the dispatcher's books (in-flight
counts) stay exact through all three."""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any

import pytest
from test_simulate_driver import RUN, B, N  # the same run as the driver's tests

from asyncdapo.contracts.config import RunConfig
from asyncdapo.tools.simulate.driver import Simulation
from asyncdapo.tools.simulate.modes import mode_config
from asyncdapo.tools.simulate.presets import load_workload
from asyncdapo.tools.simulate.profile import load_cluster

VERSIONS = 5


def simulate(
    mode: str,
    dispatch_s: float = 0.0,
    reply_s: float = 0.0,
    abort_s: float = 0.0,
    per_request_s: float = 0.0,
    watch: Any = None,
) -> tuple[Simulation, Any]:
    cfg = mode_config(RunConfig.model_validate(RUN), mode)
    latencies = {
        "dispatch_s": dispatch_s,
        "reply_s": reply_s,
        "abort_s": abort_s,
        "dispatch_per_request_s": per_request_s,
    }
    cluster = load_cluster("h100-7b", 8).model_copy(update=latencies)
    sim = Simulation(cfg, cluster, load_workload("rollpacker-14b"), VERSIONS)
    if watch is not None:
        watch(sim)
    return sim, sim.simulate()


@pytest.mark.parametrize("per_request_s", [0.0, 0.002])
@pytest.mark.parametrize("mode", ["async", "pdsr", "fully-async"])
def test_invariants_and_in_flight_books_hold_with_latencies(mode: str, per_request_s: float) -> None:
    sim, res = simulate(mode, dispatch_s=0.2, reply_s=0.1, abort_s=0.15, per_request_s=per_request_s)
    s = sim.cfg.rollout.max_staleness
    assert [st.version for st in res.steps] == list(range(1, VERSIONS + 1))
    assert all(len(st.staleness) == B and all(0 <= x <= s for x in st.staleness) for st in res.steps)
    assert len(sim.run.groups) == VERSIONS * B + len(sim.stream) + sim.credited
    # every request the dispatcher counts in flight on a gateway is placed there, and only those
    placed = Counter(g.address for g, _, _ in sim._placed.values())
    assert {g.address: g.in_flight for g in sim.gws if g.in_flight} == dict(placed)
    # a request still on its way is not on any engine
    on_engines = {id(q) for g in sim.gws for q in g.engine.waiting}
    assert not on_engines & sim._transit
    if mode != "fully-async":
        assert res.counts.outcomes["requeued:early_stop"] > 0  # aborts met requests in transit too


def test_sync_rollout_pays_the_round_trip_once_per_version_at_least() -> None:
    """Sync: every version's generation starts with a dispatch and ends with a reply, so each
    rollout is longer by at least dispatch_s + reply_s (more when stragglers wait on both)."""
    _, base = simulate("sync")
    _, slow = simulate("sync", dispatch_s=0.5, reply_s=0.25)
    gen = [st.t_data - st.t_free for st in base.steps]
    gen_slow = [st.t_data - st.t_free for st in slow.steps]
    extra = statistics.fmean(gen_slow) - statistics.fmean(gen)
    assert 0.75 - 1e-6 <= extra <= 3 * 0.75, (gen, gen_slow)


def test_zero_latency_is_the_immediate_path() -> None:
    a = simulate("async")[1]
    b = simulate("async", dispatch_s=0.0, reply_s=0.0)[1]
    assert (a.sim_s, a.decode_tokens, a.aborted_tokens) == (b.sim_s, b.decode_tokens, b.aborted_tokens)


def test_engines_generate_until_the_abort_reaches_them() -> None:
    """Early stop's aborts take abort_s to reach the engines, which step the aborted requests
    meanwhile: more tokens are aborted (wasted), and every one is counted."""
    _, now = simulate("async")
    _, late = simulate("async", abort_s=0.5)
    assert late.aborted_tokens > now.aborted_tokens
    # every token an engine decoded is either in a completion the core counted or aborted
    for res in (now, late):
        assert res.decode_tokens <= res.counts.completed_tokens + res.aborted_tokens


def record_arrivals(sim: Simulation, log: list[tuple[str, float]]) -> None:
    """Log (gateway, virtual time) of every request its engine receives."""
    sim.transport.arrivals = log


def test_a_burst_reaches_its_engine_together_after_its_frontend_took_it_in() -> None:
    """Sync dispatches its whole generation batch at t = 0: each gateway's share of it reaches the
    engine at once, dispatch_s + per request × its share later — not spread from dispatch_s on."""
    arrivals: list[tuple[str, float]] = []
    sim, res = simulate(
        "sync", dispatch_s=0.05, per_request_s=0.001, watch=lambda s: record_arrivals(s, arrivals)
    )
    first = [(a, t) for a, t in arrivals if t < res.steps[0].t_data]
    per_gw = Counter(a for a, _ in first)
    assert len(per_gw) == len(sim.gws)
    for address, n in per_gw.items():
        times = {round(t, 9) for a, t in first if a == address}
        # dispatched by the first admission round, one Redis round trip in
        assert times == {round(sim.rtt + 0.05 + 0.001 * n, 9)}, (address, n, times)


def test_the_frontend_cost_lengthens_a_sync_rollout_by_about_its_burst() -> None:
    _, base = simulate("sync", dispatch_s=0.05)
    _, slow = simulate("sync", dispatch_s=0.05, per_request_s=0.002)
    per_gw = B * N / 8  # at least this run's B prompts × n over its 8 gateways at a version start
    extra = statistics.fmean(st.t_data - st.t_free for st in slow.steps) - statistics.fmean(
        st.t_data - st.t_free for st in base.steps
    )
    assert extra >= 0.002 * per_gw * 0.9, extra
