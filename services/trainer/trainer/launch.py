"""Starting the trainer: in-process for `trainer.workers: 1`, on Ray Train otherwise.

With W > 1 workers, Ray Train's TorchTrainer starts W processes with an initialised process
group (gloo on CPU, NCCL on GPU); each runs the same `Trainer` as a rank of a DDP job. Rank 0 does
all I/O. The Ray cluster is the one at RAY_ADDRESS when set (a RayCluster on Kubernetes), else a
local one started for the run.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Any

from asyncdapo.config import RunConfig
from asyncdapo.trainer.checkpoint import TrainerState
from asyncdapo.trainer.loop import Trainer, TrainerOptions

log = logging.getLogger(__name__)

# rank 0 may block for a whole rollout phase while the others wait in a broadcast
PROCESS_GROUP_TIMEOUT_S = 6 * 3600


def run_training(cfg: RunConfig, opts: TrainerOptions) -> TrainerState | None:
    if cfg.trainer.workers == 1:
        return Trainer(cfg, opts).run()
    launch_ray(cfg, opts)
    return None


def _options_to_dict(opts: TrainerOptions) -> dict[str, Any]:
    d = dataclasses.asdict(opts)
    d["out_dir"] = str(opts.out_dir)
    return d


def _worker_main(config: dict[str, Any]) -> None:
    """Entry point of each Ray Train worker."""
    import ray.train
    import ray.train.torch
    import torch

    from asyncdapo.trainer.dist import DistContext

    logging.basicConfig(level=config.get("log_level", "INFO"), format="%(asctime)s %(name)s %(message)s")
    ctx = ray.train.get_context()
    device = ray.train.torch.get_device()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist = DistContext(rank=ctx.get_world_rank(), world=ctx.get_world_size(), device=device)
    cfg = RunConfig.model_validate(config["cfg"])
    opts_d = dict(config["opts"])
    opts_d["out_dir"] = Path(opts_d["out_dir"])
    Trainer(cfg, TrainerOptions(**opts_d), dist).run()


def launch_ray(cfg: RunConfig, opts: TrainerOptions, num_cpus: int | None = None) -> None:
    import ray
    import torch
    from ray.train import RunConfig as RayRunConfig
    from ray.train import ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    use_gpu = torch.cuda.is_available()
    started = False
    if not ray.is_initialized():
        address = os.environ.get("RAY_ADDRESS")
        ray.init(address=address, num_cpus=None if address else num_cpus, include_dashboard=False,
                 log_to_driver=True)  # fmt: skip
        started = True
    try:
        trainer = TorchTrainer(
            _worker_main,
            train_loop_config={
                "cfg": cfg.model_dump(mode="json"),
                "opts": _options_to_dict(opts),
                "log_level": logging.getLevelName(logging.getLogger().level),
            },
            scaling_config=ScalingConfig(
                num_workers=cfg.trainer.workers,
                use_gpu=use_gpu,
                resources_per_worker=None if use_gpu else {"CPU": 1},
            ),
            torch_config=TorchConfig(
                backend="nccl" if use_gpu else "gloo", timeout_s=PROCESS_GROUP_TIMEOUT_S
            ),
            run_config=RayRunConfig(
                name=f"asyncdapo-{cfg.name}", storage_path=str(Path(opts.out_dir).resolve() / "ray")
            ),
        )
        trainer.fit()
    finally:
        if started:
            ray.shutdown()
