"""Waiting through a Redis outage (a restart, an AOF reload, a failover, a network cut), the same
way in every service.

`RedisWaiter.call(fn, what)` (threads) and `await RedisWaiter.acall(fn, what)` (asyncio) run
`fn(attempt)` until it returns. An error that `redis_conn.is_unavailable` calls an outage is
waited out with the waiter's `Backoff`, for as long as it lasts (or until `give_up_after_s`);
every other error is raised at once. Only operations that are safe to run again go through here:
a lost reply may have been applied, and `attempt > 0` tells `fn` that an earlier try may have
been.

The waiter also keeps the bookkeeping an operator sees: `up`, since when Redis is down, how many
outages there were (a reader compares `outages` to notice that Redis may have restarted and rolled
back), one warning when it goes away, a reminder every `remind_every_s` while it stays away, one
line when it is back, and `on_change` callbacks (the `*_redis_up` gauge, health, a state re-read).
Its state is guarded by a lock: trainer threads share one waiter.

A Redis at `maxmemory` (it refuses writes with OOM under `noeviction`) is waited out the same way,
and told apart: `full` is true while the latest refusal was OOM (the `*_redis_full` gauge), and the
warning says that the writes wait for memory to free (the trainer consuming groups, finished state
expiring) or for a larger `maxmemory`. Nothing is dropped meanwhile: the refused write is retried.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from asyncdapo.runtime.backoff import Backoff, Delays
from asyncdapo.runtime.redis_conn import is_full, is_unavailable, redacted_url

log = logging.getLogger(__name__)

T = TypeVar("T")

REMIND_EVERY_S = 60.0  # while Redis stays away, a reminder this often


class RedisWaiter:
    """Whether Redis answers, and the retry loop that waits while it does not."""

    def __init__(
        self,
        backoff: Backoff,
        *,
        url: str = "",
        give_up_after_s: float | None = None,
        remind_every_s: float = REMIND_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        asleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self.backoff = backoff
        self.url = url
        self.give_up_after_s = give_up_after_s  # None: wait for as long as the outage lasts
        self.remind_every_s = remind_every_s
        self._clock = clock
        self._sleep = sleep
        self._asleep = asleep
        self._rng = rng
        self._name = f"redis {redacted_url(url)}" if url else "redis"
        self.up = True
        self.outages = 0  # outages so far, the current one included
        self.down_since: float | None = None  # clock() when the current outage began
        self.last_recovered = 0.0  # clock() of the latest recovery
        self.last_error = ""  # "Type: message" of the error that began the latest outage
        self.full = False  # the current outage is Redis at maxmemory (OOM), not Redis away
        self._last_remind = 0.0
        self._lock = threading.Lock()
        self._on_change: list[Callable[[bool], None]] = []

    def on_change(self, fn: Callable[[bool], None]) -> None:
        """Call `fn(up)` on every change (up → down, down → up, and `fn(False)` again when a down
        Redis turns from away to full or back: read `full`); not called for the state now."""
        self._on_change.append(fn)

    # ------------------------------------------------------------------ bookkeeping

    def note_failure(self, err: BaseException, what: str) -> None:
        """An operation (`what`) failed with an outage error: Redis is down (warned once, then
        reminded every `remind_every_s`)."""
        now = self._clock()
        full = is_full(err)
        with self._lock:
            went_down = self.up
            changed = went_down or full != self.full  # down, or away <-> full while down
            if went_down:
                self.up = False
                self.down_since = now
                self.outages += 1
            if changed:
                self.full = full
                self._last_remind = now
                self.last_error = f"{type(err).__name__}: {err}"
            remind = not changed and now - self._last_remind >= self.remind_every_s
            if remind:
                self._last_remind = now
            down_for = now - (self.down_since if self.down_since is not None else now)
        if changed:
            if full:
                log.warning(
                    "%s is full (maxmemory reached: %s) during %s; the write waits until memory frees "
                    "(the trainer consumes groups, finished state expires) or maxmemory is raised "
                    "(backoff up to %.0fs)",
                    self._name, err, what, self.backoff.max_s,
                )  # fmt: skip
            else:
                log.warning(
                    "%s unavailable (%s: %s) during %s; waiting for it (backoff up to %.0fs)",
                    self._name, type(err).__name__, err, what, self.backoff.max_s,
                )  # fmt: skip
            for fn in self._on_change:
                fn(False)
        elif remind:
            state = "full" if full else "unavailable"
            log.warning("%s still %s after %.0fs (%s)", self._name, state, down_for, err)

    def note_success(self, ends_full: bool = False) -> None:
        """An operation succeeded: Redis is up (one line if it was down). A full spell (OOM) ends
        only with `ends_full`: a write Redis refused as full that has now gone through. Reads, and
        a lease's PEXPIRE, which a full Redis also serves, do not end it: `full`, and the gauge and
        health that follow it, would flip back and forth while every other write is refused."""
        if self.up:  # the common case, without the lock
            return
        now = self._clock()
        with self._lock:
            if self.up or (self.full and not ends_full):
                return
            self.up = True
            self.full = False
            down_for = now - (self.down_since if self.down_since is not None else now)
            self.down_since = None
            self.last_recovered = now
        log.warning("%s is back after %.1fs", self._name, down_for)
        for fn in self._on_change:
            fn(True)

    def _retry_in(self, err: Exception, what: str, started: float, delays: Delays) -> float | None:
        """The wait before the next attempt after `err`, or None to raise it: not an outage, or
        the outage outlasted `give_up_after_s`."""
        if not is_unavailable(err):
            return None
        self.note_failure(err, what)
        if self.give_up_after_s is not None and self._clock() - started >= self.give_up_after_s:
            return None
        return delays.next()

    # ------------------------------------------------------------------ retry loops

    def call(self, fn: Callable[[int], T], what: str) -> T:
        """`fn(attempt)` until it returns; waits out an outage, raises every other error."""
        delays = self.backoff.delays(self._rng)
        started = self._clock()
        attempt = 0
        refused_full = False  # this operation was refused as full: its success ends a full spell
        while True:
            try:
                result = fn(attempt)
            except Exception as err:
                wait = self._retry_in(err, what, started, delays)
                if wait is None:
                    raise
                refused_full = refused_full or is_full(err)
                self._sleep(wait)
                attempt += 1
                continue
            self.note_success(ends_full=refused_full)
            return result

    async def acall(self, fn: Callable[[int], Awaitable[T]], what: str) -> T:
        """`await fn(attempt)` until it returns; waits out an outage, raises every other error."""
        delays = self.backoff.delays(self._rng)
        started = self._clock()
        attempt = 0
        refused_full = False  # this operation was refused as full: its success ends a full spell
        while True:
            try:
                result = await fn(attempt)
            except Exception as err:
                wait = self._retry_in(err, what, started, delays)
                if wait is None:
                    raise
                refused_full = refused_full or is_full(err)
                await self._asleep(wait)
                attempt += 1
                continue
            self.note_success(ends_full=refused_full)
            return result
