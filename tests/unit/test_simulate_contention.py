"""SIMULATOR host-CPU contention (CPU profiles): the stretch formula against arithmetic by hand,
an engine's steps stretched by it, a calibration that divides the contention back out, the
driver's control-plane demand, and the workload's brief answers."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from asyncdapo.contracts.config import RunConfig
from asyncdapo.tools.simulate.calibrate import calibrate_files
from asyncdapo.tools.simulate.clock import VirtualClock
from asyncdapo.tools.simulate.driver import Simulation
from asyncdapo.tools.simulate.engine_model import Engine, Seq
from asyncdapo.tools.simulate.host_load import HostLoad
from asyncdapo.tools.simulate.modes import mode_config
from asyncdapo.tools.simulate.presets import load_workload
from asyncdapo.tools.simulate.profile import CPU_TINY, EngineProfile, HostCpuContention
from asyncdapo.tools.simulate.workload import Workload, WorkloadSpec

HOST = HostCpuContention(cores=2, completion_cpu_s=0.002, version_cpu_s=0.05, trainer_cores=1.5)


def test_lost_share_by_hand() -> None:
    # 2 cores, both engines stepping, 0.5 cores of other demand: it all spills onto the engine
    # cores, 0.25 each; a step takes 1 / (1 - 0.25) = 4/3 as long
    assert HOST.lost_share(0.5, 2) == pytest.approx(0.25)
    assert HOST.stretch(0.5, 2) == pytest.approx(4 / 3)
    # one engine stepping: the idle engine's core takes the first core of demand
    assert HOST.stretch(0.5, 1) == 1.0
    assert HOST.stretch(1.3, 1) == pytest.approx(1 / (1 - 0.3))
    # the fair share caps what an engine gives up: 3 cores of demand on 2 stepping engines
    assert HOST.lost_share(3.0, 2) == 0.5 and HOST.stretch(3.0, 2) == pytest.approx(2.0)
    # no demand, or no engine stepping: no stretch
    assert HOST.stretch(0.0, 2) == 1.0 and HOST.stretch(5.0, 0) == 1.0


def test_background_threads_share_every_core_by_hand() -> None:
    # 3 other runnable threads on 2 cores: 1.5 per core, an engine gets 1 / 2.5 of its core
    busy = HOST.model_copy(update={"background_threads": 3.0})
    assert busy.stretch(0.0, 2) == pytest.approx(2.5)
    # on top of the floating work's share: 0.5 cores spilled on 2 engines -> 4/3 x 2.5
    assert busy.stretch(0.5, 2) == pytest.approx(2.5 * 4 / 3)
    # the trainer (1.5 cores: all its step on the CPU) with idle engines: only the threads
    assert busy.trainer_stretch(1.5, 0) == pytest.approx(2.5)


def test_trainer_stretch_by_hand() -> None:
    # idle engines: the trainer's 1.5 cores + 0.3 of background fit in 2 cores
    assert HOST.trainer_stretch(1.8, 0) == 1.0
    # two stepping engines leave 2 x 0.5 = 1 core of floating capacity for 1.8 cores of demand
    assert HOST.trainer_stretch(1.8, 2) == pytest.approx(1.8)
    # one stepping engine: 1 + 0.5 = 1.5 cores for 1.8
    assert HOST.trainer_stretch(1.8, 1) == pytest.approx(1.2)
    # a trainer on the CPU 40 % of its step (the rest checkpoint and snapshot I/O): only that
    # part stretches, 1 + 0.4 x (1.8 - 1)
    io_bound = HOST.model_copy(update={"trainer_cores": 0.4})
    assert io_bound.trainer_stretch(1.8, 2) == pytest.approx(1.32)
    # interference beside stepping engines multiplies the fair-share slow-down, never idle engines':
    # 1.8 x 1.25 = 2.25 with two stepping engines; 1 + 0.4 x (2.25 - 1) = 1.5 for the I/O-bound one
    noisy = HOST.model_copy(update={"trainer_interference": 1.25})
    assert noisy.trainer_stretch(1.8, 2) == pytest.approx(2.25)
    assert noisy.trainer_stretch(1.8, 0) == 1.0
    assert noisy.model_copy(update={"trainer_cores": 0.4}).trainer_stretch(1.8, 2) == pytest.approx(1.5)


def test_engines_give_up_what_the_trainer_gets_not_what_it_asks() -> None:
    """Work-conserving: the trainer (1 core of demand) slowed 1.5x beside two stepping engines gets
    2/3 of a core, and that is what the engines lose (1/3 each: 1.5x), not its whole demand (which
    would cap them at the fair share, 2x) — the CPU samples the engines are calibrated on count the
    trainer's CPU time the same way."""
    host = HostCpuContention(cores=2, trainer_cores=1.0, trainer_interference=1.5)
    assert host.trainer_stretch(1.0, 2) == pytest.approx(1.5)
    assert host.trainer_used_cores(1.0, 2) == pytest.approx(2 / 3)
    assert host.trainer_used_cores(1.0, 0) == pytest.approx(1.0)  # idle engines: all it asks for
    load = HostLoad(host, VirtualClock(), lambda: 2)
    assert load.engine_stretch() == 1.0  # the trainer waits for data: nothing floats
    load.training = True
    assert load.floating_cores() == pytest.approx(1.0)  # its demand decides its own share ...
    assert load.trainer_stretch() == pytest.approx(1.5)
    assert load.engine_stretch() == pytest.approx(1 / (1 - 1 / 3))  # ... its use the engines'
    assert load.engine_stretch() < host.stretch(1.0, 2) == pytest.approx(2.0)
    # an I/O-bound trainer (on the CPU 40 % of its step) slows less and takes less
    light = HostLoad(host.model_copy(update={"trainer_cores": 0.4}), VirtualClock(), lambda: 2)
    light.training = True
    assert light.trainer_stretch() == pytest.approx(1 + 0.4 * (1.5 - 1))
    assert light.engine_stretch() == pytest.approx(1 / (1 - 0.4 / 1.2 / 2))


