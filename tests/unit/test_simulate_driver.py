"""SIMULATOR driver: the real rollout core, store and dispatch on a virtual clock. Each mode trains
exactly B groups per step with the staleness its bound allows; sync aborts nothing; runs are
reproducible; the ideal is the arithmetic it claims; the command prints its table and RESULT lines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from asyncdapo.cli import main
from asyncdapo.contracts.config import PauseMode, RunConfig
from asyncdapo.tools.simulate.comparison import EfficiencyError, ideal, mode_report, step_floor
from asyncdapo.tools.simulate.driver import Simulation, check_supported
from asyncdapo.tools.simulate.modes import ModeError, mode_config
from asyncdapo.tools.simulate.presets import load_workload
from asyncdapo.tools.simulate.profile import load_cluster
from asyncdapo.tools.simulate.simulation_error import SimulationError
from asyncdapo.tools.simulate.workload import Workload, WorkloadSpec

B, N, VERSIONS = 16, 8, 6
RUN: dict[str, Any] = {
    "name": "sim",
    "data": {"train_batch_size": B, "max_response_length": 8192, "max_prompt_length": 1024},
    "rollout": {"n": N, "max_concurrent_prompts": 3 * B},
    "reward": {"overlong_buffer": {"len": 1024}},
    "trainer": {"ppo_mini_batch_size": B},
}


def run(mode: str, engines: int = 8, **wl: Any) -> tuple[Simulation, Any]:
    cfg = mode_config(RunConfig.model_validate(RUN), mode)
    sim = Simulation(cfg, load_cluster("h100-7b", engines), load_workload("rollpacker-14b", **wl), VERSIONS)
    return sim, sim.simulate()


@pytest.mark.parametrize(
    "mode",
    [
        "sync",
        "async",
        "async-fifo",
        "fully-async",
        "fully-async-s2",
        "fully-async-s0.5",
        "pdsr",
        "async+greedy",
    ],
)
def test_every_step_trains_b_groups_within_the_staleness_bound(mode: str) -> None:
    sim, res = run(mode)
    s = sim.cfg.staleness_window  # ceil(s): 1 for s = 0.5
    assert [st.version for st in res.steps] == list(range(1, VERSIONS + 1))
    assert all(len(st.staleness) == B for st in res.steps)
    assert all(0 <= x <= s for st in res.steps for x in st.staleness)
    # every group the store committed was trained, is waiting in the stream, or was credited back
    assert len(sim.run.groups) == VERSIONS * B + len(sim.stream) + sim.credited
    assert res.steps[-1].t_published == pytest.approx(res.sim_s)


def test_sync_never_aborts_or_requeues_and_async_does() -> None:
    _, sync = run("sync")
    assert sync.aborted_tokens == 0 and all(a == 1 for st in sync.steps for a in st.attempts)
    assert not any(k.startswith("requeued") for k in sync.counts.outcomes)
    _, asy = run("async")
    assert asy.aborted_tokens > 0 and asy.counts.outcomes["requeued:early_stop"] > 0
    assert asy.sim_s < sync.sim_s  # s = 0 early stop beats the generation batch barrier here


def test_responses_span_versions_only_with_staleness() -> None:
    _, fa = run("fully-async")
    assert any(x == 1 for st in fa.steps for x in st.staleness)
    _, pd = run("pdsr")
    assert pd.counts.long_tail_actions["cap_continue"] > 0


def test_a_run_is_a_function_of_its_inputs() -> None:
    a = run("async")[1]
    b = run("async")[1]
    assert (a.sim_s, a.decode_tokens, a.aborted_tokens) == (b.sim_s, b.decode_tokens, b.aborted_tokens)
    c = run("async", seed=1)[1]
    assert c.sim_s != a.sim_s


def test_ideal_is_critical_path_or_volume() -> None:
    """Every response 1000 tokens, every prompt 100: the critical path is 1000 steps of one
    sequence; the volume is B·n·1000 tokens over the engines at the concurrency B·n fills."""
    spec = WorkloadSpec(name="flat", length_median=1000, between_sigma=0, within_sigma=0, wrong_length_ratio=1.0,
                        prompt_median=100, prompt_sigma=0, max_response_length=8192)  # fmt: skip
    cfg = RunConfig.model_validate(RUN)
    cl = load_cluster("h100-7b", 4)
    e = cl.engine
    got = ideal(cfg, cl, Workload(spec), steps=2)
    assert got.critical_path_s == pytest.approx(1000 * e.step_s(1, 100 + 500))
    m = B * N // 4
    assert got.concurrency == m
    assert got.volume_s == pytest.approx(B * N * 1000 / (4 * m / e.step_s(m, m * 600)))
    assert got.rollout_s == pytest.approx(max(got.critical_path_s, got.volume_s))


def test_the_step_floor_is_volume_or_train_plus_update() -> None:
    """The floor at a trained length: B·n·L tokens at the best concurrency the KV cache allows, or
    the trainer's step on those tokens plus the weight update, whichever is longer."""
    cfg = RunConfig.model_validate(RUN)
    cl = load_cluster("h100-7b", 4)
    e, t = cl.engine, cl.trainer
    f = step_floor(cfg, cl, 1000, 100)
    m = min(e.max_num_seqs, e.kv_capacity_tokens // 600)
    assert f.concurrency == m
    assert f.volume_s == pytest.approx(B * N * 1000 / (4 * m / e.step_s(m, m * 600)))
    assert f.train_s == pytest.approx(t.step_s(B * N * 1100, B * N) + t.publish_s)
    assert f.update_s == pytest.approx(e.pause_s + e.reload_s) == cl.weight_update_s()
    assert f.step_s == max(f.volume_s, f.train_s + f.update_s)
    assert step_floor(cfg, cl, 500, 100).step_s < f.step_s  # shorter answers: a lower floor


def test_report_holds_the_mode_against_the_ideal_at_its_trained_length() -> None:
    sim, res = run("sync")
    cfg = sim.cfg
    ide = ideal(cfg, sim.cluster, sim.workload)
    rep = mode_report("sync", cfg, res, ide, 0.0)
    assert rep.ideal_step_s == pytest.approx(ide.floor(rep.trained_length, rep.trained_prompt).step_s)
    assert rep.efficiency == pytest.approx(rep.ideal_step_s / rep.step_s)
    assert 0 < rep.efficiency < 1
    assert rep.warmup_steps == 1 and rep.steps == VERSIONS - 1
    assert 0 <= rep.engine_idle_fraction < 1 and rep.staleness == {0: (VERSIONS - 1) * B}


@pytest.mark.parametrize("mode", ["sync", "async", "fully-async", "fully-async-s2", "pdsr"])
def test_no_mode_beats_the_one_ideal(mode: str) -> None:
    """One bound for every mode: whatever its staleness, no mode's efficiency exceeds 1 — fully
    async's above all, which trains shorter answers than sync."""
    sim, res = run(mode)
    ide = ideal(sim.cfg, sim.cluster, sim.workload)
    rep = mode_report(mode, sim.cfg, res, ide, 0.0)
    assert 0 < rep.efficiency <= 1
    # the same bound for every staleness at equal trained length: the mode's config does not enter it
    other = mode_report(mode, mode_config(sim.cfg, "fully-async-s3"), res, ide, 0.0)
    assert other.ideal_step_s == rep.ideal_step_s


def test_a_step_faster_than_the_ideal_is_refused() -> None:
    """An efficiency above 1 would mean the lower bound is wrong: the report raises rather than
    print it (and the CLI, which goes through it, exits with the message)."""
    sim, res = run("fully-async")
    ide = ideal(sim.cfg, sim.cluster, sim.workload)
    for st in res.steps:  # every step published 100x sooner than it was
        st.t_published /= 100
    with pytest.raises(EfficiencyError, match="beats the ideal"):
        mode_report("fully-async", sim.cfg, res, ide, 0.0)


def test_modes_parse_and_bad_ones_are_clear() -> None:
    base = RunConfig.model_validate(RUN)
    assert mode_config(base, "fully-async-s3").rollout.max_staleness == 3
    assert mode_config(base, "pdsr-s0.5").rollout.max_staleness == 0.5
    assert mode_config(base, "async+m1.5").rollout.admission.margin == 1.5
    assert mode_config(base, "pdsr").rollout.long_tail.policy.value == "pdsr"
    for bad in ("turbo", "sync-s1", "sync-s0.5", "async-s.5", "async+x"):
        with pytest.raises(ModeError):
            mode_config(base, bad)
    check_supported(mode_config(base, "sync"))
    with pytest.raises(SimulationError):
        Simulation(
            mode_config(base, "sync"), load_cluster("h100-7b", 2), load_workload("rollpacker-14b"), 2
        ).simulate(max_sim_s=1.0)


def test_command_prints_table_and_results(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "run.yaml"
    cfg.write_text(json.dumps(RUN))
    rc = main(["simulate", str(cfg), "--cluster", "h100-7b", "--engines", "4", "--versions", "3",
               "--modes", "sync,async", "--out", str(tmp_path / "out")])  # fmt: skip
    assert rc == 0
    out = capsys.readouterr().out
    results = [x for x in out.splitlines() if x.startswith("RESULT")]
    assert [x.split()[1] for x in results[:2]] == [
        "mode=sync",
        "mode=async",
    ] and "speedup_vs_sync=" in results[1]
    data = json.loads((tmp_path / "out" / "simulate.json").read_text())
    assert [m["mode"] for m in data["modes"]] == ["sync", "async"]
    assert (tmp_path / "out" / "simulate.png").stat().st_size > 1000
    assert main(["simulate", str(cfg), "--modes", "warp"]) == 2


def test_the_command_refuses_to_print_an_efficiency_above_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bound that is wrong (here: forced 1000x too high) makes the command exit with the reason,
    no table and no RESULT line."""
    import asyncdapo.tools.simulate.comparison as comparison

    real = comparison.step_floor

    def too_high(*args: Any) -> Any:
        f = real(*args)
        return comparison.StepFloor(f.length, f.volume_s * 1000, f.train_s, f.update_s, f.concurrency)

    monkeypatch.setattr(comparison, "step_floor", too_high)
    cfg = tmp_path / "run.yaml"
    cfg.write_text(json.dumps(RUN))
    rc = main(["simulate", str(cfg), "--cluster", "h100-7b", "--engines", "4", "--versions", "3",
               "--modes", "sync", "--out", str(tmp_path / "out"), "--no-png"])  # fmt: skip
    assert rc != 0
    captured = capsys.readouterr()
    assert "beats the ideal" in captured.err
    assert "RESULT" not in captured.out and not (tmp_path / "out" / "simulate.json").exists()


def test_replay_drives_the_simulation_from_a_trace(tmp_path: Path) -> None:
    from asyncdapo.tools.simulate.replay import load_replay
    from asyncdapo.tools.simulate.workload import WorkloadError

    lines = []
    for i in range(40):  # every other group mixed (valid), the rest all wrong (filtered)
        acc = [i % 2 == 0 and j % 2 == 0 for j in range(N)]
        lines.append(
            json.dumps({"prompt_tokens": 50, "lengths": [100 + 10 * j + i for j in range(N)], "acc": acc})
        )
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(lines) + "\n")
    cfg = mode_config(RunConfig.model_validate(RUN), "async")
    wl = load_replay(trace, cfg.data.max_response_length)
    assert wl.attempt(3, 1, N).lengths == [103 + 10 * j for j in range(N)]
    sim = Simulation(cfg, load_cluster("h100-7b", 4), wl, 2)
    res = sim.simulate()
    assert len(res.steps) == 2 and res.counts.outcomes["filtered"] > 0
    assert all(min(st.staleness) == 0 for st in res.steps)
    (tmp_path / "bad.jsonl").write_text('{"lengths": [1, 2], "acc": [1]}\n')
    with pytest.raises(WorkloadError, match="differ"):
        load_replay(tmp_path / "bad.jsonl", 100)


@pytest.mark.parametrize("update", ["abort", "wait"])
def test_weight_update_modes_other_than_keep(update: str) -> None:
    """pause abort: in-flight responses come back partial and continue elsewhere from their tokens
    (the dispatcher's `aborted_by_gateway`); pause wait: engines drain before they reload."""
    cfg = mode_config(RunConfig.model_validate(RUN), "fully-async")
    cfg.rollout.weight_update_mode = PauseMode(update)
    sim = Simulation(cfg, load_cluster("h100-7b", 8), load_workload("rollpacker-14b"), 4)
    res = sim.simulate()
    assert [st.version for st in res.steps] == [1, 2, 3, 4]
    assert all(len(st.staleness) == B and max(st.staleness) <= 1 for st in res.steps)
    keep = run("fully-async")[1]
    if update == "wait":  # draining holds the weights back until the longest response ends
        assert min(st.sync_s for st in res.steps) > min(st.sync_s for st in keep.steps[:4])


def test_a_request_aborted_by_pauses_max_tries_times_drops_its_group_as_the_scheduler_does() -> None:
    """The dispatcher gives up a request after `max_tries` dispatches, pause aborts included, and
    the core drops its group (`gateway_error`); the simulator runs the same queue, so long responses
    that span more weight updates than that are lost there too — and the run still trains B groups
    a step."""
    cfg = mode_config(RunConfig.model_validate(RUN), "async-s4")
    cfg.rollout.weight_update_mode = PauseMode.ABORT
    sim = Simulation(cfg, load_cluster("h100-7b", 8), load_workload("seer-tail"), 4)
    sim.dispatch.max_tries = 2  # the default 8 needs responses longer than 7 versions
    res = sim.simulate()
    assert res.counts.outcomes["dropped:gateway_error"] > 0
    assert all(len(st.staleness) == B for st in res.steps)


def test_replay_of_a_problem_trace_follows_the_trainers_order_and_requeues_the_same_problem(
    tmp_path: Path,
) -> None:
    """A trace with 4n responses per line (one per dataset row): the simulator feeds rows in the
    trainer's seeded epoch order, and attempt a of a row replays that row's block (a - 1) mod 4."""
    from asyncdapo.contracts.prompts import epoch_order
    from asyncdapo.tools.simulate.replay import load_replay

    rows = 12
    lines = [
        {
            "prompt_tokens": 40 + k,
            "lengths": [1000 * k + r for r in range(4 * N)],
            "acc": [r % 2 for r in range(4 * N)],
        }
        for k in range(rows)
    ]
    trace = tmp_path / "problems.jsonl"
    trace.write_text("".join(json.dumps(x) + "\n" for x in lines))
    cfg = mode_config(RunConfig.model_validate(RUN), "async")
    wl = load_replay(trace, cfg.data.max_response_length)
    assert wl.dataset_size == rows and wl.prompt_length(5) == 45
    for attempt, block in ((1, 0), (2, 1), (4, 3), (5, 0)):
        assert wl.attempt(5, attempt, N).lengths == [5000 + block * N + r for r in range(N)]
    # another seed: another recorded realisation of the same problem, still aligned with its row
    other = load_replay(trace, cfg.data.max_response_length, seed=2)
    assert other.prompt_length(5) == 45 and other.attempt(5, 1, N).lengths == [
        5000 + 2 * N + r for r in range(N)
    ]
    sim = Simulation(cfg, load_cluster("h100-7b", 4), wl, 1)
    sim._feed(rows + 3 - cfg.data.prompt_queue_watermark)  # one epoch and the start of the next
    order0 = epoch_order(rows, cfg.data.seed, 0, cfg.data.shuffle).tolist()
    order1 = epoch_order(rows, cfg.data.seed, 1, cfg.data.shuffle).tolist()
    assert order0 != list(range(rows))  # shuffled, as the trainer does by default
    assert list(sim.run.queue)[: rows + 3] == [f"e0-{i}" for i in order0] + [f"e1-{i}" for i in order1[:3]]


def test_replay_with_one_group_per_line_requeues_another_recorded_group(tmp_path: Path) -> None:
    from asyncdapo.tools.simulate.replay import STRIDE, load_replay

    lines = [{"lengths": [10 * k + r for r in range(N)], "acc": [1] * N} for k in range(10)]
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(x) + "\n" for x in lines))
    wl = load_replay(trace, 8192)
    assert wl.attempt(2, 1, N).lengths[0] == 20
    assert wl.attempt(2, 2, N).lengths[0] == 10 * ((2 + STRIDE) % 10)  # not the same responses again
    assert load_replay(trace, 8192, seed=1).attempt(2, 1, N).lengths[0] == 10 * ((2 + STRIDE) % 10)
