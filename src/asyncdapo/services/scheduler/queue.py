"""The reliable prompt queue: ownership of the run, claim, load, release and reconciliation.

The trainer RPUSHes prompt ids to `RunKeys.prompts` (head = next) with their data in
`RunKeys.prompt_data(id)` (`asyncdapo.contracts.prompts.PromptRecord`). A claim moves ids atomically from
the list into the `prompts:claimed` HASH (id -> "owner|attempt|ms") and starts a new attempt of
the prompt's group state; the claim is released only by the script that records the attempt's
outcome.

Ownership (one scheduler per run): `take_over` increments the run's fencing epoch; from then on
every script call of an older epoch is refused (`fenced`), so a predecessor that is still alive —
a pod being replaced, a paused process — can no longer claim, count or commit anything. The new
owner requeues every claim it did not make itself at once (`requeued(scheduler_restart)`): a
scheduler restarted within its predecessor's lease strands nothing. The lease key
(`scheduler:lease`, `owner|epoch`, 15 s) only tells operators and checkers who is alive.

Invariants:
- every claim is held by the owner that made it until its outcome is recorded, and a claim whose
  owner is no longer the run's owner is requeued by the next `recover` (on take-over and in every
  reconciliation round);
- a CLAIM retried after a lost reply returns the first reply (client token) and claims nothing
  more; claims of ours that no task holds (an abandoned call, a Redis rollback) are found by
  `orphans` and requeued by the rollout's reconciliation.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

from asyncdapo.contracts.prompts import PromptRecord, PromptRecordError
from asyncdapo.contracts.redis_keys import CLAIM_TOKEN_TTL_S, RunKeys
from asyncdapo.services.scheduler.claim_records import Claim, ClaimBatch, ClaimRecord, Fenced
from asyncdapo.services.scheduler.group_state import GroupStore, RoundTrips, ScriptRunner, _s, items
from asyncdapo.services.scheduler.outcome_records import FinishResult, Outcome, RequeueReason

if TYPE_CHECKING:
    from redis.asyncio import Redis


class PromptQueue:
    def __init__(
        self,
        redis: Redis,
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
        self.epoch = 0

    # --- ownership ---

    async def take_over(self) -> int:
        """Become the run's owner: a new fencing epoch, and our lease."""
        k = self.keys
        epoch = int(
            _s(
                await self.scripts.run(
                    "takeover", [k.scheduler_epoch, k.scheduler_lease], [self.owner, self.lease_ms]
                )
            )
        )
        self.epoch = self.store.epoch = epoch
        return epoch

    async def refresh_lease(self) -> int:
        """1: still the owner; 0: fenced (a successor took over); -1: Redis lost the epoch."""
        k = self.keys
        return int(
            _s(
                await self.scripts.run(
                    "lease", [k.scheduler_epoch, k.scheduler_lease], [self.owner, self.epoch, self.lease_ms]
                )
            )
        )

    async def release_lease(self) -> None:
        await self.scripts.run("release", [self.keys.scheduler_lease], [f"{self.owner}|{self.epoch}"])

    # --- claims ---

    def new_token(self) -> str:
        return f"{self.owner}:{uuid.uuid4().hex[:12]}"

    async def claim(self, max_count: int, n: int, token: str | None = None) -> ClaimBatch:
        """Take up to `max_count` ids from the head; each starts attempt k+1 with group size `n`.
        Retry a call whose reply was lost with the same `token`: it returns the same claims."""
        if max_count <= 0:
            return ClaimBatch([], -1)
        k = self.keys
        tok = token or self.new_token()
        reply = await self.scripts.run(
            "claim",
            [k.prompts, k.prompts_claimed, k.counters, k.scheduler_epoch, k.claim_token(tok)],
            [max_count, self.owner, int(time.time() * 1000), k.prompt(""), n, self.epoch, CLAIM_TOKEN_TTL_S],
        )
        vals = [_s(x) for x in items(reply)]
        if vals[0] == "fenced":
            raise Fenced(
                f"claim refused: another scheduler took run {k.run!r} over (we hold epoch {self.epoch})"
            )
        return ClaimBatch([Claim(vals[i], int(vals[i + 1])) for i in range(2, len(vals), 2)], int(vals[1]))

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

    async def claims(self) -> dict[str, ClaimRecord]:
        """pid -> claim of every outstanding claim."""
        raw = await self.redis.hgetall(self.keys.prompts_claimed)
        self.rtt.count += 1
        out = {}
        for pid, rec in raw.items():
            owner, attempt, ms = _s(rec).split("|")
            out[_s(pid)] = ClaimRecord(owner, int(attempt), int(ms))
        return out

    async def requeue(
        self, claims: Sequence[tuple[str, ClaimRecord]], reason: RequeueReason
    ) -> list[FinishResult]:
        """Record `requeued(reason)` for these claims (oldest ends up at the queue head)."""
        # LPUSH puts each at the head: push the newest claim first so the oldest ends up first.
        order = sorted(claims, key=lambda c: (c[1].unix_ms, c[0]), reverse=True)
        calls = [self.store.finish_call(pid, c.attempt, Outcome.REQUEUED, reason) for pid, c in order]
        return await self.store.finish_many(calls)

    async def recover(self) -> list[FinishResult]:
        """Requeue every claim that is not ours: its owner was replaced (we hold the newer epoch)."""
        theirs = [(pid, c) for pid, c in (await self.claims()).items() if c.owner != self.owner]
        return await self.requeue(theirs, RequeueReason.SCHEDULER_RESTART)

    async def orphans(self, held: set[tuple[str, int]]) -> list[tuple[str, ClaimRecord]]:
        """Our claims that no task holds (`held`: the (pid, attempt) of our live tasks)."""
        return [
            (pid, c)
            for pid, c in (await self.claims()).items()
            if c.owner == self.owner and (pid, c.attempt) not in held
        ]
