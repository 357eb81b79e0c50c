"""Starting the trainer: in-process for `trainer.workers: 1`, on Ray Train otherwise.

With W > 1 workers, Ray Train's TorchTrainer starts W processes with an initialised process
group (gloo on CPU, NCCL on GPU); each runs the same `Trainer` as a rank of a DDP (or FSDP) job.
Rank 0 does all I/O. The Ray cluster is the one at RAY_ADDRESS when set (a RayCluster on
Kubernetes), else a local one started for the run.

GPUs come from the config (`trainer.gpus_per_worker`, set by the operator from the TrainingRun),
never from what the driver sees: on KubeRay the driver runs on the GPU-less head. Each worker asks
for its GPUs (or one CPU; Ray Train's controller reserves nothing), so one worker fills one KubeRay
worker pod; every rank serves /metrics on the metrics port (rank 0 the trainer's metrics, the
others their rank), so each endpoint of the trainer's metrics Service answers.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Any

from asyncdapo.contracts.config import RunConfig
from asyncdapo.services.trainer.checkpoint import TrainerState
from asyncdapo.services.trainer.loop import Trainer
from asyncdapo.services.trainer.trainer_options import TrainerOptions

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

    from asyncdapo.services.trainer.dist import DistContext

    logging.basicConfig(level=config.get("log_level", "INFO"), format="%(asctime)s %(name)s %(message)s")
    ctx = ray.train.get_context()
    device = ray.train.torch.get_device()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist = DistContext(rank=ctx.get_world_rank(), world=ctx.get_world_size(), device=device)
    cfg = RunConfig.model_validate(config["cfg"])
    opts_d = dict(config["opts"])
    opts_d["out_dir"] = Path(opts_d["out_dir"])
    if dist.rank != 0 and opts_d.get("metrics_port") is not None:
        _serve_rank(dist.rank, dist.world, opts_d["metrics_port"])
    Trainer(cfg, TrainerOptions(**opts_d), dist).run()


def _serve_rank(rank: int, world: int, port: int) -> None:
    """A rank other than 0 exports only who it is: the trainer's metrics come from rank 0."""
    from prometheus_client import CollectorRegistry, Gauge, start_http_server

    registry = CollectorRegistry()
    Gauge("asyncdapo_trainer_worker_rank", "Data-parallel rank of this worker", registry=registry).set(rank)
    Gauge("asyncdapo_trainer_workers", "Data-parallel workers", registry=registry).set(world)
    start_http_server(port, addr="0.0.0.0", registry=registry)


def worker_resources(cfg: RunConfig, cuda_on_driver: bool) -> tuple[bool, dict[str, float]]:
    """(use_gpu, Ray resources of one worker): from `trainer.gpus_per_worker`; only when it is not
    set (a local run) from whether the driver sees CUDA."""
    gpus = cfg.trainer.gpus_per_worker
    if gpus is None:
        gpus = 1 if cuda_on_driver else 0
    return (True, {"GPU": float(gpus)}) if gpus > 0 else (False, {"CPU": 1.0})


def launch_ray(cfg: RunConfig, opts: TrainerOptions, num_cpus: int | None = None) -> None:
    import ray
    import torch
    from ray.train import RunConfig as RayRunConfig
    from ray.train import ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    use_gpu, per_worker = worker_resources(cfg, cuda_on_driver=torch.cuda.is_available())
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
                resources_per_worker=per_worker,  # Ray Train v2's controller reserves nothing
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
