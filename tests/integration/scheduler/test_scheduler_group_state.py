"""Group state and the reliable queue against a real redis-server: Lua arithmetic, idempotent
retries, exactly-once outcomes, the bound, the staleness rule with credits, fencing, compaction,
crash recovery."""

from __future__ import annotations

import random

import pytest
import redis.asyncio as aioredis

from asyncdapo.contracts.prompts import PromptRecord, queue_prompts
from asyncdapo.contracts.redis_keys import RunKeys
from asyncdapo.services.scheduler.claim_records import Claim, Fenced
from asyncdapo.services.scheduler.group_records import RecordStatus, ResponseScore, welford
from asyncdapo.services.scheduler.group_state import GroupStore, RoundTrips, ScriptRunner
from asyncdapo.services.scheduler.outcome_records import Outcome, RequeueReason
from asyncdapo.services.scheduler.queue import PromptQueue

KEYS = RunKeys("t")


def _rec(i: int) -> PromptRecord:
    return PromptRecord(f"e0-{i}", [1, 2, 3], "q", str(i), "synth", 0, i)


async def _setup(
    url: str, count: int = 4, owner: str = "s1", b: int = 1, s: int = 0, queue: bool = True
) -> tuple[aioredis.Redis, PromptQueue, GroupStore]:
    r = aioredis.from_url(url)
    if queue:
        pipe = r.pipeline()
        queue_prompts(pipe, KEYS, [_rec(i) for i in range(count)])
        await pipe.execute()
    rtt = RoundTrips()
    scripts = ScriptRunner(r, rtt)
    store = GroupStore(scripts, KEYS, train_batch_size=b, staleness_window=s)
    q = PromptQueue(r, KEYS, scripts, store, rtt, owner=owner)
    await q.take_over()
    return r, q, store


async def _claim(q: PromptQueue, k: int, n: int) -> list[Claim]:
    return (await q.claim(k, n)).claims


async def _counters(r: aioredis.Redis) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in (await r.hgetall(KEYS.counters)).items()}


async def test_record_matches_welford_and_is_idempotent(redis_url: str) -> None:
    r, q, store = await _setup(redis_url, 1)
    (c,) = await _claim(q, 5, n=6)
    assert (c.pid, c.attempt) == ("e0-0", 1)
    rng = random.Random(0)
    metrics = [rng.choice([0.0, 1.0]) for _ in range(6)]
    rewards = [m - rng.random() * 0.3 for m in metrics]
    progress = []
    for i, (m, rw) in enumerate(zip(metrics, rewards, strict=True)):
        s = ResponseScore(c.pid, c.attempt, i, m, rw, 3 + i % 2, 4, length=10 + i)
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
    # the completion counters moved inside the script: each response counted once
    c2 = await _counters(r)
    assert c2["completions"] == 6 and c2["generated_tokens"] == sum(10 + i for i in range(6))
    await r.aclose()


async def test_all_equal_group_has_exactly_zero_std(redis_url: str) -> None:
    r, q, store = await _setup(redis_url, 1)
    (c,) = await _claim(q, 1, n=8)
    out = await store.record([ResponseScore(c.pid, c.attempt, i, 1.0, 0.7, 0, 0) for i in range(8)])
    assert out[-1].status is RecordStatus.COMPLETE and out[-1].metric_std == 0.0
    await r.aclose()


async def test_outcome_once_bound_enforced_and_requeue_at_head(redis_url: str) -> None:
    r, q, store = await _setup(redis_url, 4)
    claims = await _claim(q, 3, n=2)
    assert [c.pid for c in claims] == ["e0-0", "e0-1", "e0-2"]
    assert await q.depth() == 1
    calls = [store.finish_call(c.pid, c.attempt, Outcome.VALID, bound=1, group=b"G") for c in claims]
    res = await store.finish_many([*calls, calls[0]])
    assert [x.label for x in res] == ["valid", "requeued:over_bound", "requeued:over_bound", "dup:valid"]
    assert res[0].valid_produced == 1 and res[3].valid_produced == 1
    assert res[3].recorded == ("valid", "")  # a repeat says what the lost first reply said
    assert await r.xlen(KEYS.groups) == 1
    # over-bound prompts went back to the head, the later one pushed first
    assert [x.decode() for x in await r.lrange(KEYS.prompts, 0, -1)] == ["e0-2", "e0-1", "e0-3"]
    assert await r.hlen(KEYS.prompts_claimed) == 0
    counters = await _counters(r)
    assert counters["admitted"] == 3 and counters["outcome:valid"] == 1
    assert counters["outcome:requeued"] == 2 and counters["requeued:over_bound"] == 2
    # every recorded outcome is in the audit stream, once
    audit = [(f[b"p"].decode(), f[b"o"].decode()) for _, f in await r.xrange(KEYS.outcomes)]
    assert sorted(audit) == [
        ("e0-0", "valid"),
        ("e0-1", "requeued:over_bound"),
        ("e0-2", "requeued:over_bound"),
    ]
    # a response of the finished attempt is stale, and so is a finish of an old attempt
    (again,) = await _claim(q, 1, n=2)
    assert (again.pid, again.attempt) == ("e0-2", 2)
    stale = await store.record([ResponseScore("e0-2", 1, 0, 1.0, 1.0, 0, 0)])
    assert stale[0].status is RecordStatus.STALE
    (old,) = await store.finish_many([store.finish_call("e0-2", 1, Outcome.FILTERED)])
    assert old.label == "stale" and old.recorded is None
    (drop,) = await store.finish_many([store.finish_call("e0-2", 2, Outcome.DROPPED, "verifier_error")])
    assert drop.label == "dropped:verifier_error"
    await r.aclose()


