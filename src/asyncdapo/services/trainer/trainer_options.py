"""What a trainer process is given (its options beside the run config) and what it refuses: run
configs this trainer cannot work with, and durable state that does not add up."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from asyncdapo.contracts.config import RunConfig
from asyncdapo.contracts.errors import AsyncdapoError
from asyncdapo.services.trainer.fence import DEFAULT_LEASE_S, default_trainer_id

log = logging.getLogger(__name__)


class TrainerConfigError(AsyncdapoError, ValueError):
    """The run config cannot work with this trainer setup; the message names the fields."""


class TrainerStateError(AsyncdapoError, RuntimeError):
    """Durable state (checkpoints, Redis, scheduler) is inconsistent; the message says how."""


@dataclass
class TrainerOptions:
    redis_url: str
    out_dir: Path  # metrics.jsonl, trained.jsonl; checkpoints go to cfg.trainer.checkpoint_dir
    scheduler: str | None = None
    token: str | None = None
    scheduler_tls_ca: str | None = None  # PEM CA: call the scheduler over TLS
    metrics_port: int | None = None
    consumer: str = "trainer-0"
    poll_ms: int = 500
    max_wait_s: float | None = None  # give up when no group arrives for this long (None: wait forever)
    max_steps: int | None = None  # stop after this many steps in this process (None: until total_steps)
    # the lease holder's id: unique per process by default; the same id takes its own lease over at
    # once (a restart of the same container), any other waits for it to expire
    trainer_id: str = field(default_factory=default_trainer_id)
    lease_s: float = DEFAULT_LEASE_S
    # trainer.weight_transport stream: where the WeightStore listens, and the address gateways dial
    # (None: the listen host with the bound port)
    weight_store_listen: str = "127.0.0.1:0"
    weight_store_advertise: str | None = None


def check_config(cfg: RunConfig) -> None:
    t, s = cfg.trainer, cfg.rollout.max_staleness
    # on the exact s, not its window: steps v .. v + k - 1 train on groups of version v, so the bound
    # floor((v + 1 + s)·B) must reach (v + k)·B
    if t.publish_every > 1 and s < t.publish_every - 1:
        raise TrainerConfigError(
            f"trainer.publish_every={t.publish_every} needs rollout.max_staleness >= {t.publish_every - 1}: "
            "groups are produced by published versions only, so with less staleness the trainer waits forever"
        )
    rows = t.ppo_mini_batch_size * cfg.rollout.n
    if t.workers > rows:
        raise TrainerConfigError(
            f"trainer.workers={t.workers} exceeds the {rows} responses of a mini-batch "
            "(trainer.ppo_mini_batch_size x rollout.n)"
        )
