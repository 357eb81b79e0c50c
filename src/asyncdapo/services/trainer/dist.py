"""Data-parallel context: rank/world and the few collectives the loop needs.

With `world == 1` every method is a local no-op, so the single-worker trainer runs without
torch.distributed (and without Ray). With `world > 1` the process group has been initialised by
Ray Train's TorchTrainer (gloo on CPU, NCCL on GPU).

Sharding rule (shared by the old-log-prob pass and the update so each rank only computes rows it
trains): within a mini-batch's rows, rank r owns rows[r::world].
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def shard(self, rows: Sequence[int]) -> list[int]:
        return list(rows[self.rank :: self.world])

    def broadcast(self, obj: Any) -> Any:
        """`obj` from rank 0 on every rank (pickled)."""
        if self.world == 1:
            return obj
        import torch.distributed as dist

        box = [obj if self.is_main else None]
        dist.broadcast_object_list(box, src=0, device=self.device if self.device.type == "cuda" else None)
        return box[0]

    def all_reduce_sum(self, t: Tensor) -> Tensor:
        if self.world == 1:
            return t
        import torch.distributed as dist

        t = t.to(self.device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()
