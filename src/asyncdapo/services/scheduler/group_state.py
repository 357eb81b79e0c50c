"""Per-prompt group state in Redis: responses counted exactly once, outcomes recorded exactly once.

`GroupStore` runs the scripts of `lua.py` with EVALSHA, many per pipeline (one round trip per
batch of scored responses), and reloads them if Redis lost its script cache. What the scripts
take and answer are pure records (`group_records`, `outcome_records`), where the pure helpers the
Lua arithmetic is tested against (`group_records.welford`, `is_valid`) live too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, cast

from redis.exceptions import NoScriptError

from asyncdapo.contracts.redis_keys import FINISHED_PROMPT_TTL_S, OUTCOMES_MAXLEN, RunKeys, text
from asyncdapo.services.scheduler.group_records import GroupProgress, RecordStatus, ResponseScore
from asyncdapo.services.scheduler.lua import SCRIPTS
from asyncdapo.services.scheduler.outcome_records import FinishItem, FinishResult, Outcome

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.asyncio.client import Pipeline

_s = text

ScriptArg = str | int | float | bytes  # one ARGV value (Redis sends its text)
# A script's reply as redis-py hands it over: bytes or str (decode_responses), integers, nested
# lists. Its shape is the script's contract (lua.py); readers convert it with `text` / `rows`.
ScriptReply = object


def rows(reply: ScriptReply) -> list[Sequence[ScriptReply]]:
    """A reply that is a list of rows (RECORD, FINISH), as the script returns it."""
    return cast("list[Sequence[ScriptReply]]", reply)


def items(reply: ScriptReply) -> Sequence[ScriptReply]:
    """A reply that is a flat list (CLAIM)."""
    return cast("Sequence[ScriptReply]", reply)


def parse_progress(reply: Sequence[ScriptReply]) -> GroupProgress:
    status = RecordStatus(_s(reply[0]))
    if status in (RecordStatus.STALE, RecordStatus.FENCED):
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


class RoundTrips:
    """Counts Redis round trips (one per command or pipeline execute) for metrics and benchmarks."""

    def __init__(self) -> None:
        self.count = 0


class ScriptRunner:
    """EVALSHA with the scripts loaded once; a NOSCRIPT reply (Redis restarted) reloads and retries."""

    def __init__(self, redis: Redis, rtt: RoundTrips) -> None:
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
        calls: Sequence[tuple[str, Sequence[str], Sequence[ScriptArg]]],
        extra: Callable[[Pipeline], None] | None = None,
    ) -> list[ScriptReply]:
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
                replies: list[ScriptReply] = await pipe.execute()
                self.rtt.count += 1
                return replies[: len(calls)]
            except NoScriptError:
                self.rtt.count += 1
                if attempt:
                    raise
                await self.load()
        raise AssertionError("unreachable")

    async def run(self, name: str, keys: Sequence[str], args: Sequence[ScriptArg]) -> ScriptReply:
        return (await self.run_many([(name, keys, args)]))[0]


class GroupStore:
    """Batched access to the group state: one EVALSHA per batch (see `lua.py`). Every write
    carries the caller's fencing `epoch` (set once the scheduler has taken the run over)."""

    def __init__(
        self,
        scripts: ScriptRunner,
        keys: RunKeys,
        train_batch_size: int = 1,
        staleness_window: int = 0,
        finished_ttl_s: int = FINISHED_PROMPT_TTL_S,
    ) -> None:
        self.scripts = scripts
        self.keys = keys
        self.epoch = 0
        self.version = 0  # the published policy version (the scheduler keeps it current)
        self.train_batch_size = train_batch_size
        # ceil(s) (`RunConfig.staleness_window`): FINISH's version window; the bound comes per item
        self.staleness_window = staleness_window
        self.finished_ttl_s = finished_ttl_s

    async def record(self, scores: Sequence[ResponseScore]) -> list[GroupProgress]:
        """Count each scored response into its prompt's group state and the completion counters
        (one command, one round trip; a response counted before is `dup` and counts nothing)."""
        if not scores:
            return []
        keys = [self.keys.counters, self.keys.scheduler_epoch] + [self.keys.prompt(s.pid) for s in scores]
        args = [str(self.epoch)] + [
            f"{s.attempt} {s.idx} {float(s.metric)!r} {float(s.reward)!r} {s.min_version} "
            f"{s.max_version} {s.length}"
            for s in scores
        ]
        (reply,) = await self.scripts.run_many([("record", keys, args)])
        return [parse_progress(r) for r in rows(reply)]

    def finish_call(
        self,
        pid: str,
        attempt: int,
        outcome: Outcome,
        reason: str = "",
        bound: int = -1,
        group: bytes = b"",
        min_version: int = 0,
    ) -> FinishItem:
        return FinishItem(pid, attempt, outcome, str(reason), bound, group, min_version)

    async def finish_many(self, items: Sequence[FinishItem]) -> list[FinishResult]:
        """Record the outcomes, in order, in one atomic script call."""
        if not items:
            return []
        k = self.keys
        keys = [k.counters, k.prompts_claimed, k.prompts, k.groups, k.scheduler_epoch, k.outcomes]
        args: list[ScriptArg] = [
            str(self.epoch),
            self.train_batch_size,
            self.staleness_window,
            self.finished_ttl_s,
            OUTCOMES_MAXLEN,
            self.version,
        ]
        for i in items:
            keys += [k.prompt(i.pid), k.prompt_data(i.pid)]
            args += [i.pid, i.attempt, i.outcome.value, i.reason, i.bound, i.group, i.min_version]
        (reply,) = await self.scripts.run_many([("finish", keys, args)])
        return [FinishResult(_s(r[0]), int(_s(r[1])), int(_s(r[2]))) for r in rows(reply)]
