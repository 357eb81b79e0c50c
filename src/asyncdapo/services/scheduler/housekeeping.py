"""The scheduler's housekeeping: what keeps the run owned, in step with Redis and free of strays.

Every second (`loop`), each step waiting through a Redis outage and none able to end the loop:
- the lease: refreshed, or we learn that a successor fenced us (`Fenced`), or that Redis lost the
  run's epoch (then we take the run over again and re-read it);
- the state re-read (`read_state`) once Redis came back from an outage: version, uri and counts;
  counts lower than we saw mean Redis rolled back acknowledged writes, and what we hold in flight
  is dropped without writing anything (Redis, not this process, owns those attempts now);
- the counters kept in memory (aborts, early stops), written with the idempotent COUNT script;
- the trainer's credits (groups it dropped): room under the bound again;
- every `reconcile_every_s`, the reconciliation: claims of ours that no task holds are requeued.

`Housekeeper` owns the re-read flag, the reconciliation clock and the counters already written; it
reads and moves the run's state through the rollout core (its one owner) and reaches the driver
only through `HousekeptRun`, so no module imports the rollout driver back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from asyncdapo.contracts import redis_keys as rk
from asyncdapo.contracts.redis_keys import ADMITTED, VALID_CREDITED, VALID_PRODUCED, RunKeys, decode_map
from asyncdapo.services.scheduler.claim_records import Fenced
from asyncdapo.services.scheduler.core import Command, RolloutCore
from asyncdapo.services.scheduler.group_state import ScriptArg, ScriptRunner
from asyncdapo.services.scheduler.metrics import SchedulerMetrics
from asyncdapo.services.scheduler.outcome_records import Outcome, RequeueReason
from asyncdapo.services.scheduler.queue import PromptQueue

if TYPE_CHECKING:
    from redis.asyncio import Redis

log = logging.getLogger(__name__)

HOUSEKEEPING_EVERY_S = 1.0
COUNT_SEQ_TTL_S = 86_400  # how long COUNT remembers a sequence number (a retry's dedupe window)


class HousekeptRun(Protocol):
    """What the housekeeper needs from the rollout driver — and no more."""

    @property
    def claiming(self) -> bool:
        """A claim is being admitted: its tasks may not be registered in the core yet."""

    def counters_now(self) -> dict[str, int]:
        """The counters kept in memory (`rk.ABORTED_TOKENS`, `rk.ABORTED_REQUESTS`,
        `rk.EARLY_STOPS`), as totals since this process started."""

    def set_version(self, version: int, uri: str | None = None) -> None:
        """Redis' weight version: the core, the store and the dispatcher follow it."""

    def run_commands(self, commands: Iterable[Command]) -> None:
        """Carry out what the core decided (abort what a dropped task still runs)."""

    def on_fenced(self, where: str) -> None:
        """A successor took the run over: stop for good."""

    def wake_admission(self) -> None:
        """There may be room under the bound again."""

    def update_gauges(self, per_gateway: bool) -> None:
        """Refresh the run's gauges (and the per-gateway ones, once a second at most)."""


