"""The Redis outage waiter every service shares (`asyncdapo.runtime.redis_outage`) and the one rule
of what counts as an outage (`redis_conn.is_unavailable`), on a fake clock: nothing sleeps."""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Callable

import pytest
import redis
from redis._parsers.base import BaseParser

from asyncdapo.runtime.backoff import Backoff, Jitter
from asyncdapo.runtime.redis_conn import is_unavailable
from asyncdapo.runtime.redis_outage import RedisWaiter

POLICY = Backoff(0.1, 2.0)


class FakeTime:
    """A clock that moves only when the waiter sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s

    async def asleep(self, s: float) -> None:
        self.sleep(s)


def _waiter(t: FakeTime, policy: Backoff = POLICY, **kw: object) -> RedisWaiter:
    return RedisWaiter(policy, clock=t.clock, sleep=t.sleep, asleep=t.asleep, **kw)  # type: ignore[arg-type]


def _reply(text: str) -> redis.RedisError:
    """The exception redis-py raises for the error reply `text` (its own parser)."""
    return BaseParser.parse_error(text)


OUTAGES = [
    redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused."),
    redis.TimeoutError("Timeout reading from socket"),
    _reply("LOADING Redis is loading the dataset in memory"),
    _reply("READONLY You can't write against a read only replica."),
    _reply("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."),
    _reply(
        "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk."
    ),
    _reply("TRYAGAIN Multiple keys request during rehashing of slot"),
    _reply("CLUSTERDOWN The cluster is down"),
    _reply("ERR max number of clients reached"),
    _reply("OOM command not allowed when used memory > 'maxmemory'."),  # waits for memory to free
]
NOT_OUTAGES = [
    _reply("NOAUTH Authentication required."),
    _reply("WRONGPASS invalid username-password pair or user is disabled."),
    redis.exceptions.AuthorizationError("not authorized"),
    _reply("NOPERM this user has no permissions to run the 'eval' command"),
    _reply("BUSYGROUP Consumer Group name already exists"),
    _reply("WRONGTYPE Operation against a key holding the wrong kind of value"),
    _reply("NOSCRIPT No matching script. Please use EVAL."),
    ValueError("a bug"),
]


@pytest.mark.parametrize("err", OUTAGES, ids=lambda e: f"{type(e).__name__}:{str(e)[:20]}")
def test_redis_away_or_not_ready_is_an_outage(err: BaseException) -> None:
    assert is_unavailable(err)


@pytest.mark.parametrize("err", NOT_OUTAGES, ids=lambda e: f"{type(e).__name__}:{str(e)[:20]}")
def test_what_a_retry_does_not_cure_is_no_outage(err: BaseException) -> None:
    assert not is_unavailable(err)


def _failing(times: int, err: BaseException, result: str = "ok") -> tuple[Callable[[int], str], list[int]]:
    attempts: list[int] = []

    def fn(attempt: int) -> str:
        attempts.append(attempt)
        if len(attempts) <= times:
            raise err
        return result

    return fn, attempts


def test_an_outage_is_waited_out_with_the_backoff_and_told_once_each_way(
    caplog: pytest.LogCaptureFixture,
) -> None:
    t = FakeTime()
    w = _waiter(t)
    changes: list[bool] = []
    w.on_change(changes.append)
    fn, attempts = _failing(4, redis.ConnectionError("Connection refused"))
    with caplog.at_level(logging.INFO, logger="asyncdapo.runtime.redis_outage"):
        assert w.call(fn, "a refill") == "ok"
    assert attempts == [0, 1, 2, 3, 4]  # fn learns that an earlier try may have been applied
    assert t.sleeps == [0.1, 0.2, 0.4, 0.8]
    assert changes == [False, True] and w.up and w.outages == 1
    assert w.down_since is None and w.last_recovered == t.now
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert "redis unavailable (ConnectionError: Connection refused) during a refill" in lines[0]
    assert "backoff up to 2s" in lines[0]
    assert lines[1] == "redis is back after 1.5s"


def test_a_long_outage_is_reminded_of_every_period(caplog: pytest.LogCaptureFixture) -> None:
    t = FakeTime()
    w = _waiter(t, remind_every_s=60.0)
    start = t.now

    def fn(_attempt: int) -> str:
        if t.now - start < 150.0:
            raise redis.TimeoutError("Timeout reading from socket")
        return "ok"

    with caplog.at_level(logging.WARNING, logger="asyncdapo.runtime.redis_outage"):
        w.call(fn, "a read")
    lines = [r.getMessage() for r in caplog.records]
    reminders = [x for x in lines if "still unavailable after" in x]
    assert len(reminders) == 2  # at ~60 s and ~120 s of a 150 s outage
    # the first once 60 s have passed (the next failure after it, <= one capped wait later)
    assert re.match(r"redis still unavailable after 6[0-2]s \(Timeout reading from socket\)$", reminders[0])
    assert sum("unavailable (" in x for x in lines) == 1 and sum("is back after" in x for x in lines) == 1
    assert max(t.sleeps) == 2.0 and w.outages == 1


def test_each_outage_is_counted() -> None:
    t = FakeTime()
    w = _waiter(t)
    for _ in range(3):
        fn, _ = _failing(1, redis.ConnectionError("reset"))
        w.call(fn, "x")
    assert w.outages == 3 and w.up


def test_the_waiter_gives_up_after_its_limit_and_stays_down() -> None:
    t = FakeTime()
    w = _waiter(t, give_up_after_s=5.0)
    changes: list[bool] = []
    w.on_change(changes.append)
    fn, _ = _failing(10**6, redis.ConnectionError("refused"))
    with pytest.raises(redis.ConnectionError, match="refused"):
        w.call(fn, "a read")
    assert 5.0 <= sum(t.sleeps) < 5.0 + 2.0  # it stops at the first failure past the limit
    assert not w.up and changes == [False] and w.outages == 1


def test_a_waiter_that_never_waits_raises_the_first_outage_error_at_once() -> None:
    t = FakeTime()
    w = _waiter(t, give_up_after_s=0)
    fn, attempts = _failing(1, redis.ConnectionError("refused"))
    with pytest.raises(redis.ConnectionError):
        w.call(fn, "a read")
    assert attempts == [0] and t.sleeps == [] and not w.up  # still noted: the gauge shows it


@pytest.mark.parametrize("err", NOT_OUTAGES[:3] + NOT_OUTAGES[-3:], ids=lambda e: type(e).__name__)
def test_an_error_that_is_no_outage_is_raised_at_once(err: BaseException) -> None:
    t = FakeTime()
    w = _waiter(t)
    changes: list[bool] = []
    w.on_change(changes.append)
    fn, attempts = _failing(1, err)
    with pytest.raises(type(err)):
        w.call(fn, "a write")
    assert attempts == [0] and t.sleeps == [] and w.up and changes == [] and w.outages == 0


def test_the_url_is_named_without_its_password(caplog: pytest.LogCaptureFixture) -> None:
    t = FakeTime()
    w = _waiter(t, url="redis://:hunter2@redis.example:6379/0")
    fn, _ = _failing(1, redis.ConnectionError("refused"))
    with caplog.at_level(logging.WARNING, logger="asyncdapo.runtime.redis_outage"):
        w.call(fn, "x")
    text = caplog.text
    assert "redis redis://***@redis.example:6379/0 unavailable (" in text and "hunter2" not in text


def test_noted_failures_and_successes_from_outside_a_retry_loop() -> None:
    """A heartbeat or a status read that does its own error handling reports through the same state."""
    t = FakeTime()
    w = _waiter(t)
    changes: list[bool] = []
    w.on_change(changes.append)
    w.note_failure(redis.ConnectionError("refused"), "heartbeat")
    w.note_failure(redis.ConnectionError("refused"), "heartbeat")
    assert not w.up and w.down_since == t.now and w.last_error == "ConnectionError: refused"
    t.now += 3.0
    w.note_success()
    w.note_success()
    assert w.up and changes == [False, True] and w.outages == 1 and w.last_recovered == t.now


async def test_async_calls_wait_out_an_outage_the_same_way(caplog: pytest.LogCaptureFixture) -> None:
    t = FakeTime()
    policy = Backoff(0.05, 2.0, jitter=Jitter.EQUAL)
    w = _waiter(t, policy, rng=random.Random(5))
    changes: list[bool] = []
    w.on_change(changes.append)
    attempts: list[int] = []

    async def fn(attempt: int) -> int:
        attempts.append(attempt)
        if attempt < 8:
            raise _reply("LOADING Redis is loading the dataset in memory")
        return 42

    with caplog.at_level(logging.WARNING, logger="asyncdapo.runtime.redis_outage"):
        assert await w.acall(fn, "a claim") == 42
    assert attempts == list(range(9)) and changes == [False, True] and w.outages == 1
    for k, s in enumerate(t.sleeps):  # each wait within [d/2, d] of the doubled, capped wait
        assert policy.capped(k) / 2 <= s <= policy.capped(k)
    assert (
        "redis unavailable (BusyLoadingError: Redis is loading the dataset in memory) during a claim"
        in caplog.text
    )


async def test_async_give_up_and_non_outage_errors() -> None:
    t = FakeTime()
    w = _waiter(t, give_up_after_s=1.0)

    async def away(_attempt: int) -> None:
        raise redis.TimeoutError("Timeout connecting to server")

    with pytest.raises(redis.TimeoutError):
        await w.acall(away, "a read")
    assert not w.up and 1.0 <= sum(t.sleeps) < 3.0

    t2 = FakeTime()
    w2 = _waiter(t2)

    async def wrong_type(_attempt: int) -> None:
        raise _reply("WRONGTYPE Operation against a key holding the wrong kind of value")

    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        await w2.acall(wrong_type, "a read")
    assert t2.sleeps == [] and w2.up


def test_a_full_redis_is_waited_out_and_told_apart_from_one_that_is_away(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """OOM at maxmemory (noeviction) clears once memory frees: the write waits, `full` says why,
    and a pipeline's wrapped OOM ("Command # 1 (...) of pipeline caused error") counts too."""
    t = FakeTime()
    w = _waiter(t)
    changes: list[tuple[bool, bool]] = []
    w.on_change(lambda up: changes.append((up, w.full)))
    oom = _reply("OOM command not allowed when used memory > 'maxmemory'.")
    wrapped = redis.exceptions.OutOfMemoryError(f"Command # 1 (XADD g * g x) of pipeline caused error: {oom}")
    errors = [oom, wrapped, redis.ConnectionError("reset"), oom]
    attempts: list[int] = []

    def fn(attempt: int) -> str:
        attempts.append(attempt)
        if attempt < len(errors):
            raise errors[attempt]
        return "written"

    with caplog.at_level(logging.WARNING, logger="asyncdapo.runtime.redis_outage"):
        assert w.call(fn, "a group write") == "written"
    assert attempts == [0, 1, 2, 3, 4] and w.up and not w.full and w.outages == 1
    # full, then away (told), then full again (told), then back: one outage, each change reported
    assert changes == [(False, True), (False, False), (False, True), (True, False)]
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("redis is full (maxmemory reached: command not allowed when used memory")
    assert "during a group write; the write waits until memory frees" in lines[0]
    assert lines[1].startswith("redis unavailable (ConnectionError: reset)")
    assert lines[2].startswith("redis is full") and lines[3].startswith("redis is back after")
    assert len(lines) == 4


def test_a_full_spell_ends_only_when_a_refused_write_goes_through() -> None:
    """At maxmemory reads and a lease's PEXPIRE still succeed: they must not flip `full` (and the
    gauge and health that follow it) back and forth while every other write is refused. The spell
    ends when a write that was refused as full goes through."""
    t = FakeTime()
    w = _waiter(t)
    changes: list[bool] = []
    w.on_change(changes.append)
    oom = _reply("OOM command not allowed when used memory > 'maxmemory'.")
    w.note_failure(oom, "a write")
    assert w.full and not w.up
    assert w.call(lambda _a: "read", "a read") == "read"
    w.note_success()  # the trainer's lease heartbeat
    assert w.full and not w.up and changes == [False]
    fn, _ = _failing(2, oom)  # a write refused twice, then through: memory freed
    w.call(fn, "a write")
    assert w.up and not w.full and changes == [False, True]
    # a Redis away (not full) is back at any success
    w.note_failure(redis.ConnectionError("reset"), "a read")
    w.call(lambda _a: None, "a read")
    assert w.up and changes == [False, True, False, True]