def test_the_control_planes_idle_floor_floats_all_the_time_and_impulses_decay_above_it() -> None:
    """The control plane's floor (its loops, heartbeats, metrics: `control_idle_cores`) is demand at
    every instant, not a burst at a version start; a version's CPU is an impulse that decays back
    to the floor over window_s."""
    clock = VirtualClock()
    host = HostCpuContention(cores=2, control_idle_cores=0.5, version_cpu_s=0.1, window_s=0.1)
    load = HostLoad(host, clock, lambda: 2)
    # 0.5 cores spill onto two stepping engines before any work arrives: 0.25 each, 4/3 x
    assert load.control_cores() == pytest.approx(0.5)
    assert load.engine_stretch() == pytest.approx(4 / 3)
    load.cpu_work(host.version_cpu_s)  # 0.1 CPU s over a 0.1 s window: +1 core now
    assert load.control_cores() == pytest.approx(1.5)
    clock.now = 0.1  # one time constant later: 1 / e of it left
    assert load.control_cores() == pytest.approx(0.5 + math.exp(-1.0))
    clock.now = 10.0
    assert load.control_cores() == pytest.approx(0.5)  # back to the floor, never below
    # requests in flight cost the control plane more while any engine steps (0.2 cores here)
    engines = [0]
    rolling = HostLoad(host.model_copy(update={"control_rollout_cores": 0.2}), clock, lambda: engines[0])
    assert rolling.control_cores() == pytest.approx(0.5)
    engines[0] = 1
    assert rolling.control_cores() == pytest.approx(0.7)
    # one engine stepping on 2 cores: the 0.7 cores fit on the idle engine's core, no stretch
    assert rolling.engine_stretch() == 1.0
    engines[0] = 2
    assert rolling.engine_stretch() == pytest.approx(1 / (1 - 0.35))


