"""Reading whole groups from the run's groups stream with the `trainer` consumer group.

Delivery contract: every committed group is trained exactly once, or dropped (and credited) exactly
once — across trainer crashes, overlapping trainers, Redis restarts, lost replies and Redis
rollbacks of a consumer-group position or an XACK.

- Pending until durable: an entry the trainer trains stays pending (un-XACKed) until a checkpoint
  covering its step is durable; the checkpoint lists the ids it covers, a restart XACKs them first
  (the crash may have hit between the checkpoint and the XACK).
- Replay: once the trainer holds the lease (`fence.py`) it takes over every pending entry
  (XAUTOCLAIM, whatever consumer read it) and replays them oldest first before reading new ones:
  the groups of steps lost with the previous process, trained exactly once more.
- Drops credited: a group that will never be trained (stale, from a lost future version,
  malformed, deleted from the stream) is XACKed and credited in one script (atomic, replicated and
  written to the AOF as one MULTI/EXEC): 1 to `trainer:dropped:<reason>` and to `valid_credited`
  (the scheduler's bound), together with a marker (`RunKeys.trainer_credited`) that the script
  checks first. A retry after a lost reply or a redelivery therefore credits nothing twice, and a
  Redis rollback loses the XACK, the credit and the marker together (the entry comes back and is
  credited once, when it is dropped again).
- Redelivery fence: the reader keeps the newest stream id processed (trained or dropped;
  `TrainerState.last_stream_id` in the checkpoint). An entry delivered again with an id at or below
  it (Redis rolled back the group's last-delivered id or an XACK) is never trained again: if this
  trainer dropped it (it remembers its drops, and the trained log lists those of checkpointed steps) it
  is dropped again, which credits it only if Redis lost the first credit (no marker); otherwise it
  was trained and is XACKed once a durable checkpoint covers it. Counted as `trainer:redelivered`.
- Every script that writes (read, drop, XACK + trim) checks the trainer fence first, atomically;
  a fenced-out trainer reads nothing more (nothing it reads could get stuck as its pending entry).
- Lost replies: a read whose reply is lost leaves its entries pending for this consumer; after any
  Redis error the reader re-claims and re-reads its whole pending list (that also catches entries
  whose XACK a Redis restart rolled back), so they are replayed, not lost.
- Trimming: after a durable checkpoint and its XACK, the stream is trimmed to MINID = the oldest
  entry still pending, or (none) last-delivered-id + 1: nothing unacknowledged is ever trimmed.
  Credit markers older than MINID go with it (their entries can no longer be delivered).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar, cast

import redis

from asyncdapo.contracts.redis_keys import (
    GROUP_FIELD,
    GROUPS_CONSUMER_GROUP,
    TRAINER_DROPPED_PREFIX,
    TRAINER_REDELIVERED,
    VALID_CREDITED,
    RunKeys,
    text,
)
from asyncdapo.contracts.redis_scripts import RedisScript, script
from asyncdapo.contracts.v1 import rollout_pb2
from asyncdapo.runtime.redis_outage import RedisWaiter
from asyncdapo.services.trainer.batch import MalformedGroup, validate_group
from asyncdapo.services.trainer.fence import TrainerFence
from asyncdapo.services.trainer.redis_io import TRAINER_REDIS_BACKOFF

log = logging.getLogger(__name__)

T = TypeVar("T")


class GroupDropReason(StrEnum):
    STALE = "stale"  # min_version < version - ceil(s) (`RunConfig.staleness_window`)
    FUTURE = "future"  # produced by a version newer than the trainer's (lost in a rollback)
    MALFORMED = "malformed"  # violates the Group contract or does not parse
    MISSING = "missing"  # the entry's data was trimmed from the stream before it was read


def dropped_counter(reason: GroupDropReason) -> str:
    return TRAINER_DROPPED_PREFIX + reason.value


def stream_id(sid: str) -> tuple[int, int]:
    ms, _, seq = sid.partition("-")
    return int(ms), int(seq or 0)


# The stream scripts (asyncdapo/contracts/redis_scripts/trainer_groups_*.lua: KEYS, ARGV, replies),
# each starting with the fence check (FENCE_LUA) and, but for settle, the stream-id helpers.
_READ = script(RedisScript.TRAINER_GROUPS_READ)
_SETTLE = script(RedisScript.TRAINER_GROUPS_SETTLE)
_CLAIM_ALL = script(RedisScript.TRAINER_GROUPS_CLAIM_ALL)
_COMMIT = script(RedisScript.TRAINER_GROUPS_COMMIT)


@dataclass(frozen=True)
class Entry:
    id: str
    group: rollout_pb2.Group | None  # None: unreadable; `error` says why
    error: GroupDropReason | None = None
    detail: str = ""


def classify(
    group: rollout_pb2.Group,
    version: int,
    staleness_window: int,
    vocab_size: int,
    max_response_length: int,
) -> tuple[GroupDropReason | None, str]:
    """(None, "") if `group` may train the policy at `version`, else (reason, detail).
    `staleness_window` is ceil(s) (`RunConfig.staleness_window`): every group the bound
    floor((v + 1 + s)·B) lets the scheduler commit under version v trains by step v + ceil(s)."""
    try:
        validate_group(group, vocab_size, max_response_length)
    except MalformedGroup as err:
        return GroupDropReason.MALFORMED, str(err)
    if group.min_version < version - staleness_window:
        return GroupDropReason.STALE, f"min_version {group.min_version} < {version} - {staleness_window}"
    if group.max_version > version:
        return GroupDropReason.FUTURE, f"max_version {group.max_version} > trainer version {version}"
    return None, ""


def _parse(entry_id: Any, fields: Any) -> Entry:
    eid = text(entry_id)
    if not fields:
        return Entry(eid, None, GroupDropReason.MISSING, "entry deleted from the stream")
    if isinstance(fields, list):  # a script's reply: flat [field, value, ...]
        fields = {text(fields[i]): fields[i + 1] for i in range(0, len(fields) - 1, 2)}
    raw = fields.get(GROUP_FIELD.encode(), fields.get(GROUP_FIELD))
    if raw is None:
        return Entry(eid, None, GroupDropReason.MALFORMED, f"no field {GROUP_FIELD!r}")
    group = rollout_pb2.Group()
    try:
        group.ParseFromString(raw if isinstance(raw, bytes) else raw.encode("latin-1"))
    except Exception as err:  # protobuf raises DecodeError and friends
        return Entry(eid, None, GroupDropReason.MALFORMED, f"not a Group: {err}")
    return Entry(eid, group)


class GroupsReader:
    """The trainer's view of the stream (rank 0 only). `fence` None: unfenced (tools, tests)."""

    def __init__(
        self,
        client: redis.Redis,
        keys: RunKeys,
        consumer: str = "trainer-0",
        fence: TrainerFence | None = None,
        waiter: RedisWaiter | None = None,
    ) -> None:
        self.client = client
        self.keys = keys
        self.consumer = consumer
        self.fence = fence
        self.waiter = waiter or (
            fence.waiter if fence else RedisWaiter(TRAINER_REDIS_BACKOFF, give_up_after_s=0)
        )
        self.newest = "0-0"  # newest stream id processed (trained, about to be trained, or dropped)
        self.dropped: dict[str, GroupDropReason] = {}  # every drop this trainer knows of (redeliveries)
        self.uncovered: set[str] = set()  # read for training, not yet covered by a durable checkpoint
        self.redelivered = 0  # redelivered entries seen by this process
        self.rescans = 0
        self._replay_from: str | None = "0-0"  # None once every pending entry was replayed
        self._outages_seen = self.waiter.outages
        self._wait_from = "0-0"  # side-effect-free XREAD position while waiting for new entries
        self._read = client.register_script(_READ)
        self._settle_script = client.register_script(_SETTLE)
        self._claim_all = client.register_script(_CLAIM_ALL)
        self._commit = client.register_script(_COMMIT)

    # ------------------------------------------------------------------ plumbing

    def _fence_args(self) -> list[str]:
        return self.fence.script_args() if self.fence else ["", "0"]

    def _fence_keys(self) -> list[str]:
        return [self.keys.trainer_lease, self.keys.trainer_epoch]

    def _call(self, fn: Callable[[int], T], what: str) -> T:
        return self.waiter.call(fn, what)

    def _script(self, script: Any, keys: list[str], args: Callable[[int], list[Any]], what: str) -> Any:
        """Run a FENCE_LUA script through the waiter; `args(attempt)`."""

        def once(attempt: int) -> Any:
            def call() -> Any:
                return script(keys=self._fence_keys() + keys, args=self._fence_args() + args(attempt))

            return self.fence.run_fenced(call) if self.fence else call()

        return self._call(once, what)

    def _is_new(self, sid: str) -> bool:
        return stream_id(sid) > stream_id(self.newest)

    # ------------------------------------------------------------------ start

    def start(
        self,
        covered_by_checkpoint: list[str],
        newest: str = "0-0",
        dropped: dict[str, GroupDropReason] | None = None,
    ) -> tuple[int, int]:
        """Create the consumer group, XACK what the last checkpoint covers, take over pending
        entries; returns (entries to replay, pending entries found deleted from the stream).

        `newest`: the checkpoint's newest processed stream id (the redelivery fence); `dropped`:
        the drops the trainer's trained log lists (a redelivered one of them is dropped again)."""

        def create(_a: int) -> None:
            try:
                self.client.xgroup_create(self.keys.groups, GROUPS_CONSUMER_GROUP, id="0", mkstream=True)
            except redis.ResponseError as err:
                if "BUSYGROUP" not in str(err):
                    raise

        self._call(create, "consumer group creation")
        self.newest = newest
        self.dropped = dict(dropped or {})
        self.uncovered = set()
        if covered_by_checkpoint:
            self._script(self._commit, [self.keys.groups, self.keys.trainer_credited],
                         lambda _a: [GROUPS_CONSUMER_GROUP, *covered_by_checkpoint], "XACK of checkpointed groups")  # fmt: skip
        missing = self._take_over()
        return self.pending_count(), missing

    def _take_over(self) -> int:
        """XAUTOCLAIM every pending entry for this consumer and replay the pending list from the start."""
        reply = self._script(
            self._claim_all, [self.keys.groups, self.keys.counters, self.keys.trainer_credited],
            lambda _a: [GROUPS_CONSUMER_GROUP, self.consumer, self.newest,
                        dropped_counter(GroupDropReason.MISSING), VALID_CREDITED],
            "claim of pending groups",
        )  # fmt: skip
        missing = int(reply[2])
        if missing:
            log.warning("%d pending group(s) were deleted from the stream before training; credited", missing)
        self._replay_from = "0-0"
        self._outages_seen = self.waiter.outages
        return missing

    # ------------------------------------------------------------------ reading

    def read(self, count: int, block_ms: int) -> list[Entry]:
        """Up to `count` entries newer than everything processed: pending ones being replayed
        first, then new ones (waiting up to `block_ms` for one). Redeliveries are settled here."""
        if count <= 0:
            return []
        waited = False
        while True:
            if self.waiter.outages != self._outages_seen:
                # Redis restarted (and may have rolled back) or a reply was lost, possibly that of a
                # '>' read whose entries now sit in our pending list: re-claim and replay the list
                self.rescans += 1
                log.info("re-reading the pending groups after a Redis error")
                self._take_over()
            if self._replay_from is not None:
                entries, _ = self._read_once(count, self._replay_from)
                if entries:
                    self._replay_from = entries[-1].id
                    fresh = self._settle(entries, from_pending=True)
                    if fresh:
                        return fresh
                    continue
                self._replay_from = None
            entries, last = self._read_once(count, ">")
            if self.waiter.outages != self._outages_seen:
                continue  # this read was retried: replay instead (top of the loop)
            if entries:
                fresh = self._settle(entries, from_pending=False)
                if fresh:
                    return fresh
                continue  # all of them were redeliveries: read on
            if waited or block_ms <= 0:
                return []
            self._wait_new(last, block_ms)
            waited = True

    def _read_once(self, count: int, start: str) -> tuple[list[Entry], str]:
        """One fenced XREADGROUP; returns (entries, the group's last-delivered id when '>' read none)."""
        reply = self._script(
            self._read, [self.keys.groups], lambda _a: [GROUPS_CONSUMER_GROUP, self.consumer, count, start],
            "read of groups",
        )  # fmt: skip
        raw = reply[2] if len(reply) > 2 else []
        return [_parse(e[0], e[1]) for e in raw], text(reply[1])

    def _wait_new(self, last_delivered: str, block_ms: int) -> None:
        """Block until an entry newer than the group's last-delivered id exists (XREAD has no side
        effects, so a fenced-out or crashing trainer cannot strand anything here)."""
        if last_delivered and stream_id(last_delivered) > stream_id(self._wait_from):
            self._wait_from = last_delivered
        reply = self._call(
            lambda _a: self.client.xread({self.keys.groups: self._wait_from}, count=1, block=block_ms),
            "wait for groups",
        )
        streams = cast("list[list[Any]]", reply)  # RESP2: [[stream, [(id, fields), ...]]]
        if streams and streams[0][1]:
            self._wait_from = text(streams[0][1][-1][0])

    def _settle(self, entries: list[Entry], from_pending: bool) -> list[Entry]:
        """The fresh entries (newest first seen); redelivered ones are XACKed or dropped again."""
        fresh: list[Entry] = []
        pairs: list[tuple[str, str]] = []
        seen = 0
        for e in entries:
            if self._is_new(e.id):
                fresh.append(e)
                self.newest = e.id
                self.uncovered.add(e.id)
            elif e.id in self.uncovered:
                if not from_pending:  # our own pending entry, delivered again by a rolled-back position
                    seen += 1
            else:
                seen += 1
                reason = self.dropped.get(e.id)
                pairs.append((e.id, reason.value if reason else ""))
        if seen:
            self.redelivered += seen
            log.warning(
                "%d redelivered group(s) at or below the newest processed stream id %s (Redis rolled back "
                "a consumer-group position or an XACK): not trained again", seen, self.newest,
            )  # fmt: skip
        if pairs or seen:
            self._settle_call(pairs, seen)
        return fresh

    def _settle_call(self, pairs: list[tuple[str, str]], redelivered: int) -> tuple[int, int]:
        def args(attempt: int) -> list[Any]:
            # a retry may follow an applied attempt: XACK and the marker-guarded credits are
            # idempotent, the redelivery count is not, so it is sent with the first attempt only
            flat = [x for p in pairs for x in p]
            return [GROUPS_CONSUMER_GROUP, TRAINER_DROPPED_PREFIX, VALID_CREDITED, TRAINER_REDELIVERED,
                    0 if attempt else redelivered, *flat]  # fmt: skip

        keys = [self.keys.groups, self.keys.counters, self.keys.trainer_credited]
        reply = self._script(self._settle_script, keys, args, "XACK of groups")
        return int(reply[1]), int(reply[2])

    # ------------------------------------------------------------------ outcomes

    def drop(self, entries: Iterable[tuple[Entry, GroupDropReason]]) -> int:
        """XACK groups that will never be trained and credit them (`valid_credited`, and
        `trainer:dropped:<reason>`) in one script, once per entry (its credit marker); returns how
        many were credited now."""
        pairs = []
        for e, reason in entries:
            self.dropped[e.id] = reason
            self.uncovered.discard(e.id)
            if self._is_new(e.id):
                self.newest = e.id
            pairs.append((e.id, reason.value))
        if not pairs:
            return 0
        return self._settle_call(pairs, 0)[1]

    def commit(self, covered: list[str]) -> int:
        """After a durable checkpoint: XACK the groups it covers and trim the stream to the oldest
        pending entry; returns the number of entries trimmed."""
        reply = self._script(self._commit, [self.keys.groups, self.keys.trainer_credited],
                             lambda _a: [GROUPS_CONSUMER_GROUP, *covered], "XACK and trim of groups")  # fmt: skip
        self.uncovered.difference_update(covered)
        pending, trimmed = int(reply[1]), int(reply[2])
        if pending > len(self.uncovered):
            # entries this trainer does not hold are pending: a rollback brought them back
            log.warning("%d group(s) pending that this trainer does not hold; re-reading them", pending)
            self._take_over()
        return trimmed

    def ack(self, ids: list[str]) -> int:
        if not ids:
            return 0
        return int(
            self._call(lambda _a: self.client.xack(self.keys.groups, GROUPS_CONSUMER_GROUP, *ids), "XACK")
        )

    def pending_count(self) -> int:
        reply = self._call(
            lambda _a: self.client.xpending(self.keys.groups, GROUPS_CONSUMER_GROUP), "XPENDING"
        )
        return int(reply["pending"])
