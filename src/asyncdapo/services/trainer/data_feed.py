"""Dataset → Redis prompt queue, kept at or above a watermark.

Order: epoch e visits the training set in the permutation drawn from `(seed, e)` (identity when
shuffle is off), so the whole order is a pure function of the cursor `(epoch, position)`.

Crash safety: each refill is one MULTI/EXEC transaction that writes the prompts' data, queues
their ids and moves the cursor stored in Redis (`RunKeys.trainer_feed`). The cursor in Redis
therefore always matches what was queued, and a restarted trainer continues from it: no prompt is
queued twice or skipped. The checkpoint keeps a copy, used only when Redis has no cursor (a fresh
Redis).

Lost replies and rollbacks: the transaction runs under WATCH of the cursor (and of the trainer
fence's keys), after re-reading the cursor from Redis. A refill whose EXEC reply was lost is simply
run again: it finds the cursor already moved and continues from there, so nothing is queued twice;
after a Redis rollback it finds the older cursor and queues the lost prompts again. A fenced-out
trainer queues nothing (its transaction fails, and `fence.check()` raises TrainerFenced).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import redis

from asyncdapo.contracts.config import PromptTruncation
from asyncdapo.contracts.prompting import fit_prompt
from asyncdapo.contracts.prompts import PromptRecord, epoch_order, prompt_id, queue_prompts
from asyncdapo.contracts.redis_keys import (
    TRAINER_PROMPTS_QUEUED,
    TRAINER_PROMPTS_TOO_LONG,
    RunKeys,
    decode_counters,
)
from asyncdapo.contracts.redis_keys import text as as_text
from asyncdapo.contracts.verl_format import Example

if TYPE_CHECKING:
    from asyncdapo.services.trainer.fence import TrainerFence

log = logging.getLogger(__name__)

COUNTER_TOO_LONG = TRAINER_PROMPTS_TOO_LONG
COUNTER_QUEUED = TRAINER_PROMPTS_QUEUED


@dataclass(frozen=True)
class Cursor:
    epoch: int = 0
    position: int = 0

    def to_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    @classmethod
    def from_dict(cls, d: dict[Any, Any]) -> Cursor:
        """From a dict with str or bytes keys/values (an HGETALL reply or a checkpoint)."""
        norm = decode_counters(d)
        return cls(epoch=norm["epoch"], position=norm["position"])


class PromptFeed:
    """Feeds `examples` into the run's prompt queue; `encode(example) -> (token ids, text)`."""

    def __init__(
        self,
        client: Any,
        keys: RunKeys,
        examples: Sequence[Example],
        encode: Callable[[Example], tuple[list[int], str]],
        *,
        watermark: int,
        max_prompt_length: int,
        seed: int,
        shuffle: bool,
        fence: TrainerFence | None = None,
        truncation: PromptTruncation = PromptTruncation.DROP,
    ) -> None:
        if not examples:
            raise ValueError("the training set is empty (data.train_files)")
        self.client = client
        self.keys = keys
        self.examples = examples
        self.encode = encode
        self.watermark = watermark
        self.max_prompt_length = max_prompt_length
        self.truncation = truncation
        self.seed = seed
        self.shuffle = shuffle
        self.fence = fence
        self.cursor = Cursor()
        self.transactions_retried = 0  # WATCH conflicts (a changed cursor or fence)
        self._order_epoch = -1
        self._order: np.ndarray = np.arange(0)

    def restore(self, checkpoint_cursor: Cursor | None) -> Cursor:
        """Continue from Redis' cursor if it has one, else from the checkpoint's, else the start."""
        stored = self.client.hgetall(self.keys.trainer_feed)
        if stored:
            self.cursor = Cursor.from_dict(stored)
        elif checkpoint_cursor is not None:
            self.cursor = checkpoint_cursor
        return self.cursor

    def _next(self, cursor: Cursor) -> tuple[int, Cursor]:
        """(dataset index at `cursor`, the cursor after it)."""
        if cursor.epoch != self._order_epoch:
            self._order = epoch_order(len(self.examples), self.seed, cursor.epoch, self.shuffle)
            self._order_epoch = cursor.epoch
        index = int(self._order[cursor.position])
        nxt = Cursor(cursor.epoch, cursor.position + 1)
        if nxt.position == len(self.examples):
            nxt = Cursor(cursor.epoch + 1, 0)
        return index, nxt

    def refill(self) -> int:
        """Queue prompts until the queue holds at least `watermark`; returns how many were queued.

        Safe to call again after any error, including a lost EXEC reply (see the module docstring)."""
        if self.watermark - int(self.client.llen(self.keys.prompts)) <= 0:
            return 0
        for _ in range(100):
            with self.client.pipeline(transaction=True) as pipe:
                try:
                    return self._refill_watched(pipe)
                except redis.WatchError:
                    self.transactions_retried += 1
                    continue
        raise RuntimeError(f"the prompt feed cursor {self.keys.trainer_feed} keeps changing under WATCH")

    def _refill_watched(self, pipe: Any) -> int:
        fence_keys = self.fence.lease_keys[:2] if self.fence else []
        pipe.watch(self.keys.trainer_feed, *fence_keys)
        if self.fence is not None:
            lease, epoch = pipe.mget(*fence_keys)
            if (
                lease is None
                or as_text(lease) != self.fence.trainer_id
                or int(epoch or 0) != self.fence.epoch
            ):
                pipe.unwatch()
                self.fence.check()  # raises TrainerFenced, or re-took our expired lease
                raise redis.WatchError("fence re-checked")
        stored = pipe.hgetall(self.keys.trainer_feed)
        if stored:
            in_redis = Cursor.from_dict(stored)
            if in_redis != self.cursor:
                log.warning(
                    "prompt feed cursor in Redis is %s, in memory %s (a refill whose reply was lost, or "
                    "a Redis rollback): continuing from Redis'", in_redis, self.cursor,
                )  # fmt: skip
                self.cursor = in_redis
        need = self.watermark - int(pipe.llen(self.keys.prompts))
        if need <= 0:
            pipe.unwatch()
            return 0
        records: list[PromptRecord] = []
        too_long = 0
        cursor = self.cursor
        visited = 0
        while len(records) < need:
            index, nxt = self._next(cursor)
            ex = self.examples[index]
            ids, text = self.encode(ex)
            where = f"training example {index} (data_source {ex.data_source!r}, extra_info.index {ex.source_index!r})"
            fitted = fit_prompt(ids, self.max_prompt_length, self.truncation, where)
            if fitted is None:
                too_long += 1
            else:
                ids = fitted
                records.append(PromptRecord(
                    id=prompt_id(cursor.epoch, index), prompt_token_ids=ids, prompt_text=text,
                    ground_truth=ex.ground_truth, data_source=ex.data_source,
                    epoch=cursor.epoch, index=index,
                ))  # fmt: skip
            cursor = nxt
            visited += 1
            if visited >= len(self.examples) and not records:
                raise ValueError(
                    f"no training prompt fits data.max_prompt_length={self.max_prompt_length} tokens "
                    "(data.truncation: drop)"
                )
        pipe.multi()
        queue_prompts(pipe, self.keys, records)
        pipe.hset(self.keys.trainer_feed, mapping=cursor.to_dict())
        pipe.hincrby(self.keys.counters, COUNTER_QUEUED, len(records))
        if too_long:
            pipe.hincrby(self.keys.counters, COUNTER_TOO_LONG, too_long)
        pipe.execute()
        self.cursor = cursor
        if too_long:
            log.info("skipped %d prompt(s) longer than max_prompt_length", too_long)
        return len(records)


def make_encoder(tokenizer: Any, apply_chat_template: bool) -> Callable[[Example], tuple[list[int], str]]:
    from asyncdapo.contracts.prompting import render_prompt

    def encode(ex: Example) -> tuple[list[int], str]:
        text = render_prompt(ex, tokenizer, apply_chat_template)
        # as asyncdapo.contracts.prompting.prompt_token_ids: the template carries its special tokens
        return list(tokenizer(text, add_special_tokens=False)["input_ids"]), text

    return encode