def test_an_engine_step_takes_the_stretch_times_its_time() -> None:
    prof = EngineProfile(
        base_s=0.01, per_seq_s=0.001, kv_capacity_tokens=100_000, max_num_batched_tokens=8192
    )
    times = {}

    def finish_time(factor: float) -> float:
        clock = VirtualClock()
        done: list[float] = []
        eng = Engine(clock, prof, lambda s: done.append(clock.now))
        if factor != 1.0:
            eng.stretch = lambda: factor
        eng.submit(Seq("a", 10, 0, 20))
        clock.run(lambda: False)
        return done[0]

    for factor in (1.0, 1.5):
        times[factor] = finish_time(factor)
    # 20 steps (a prefill that samples the first token, 19 decodes) of 10 + 1 ms: 0.22 s, x 1.5
    assert times[1.0] == pytest.approx(20 * 0.011)
    assert times[1.5] == pytest.approx(1.5 * 20 * 0.011)


def test_calibration_divides_the_contention_out(tmp_path: Path) -> None:
    """A log whose steps ran 1.6x slower in the second half fits to the uncontended costs when
    the calibration is told the stretch, and to something between when it is not."""
    base, per_seq = 0.003, 0.0002
    t, lines = 1000.0, []
    for i in range(400):
        running = 1 + i % 20
        slow = 1.6 if t >= 1000.0 + 400 * 0.004 / 2 else 1.0
        t += (base + per_seq * running) * slow
        lines.append({"t": t, "running": running, "waiting": 0, "kv": 0.0, "decode": running,
                      "prefill_reqs": 0, "prefill_tokens": 0, "block": 1})  # fmt: skip
    log = tmp_path / "g.jsonl"
    log.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    half = 1000.0 + 400 * 0.004 / 2

    def stretch(path: Path, when: float) -> float:
        assert path == log
        return 1.6 if when >= half else 1.0

    _, plain = calibrate_files([log], 1 << 20)
    _, fitted = calibrate_files([log], 1 << 20, stretch=stretch)
    assert fitted.coef["base_s"] == pytest.approx(base, rel=0.05)
    assert fitted.coef["per_seq_s"] == pytest.approx(per_seq, rel=0.05)
    assert plain.coef["base_s"] + 10 * plain.coef["per_seq_s"] > 1.2 * (base + 10 * per_seq)


def test_brief_answers_are_a_share_of_every_group() -> None:
    spec = WorkloadSpec(name="b", length_median=40, max_response_length=160, n_ref=8, within_sigma=0.2,
                        brief_fraction=0.75, brief_median=6.5, brief_sigma=0.03, wrong_length_ratio=1.0)  # fmt: skip
    w = Workload(spec, seed=3)
    lens = np.array([w.attempt(i, 1, 8).lengths for i in range(2000)])
    brief = lens <= 8
    assert brief.mean() == pytest.approx(0.75, abs=0.02)
    assert np.median(lens[brief]) in (6, 7)
    # within a group, brief and worked answers mix: most groups have both
    assert ((brief.sum(axis=1) > 0) & (brief.sum(axis=1) < 8)).mean() > 0.85
    # without brief answers the draws are the ones the workload always made
    plain = Workload(spec.model_copy(update={"brief_fraction": 0.0}), seed=3)
    worked = np.array([plain.attempt(i, 1, 8).lengths for i in range(2000)])
    assert (lens[~brief] == worked[~brief]).all()
    assert math.isclose(float(np.median(np.log(worked))), math.log(40), abs_tol=0.15)


