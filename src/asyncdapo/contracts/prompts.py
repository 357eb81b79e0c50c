"""The prompt queue record shared by the trainer (producer) and the scheduler (consumer).

Layout in Redis (keys from `asyncdapo.contracts.redis_keys.RunKeys`):
- `RunKeys.prompt_data(id)`: a HASH holding one `PromptRecord` (`PromptRecord.to_redis()`), written
  before the id is queued, so a consumer that pops an id can always read its data;
- `RunKeys.prompts`: a LIST of ids, pushed with RPUSH (head = next to admit).

HASH fields, all strings:
    id                str   unique per (epoch, dataset index): `e{epoch}-{index}`
    prompt_token_ids  str   JSON array of ints, the rendered prompt (chat template applied)
    prompt_text       str   the rendered prompt text the ids were made from
    ground_truth      str   reward_model.ground_truth of the dataset row
    data_source       str   the row's data_source ("" when absent)
    epoch             str   decimal int, pass over the dataset that queued it (0-based)
    index             str   decimal int, row index in the training set
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from asyncdapo.contracts.redis_keys import RunKeys, decode_map

FIELDS = ("id", "prompt_token_ids", "prompt_text", "ground_truth", "data_source", "epoch", "index")


class PromptRecordError(ValueError):
    """A prompt record read from Redis is missing a field or has a malformed one."""


def prompt_id(epoch: int, index: int) -> str:
    """The queue id of dataset row `index` queued in `epoch` (unique over the whole run)."""
    return f"e{epoch}-{index}"


def epoch_order(n: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The order the trainer queues dataset rows 0..n-1 in `epoch` (`data.seed`, `data.shuffle`);
    the simulator feeds prompts in the same order."""
    if not shuffle:
        return np.arange(n)
    return np.random.default_rng([seed, epoch]).permutation(n)


@dataclass(frozen=True)
class PromptRecord:
    id: str
    prompt_token_ids: Sequence[int]  # a list; the simulator passes range(n): only len is read
    prompt_text: str
    ground_truth: str
    data_source: str
    epoch: int
    index: int

    def to_redis(self) -> dict[str, str]:
        """The HASH mapping for `HSET RunKeys.prompt_data(id)`."""
        return {
            "id": self.id,
            "prompt_token_ids": json.dumps(list(self.prompt_token_ids), separators=(",", ":")),
            "prompt_text": self.prompt_text,
            "ground_truth": self.ground_truth,
            "data_source": self.data_source,
            "epoch": str(self.epoch),
            "index": str(self.index),
        }

    @classmethod
    def from_redis(cls, mapping: Mapping[Any, Any]) -> PromptRecord:
        """Parse an HGETALL reply (bytes or str keys/values); errors name the field."""
        data = decode_map(mapping)
        missing = [f for f in FIELDS if f not in data]
        if missing:
            raise PromptRecordError(f"prompt record {data.get('id', '?')!r} is missing field(s) {missing}")
        try:
            ids = json.loads(data["prompt_token_ids"])
        except json.JSONDecodeError as err:
            raise PromptRecordError(
                f"prompt record {data['id']!r}: prompt_token_ids is not JSON: {err}"
            ) from None
        if not isinstance(ids, list) or not all(isinstance(t, int) and t >= 0 for t in ids):
            raise PromptRecordError(
                f"prompt record {data['id']!r}: prompt_token_ids must be a list of non-negative ints"
            )
        return cls(
            id=data["id"],
            prompt_token_ids=ids,
            prompt_text=data["prompt_text"],
            ground_truth=data["ground_truth"],
            data_source=data["data_source"],
            epoch=_int(data, "epoch"),
            index=_int(data, "index"),
        )


def queue_prompts(pipe: Any, keys: RunKeys, records: Iterable[PromptRecord]) -> int:
    """Add HSET data + RPUSH id for each record to a redis pipeline (execute is the caller's)."""
    ids = []
    for rec in records:
        pipe.hset(keys.prompt_data(rec.id), mapping=rec.to_redis())
        ids.append(rec.id)
    if ids:
        pipe.rpush(keys.prompts, *ids)
    return len(ids)


def load_prompt(client: Any, keys: RunKeys, pid: str) -> PromptRecord | None:
    """The record of prompt `pid`, or None when its data HASH does not exist."""
    mapping = client.hgetall(keys.prompt_data(pid))
    return PromptRecord.from_redis(mapping) if mapping else None


def _int(data: Mapping[str, str], field: str) -> int:
    try:
        return int(data[field])
    except ValueError:
        raise PromptRecordError(
            f"prompt record {data['id']!r}: {field} must be an integer, got {data[field]!r}"
        ) from None
