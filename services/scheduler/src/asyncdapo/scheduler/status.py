"""`RunStatus`: the run's progress as GetRun / WatchRun report it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from asyncdapo.scheduler.group_state import REDIS_WAIT_ERRORS
from asyncdapo.v1 import scheduler_pb2

if TYPE_CHECKING:
    from asyncdapo.scheduler.rollout import Rollout


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


STATUS_WAIT_S = 2.0  # how long GetRun waits for Redis before answering from its last reading


async def run_status(ro: Rollout) -> scheduler_pb2.RunStatus:
    """Counters from Redis and phase from memory, read under the outcome lock so that the two
    always agree (a BOUND phase never shows fewer valid groups than the bound). While Redis is
    away (or the finisher holds the lock waiting for it) the status answers within
    `STATUS_WAIT_S` from the last counters it read, with `redis_available` false."""

    def read() -> Awaitable[list[Any]]:
        pipe = ro.redis.pipeline(transaction=False)
        pipe.hgetall(ro.keys.counters)
        pipe.llen(ro.keys.prompts)
        return pipe.execute()

    try:
        async with asyncio.timeout(STATUS_WAIT_S), ro.outcome_lock:
            counters, depth = await read()
            phase, in_flight = ro.phase, len(ro.tasks)
        ro.rtt.count += 1
        ro.last_status_counters = (counters, depth)
    except REDIS_WAIT_ERRORS as err:
        ro.redis_link.mark(False, f"{type(err).__name__}: {err}")
        counters, depth = ro.last_status_counters
        phase, in_flight = ro.phase, len(ro.tasks)
    except TimeoutError:
        counters, depth = ro.last_status_counters
        phase, in_flight = ro.phase, len(ro.tasks)
    c = {_text(k): int(v) for k, v in counters.items()}
    return scheduler_pb2.RunStatus(
        run=ro.cfg.name,
        phase=phase,  # type: ignore[arg-type]
        policy_version=ro.version,
        valid_groups_produced=c.get("valid_produced", 0),
        valid_groups_bound=ro.bound,
        in_flight_prompts=in_flight,
        queue_depth=int(depth),
        outcomes={k[len("outcome:") :]: v for k, v in c.items() if k.startswith("outcome:")},
        early_stops=c.get("early_stops", 0),
        aborted_requests=c.get("aborted_requests", 0),
        aborted_tokens=c.get("aborted_tokens", 0),
        completions=c.get("completions", 0),
        generated_tokens=c.get("generated_tokens", 0),
        mode=ro.cfg.rollout.mode.value,
        max_staleness=ro.cfg.rollout.max_staleness,
        valid_groups_credited=c.get("valid_credited", 0),
        redis_available=ro.redis_link.up,
        scheduler_epoch=ro.queue.epoch,
    )
