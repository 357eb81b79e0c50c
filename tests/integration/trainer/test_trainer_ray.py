"""Data parallelism on Ray Train: two CPU workers (DDP, or FSDP2 shards, over gloo) make the same
update as one — through the whole trainer: checkpoint and weights snapshot gathered from the shards."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import required

from asyncdapo.contracts.redis_keys import GROUP_FIELD, RunKeys
from asyncdapo.services.trainer.launch import launch_ray
from asyncdapo.services.trainer.loop import Trainer
from asyncdapo.services.trainer.trainer_options import TrainerOptions


@pytest.mark.slow
@pytest.mark.parametrize("sharding", ["ddp", "fsdp"])
def test_two_ray_workers_match_one_worker(
    tmp_path: Path, make_config: Any, rollout: Any, redis_url: str, redis_client: Any, sharding: str
) -> None:
    required.module("ray.train")
    # 2 groups x 4 responses; mini-batch = 1 group = 4 rows -> 2 rows per worker, micro-batch 1:
    # the accumulation, the sharding and the DDP all-reduce are all exercised in one step.
    over = {
        "trainer__total_steps": 1,
        "trainer__micro_batch_size": 1,
        "algorithm__loss_agg_mode": "token-mean",
    }
    one = make_config(tmp_path / "one", **over)
    two = make_config(tmp_path / "two", **over, trainer__workers=2, trainer__sharding=sharding)
    one.name, two.name = "dp-one", f"dp-two-{sharding}"
    groups = rollout.produce(redis_client, RunKeys(one.name), iter(rollout.records(40, epoch=21)), 2)
    for g in groups:
        redis_client.xadd(RunKeys(two.name).groups, {GROUP_FIELD: g.SerializeToString()})

    single = Trainer(one, TrainerOptions(redis_url, tmp_path / "one", max_wait_s=30))
    before = {k: v.detach().clone() for k, v in single.model.state_dict().items()}
    single.run()
    launch_ray(two, TrainerOptions(redis_url, tmp_path / "two", max_wait_s=60), num_cpus=2)

    from safetensors.torch import load_file

    a = load_file(str(tmp_path / "one" / "weights" / "v1" / "model.safetensors"))
    b = load_file(str(tmp_path / "two" / "weights" / "v1" / "model.safetensors"))
    assert a.keys() == b.keys()
    worst = 0.0
    for k in a:
        delta_a, delta_b = a[k] - before[k], b[k] - before[k]
        assert delta_a.abs().max() > 0, k  # the step did change every tensor
        # AdamW's first step is ~lr * sign(g): allow float-summation-order noise on tiny gradients
        rel = float((delta_a - delta_b).norm() / delta_a.norm())
        worst = max(worst, rel)
        assert rel < 1e-3, (k, rel)
    print(f"max relative difference of the 1- and 2-worker updates: {worst:.2e}")
    lines = (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 1  # only rank 0 writes
    record = json.loads(lines[0])
    assert record["workers"] == 2
    assert record["actor/optimizer_steps"] == 2.0
    # the checkpoint is the replicated format whatever the sharding: a single process resumes it
    import torch

    (step,) = sorted((tmp_path / "two" / "checkpoints").glob("step-*"))
    state = torch.load(step / "model.pt", weights_only=True)
    assert state.keys() == before.keys() and all(not hasattr(v, "placements") for v in state.values())
