"""One suite, two stores: the Lua scripts on a real redis-server and `memstore` in memory must give
the same answers — claims, record progress, outcome labels and counts, the bound and the staleness
rule with credits, fencing, recovery — and leave the same queue and counters behind. The simulator
drives the rollout core on `memstore`; this is what makes its store the production one."""

from __future__ import annotations

import inspect
import random
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
import redis.asyncio as aioredis

from asyncdapo.contracts.config import RunConfig
from asyncdapo.contracts.prompts import PromptRecord, queue_prompts
from asyncdapo.contracts.redis_keys import RunKeys
from asyncdapo.services.scheduler.claim_records import Fenced
from asyncdapo.services.scheduler.group_records import ResponseScore
from asyncdapo.services.scheduler.group_state import GroupStore, RoundTrips, ScriptRunner
from asyncdapo.services.scheduler.memstore import MemoryGroupStore, MemoryQueue, MemoryRun
from asyncdapo.services.scheduler.outcome_records import Outcome, RequeueReason
from asyncdapo.services.scheduler.queue import PromptQueue

KEYS = RunKeys("eq")
T = TypeVar("T")


async def _a(x: T | Awaitable[T]) -> T:
    return await x if inspect.isawaitable(x) else x  # type: ignore[return-value]


def _rec(i: int) -> PromptRecord:
    return PromptRecord(f"e0-{i}", [1, 2, 3], "q", str(i), "synth", 0, i)


@dataclass
class Backend:
    name: str
    queue: Any
    store: Any
    redis: aioredis.Redis | None = None
    run: MemoryRun | None = None

    async def push(self, records: list[PromptRecord]) -> None:
        if self.run is not None:
            self.run.push(records)
        else:
            assert self.redis is not None
            pipe = self.redis.pipeline()
            queue_prompts(pipe, KEYS, records)
            await pipe.execute()

    async def credit(self, n: int) -> None:
        if self.run is not None:
            self.run.incr("valid_credited", n)
        else:
            assert self.redis is not None
            await self.redis.hincrby(KEYS.counters, "valid_credited", n)

    async def state(self) -> tuple[list[str], dict[str, int], int]:
        """Queue, counters (those both keep) and the number of committed groups."""
        if self.run is not None:
            return list(self.run.queue), dict(self.run.counters), len(self.run.groups)
        assert self.redis is not None
        q = [x.decode() for x in await self.redis.lrange(KEYS.prompts, 0, -1)]
        c = {k.decode(): int(v) for k, v in (await self.redis.hgetall(KEYS.counters)).items()}
        return q, c, int(await self.redis.xlen(KEYS.groups))

    def other(self, owner: str) -> Backend:
        """A second scheduler on the same run (another owner)."""
        if self.run is not None:
            store = MemoryGroupStore(self.run, self.store.train_batch_size, self.store.staleness_window)
            q = MemoryQueue(self.run, owner)
            q.store = store
            return Backend(self.name, q, store, run=self.run)
        assert self.redis is not None
        rtt = RoundTrips()
        scripts = ScriptRunner(self.redis, rtt)
        store = GroupStore(scripts, KEYS, self.store.train_batch_size, self.store.staleness_window)
        return Backend(
            self.name, PromptQueue(self.redis, KEYS, scripts, store, rtt, owner=owner), store, self.redis
        )


def _cfg(b: int, s: float) -> RunConfig:
    return RunConfig.model_validate(
        {
            "data": {"train_batch_size": b},
            "trainer": {"ppo_mini_batch_size": b},
            "rollout": {"max_staleness": s},
        }
    )


async def _backends(redis_url: str, b: int = 1, s: int = 0) -> list[Backend]:
    r = aioredis.from_url(redis_url)
    rtt = RoundTrips()
    scripts = ScriptRunner(r, rtt)
    gs = GroupStore(scripts, KEYS, b, s)
    rb = Backend("redis", PromptQueue(r, KEYS, scripts, gs, rtt, owner="s1"), gs, r)
    run = MemoryRun()
    ms = MemoryGroupStore(run, b, s)
    mq = MemoryQueue(run, "s1")
    mq.store = ms
    return [rb, Backend("memory", mq, ms, run=run)]


async def _both(backends: list[Backend], fn: Any) -> Any:
    """Run `fn(backend)` on both; the answers must be equal; returns the answer."""
    answers = [await fn(be) for be in backends]
    assert answers[0] == answers[1], f"redis {answers[0]!r} != memory {answers[1]!r}"
    return answers[0]


