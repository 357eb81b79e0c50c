"""SIMULATOR costs real systems pay, each on its own: the trainer from FLOPs at an MFU, the weight
transfer by transport (and whether engines generate meanwhile), a partial rollout's resume (the
prefill of its kept tokens under the new weights), the colocated placement; and the published
setups they are used with."""

from __future__ import annotations

import math
from typing import Any

import pytest

from asyncdapo.contracts.config import RunConfig
from asyncdapo.tools.simulate.clock import VirtualClock
from asyncdapo.tools.simulate.comparison import ideal, mode_report
from asyncdapo.tools.simulate.driver import Simulation
from asyncdapo.tools.simulate.engine_model import Engine, Seq
from asyncdapo.tools.simulate.modes import mode_config
from asyncdapo.tools.simulate.presets import load_workload
from asyncdapo.tools.simulate.profile import (
    EngineProfile,
    Placement,
    ProfileError,
    WeightSyncProfile,
    WeightTransport,
    load_cluster,
    trainer_from_flops,
)
from asyncdapo.tools.simulate.published import PUBLISHED
from asyncdapo.tools.simulate.simulation_error import SimulationError

GB = 1e9
RUN: dict[str, Any] = {
    "name": "costs",
    "data": {"train_batch_size": 16, "max_response_length": 8192, "max_prompt_length": 1024},
    "rollout": {"n": 8, "max_concurrent_prompts": 48},
    "reward": {"overlong_buffer": {"len": 1024}},
    "trainer": {"ppo_mini_batch_size": 16},
}


def test_trainer_from_flops_is_8p_or_6p_per_token_at_the_mfu() -> None:
    t = trainer_from_flops(7e9, 16, 1e15, 0.5, publish_s=3.0)
    assert t.per_token_s == pytest.approx(8 * 7e9 / (16 * 1e15 * 0.5))
    assert t.publish_s == 3.0
    # the old-log-prob pass is 2P of the 8P: without it, 3/4 of the time per token
    no_olp = trainer_from_flops(7e9, 16, 1e15, 0.5, old_log_prob=False)
    assert no_olp.per_token_s == pytest.approx(t.per_token_s * 6 / 8)
    # twice the GPUs, half the time per token
    assert trainer_from_flops(7e9, 32, 1e15, 0.5).per_token_s == pytest.approx(t.per_token_s / 2)
    for bad in ({"mfu": 0.0}, {"mfu": 1.5}, {"gpus": 0}):
        args: dict[str, Any] = {"params": 7e9, "gpus": 16, "peak_flops": 1e15, "mfu": 0.5} | bad
        with pytest.raises(ProfileError, match="mfu"):
            trainer_from_flops(**args)


def test_weight_transfer_by_transport() -> None:
    b, link = 16 * GB, 50 * GB
    nccl = WeightSyncProfile(
        transport=WeightTransport.NCCL, weight_bytes=b, link_bytes_per_s=link, setup_s=0.1
    )
    assert nccl.transfer_s(64) == pytest.approx(0.1 + b / link) and not nccl.overlaps_generation
    stream = WeightSyncProfile(transport=WeightTransport.STREAM, weight_bytes=b, link_bytes_per_s=link)
    hops = math.ceil(math.log2(65))  # a relay tree of 64 engines: 7 hops of one chunk each
    assert stream.transfer_s(64) == pytest.approx(b / link + hops * 4 * 1024 * 1024 / link)
    assert stream.overlaps_generation and stream.trainer_write_s == 0.0
    snap = WeightSyncProfile(
        transport=WeightTransport.SNAPSHOT, weight_bytes=b, link_bytes_per_s=link,
        storage_bytes_per_s=200 * GB, write_bytes_per_s=4 * GB,
    )  # fmt: skip
    # 64 readers share 200 GB/s: 3.125 GB/s each, below the link
    assert snap.transfer_s(64) == pytest.approx(b / (200 * GB / 64))
    assert snap.transfer_s(2) == pytest.approx(b / link)  # 2 readers: the link bounds
    assert snap.trainer_write_s == pytest.approx(b / (4 * GB)) and not snap.overlaps_generation
    assert WeightSyncProfile().transfer_s(512) == 0.0  # no bytes: the engines' own pause and load only


def _run(cluster_update: dict[str, Any], mode: str, versions: int = 4) -> tuple[Simulation, Any]:
    cl = load_cluster("h100-7b", 8).model_copy(update=cluster_update)
    cfg = mode_config(RunConfig.model_validate(RUN), mode)
    sim = Simulation(cfg, cl, load_workload("rollpacker-14b"), versions)
    return sim, sim.simulate()


def test_a_paused_transfer_lengthens_every_weight_update_by_its_time() -> None:
    ws = WeightSyncProfile(transport=WeightTransport.NCCL, weight_bytes=15.2 * GB, link_bytes_per_s=1.9 * GB)
    sim, res = _run({"weight_sync": ws}, "sync")
    e = sim.cluster.engine
    want = e.pause_s + 15.2 / 1.9 + e.reload_s  # sync mode: the engines are idle when the trainer publishes
    assert [s.sync_s for s in res.steps] == pytest.approx([want] * len(res.steps))
    _, plain = _run({}, "sync")
    assert res.sim_s > plain.sim_s + (len(res.steps) - 1) * 15.2 / 1.9 * 0.99


