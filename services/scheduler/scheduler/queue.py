"""The reliable prompt queue: claim, load, recover.

The trainer RPUSHes prompt ids to `RunKeys.prompts` (head = next) with their data in
`RunKeys.prompt_data(id)` (`asyncdapo.prompts.PromptRecord`). A claim moves ids atomically from
the list into the `prompts:claimed` HASH (id -> "owner|attempt|ms") and starts a new attempt of
the prompt's group state; the claim is released only by the script that records the attempt's
outcome. A scheduler holds a lease key refreshed while it lives; on start (and periodically) the
claims of owners whose lease expired are requeued at the head with outcome
`requeued(scheduler_restart)`, so a scheduler crash loses no prompt.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from asyncdapo.prompts import PromptRecord, PromptRecordError
from asyncdapo.redis_keys import RunKeys
from asyncdapo.scheduler.group_state import (
    FinishResult,
    GroupStore,
    Outcome,
    RequeueReason,
    RoundTrips,
    ScriptRunner,
    _s,
)


@dataclass(frozen=True, slots=True)
class Claim:
    pid: str
    attempt: int


def lease_key(keys: RunKeys, owner: str) -> str:
    return f"{keys.prefix}scheduler:lease:{owner}"


class PromptQueue:
    def __init__(
        self,
        redis: Any,
        keys: RunKeys,
        scripts: ScriptRunner,
        store: GroupStore,
        rtt: RoundTrips,
        owner: str | None = None,
        lease_ms: int = 15_000,
    ) -> None:
        self.redis = redis
        self.keys = keys
        self.scripts = scripts
        self.store = store
        self.rtt = rtt
        self.owner = owner or uuid.uuid4().hex[:12]
        self.lease_ms = lease_ms

    async def refresh_lease(self) -> None:
        await self.redis.set(lease_key(self.keys, self.owner), b"1", px=self.lease_ms)
        self.rtt.count += 1

    async def claim(self, max_count: int, n: int) -> list[Claim]:
        """Take up to `max_count` ids from the head; each starts attempt k+1 with group size `n`."""
        if max_count <= 0:
            return []
        k = self.keys
        reply = await self.scripts.run(
            "claim",
            [k.prompts, k.prompts_claimed, k.counters],
            [max_count, self.owner, int(time.time() * 1000), k.prompt(""), n],
        )
        vals = [_s(x) for x in reply]
        return [Claim(vals[i], int(vals[i + 1])) for i in range(0, len(vals), 2)]

    async def load(self, pids: Sequence[str]) -> list[PromptRecord | PromptRecordError]:
        """The records of claimed prompts (one round trip); a missing or malformed one is returned
        as the error, for the caller to drop with reason bad_prompt."""
        if not pids:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for pid in pids:
            pipe.hgetall(self.keys.prompt_data(pid))
        replies = await pipe.execute()
        self.rtt.count += 1
        out: list[PromptRecord | PromptRecordError] = []
        for pid, mapping in zip(pids, replies, strict=True):
            if not mapping:
                out.append(PromptRecordError(f"prompt {pid!r}: no data at {self.keys.prompt_data(pid)}"))
                continue
            try:
                out.append(PromptRecord.from_redis(mapping))
            except PromptRecordError as err:
                out.append(err)
        return out

    async def depth(self) -> int:
        n = await self.redis.llen(self.keys.prompts)
        self.rtt.count += 1
        return int(n)

    async def claims(self) -> dict[str, tuple[str, int, int]]:
        """pid -> (owner, attempt, claimed unix ms) of every outstanding claim."""
        raw = await self.redis.hgetall(self.keys.prompts_claimed)
        self.rtt.count += 1
        out = {}
        for pid, rec in raw.items():
            owner, attempt, ms = _s(rec).split("|")
            out[_s(pid)] = (owner, int(attempt), int(ms))
        return out

    async def recover(self, include_own: bool = False) -> list[FinishResult]:
        """Requeue the claims of schedulers whose lease expired (and ours, with `include_own`, when
        this process restarted its rollout and holds nothing in memory)."""
        claims = await self.claims()
        owners = {o for o, _, _ in claims.values() if o != self.owner}
        alive: set[str] = set()
        if owners:
            pipe = self.redis.pipeline(transaction=False)
            order = sorted(owners)
            for o in order:
                pipe.exists(lease_key(self.keys, o))
            for o, ex in zip(order, await pipe.execute(), strict=True):
                if ex:
                    alive.add(o)
            self.rtt.count += 1
        dead = [
            (ms, pid, attempt)
            for pid, (owner, attempt, ms) in claims.items()
            if owner not in alive and (owner != self.owner or include_own)
        ]
        # LPUSH puts each at the head: push the newest claim first so the oldest ends up first.
        dead.sort(reverse=True)
        calls = [
            self.store.finish_call(pid, attempt, Outcome.REQUEUED, RequeueReason.SCHEDULER_RESTART.value)
            for _, pid, attempt in dead
        ]
        return await self.store.finish_many(calls)