def _cpu_sim(mode: str, host: HostCpuContention | None, versions: int) -> Any:
    """A small run on cpu-tiny (B = 8, n = 8, 160-token cap) with `host`'s contention."""
    run = {
        "name": "sim",
        "data": {"train_batch_size": 8, "max_response_length": 160, "max_prompt_length": 64},
        "rollout": {"n": 8, "max_concurrent_prompts": 24},
        "trainer": {"ppo_mini_batch_size": 8},
    }
    cfg = mode_config(RunConfig.model_validate(run), mode)
    cluster = CPU_TINY.model_copy(update={"host": host})
    return Simulation(cfg, cluster, load_workload("tiny-longtail", 0), versions).simulate()


def _cpu_run(mode: str, host: HostCpuContention | None) -> tuple[float, float]:
    """(engine busy seconds, mean trainer step seconds) of a 4-version run."""
    res = _cpu_sim(mode, host, 4)
    return res.busy_s, sum(s.train_s for s in res.steps) / len(res.steps)


def test_the_driver_stretches_engines_by_the_floating_demand() -> None:
    plain = _cpu_run("sync", None)
    # a host with no other demand changes nothing (the trainer's time is integrated in ticks: to
    # float rounding)
    assert _cpu_run("sync", HostCpuContention(cores=2)) == pytest.approx(plain, rel=1e-9)
    # two cores of background: whether one engine steps (1 core spills onto it) or two (1 each),
    # an engine gives up its fair-share cap, half its core: every step takes 2x (the verifier's and
    # Redis' round trips are not stretched, so the order of events may differ a little)
    busy, train = _cpu_run("sync", HostCpuContention(cores=2, background_cores=2.0))
    assert busy == pytest.approx(2 * plain[0], rel=0.03)
    # sync trains while the engines idle: 1 + 1 cores of demand fit in 2, the trainer is not slowed
    busy, train = _cpu_run("sync", HostCpuContention(cores=2, background_cores=1.0, trainer_cores=1.0))
    assert train == pytest.approx(plain[1])
    # control-plane CPU per completion slows the engines, a little
    busy, _ = _cpu_run("sync", HostCpuContention(cores=2, completion_cpu_s=0.002, background_cores=0.5))
    assert plain[0] < busy < 2 * plain[0]


def _train_times(mode: str, host: HostCpuContention | None) -> list[float]:
    return [s.train_s for s in _cpu_sim(mode, host, 8).steps]


def test_the_trainer_is_slowed_for_as_long_as_engines_step_beside_it() -> None:
    """Fully async: the next version's rollout overlaps a step for part of it, so the step takes
    between its uncontended time and its time fully stretched (the rate follows the engines'
    state through the step instead of being fixed when it starts)."""
    base = _train_times("fully-async", None)
    host = HostCpuContention(cores=2, trainer_cores=1.0, trainer_interference=1.5)
    # both engines stepping the whole step: 2 x 0.5 cores of capacity for its 1 core (no fair-share
    # slow-down), times the interference
    full = host.trainer_stretch(1.0, 2)
    assert full == pytest.approx(1.5)
    got = _train_times("fully-async", host)
    ratios = [g / b for g, b in zip(got, base, strict=True)]
    assert all(1.0 - 1e-9 <= r <= full + 1e-9 for r in ratios)
    assert any(1.02 < r < full - 0.02 for r in ratios)  # partly overlapped steps exist
    # sync trains while every engine idles: its steps keep their uncontended time
    assert _train_times("sync", host) == pytest.approx(_train_times("sync", None))


def test_length_max_bounds_natural_lengths() -> None:
    spec = WorkloadSpec(
        name="m", length_median=60, between_sigma=1.0, max_response_length=160, length_max=113
    )
    lens = np.array([Workload(spec, seed=1).attempt(i, 1, 8).lengths for i in range(500)])
    assert lens.max() == 113
    unbounded = np.array(
        [
            Workload(spec.model_copy(update={"length_max": 0}), seed=1).attempt(i, 1, 8).lengths
            for i in range(500)
        ]
    )
    assert (np.minimum(unbounded, 113) == lens).all() and unbounded.max() > 160