async def test_final_outcome_compacts_prompt_state(redis_url: str) -> None:
    """Memory stays bounded: a final outcome deletes the prompt's data and lets its compacted state
    expire; a requeue keeps both (the prompt comes back)."""
    r, q, store = await _setup(redis_url, 2)
    a, b = await _claim(q, 2, n=2)
    await store.finish_many(
        [
            store.finish_call(a.pid, a.attempt, Outcome.FILTERED),
            store.finish_call(b.pid, b.attempt, Outcome.REQUEUED, RequeueReason.EARLY_STOP),
        ]
    )
    assert not await r.exists(KEYS.prompt_data(a.pid))
    state = {k.decode(): v.decode() for k, v in (await r.hgetall(KEYS.prompt(a.pid))).items()}
    assert state == {"attempt": "1", "o:1": "filtered", "outcome": "filtered"}
    assert 0 < await r.ttl(KEYS.prompt(a.pid)) <= store.finished_ttl_s
    assert await r.exists(KEYS.prompt_data(b.pid))
    assert await r.ttl(KEYS.prompt(b.pid)) == -1
    await r.aclose()


async def test_claim_is_idempotent_with_its_token(redis_url: str) -> None:
    """A CLAIM retried after its reply was lost returns the same claims and claims nothing more."""
    r, q, _ = await _setup(redis_url, 6)
    first = await q.claim(2, n=2, token="tok-1")
    again = await q.claim(2, n=2, token="tok-1")
    assert first == again and [c.pid for c in first.claims] == ["e0-0", "e0-1"]
    assert await q.depth() == 4 and await r.hlen(KEYS.prompts_claimed) == 2
    assert (await _counters(r))["admitted"] == 2 == first.admitted_total
    other = await q.claim(2, n=2, token="tok-2")
    assert [c.pid for c in other.claims] == ["e0-2", "e0-3"] and other.admitted_total == 4
    await r.aclose()


async def test_staleness_is_judged_against_the_consuming_step_and_credits_reopen_the_bound(
    redis_url: str,
) -> None:
    """B = 2, s = 1: the group at effective position k is trained by step k // 2, so a group whose
    oldest token is from version 0 may be the 4th (step 1) but not the 5th (step 2). Groups the
    trainer drops and credits back move later groups earlier again."""
    r, q, store = await _setup(redis_url, 8, b=2, s=1)
    claims = await _claim(q, 7, n=2)

    def valid(c: Claim, min_version: int) -> object:
        return store.finish_call(
            c.pid, c.attempt, Outcome.VALID, bound=100, group=b"G", min_version=min_version
        )

    res = await store.finish_many([valid(c, 0) for c in claims[:5]])
    assert [x.label for x in res] == ["valid"] * 4 + ["requeued:stale"]
    assert res[-1].produced == 4
    # the trainer dropped two of the four (say malformed) and credited them back
    await r.hincrby(KEYS.counters, "valid_credited", 2)
    (again,) = await store.finish_many([valid(claims[5], 0)])
    assert again.label == "valid" and again.valid_produced == 3  # effective position 2: step 1
    (late,) = await store.finish_many([valid(claims[6], 1)])
    assert late.label == "valid"
    assert (await _counters(r))["requeued:stale"] == 1
    await r.aclose()


async def test_a_replaced_scheduler_is_fenced_and_its_claims_requeued_at_once(redis_url: str) -> None:
    """Take-over: the successor requeues the predecessor's claims without waiting for its lease,
    and every later write of the predecessor is refused."""
    r, old, old_store = await _setup(redis_url, 5, owner="old")
    held = await _claim(old, 2, n=4)
    assert await old.refresh_lease() == 1
    r2, new, _ = await _setup(redis_url, owner="new", queue=False)
    assert new.epoch == old.epoch + 1
    res = await new.recover()
    assert sorted(x.label for x in res) == ["requeued:scheduler_restart"] * 2
    assert [x.decode() for x in await r.lrange(KEYS.prompts, 0, -1)] == [
        "e0-0",
        "e0-1",
        "e0-2",
        "e0-3",
        "e0-4",
    ]
    assert await r.hlen(KEYS.prompts_claimed) == 0
    # the predecessor can no longer claim, count, finish or keep its lease
    with pytest.raises(Fenced):
        await old.claim(1, n=4)
    (rec,) = await old_store.record([ResponseScore(held[0].pid, 1, 0, 1.0, 1.0, 0, 0)])
    assert rec.status is RecordStatus.FENCED
    (fin,) = await old_store.finish_many([old_store.finish_call(held[0].pid, 1, Outcome.FILTERED)])
    assert fin.fenced
    assert await old.refresh_lease() == 0
    assert (await r.get(KEYS.scheduler_lease)).decode() == f"new|{new.epoch}"
    # our own claims are ours: recover leaves them, orphans finds those no task holds
    mine = await _claim(new, 2, n=4)
    assert await new.recover() == []
    orphans = await new.orphans({(mine[0].pid, mine[0].attempt)})
    assert [pid for pid, _ in orphans] == [mine[1].pid]
    await new.release_lease()
    assert not await r.exists(KEYS.scheduler_lease)
    await r.aclose()
    await r2.aclose()