async def test_the_scripted_scenarios_answer_alike(redis_url: str) -> None:
    bes = await _backends(redis_url)
    await _both(bes, lambda be: be.push([_rec(i) for i in range(5)]))
    await _both(bes, lambda be: _a(be.queue.take_over()))
    claims = await _both(bes, lambda be: _a(be.queue.claim(3, 2, token="t1")))
    assert await _both(bes, lambda be: _a(be.queue.claim(3, 2, token="t1"))) == claims  # a retry
    c0, c1, c2 = claims.claims
    scores = [ResponseScore(c0.pid, 1, i, float(i), float(i) - 0.1, 0, 1, 5) for i in range(2)]
    await _both(bes, lambda be: _a(be.store.record([scores[0], scores[0]])))  # a repeat in the batch
    await _both(bes, lambda be: _a(be.store.record(scores)))  # completes, with a dup

    def finishes(be: Backend) -> Any:
        s = be.store
        return _a(
            s.finish_many(
                [
                    s.finish_call(c0.pid, 1, Outcome.VALID, bound=1, group=b"G"),
                    s.finish_call(c1.pid, 1, Outcome.VALID, bound=1, group=b"G"),
                    s.finish_call(c2.pid, 1, Outcome.DROPPED, "bad_prompt"),
                    s.finish_call(c0.pid, 1, Outcome.VALID, bound=1, group=b"G"),  # a repeat
                    s.finish_call(c1.pid, 7, Outcome.FILTERED),  # an attempt that is not current
                ]
            )
        )

    res = await _both(bes, finishes)
    assert [r.label for r in res] == [
        "valid",
        "requeued:over_bound",
        "dropped:bad_prompt",
        "dup:valid",
        "stale",
    ]
    await _both(bes, lambda be: be.state())


async def test_staleness_and_credits_answer_alike(redis_url: str) -> None:
    bes = await _backends(redis_url, b=2, s=1)
    await _both(bes, lambda be: be.push([_rec(i) for i in range(8)]))
    await _both(bes, lambda be: _a(be.queue.take_over()))
    claims = (await _both(bes, lambda be: _a(be.queue.claim(7, 2, token="t")))).claims

    def valid(be: Backend, cs: list[Any], mv: int) -> Any:
        s = be.store
        return _a(
            s.finish_many(
                [
                    s.finish_call(c.pid, c.attempt, Outcome.VALID, bound=100, group=b"G", min_version=mv)
                    for c in cs
                ]
            )
        )

    await _both(bes, lambda be: valid(be, claims[:5], 0))
    await _both(bes, lambda be: be.credit(2))
    await _both(bes, lambda be: valid(be, claims[5:6], 0))
    for be in bes:
        be.store.version = 3  # a publish: the staleness rule never judges older than it
    await _both(bes, lambda be: valid(be, claims[6:], 1))
    await _both(bes, lambda be: be.state())


async def test_a_fractional_staleness_answers_alike(redis_url: str) -> None:
    """s = 0.5, B = 2 (verl fully-async, staleness_threshold 0.5): floor((v + 1.5) * 2) valid groups
    at version v, and a group trains at most ceil(0.5) = 1 version late."""
    cfg = _cfg(2, 0.5)
    bes = await _backends(redis_url, b=2, s=cfg.staleness_window)
    await _both(bes, lambda be: be.push([_rec(i) for i in range(8)]))
    await _both(bes, lambda be: _a(be.queue.take_over()))
    claims = (await _both(bes, lambda be: _a(be.queue.claim(8, 2, token="t")))).claims

    def valid(be: Backend, cs: list[Any], mv: int) -> Any:
        s, bound = be.store, cfg.valid_group_bound(be.store.version)
        return _a(
            s.finish_many(
                [
                    s.finish_call(c.pid, c.attempt, Outcome.VALID, bound=bound, group=b"G", min_version=mv)
                    for c in cs
                ]
            )
        )

    at_v0 = await _both(bes, lambda be: valid(be, claims[:4], 0))
    # 3 groups, not 2 (s = 0) or 4 (s = 1)
    assert [r.label for r in at_v0] == ["valid"] * 3 + ["requeued:over_bound"]
    for be in bes:
        be.store.version = 1
    at_v1 = await _both(bes, lambda be: valid(be, claims[4:6], 0))
    # position 3 trains at step 1 (1 version late: kept); position 4 would train at step 2 (too late)
    assert [r.label for r in at_v1] == ["valid", "requeued:stale"]
    fresh = await _both(bes, lambda be: valid(be, claims[6:8], 1))
    assert [r.label for r in fresh] == ["valid", "requeued:over_bound"]  # floor(2.5 * 2) = 5 reached
    await _both(bes, lambda be: be.state())


