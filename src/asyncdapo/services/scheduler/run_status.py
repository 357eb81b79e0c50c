"""`RunStatusReader`: the run's progress as GetRun / WatchRun report it.

It reads the counters from Redis and the phase, version, bound and claims from the rollout core
(the one owner of the run's state), under the run's outcome lock so that the two always agree.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from redis.asyncio import Redis

from asyncdapo.contracts import redis_keys as rk
from asyncdapo.contracts.config import RunConfig
from asyncdapo.contracts.redis_keys import RunKeys, decode_counters, outcome_counts
from asyncdapo.contracts.v1 import scheduler_pb2
from asyncdapo.runtime.redis_conn import is_unavailable
from asyncdapo.runtime.redis_outage import RedisWaiter
from asyncdapo.services.scheduler.core import RolloutCore
from asyncdapo.services.scheduler.group_state import RoundTrips

STATUS_WAIT_S = 2.0  # how long GetRun waits for Redis before answering from its last reading


class RunStatusReader:
    def __init__(
        self,
        cfg: RunConfig,
        core: RolloutCore,
        redis: Redis,
        keys: RunKeys,
        outcome_lock: asyncio.Lock,
        redis_link: RedisWaiter,
        rtt: RoundTrips,
        epoch: Callable[[], int],
    ) -> None:
        self._cfg = cfg
        self._core = core
        self._redis = redis
        self._keys = keys
        self._lock = outcome_lock
        self._link = redis_link
        self._rtt = rtt
        self._epoch = epoch  # the scheduler's fencing epoch
        self._last: tuple[dict[str, int], int] = ({}, 0)

    async def read(self) -> scheduler_pb2.RunStatus:
        """Counters from Redis and phase from memory, read under the outcome lock (a BOUND phase
        never shows fewer valid groups than the bound). While Redis is away (or the finisher holds
        the lock waiting for it) the status answers within `STATUS_WAIT_S` from the last counters it
        read, with `redis_available` false."""
        core = self._core

        def fetch() -> Awaitable[list[Any]]:  # HGETALL's and LLEN's replies (redis-py's type)
            pipe = self._redis.pipeline(transaction=False)
            pipe.hgetall(self._keys.counters)
            pipe.llen(self._keys.prompts)
            return pipe.execute()

        try:
            async with asyncio.timeout(STATUS_WAIT_S), self._lock:
                raw, depth = await fetch()
                phase, in_flight = core.phase, len(core.tasks)
            self._rtt.count += 1
            self._last = (decode_counters(raw), int(depth))
        except TimeoutError:
            phase, in_flight = core.phase, len(core.tasks)
        except Exception as err:
            if not is_unavailable(err):
                raise
            self._link.note_failure(err, "a run status read")
            phase, in_flight = core.phase, len(core.tasks)
        c, depth = self._last
        return scheduler_pb2.RunStatus(
            run=self._cfg.name,
            phase=phase,
            policy_version=core.version,
            valid_groups_produced=c.get(rk.VALID_PRODUCED, 0),
            valid_groups_bound=core.bound,
            in_flight_prompts=in_flight,
            queue_depth=depth,
            outcomes=outcome_counts(c),
            early_stops=c.get(rk.EARLY_STOPS, 0),
            aborted_requests=c.get(rk.ABORTED_REQUESTS, 0),
            aborted_tokens=c.get(rk.ABORTED_TOKENS, 0),
            completions=c.get(rk.COMPLETIONS, 0),
            generated_tokens=c.get(rk.GENERATED_TOKENS, 0),
            mode=self._cfg.rollout.mode.value,
            max_staleness=self._cfg.staleness_window,  # ceil(s): the version window (int32 on the wire)
            valid_groups_credited=c.get(rk.VALID_CREDITED, 0),
            redis_available=self._link.up,
            scheduler_epoch=self._epoch(),
            max_staleness_exact=self._cfg.rollout.max_staleness,
        )
