"""The trainer's Redis connection: no blind retries, and waiting (not failing) while Redis is away.

redis-py's own `Retry` re-sends a command after a connection error, which is wrong for commands
that are not idempotent (a lost reply would apply them twice) and gives up after a few tries. The
trainer's client therefore has no built-in retry; every operation goes through
`RedisWaiter.call(fn)`, which re-runs `fn(attempt)` on connection errors, timeouts, LOADING and
the other "try again" replies, with capped exponential backoff and no limit by default. Each
caller makes its `fn` safe to re-run: the scripts are idempotent (an XACK-guarded credit, a
fenced read followed by a re-scan of the pending list), the prompt refill re-reads the feed
cursor under WATCH before it writes, and `attempt > 0` tells a caller that an earlier attempt may
have been applied.

The waiter logs once per state change (away, back after N s), keeps `up` for the
`asyncdapo_trainer_redis_up` gauge, and counts outages: after any outage the groups reader
re-scans the consumer group's pending list, since Redis may have restarted and rolled back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

log = logging.getLogger(__name__)

T = TypeVar("T")

# replies meaning "Redis is there but cannot serve this now": waited for like a refused connection
_UNAVAILABLE_REPLIES = ("LOADING", "MASTERDOWN", "MISCONF", "READONLY", "TRYAGAIN", "CLUSTERDOWN")
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


def is_unavailable(err: BaseException) -> bool:
    """True for errors that mean Redis is away or not ready (wait), not a bug (raise)."""
    if isinstance(err, redis.AuthenticationError | redis.exceptions.AuthorizationError):
        return False  # a wrong password is the user's to fix, not an outage
    if isinstance(err, redis.ConnectionError | redis.TimeoutError):  # BusyLoadingError included
        return True
    return isinstance(err, redis.ResponseError) and str(err).startswith(_UNAVAILABLE_REPLIES)


class RedisWaiter:
    """Runs Redis operations, waiting through outages of any length (thread-safe state)."""

    def __init__(
        self,
        url: str = "",
        base_s: float = 0.1,
        cap_s: float = 2.0,
        give_up_after_s: float | None = None,
        remind_every_s: float = 60.0,
    ) -> None:
        self.url = url
        self.base_s = base_s
        self.cap_s = cap_s
        self.give_up_after_s = give_up_after_s  # None: wait forever (the default everywhere)
        self.remind_every_s = remind_every_s
        self.up = True
        self.outages = 0  # completed or ongoing outages so far; readers compare it to re-scan
        self.down_since: float | None = None
        self.last_recovered = 0.0  # time.monotonic() of the latest recovery
        self._last_remind = 0.0
        self._lock = threading.Lock()
        self._on_change: list[Callable[[bool], None]] = []

    def on_change(self, fn: Callable[[bool], None]) -> None:
        """Call `fn(up)` on every state change (e.g. to set a gauge); called once now."""
        self._on_change.append(fn)
        fn(self.up)

    def note_failure(self, err: BaseException, what: str) -> None:
        now = time.monotonic()
        with self._lock:
            changed = self.up
            if changed:
                self.up = False
                self.down_since = now
                self._last_remind = now
                self.outages += 1
            remind = not changed and now - self._last_remind >= self.remind_every_s
            if remind:
                self._last_remind = now
            down_for = now - (self.down_since or now)
        if changed:
            log.warning(
                "redis %s unavailable (%s: %s) during %s; waiting for it (backoff up to %.0fs)",
                self.url, type(err).__name__, err, what, self.cap_s,
            )  # fmt: skip
            for fn in self._on_change:
                fn(False)
        elif remind:
            log.warning("redis %s still unavailable after %.0fs (%s)", self.url, down_for, err)

    def note_success(self) -> None:
        if self.up:  # the common case, without the lock
            return
        now = time.monotonic()
        with self._lock:
            if self.up:
                return
            self.up = True
            down_for = now - (self.down_since or now)
            self.down_since = None
            self.last_recovered = now
        log.warning("redis %s is back after %.1fs", self.url, down_for)
        for fn in self._on_change:
            fn(True)

    def call(self, fn: Callable[[int], T], what: str) -> T:
        """`fn(attempt)` until it returns; waits out unavailability, raises everything else."""
        attempt = 0
        delay = self.base_s
        started = time.monotonic()
        while True:
            try:
                result = fn(attempt)
            except Exception as err:
                if not is_unavailable(err):
                    raise
                self.note_failure(err, what)
                if self.give_up_after_s is not None and time.monotonic() - started > self.give_up_after_s:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, self.cap_s)
                attempt += 1
                continue
            self.note_success()
            return result