async def test_fencing_and_recovery_answer_alike(redis_url: str) -> None:
    bes = await _backends(redis_url)
    await _both(bes, lambda be: be.push([_rec(i) for i in range(5)]))
    await _both(bes, lambda be: _a(be.queue.take_over()))
    held = (await _both(bes, lambda be: _a(be.queue.claim(2, 4, token="t")))).claims
    new = [be.other("s2") for be in bes]
    await _both(new, lambda be: _a(be.queue.take_over()))
    res = await _both(new, lambda be: _a(be.queue.recover()))
    assert [r.label for r in res] == ["requeued:scheduler_restart"] * 2

    async def refused(be: Backend) -> tuple[str, str, int]:
        try:
            await _a(be.queue.claim(1, 4))
            claim = "claimed"
        except Fenced:
            claim = "fenced"
        (rec,) = await _a(be.store.record([ResponseScore(held[0].pid, 1, 0, 1.0, 1.0, 0, 0, 3)]))
        return claim, str(rec.status), await _a(be.queue.refresh_lease())

    assert await _both(bes, refused) == ("fenced", "fenced", 0)
    await _both(bes, lambda be: be.state())


@pytest.mark.parametrize(("seed", "s"), [(1, 1), (2, 1), (3, 1), (4, 0.5), (5, 1.3)])
async def test_random_operation_sequences_answer_alike(redis_url: str, seed: int, s: float) -> None:
    """A seeded random walk over claims, records (with repeats and stale attempts), finishes of every
    kind (valid under a moving bound and version, filtered, dropped, requeued, repeats), credits and
    reconciliation: every answer, and the queue and counters at the end, are the same; s fractional
    too (the bound floor((v + 1 + s) * B), the window ceil(s))."""
    cfg = _cfg(3, s)
    bes = await _backends(redis_url, b=3, s=cfg.staleness_window)
    rng = random.Random(seed)
    await _both(bes, lambda be: be.push([_rec(i) for i in range(40)]))
    await _both(bes, lambda be: _a(be.queue.take_over()))
    live: list[Any] = []
    version = 0
    for step in range(300):
        op = rng.random()
        if op < 0.2:
            k = rng.randint(1, 4)
            batch = await _both(bes, lambda be, k=k, step=step: _a(be.queue.claim(k, 3, token=f"t{step}")))
            live += batch.claims
        elif op < 0.5 and live:
            c = rng.choice(live)
            attempt = c.attempt if rng.random() < 0.9 else c.attempt + 1
            sc = [ResponseScore(c.pid, attempt, rng.randint(0, 3), float(rng.random() < 0.5), rng.random(), version, version, rng.randint(1, 9)) for _ in range(rng.randint(1, 3))]  # fmt: skip
            await _both(bes, lambda be, sc=sc: _a(be.store.record(sc)))
        elif op < 0.85 and live:
            c = rng.choice(live)
            kind = rng.choice(
                [Outcome.VALID, Outcome.VALID, Outcome.FILTERED, Outcome.DROPPED, Outcome.REQUEUED]
            )
            reason = {Outcome.DROPPED: "gateway_error", Outcome.REQUEUED: RequeueReason.EARLY_STOP}.get(
                kind, ""
            )
            bound = rng.choice([-1, cfg.valid_group_bound(version)])
            mv = max(0, version - rng.randint(0, 2))
            res = await _both(
                bes,
                lambda be, c=c, kind=kind, reason=reason, bound=bound, mv=mv: _a(
                    be.store.finish_many(
                        [be.store.finish_call(c.pid, c.attempt, kind, reason, bound, b"G", mv)]
                    )
                ),
            )
            if not res[0].label.startswith("dup") and rng.random() < 0.8:
                live.remove(c)
        elif op < 0.9:
            await _both(bes, lambda be: be.credit(1))
        elif op < 0.95:
            version += 1
            for be in bes:
                be.store.version = version
        else:
            held = {(c.pid, c.attempt) for c in live}
            orphans = await _both(bes, lambda be, held=held: _a(be.queue.orphans(held)))
            await _both(bes, lambda be, o=orphans: _a(be.queue.requeue(o, RequeueReason.ORPHANED)))
    q = await _both(bes, lambda be: be.state())
    assert q[1]["admitted"] > 20