def test_engines_generate_while_the_stream_transfer_runs() -> None:
    """The same bytes over the same link: streamed, the engines fetch them while generating, so
    fully async makes more of its next batch meanwhile than with a broadcast that pauses them."""
    common = {"weight_bytes": 15.2 * GB, "link_bytes_per_s": 0.5 * GB}
    stream = WeightSyncProfile(transport=WeightTransport.STREAM, **common)
    nccl = WeightSyncProfile(transport=WeightTransport.NCCL, **common)
    _, rs = _run({"weight_sync": stream}, "fully-async", versions=6)
    _, rn = _run({"weight_sync": nccl}, "fully-async", versions=6)
    assert rs.sim_s < rn.sim_s
    busy_share = [r.busy_s / (r.engines * r.sim_s) for r in (rs, rn)]
    assert busy_share[0] > busy_share[1]


def test_a_partial_rollout_resumes_by_prefilling_its_kept_tokens() -> None:
    """A request aborted at a weight update continues elsewhere from its tokens: its prompt and its
    kept tokens are prefilled under the new weights before it decodes again (pause abort's cost)."""
    prof = EngineProfile(base_s=0.01, per_seq_s=0.001, prefill_per_token_s=1e-4, max_num_batched_tokens=8192)

    def finish_time(kept: int) -> float:
        clock = VirtualClock()
        done: list[float] = []
        eng = Engine(clock, prof, lambda s: done.append(clock.now))
        eng.submit(Seq("r", 100, kept, kept + 1))  # one token left to make
        clock.run(lambda: False)
        return done[0]

    times = {kept: finish_time(kept) for kept in (0, 2000)}
    # one step either way: its prefill chunk is the prompt plus the kept tokens
    assert times[2000] - times[0] == pytest.approx(2000 * 1e-4)


def test_colocated_placement_runs_sync_only_and_pays_its_switch() -> None:
    _, res = _run({"placement": Placement.COLOCATED, "switch_s": 7.0}, "sync")
    _, plain = _run({}, "sync")
    assert [s.train_s for s in res.steps] == pytest.approx([s.train_s + 7.0 for s in plain.steps])
    with pytest.raises(SimulationError, match="colocated"):
        _run({"placement": Placement.COLOCATED}, "fully-async")


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_setups_are_well_formed(name: str) -> None:
    """Each published comparison: a colocated sync arm on all the GPUs, a disaggregated async arm on
    the same GPUs split, the paper's speed-up from its own step times, a source and assumptions."""
    r = PUBLISHED[name]
    assert r.sync.cluster.placement is Placement.COLOCATED and r.sync.mode == "sync"
    assert r.asynchronous.cluster.placement is Placement.DISAGGREGATED
    assert r.asynchronous.cluster.engines * 2 == r.sync.cluster.engines  # half the GPUs roll out
    assert r.published_speedup == pytest.approx(r.sync.published_step_s / r.asynchronous.published_step_s)
    assert 1.0 < r.published_speedup < 3.0
    assert "README" in r.source and r.assumptions
    RunConfig.model_validate(r.run)


def test_a_published_arm_simulates_and_holds_to_the_one_ideal() -> None:
    """The smallest published setup, briefly: both arms run, neither beats the ideal."""
    r = PUBLISHED["verl-fully-async-7b-32"]
    small = RunConfig.model_validate(
        r.run | {"data": r.run["data"] | {"train_batch_size": 32}, "trainer": {"ppo_mini_batch_size": 32}}
    )
    for arm in (r.sync, r.asynchronous):
        cfg = mode_config(small, arm.mode)
        wl = load_workload("rollpacker-14b")
        res = Simulation(cfg, arm.cluster, wl, 3).simulate()
        rep = mode_report(arm.mode, cfg, res, ideal(cfg, arm.cluster, wl), 0.0)
        assert 0 < rep.efficiency <= 1


def test_a_streaming_trainer_trains_parts_of_the_batch_as_they_arrive() -> None:
    """stream_chunks 4: the trainer starts on the first quarter of the groups while the rest are
    still generated, so sync-like s = 0 rollout hides 3/4 of the training; the same compute in all."""
    base = load_cluster("h100-7b", 8)
    streaming = base.trainer.model_copy(update={"stream_chunks": 4})
    _, whole = _run({}, "async-fifo+m1.0", versions=5)
    _, parts = _run({"trainer": streaming}, "async-fifo+m1.0", versions=5)
    # the compute per step is the same (the fixed part spread over the parts)
    assert sum(s.train_s for s in parts.steps) == pytest.approx(sum(s.train_s for s in whole.steps), rel=0.05)
    assert parts.sim_s < whole.sim_s
    assert all(len(s.staleness) == 16 for s in parts.steps)  # still B groups per version
    with pytest.raises(SimulationError, match="stream_chunks"):
        _run({"trainer": base.trainer.model_copy(update={"stream_chunks": 17})}, "sync")
