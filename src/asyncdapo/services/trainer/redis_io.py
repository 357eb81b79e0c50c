"""The trainer's Redis connection: no blind retries, and waiting (not failing) while Redis is away.

redis-py's own `Retry` re-sends a command after a connection error, which is wrong for commands
that are not idempotent (a lost reply would apply them twice) and gives up after a few tries. The
trainer's client therefore has no built-in retry; every operation goes through the trainer's one
`asyncdapo.runtime.redis_outage.RedisWaiter` (`call(fn, what)`), which re-runs `fn(attempt)` on
connection errors, timeouts, LOADING and the other "try again" replies, with `TRAINER_REDIS_BACKOFF`
and no limit by default. Each caller makes its `fn` safe to re-run: the scripts are idempotent (an
XACK-guarded credit, a fenced read followed by a re-scan of the pending list), the prompt refill
re-reads the feed cursor under WATCH before it writes, and `attempt > 0` tells a caller that an
earlier attempt may have been applied.

The waiter logs once per state change (away, back after N s), keeps `up` for the
`asyncdapo_trainer_redis_up` gauge, and counts outages: after any outage the groups reader
re-scans the consumer group's pending list, since Redis may have restarted and rolled back.
"""

from __future__ import annotations

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from asyncdapo.runtime.backoff import Backoff

# the trainer's wait between Redis attempts while Redis is away: 0.1 s, doubled, at most 2 s
TRAINER_REDIS_BACKOFF = Backoff(0.1, 2.0)
SOCKET_TIMEOUT_S = 15.0  # > every BLOCK the trainer uses; a hung Redis shows up as a timeout


def connect(url: str) -> redis.Redis:
    """A client that never retries by itself (see the module docstring), with the run's Redis
    password (`asyncdapo.runtime.redis_conn`)."""
    from asyncdapo.runtime.redis_conn import sync_client

    return sync_client(
        url,
        retry=Retry(NoBackoff(), 0),
        retry_on_error=[],
        socket_timeout=SOCKET_TIMEOUT_S,
        socket_connect_timeout=5.0,
        socket_keepalive=True,
    )
