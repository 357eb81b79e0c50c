"""SIMULATOR speed guard: the simulator's own cost per event stays where the 512-engine goal needs
it (docs/simulator.md, "Speed": 512 engines × 16k × B = 512, n = 16, 50 versions, ~2 M events per
mode).

Measured as CPU per event in units of a fixed reference workload timed in the same process
(`asyncdapo.tools.simulate.machine_speed`), not in events per CPU second: the same code ran at 55–68 k
events per CPU second on one of our 2-core VMs and at 24–25 k on another (2026-11-27, quiet), so
an absolute floor failed on a slow machine rather than on a regression. In reference operations
the run costs 15–17 per event (that slower VM, quiet); the ceiling, 30, fails on a regression that
doubles the per-event cost (checked by burning CPU in the event loop: 2.0× the CPU read 30.7, 2.6×
read 40.7), not on a slower machine. With the compiled event loop (`make install` builds it:
asyncdapo.tools.simulate.native) the run cost 11.4–12.4 (2026-11-27, against 15.1–16.5 plain, back to
back). Since 2026-11-28 (the per-response records' `__init__`s compiled, the workload sampled a
chunk at a time) it costs 5.9–6.3 compiled and 13.1–13.9 plain (twice each, one process each),
so the ceilings are 12 compiled and 28 plain: about twice today's cost either way.
"""

from __future__ import annotations

import time

import pytest

from asyncdapo.contracts.config import RunConfig
from asyncdapo.tools.simulate import native
from asyncdapo.tools.simulate.driver import Simulation
from asyncdapo.tools.simulate.machine_speed import cost_in_reference_ops, reference_cpu_s_per_op
from asyncdapo.tools.simulate.modes import mode_config
from asyncdapo.tools.simulate.presets import load_workload
from asyncdapo.tools.simulate.profile import load_cluster

B = 128
RUN = {
    "name": "speed",
    "data": {"train_batch_size": B, "max_response_length": 16384, "max_prompt_length": 1024},
    "rollout": {"n": 16, "max_concurrent_prompts": 3 * B},
    "reward": {"overlong_buffer": {"len": 4096}},
    "trainer": {"ppo_mini_batch_size": 64},
}
# about twice today's cost, compiled (CI: `make install` builds it) or plain
CEILING_REFERENCE_OPS_PER_EVENT = 12.0 if native.active_build() is not None else 28.0


@pytest.mark.parametrize("mode", ["async", "fully-async"])
def test_cost_per_event_in_reference_ops_stays_under_the_ceiling(mode: str) -> None:
    cfg = mode_config(RunConfig.model_validate(RUN), mode)
    sim = Simulation(cfg, load_cluster("h100-7b", 128), load_workload("rollpacker-14b"), 4)
    ref_before = reference_cpu_s_per_op()
    c0 = time.process_time()
    res = sim.simulate()
    cpu = time.process_time() - c0
    # the reference timed on both sides of the run: a load that came or went meanwhile moves both
    ref = (ref_before + reference_cpu_s_per_op()) / 2
    cost = cost_in_reference_ops(cpu, res.events, ref)
    assert res.events > 40_000, "the run is big enough to measure"
    assert cost <= CEILING_REFERENCE_OPS_PER_EVENT, (
        f"{mode}: {cost:.1f} reference ops per event ({res.events} events in {cpu:.2f} CPU s, reference "
        f"{ref * 1e6:.2f} µs per op), ceiling {CEILING_REFERENCE_OPS_PER_EVENT}: the 512-engine run would "
        "cost about twice today's"
    )


def test_cost_in_reference_ops_is_cpu_per_event_over_cpu_per_op_and_refuses_an_empty_run() -> None:
    # 2 CPU s for 1,000 events is 2 ms an event; at 100 µs per reference op that is 20 ops
    assert cost_in_reference_ops(2.0, 1000, 1e-4) == pytest.approx(20.0)
    with pytest.raises(ValueError, match="events > 0"):
        cost_in_reference_ops(1.0, 0, 1e-4)
