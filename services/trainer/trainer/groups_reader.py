"""Reading whole groups from the run's groups stream with the `trainer` consumer group.

Delivery contract (no group lost, none trained twice):
- an entry stays pending (un-XACKed) until the checkpoint covering the step that trained it is
  durable; the checkpoint records the ids it covers, and a restart XACKs them first (the crash may
  have hit between the checkpoint and the XACK);
- on start the reader takes over every pending entry (XAUTOCLAIM, whatever consumer read it) and
  replays them, oldest first, before reading new entries: those are the groups of steps that were
  lost with the process, and they are trained exactly once more;
- a group that cannot be trained (stale, from a lost future version, malformed, deleted from the
  stream) is XACKed at once and counted under its `DropReason`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import redis

from asyncdapo.redis_keys import GROUP_FIELD, GROUPS_CONSUMER_GROUP, RunKeys
from asyncdapo.trainer.batch import MalformedGroup, validate_group
from asyncdapo.v1 import rollout_pb2

log = logging.getLogger(__name__)


class DropReason(StrEnum):
    STALE = "stale"  # min_version < version - max_staleness
    FUTURE = "future"  # produced by a version newer than the trainer's (lost in a rollback)
    MALFORMED = "malformed"  # violates the Group contract or does not parse
    MISSING = "missing"  # the entry's data was trimmed from the stream before it was read


def dropped_counter(reason: DropReason) -> str:
    return f"trainer:dropped:{reason.value}"


@dataclass(frozen=True)
class Entry:
    id: str
    group: rollout_pb2.Group | None  # None: unreadable; `error` says why
    error: DropReason | None = None
    detail: str = ""


def classify(
    group: rollout_pb2.Group,
    version: int,
    max_staleness: int,
    vocab_size: int,
    max_response_length: int,
) -> tuple[DropReason | None, str]:
    """(None, "") if `group` may train the policy at `version`, else (reason, detail)."""
    try:
        validate_group(group, vocab_size, max_response_length)
    except MalformedGroup as err:
        return DropReason.MALFORMED, str(err)
    if group.min_version < version - max_staleness:
        return DropReason.STALE, f"min_version {group.min_version} < {version} - {max_staleness}"
    if group.max_version > version:
        return DropReason.FUTURE, f"max_version {group.max_version} > trainer version {version}"
    return None, ""


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _parse(entry_id: Any, fields: Any) -> Entry:
    eid = _text(entry_id)
    if not fields:
        return Entry(eid, None, DropReason.MISSING, "entry deleted from the stream")
    raw = fields.get(GROUP_FIELD.encode(), fields.get(GROUP_FIELD))
    if raw is None:
        return Entry(eid, None, DropReason.MALFORMED, f"no field {GROUP_FIELD!r}")
    group = rollout_pb2.Group()
    try:
        group.ParseFromString(raw if isinstance(raw, bytes) else raw.encode("latin-1"))
    except Exception as err:  # protobuf raises DecodeError and friends
        return Entry(eid, None, DropReason.MALFORMED, f"not a Group: {err}")
    return Entry(eid, group)


class GroupsReader:
    def __init__(self, client: redis.Redis, keys: RunKeys, consumer: str = "trainer-0") -> None:
        self.client = client
        self.keys = keys
        self.consumer = consumer
        self._replay_from: str | None = "0-0"  # None once every pending entry was replayed

    def start(self, covered_by_checkpoint: list[str]) -> tuple[int, int]:
        """Create the consumer group, XACK what the last checkpoint covers, take over pending
        entries; returns (entries to replay, pending entries found trimmed from the stream)."""
        try:
            self.client.xgroup_create(self.keys.groups, GROUPS_CONSUMER_GROUP, id="0", mkstream=True)
        except redis.ResponseError as err:
            if "BUSYGROUP" not in str(err):
                raise
        if covered_by_checkpoint:
            self.client.xack(self.keys.groups, GROUPS_CONSUMER_GROUP, *covered_by_checkpoint)
        start = "0-0"
        missing = 0
        while True:
            reply = self.client.xautoclaim(
                self.keys.groups,
                GROUPS_CONSUMER_GROUP,
                self.consumer,
                min_idle_time=0,
                start_id=start,
                count=256,
            )
            # Redis >= 7 drops pending entries whose data was trimmed and lists them third
            missing += len(reply[2]) if len(reply) > 2 else 0
            start = _text(reply[0])
            if start == "0-0":
                break
        if missing:
            log.warning("%d pending group(s) were trimmed from the stream before training", missing)
            self.client.hincrby(self.keys.counters, dropped_counter(DropReason.MISSING), missing)
        self._replay_from = "0-0"
        return self.pending_count(), missing

    def read(self, count: int, block_ms: int) -> list[Entry]:
        """Up to `count` entries: pending ones being replayed first, then new ones."""
        if count <= 0:
            return []
        if self._replay_from is not None:
            reply = self.client.xreadgroup(
                GROUPS_CONSUMER_GROUP, self.consumer, {self.keys.groups: self._replay_from}, count=count
            )
            entries = [_parse(i, f) for i, f in (reply[0][1] if reply else [])]
            if entries:
                self._replay_from = entries[-1].id
                return entries
            self._replay_from = None
        reply = self.client.xreadgroup(
            GROUPS_CONSUMER_GROUP, self.consumer, {self.keys.groups: ">"}, count=count, block=block_ms
        )
        return [_parse(i, f) for i, f in (reply[0][1] if reply else [])]

    def drop(self, entries: list[tuple[Entry, DropReason]]) -> None:
        """XACK groups that will never be trained and count them by reason, atomically."""
        if not entries:
            return
        pipe = self.client.pipeline(transaction=True)
        pipe.xack(self.keys.groups, GROUPS_CONSUMER_GROUP, *[e.id for e, _ in entries])
        for _, reason in entries:
            pipe.hincrby(self.keys.counters, dropped_counter(reason), 1)
        pipe.execute()

    def ack(self, ids: list[str]) -> int:
        if not ids:
            return 0
        return int(self.client.xack(self.keys.groups, GROUPS_CONSUMER_GROUP, *ids))

    def pending_count(self) -> int:
        return int(self.client.xpending(self.keys.groups, GROUPS_CONSUMER_GROUP)["pending"])
