"""SIMULATOR: the prompts the trainer's feed pushes, in the order the real trainer pushes them.

A workload with a dataset (`Sampler.dataset_size`, a replay) is fed in the trainer's own seeded
epoch order over its rows (`asyncdapo.contracts.prompts.epoch_order`, the same function the trainer calls),
so a replay meets the prompts the real run met; a parametric workload is fed prompt 0, 1, 2, …
"""

from __future__ import annotations

from typing import Any

from asyncdapo.contracts.config import DataConfig
from asyncdapo.contracts.prompts import PromptRecord, epoch_order, prompt_id
from asyncdapo.tools.simulate.workload import Sampler


class PromptFeed:
    def __init__(self, workload: Sampler, data: DataConfig) -> None:
        self.workload = workload
        self.data = data
        self.next = 0  # prompts fed so far
        self._orders: dict[int, Any] = {}  # the current epoch's row order (datasets)

    def records(self, count: int) -> list[PromptRecord]:
        """The next `count` prompts' records."""
        recs = []
        size = self.workload.dataset_size
        for _ in range(count):
            epoch, i = 0, self.next
            self.next += 1
            if size:
                epoch, pos = divmod(i, size)
                if epoch not in self._orders:
                    self._orders = {epoch: epoch_order(size, self.data.seed, epoch, self.data.shuffle)}
                i = int(self._orders[epoch][pos])
            plen = self.workload.prompt_length(i)
            recs.append(PromptRecord(prompt_id(epoch, i), range(plen), "", "sim", "sim", epoch, i))
        return recs
