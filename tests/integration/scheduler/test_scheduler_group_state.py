"""Group state and the reliable queue against a real redis-server: Lua arithmetic, idempotent
retries, exactly-once outcomes, the bound, crash recovery."""

from __future__ import annotations

import random

import pytest
import redis.asyncio as aioredis

from asyncdapo.prompts import PromptRecord, queue_prompts
from asyncdapo.redis_keys import RunKeys
from asyncdapo.scheduler.group_state import (
    GroupStore,
    Outcome,
    RecordStatus,
    ResponseScore,
    RoundTrips,
    ScriptRunner,
    welford,
)
from asyncdapo.scheduler.queue import PromptQueue, lease_key

KEYS = RunKeys("t")


def _rec(i: int) -> PromptRecord:
    return PromptRecord(f"e0-{i}", [1, 2, 3], "q", str(i), "synth", 0, i)


async def _setup(
    url: str, count: int = 4, owner: str = "s1"
) -> tuple[aioredis.Redis, PromptQueue, GroupStore]:
    r = aioredis.from_url(url)
    pipe = r.pipeline()
    queue_prompts(pipe, KEYS, [_rec(i) for i in range(count)])
    await pipe.execute()
    rtt = RoundTrips()
    scripts = ScriptRunner(r, rtt)
    store = GroupStore(scripts, KEYS)
    return r, PromptQueue(r, KEYS, scripts, store, rtt, owner=owner), store


async def test_record_matches_welford_and_is_idempotent(redis_url: str) -> None:
    r, q, store = await _setup(redis_url, 1)
    (c,) = await q.claim(5, n=6)
    assert (c.pid, c.attempt) == ("e0-0", 1)
    rng = random.Random(0)
    metrics = [rng.choice([0.0, 1.0]) for _ in range(6)]
    rewards = [m - rng.random() * 0.3 for m in metrics]
    progress = []
    for i, (m, rw) in enumerate(zip(metrics, rewards, strict=True)):
        s = ResponseScore(c.pid, c.attempt, i, m, rw, 3 + i % 2, 4)
        progress += await store.record([s, s])  # a retry in the same batch counts once
    assert [p.status for p in progress[1::2]] == [RecordStatus.DUP] * 6
    last = progress[-2]
    assert last.status is RecordStatus.COMPLETE and last.done == 6 and last.n == 6
    mean, std = welford(metrics)
    rmean, rstd = welford(rewards)
    assert last.metric_mean == pytest.approx(mean, abs=1e-12)
    assert last.metric_std == pytest.approx(std, abs=1e-12)
    assert last.reward_mean == pytest.approx(rmean, abs=1e-12)
    assert last.reward_std == pytest.approx(rstd, abs=1e-12)
    assert (last.min_version, last.max_version) == (3, 4)
    await r.aclose()


async def test_all_equal_group_has_exactly_zero_std(redis_url: str) -> None:
    r, q, store = await _setup(redis_url, 1)
    (c,) = await q.claim(1, n=8)
    out = await store.record([ResponseScore(c.pid, c.attempt, i, 1.0, 0.7, 0, 0) for i in range(8)])
    assert out[-1].status is RecordStatus.COMPLETE and out[-1].metric_std == 0.0
    await r.aclose()


async def test_outcome_once_bound_enforced_and_requeue_at_head(redis_url: str) -> None:
    r, q, store = await _setup(redis_url, 4)
    claims = await q.claim(3, n=2)
    assert [c.pid for c in claims] == ["e0-0", "e0-1", "e0-2"]
    assert await q.depth() == 1
    calls = [
        store.finish_call(c.pid, c.attempt, Outcome.VALID, bound=1, group=b"G", version=0) for c in claims
    ]
    res = await store.finish_many([*calls, calls[0]])
    assert [x.label for x in res] == ["valid", "requeued", "requeued", "dup:valid"]
    assert res[0].valid_produced == 1
    assert await r.xlen(KEYS.groups) == 1
    # over-bound prompts went back to the head, the later one pushed first
    assert [x.decode() for x in await r.lrange(KEYS.prompts, 0, -1)] == ["e0-2", "e0-1", "e0-3"]
    assert await r.hlen(KEYS.prompts_claimed) == 0
    counters = {k.decode(): int(v) for k, v in (await r.hgetall(KEYS.counters)).items()}
    assert counters["admitted"] == 3 and counters["outcome:valid"] == 1
    assert counters["outcome:requeued"] == 2 and counters["requeued:over_bound"] == 2
    # a response of the finished attempt is stale, and so is a finish of an old attempt
    (again,) = await q.claim(1, n=2)
    assert (again.pid, again.attempt) == ("e0-2", 2)
    stale = await store.record([ResponseScore("e0-2", 1, 0, 1.0, 1.0, 0, 0)])
    assert stale[0].status is RecordStatus.STALE
    (old,) = await store.finish_many([store.finish_call("e0-2", 1, Outcome.FILTERED)])
    assert old.label == "stale"
    (drop,) = await store.finish_many([store.finish_call("e0-2", 2, Outcome.DROPPED, "verifier_error")])
    assert drop.label == "dropped:verifier_error"
    await r.aclose()


async def test_recover_requeues_claims_of_a_dead_scheduler_only(redis_url: str) -> None:
    r, dead_q, _ = await _setup(redis_url, 5, owner="dead")
    await dead_q.claim(2, n=4)  # dead never refreshes its lease
    rtt = RoundTrips()
    scripts = ScriptRunner(r, rtt)
    store = GroupStore(scripts, KEYS)
    live_other = PromptQueue(r, KEYS, scripts, store, rtt, owner="other")
    await live_other.refresh_lease()
    await live_other.claim(1, n=4)
    me = PromptQueue(r, KEYS, scripts, store, rtt, owner="me")
    res = await me.recover()
    assert sorted(x.label for x in res) == ["requeued", "requeued"]
    assert [x.decode() for x in await r.lrange(KEYS.prompts, 0, -1)] == ["e0-0", "e0-1", "e0-3", "e0-4"]
    assert list((await me.claims()).keys()) == ["e0-2"]
    assert await r.exists(lease_key(KEYS, "other"))
    await r.aclose()
