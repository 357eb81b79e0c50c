"""Per-prompt group state in Redis: responses counted exactly once, outcomes recorded exactly once.

`GroupStore` runs the scripts of `lua.py` with EVALSHA, many per pipeline (one round trip per
batch of scored responses), and reloads them if Redis lost its script cache. The pure helpers
(`welford`, `is_valid`) are the reference the Lua arithmetic is tested against.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

from asyncdapo.redis_keys import RunKeys
from asyncdapo.scheduler.lua import SCRIPTS

log = logging.getLogger(__name__)
T = TypeVar("T")


class Outcome(StrEnum):
    VALID = "valid"
    FILTERED = "filtered"
    REQUEUED = "requeued"
    DROPPED = "dropped"


class DropReason(StrEnum):
    VERIFIER_ERROR = "verifier_error"  # the verifier stayed down through every retry
    BAD_PROMPT = "bad_prompt"  # the prompt's data is missing or malformed
    PROMPT_TOO_LONG = "prompt_too_long"  # longer than data.max_prompt_length
    GATEWAY_ERROR = "gateway_error"  # a request failed on every gateway it was tried on
    EARLY_STOP = "early_stop"  # aborted by early stop with requeue_aborted off


class RequeueReason(StrEnum):
    EARLY_STOP = "early_stop"  # aborted when the bound was reached
    OVER_BOUND = "over_bound"  # valid, but the bound was reached first (decided in Lua)
    SCHEDULER_RESTART = "scheduler_restart"  # claimed by a scheduler that died
    STOPPED = "stopped"  # StopRun aborted it


class RecordStatus(StrEnum):
    OK = "ok"
    COMPLETE = "complete"  # this response completed the group
    DUP = "dup"  # already counted (a retry); state unchanged
    STALE = "stale"  # not the current attempt, or the attempt already has an outcome


@dataclass(frozen=True, slots=True)
class GroupProgress:
    status: RecordStatus
    done: int = 0
    n: int = 0
    metric_mean: float = 0.0
    metric_std: float = 0.0
    reward_mean: float = 0.0
    reward_std: float = 0.0
    min_version: int = 0
    max_version: int = 0

    @property
    def complete(self) -> bool:
        return self.n > 0 and self.done >= self.n


@dataclass(frozen=True, slots=True)
class ResponseScore:
    pid: str
    attempt: int
    idx: int
    metric: float  # the filter metric (acc or score)
    reward: float
    min_version: int
    max_version: int


@dataclass(frozen=True, slots=True)
class FinishItem:
    pid: str
    attempt: int
    outcome: Outcome
    reason: str = ""
    bound: int = -1  # valid only: the bound checked atomically (-1: none)
    group: bytes = b""  # valid only: the serialized rollout_pb2.Group
    version: int = 0


@dataclass(frozen=True, slots=True)
class FinishResult:
    label: str  # valid | filtered | requeued | dropped:<reason>, or dup:<label> / stale
    valid_produced: int

    @property
    def outcome(self) -> str:
        return self.label.split(":", 1)[0]


def welford(values: Sequence[float]) -> tuple[float, float]:
    """Mean and population std (ddof 0, as numpy and verl's DAPO filter) — the Lua reference."""
    mean = m2 = 0.0
    for i, x in enumerate(values, 1):
        d = x - mean
        mean += d / i
        m2 += d * (x - mean)
    return mean, math.sqrt(max(m2 / max(len(values), 1), 0.0))


def is_valid(metric_std: float, eps: float) -> bool:
    """DAPO dynamic sampling: a group carries signal only when its metric varies."""
    return metric_std > eps


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def parse_progress(reply: Sequence[Any]) -> GroupProgress:
    status = RecordStatus(_s(reply[0]))
    if status is RecordStatus.STALE:
        return GroupProgress(status)
    f = [_s(x) for x in reply[1:]]
    if len(f) == 2:
        return GroupProgress(status, done=int(f[0]), n=int(f[1]))
    return GroupProgress(
        status,
        done=int(f[0]),
        n=int(f[1]),
        metric_mean=float(f[2]),
        metric_std=float(f[3]),
        reward_mean=float(f[4]),
        reward_std=float(f[5]),
        min_version=int(f[6]) if f[6] else 0,
        max_version=int(f[7]) if f[7] else 0,
    )


async def redis_retry(fn: Callable[[], Awaitable[T]], timeout_s: float = 60.0) -> T:
    """Run a Redis operation, retrying through a Redis restart for up to `timeout_s`. The scripts
    are idempotent (attempt and response markers), so a retry after a lost reply cannot
    double-count an outcome or a reward."""
    delay = 0.05
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await fn()
        except (RedisConnectionError, RedisTimeoutError) as err:
            if time.monotonic() > deadline:
                raise
            log.warning("redis unavailable (%s); retrying in %.2f s", err, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)


class RoundTrips:
    """Counts Redis round trips (one per command or pipeline execute) for metrics and benchmarks."""

    def __init__(self) -> None:
        self.count = 0


class ScriptRunner:
    """EVALSHA with the scripts loaded once; a NOSCRIPT reply (Redis restarted) reloads and retries."""

    def __init__(self, redis: Any, rtt: RoundTrips) -> None:
        self.redis = redis
        self.rtt = rtt
        self.sha: dict[str, str] = {}

    async def load(self) -> None:
        pipe = self.redis.pipeline(transaction=False)
        for src in SCRIPTS.values():
            pipe.script_load(src)
        shas = await pipe.execute()
        self.rtt.count += 1
        self.sha = {name: _s(sha) for name, sha in zip(SCRIPTS, shas, strict=True)}

    async def run_many(
        self,
        calls: Sequence[tuple[str, Sequence[str], Sequence[Any]]],
        extra: Callable[[Any], None] | None = None,
    ) -> list[Any]:
        """Run (script, keys, args) calls in one pipeline; replies in order. `extra` may add more
        commands to the same round trip (their replies are dropped)."""
        if not calls:
            return []
        if not self.sha:
            await self.load()
        for attempt in range(2):
            pipe = self.redis.pipeline(transaction=False)
            for name, keys, args in calls:
                pipe.evalsha(self.sha[name], len(keys), *keys, *args)
            if extra is not None:
                extra(pipe)
            try:
                replies = await pipe.execute()
                self.rtt.count += 1
                return replies[: len(calls)]
            except NoScriptError:
                self.rtt.count += 1
                if attempt:
                    raise
                await self.load()
        raise AssertionError("unreachable")

    async def run(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        return (await self.run_many([(name, keys, args)]))[0]


class GroupStore:
    """Batched access to the group state: one EVALSHA per batch (see `lua.py`)."""

    def __init__(self, scripts: ScriptRunner, keys: RunKeys) -> None:
        self.scripts = scripts
        self.keys = keys

    async def record(
        self, scores: Sequence[ResponseScore], extra: Callable[[Any], None] | None = None
    ) -> list[GroupProgress]:
        """Count each scored response into its prompt's group state (one command, one round trip
        shared with the `extra` commands)."""
        if not scores:
            return []
        keys = [self.keys.prompt(s.pid) for s in scores]
        args = [
            f"{s.attempt} {s.idx} {float(s.metric)!r} {float(s.reward)!r} {s.min_version} {s.max_version}"
            for s in scores
        ]
        (reply,) = await self.scripts.run_many([("record", keys, args)], extra)
        return [parse_progress(r) for r in reply]

    def finish_call(
        self,
        pid: str,
        attempt: int,
        outcome: Outcome,
        reason: str = "",
        bound: int = -1,
        group: bytes = b"",
        version: int = 0,
    ) -> FinishItem:
        return FinishItem(pid, attempt, outcome, reason, bound, group, version)

    async def finish_many(self, items: Sequence[FinishItem]) -> list[FinishResult]:
        """Record the outcomes, in order, in one atomic script call."""
        if not items:
            return []
        k = self.keys
        keys = [k.counters, k.prompts_claimed, k.prompts, k.groups] + [k.prompt(i.pid) for i in items]
        args: list[Any] = []
        for i in items:
            args += [i.pid, i.attempt, i.outcome.value, i.reason, i.bound, i.group, i.version]
        (reply,) = await self.scripts.run_many([("finish", keys, args)])
        return [FinishResult(_s(r[0]), int(_s(r[1]))) for r in reply]