class Housekeeper:
    def __init__(
        self,
        run: HousekeptRun,
        core: RolloutCore,
        redis: Redis,
        keys: RunKeys,
        queue: PromptQueue,
        scripts: ScriptRunner,
        metrics: SchedulerMetrics,
        outcome_lock: asyncio.Lock,
        redis_call: Callable[[Callable[[], Awaitable[Any]]], Awaitable[Any]],
        reconcile_every_s: float = 5.0,
    ) -> None:
        self._run = run
        self._core = core
        self._redis = redis
        self._keys = keys
        self._queue = queue
        self._scripts = scripts
        self._metrics = metrics
        self._lock = outcome_lock  # the finisher's: a re-read never interleaves with an outcome write
        self._r = redis_call  # waits through a Redis outage
        self.reconcile_every_s = reconcile_every_s
        self._resync_needed = False
        self._last_reconcile = 0.0
        # COUNT's sequence number and the totals it has written: a retry adds nothing twice
        self._count_seq = 0
        self._flushed = {rk.ABORTED_TOKENS: 0, rk.ABORTED_REQUESTS: 0, rk.EARLY_STOPS: 0}
        self._flush_lock = asyncio.Lock()

    def redis_came_back(self) -> None:
        """Redis answered again after an outage: re-read the run's state next round (it may have
        restarted from an older snapshot)."""
        self._resync_needed = True

    def flushed(self, key: str) -> int:
        """The total of counter `key` written to Redis so far."""
        return self._flushed[key]

    async def loop(self) -> None:
        while True:
            await asyncio.sleep(HOUSEKEEPING_EVERY_S)
            if self._core.fenced:
                continue
            try:
                await self.round()
            except Fenced as err:
                self._run.on_fenced(str(err))
            except Exception:
                log.exception("housekeeping round failed; retrying")
            self._run.update_gauges(per_gateway=True)

    async def round(self) -> None:
        lease = await self._r(self._queue.refresh_lease)
        if lease == 0:
            raise Fenced("lease refresh: a newer epoch holds the run")
        if lease < 0:  # Redis lost the run's state (no epoch): take it over again
            log.error("redis lost the run's fencing epoch: taking the run over again")
            await self._r(self._queue.take_over)
            self._resync_needed = True
        if self._resync_needed:
            self._resync_needed = False
            async with self._lock:
                await self.read_state()
            await self._r(self._queue.recover)
            self._last_reconcile = 0.0
        await self.flush_counters()
        c = await self._r(lambda: self._redis.hmget(self._keys.counters, [VALID_PRODUCED, VALID_CREDITED]))
        if self._core.credits_read(int(c[0] or 0), int(c[1] or 0)):
            self._run.wake_admission()  # the trainer credited dropped groups back: room again
        self._metrics.queue_depth.set(await self._r(self._queue.depth))
        if time.monotonic() - self._last_reconcile >= self.reconcile_every_s:
            await self.reconcile()

    async def read_state(self) -> None:
        """What this process keeps in memory about the run, from Redis: version, uri, counts."""
        core = self._core
        w = decode_map(await self._r(lambda: self._redis.hgetall(self._keys.weights)))
        version = int(w.get("version", "0") or 0)
        if version < core.version and core.uri:
            # Redis lost the last publish (restored from an older state): the gateways run ours
            log.warning("redis holds weights v%d, we published v%d: writing it back", version, core.version)
            v, uri = core.version, core.uri
            await self._r(lambda: self._redis.hset(self._keys.weights, mapping={"version": v, "uri": uri}))
        else:
            self._run.set_version(version, w.get("uri", ""))
        c = await self._r(
            lambda: self._redis.hmget(self._keys.counters, [VALID_PRODUCED, VALID_CREDITED, ADMITTED])
        )
        produced, credited, admitted = (int(x or 0) for x in c)
        seen = core.admitted_seen
        if core.reset_counts(produced, credited, admitted):
            # Redis lost acknowledged writes (a restart under `appendfsync everysec`, a failover):
            # our tasks may hold attempts it never recorded. Drop them without writing anything;
            # reconciliation requeues whatever claims of ours Redis still has.
            log.error(
                "redis rolled back (admitted %d < %d seen): dropping %d prompts in flight, requeueing claims",
                admitted,
                seen,
                len(core.tasks),
            )
            self._run.run_commands(core.drop_in_memory())
            self._last_reconcile = 0.0

    async def flush_counters(self) -> None:
        """Write the counters kept in memory (aborts and early stops are batched, not written per
        event) with the idempotent COUNT script: a retry after a lost reply adds nothing twice."""
        async with self._flush_lock:
            now = self._run.counters_now()
            deltas = {k: v - self._flushed[k] for k, v in now.items() if v != self._flushed[k]}
            if not deltas:
                return
            self._count_seq += 1
            seq = self._count_seq
            args: list[ScriptArg] = [seq, COUNT_SEQ_TTL_S]
            for k, v in deltas.items():
                args += [k, v]
            keys = [self._keys.counters, self._keys.count_seq(self._queue.owner)]
            await self._r(lambda: self._scripts.run("count", keys, args))
            self._flushed = now

    async def reconcile(self) -> int:
        """Requeue claims of ours that no task holds (a claim whose reply was lost for good, a
        Redis rollback that restored claims we had finished): nothing stays claimed by nobody."""
        if self._run.claiming:
            return 0
        self._last_reconcile = time.monotonic()
        orphans = await self._r(lambda: self._queue.orphans(set()))
        if self._run.claiming:
            return 0  # a claim is being admitted: its tasks may not be registered yet
        orphans = [(pid, c) for pid, c in orphans if (pid, c.attempt) not in self._core.tasks]
        if not orphans:
            return 0
        res = await self._r(lambda: self._queue.requeue(orphans, RequeueReason.ORPHANED))
        if any(r.fenced for r in res):
            raise Fenced("reconcile: a newer epoch holds the run")
        n = sum(1 for r in res if r.label.startswith("requeued"))
        if n:
            log.warning("requeued %d claim(s) of ours that no task held", n)
            self._metrics.outcomes.labels(Outcome.REQUEUED, RequeueReason.ORPHANED).inc(n)
        return n
