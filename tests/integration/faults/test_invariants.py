"""The invariant checker against a real Redis: quiet on a consistent run state written by the
scheduler's own scripts, and each kind of violation found, named and explained."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import redis

from asyncdapo.contracts.redis_keys import GROUPS_CONSUMER_GROUP, RunKeys
from asyncdapo.contracts.v1 import rollout_pb2
from asyncdapo.services.scheduler.lua import CLAIM, FINISH
from asyncdapo.tools.faults.invariants import AUDIT_STREAM, InvariantChecker, Kind

RUN = "inv"
K = RunKeys(RUN)


EPOCH = 1  # the fencing epoch the scripts are called with (the run's `scheduler:epoch`)


def _claim(r: redis.Redis, owner: str, count: int, now_ms: int | None = None) -> list[str]:
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    r.set(K.scheduler_epoch, EPOCH, nx=True)
    keys = [
        K.prompts,
        K.prompts_claimed,
        K.counters,
        K.scheduler_epoch,
        K.claim_token(f"{owner}:{time.time_ns()}"),
    ]
    out = r.eval(CLAIM, len(keys), *keys, count, owner, now_ms, K.prompt(""), 4, EPOCH, 600)
    assert out[0] == b"ok", out
    return [x.decode() for x in out[2::2]]


def _finish(r: redis.Redis, pid: str, attempt: int, outcome: str) -> str:
    group = rollout_pb2.Group(run=RUN, prompt_id=pid).SerializeToString() if outcome == "valid" else b""
    keys = [K.counters, K.prompts_claimed, K.prompts, K.groups, K.scheduler_epoch, K.outcomes]
    keys += [K.prompt(pid), K.prompt_data(pid)]
    args = [EPOCH, 1, 1 << 20, 300, 100_000, 0, pid, attempt, outcome, "x", -1, group, 0]
    reply = r.eval(FINISH, len(keys), *keys, *args)
    return reply[0][0].decode().split(":")[0]


@pytest.fixture()
def state(redis_url: str, tmp_path: Path) -> tuple[redis.Redis, Path]:
    """A consistent run: e0-0 valid and trained at step 1, e0-1 filtered, e0-2 requeued then
    claimed again by a live scheduler, e0-3 queued."""
    r = redis.Redis.from_url(redis_url)
    r.rpush(K.prompts, "e0-0", "e0-1", "e0-2", "e0-3")
    r.set(K.scheduler_lease, f"owner-a|{EPOCH}", px=15_000)
    assert _claim(r, "owner-a", 3) == ["e0-0", "e0-1", "e0-2"]
    assert _finish(r, "e0-0", 1, "valid") == "valid"
    assert _finish(r, "e0-1", 1, "filtered") == "filtered"
    assert _finish(r, "e0-2", 1, "requeued") == "requeued"
    assert _claim(r, "owner-a", 1) == ["e0-2"]
    r.xgroup_create(K.groups, GROUPS_CONSUMER_GROUP, id="0")
    [(_, entries)] = r.xreadgroup(GROUPS_CONSUMER_GROUP, "trainer-0", {K.groups: ">"})
    sid = entries[0][0].decode()
    trainer = tmp_path / "trainer"
    trainer.mkdir()
    _ledger(trainer, [{"step": 1, "stream_ids": [sid], "group_ids": ["e0-0"]}])
    r.xack(K.groups, GROUPS_CONSUMER_GROUP, sid)
    r.hset(K.weights, mapping={"version": 1, "uri": "x"})
    return r, trainer


def _ledger(trainer: Path, rows: list[dict]) -> None:
    (trainer / "trained.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def _checker(r: redis.Redis, trainer: Path | None, **kw: object) -> InvariantChecker:
    url = f"redis://127.0.0.1:{r.connection_pool.connection_kwargs['port']}/0"
    return InvariantChecker(url, RUN, trainer, **kw)  # type: ignore[arg-type]


def _kinds(found: list) -> set[Kind]:
    return {v.kind for v in found}


def test_a_consistent_run_has_no_violation(state: tuple[redis.Redis, Path]) -> None:
    r, trainer = state
    ck = _checker(r, trainer)
    assert ck.poll() == [] and ck.poll() == []
    s = ck.summary
    assert (s["attempts"], s["claimed"], s["groups_committed"], s["groups_trained"], s["steps"]) == (
        4,
        1,
        1,
        1,
        1,
    )
    assert len(ck.memory) == 2 and ck.memory[-1].used_memory > 0 and ck.memory[-1].aof_bytes > 0
    assert "0 violation(s)" in ck.report()


def test_attempts_without_an_outcome(state: tuple[redis.Redis, Path]) -> None:
    r, trainer = state
    r.hdel(K.prompt("e0-1"), "o:1")  # an old attempt lost its outcome
    r.hdel(K.prompts_claimed, "e0-2")  # the current attempt lost its claim
    found = _checker(r, trainer).poll()
    subjects = {v.subject for v in found if v.kind is Kind.ATTEMPT_WITHOUT_OUTCOME}
    assert subjects == {"e0-1#1", "e0-2#2"}, found
    assert "no outcome and no claim" in str(next(v for v in found if v.subject == "e0-2#2"))


def test_two_outcomes_between_polls_and_in_the_audit_stream(state: tuple[redis.Redis, Path]) -> None:
    r, trainer = state
    ck = _checker(r, trainer)
    assert ck.poll() == []
    r.hset(K.prompt("e0-1"), "o:1", "valid")
    r.xadd(K.prefix + AUDIT_STREAM, {"p": "e0-0", "a": 1, "o": "requeued:x", "e": EPOCH})
    found = [v for v in ck.poll() if v.kind is Kind.TWO_OUTCOMES]
    assert {v.subject for v in found} == {"e0-1#1", "e0-0#1"}
    assert "from 'filtered' to 'valid'" in str(found[0]) or "from 'filtered' to 'valid'" in str(found[1])


def test_stranded_and_bad_claims(state: tuple[redis.Redis, Path]) -> None:
    r, trainer = state
    old = int(time.time() * 1000) - 40_000
    r.rpush(K.prompts, "e0-9")
    assert _claim(r, "dead-owner", 1, now_ms=old) == ["e0-3"]  # it holds no lease: it is gone
    r.hset(K.prompts_claimed, "e0-1", "owner-a|1|0")  # a claim of an attempt that already has an outcome
    # an owner is gone once the checker has seen it without a lease for 10 s in a row (a lease
    # that lapsed while Redis itself was away is renewed at once): not at the first sight
    assert Kind.STRANDED_CLAIM not in _kinds(_checker(r, trainer).poll())
    found = _checker(r, trainer, gone_after_s=0).poll()
    stranded = [v for v in found if v.kind is Kind.STRANDED_CLAIM]
    assert [v.subject for v in stranded] == ["e0-3#1"] and "dead-owner" in stranded[0].detail
    assert {v.subject for v in found if v.kind is Kind.BAD_CLAIM} == {"e0-1#1"}
    # the same old claim held by a live owner is not stranded (a long generation), unless a cap is set
    r.hdel(K.prompts_claimed, "e0-1")
    r.set(K.scheduler_lease, f"dead-owner|{EPOCH}", px=15_000)
    assert Kind.STRANDED_CLAIM not in _kinds(_checker(r, trainer, gone_after_s=0).poll())
    assert Kind.STRANDED_CLAIM in _kinds(_checker(r, trainer, max_claim_age_s=30).poll())


def test_queued_twice_and_counter_mismatch(state: tuple[redis.Redis, Path]) -> None:
    r, trainer = state
    r.rpush(K.prompts, "e0-3", "e0-2")  # e0-3 twice; e0-2 queued while claimed
    r.hincrby(K.counters, "outcome:valid", 1)  # counted twice
    found = _checker(r, trainer).poll()
    assert {v.subject for v in found if v.kind is Kind.QUEUED_TWICE} == {"e0-3", "e0-2"}
    mismatch = {v.subject for v in found if v.kind is Kind.COUNTER_MISMATCH}
    assert {"outcome:*=4", "outcome:valid=2"} <= mismatch, found
    # with prompt state compacted, counters may exceed what state remains, but never fall short
    compacted = {v.subject for v in _checker(r, trainer, prompt_state_compacted=True).poll()}
    assert "outcome:valid=2" not in compacted and "admitted - outcomes=0" in compacted


def test_groups_trained_twice_lost_and_version_gaps(state: tuple[redis.Redis, Path]) -> None:
    r, trainer = state
    for pid in ("e0-2", "e0-3"):  # two more valid groups (e0-3 claimed and finished by a test hand)
        if pid == "e0-3":
            _claim(r, "owner-a", 1)
        assert _finish(r, pid, 2 if pid == "e0-2" else 1, "valid") == "valid"
    [(_, entries)] = r.xreadgroup(GROUPS_CONSUMER_GROUP, "trainer-0", {K.groups: ">"})
    s2, s3 = (e[0].decode() for e in entries)
    first = json.loads((trainer / "trained.jsonl").read_text())
    # step 3 trains the step-1 group again; step 2 is missing; e0-3's group is acknowledged untrained
    _ledger(
        trainer,
        [first, {"step": 3, "stream_ids": [first["stream_ids"][0], s2], "group_ids": ["e0-0", "e0-2"]}],
    )
    r.xack(K.groups, GROUPS_CONSUMER_GROUP, s2, s3)
    found = _checker(r, trainer).poll()
    kinds = _kinds(found)
    assert {
        Kind.GROUP_TRAINED_TWICE,
        Kind.PROMPT_TRAINED_TWICE,
        Kind.VERSION_GAP,
        Kind.GROUP_LOST,
    } <= kinds, found
    lost = next(v for v in found if v.kind is Kind.GROUP_LOST)
    assert lost.context["stream_ids"] == [s3]
    # a group the trainer dropped (and counted) is not lost
    r.hincrby(K.counters, "trainer:dropped:stale", 1)
    assert Kind.GROUP_LOST not in _kinds(_checker(r, trainer).poll())


def test_prompt_committed_twice_and_version_going_back(state: tuple[redis.Redis, Path]) -> None:
    r, trainer = state
    ck = _checker(r, trainer)
    assert ck.poll() == []
    r.xadd(K.groups, {"g": rollout_pb2.Group(run=RUN, prompt_id="e0-0").SerializeToString()})
    r.hincrby(K.counters, "valid_produced", 1)
    r.hset(K.weights, "version", 0)
    found = ck.poll()
    assert {Kind.PROMPT_COMMITTED_TWICE, Kind.VERSION_REGRESSED} <= _kinds(found), found
    r.hset(K.weights, "version", 5)  # published past the ledger's last step
    assert any(v.kind is Kind.VERSION_GAP and v.subject == "v5" for v in ck.poll())


def test_memory_slope_per_version(state: tuple[redis.Redis, Path]) -> None:
    r, trainer = state
    ck = _checker(r, trainer)
    rows = [json.loads((trainer / "trained.jsonl").read_text())]
    for step in range(2, 6):
        r.set(f"ballast:{step}", b"x" * 200_000)  # 200 kB more per version
        rows.append({"step": step, "stream_ids": [], "group_ids": []})
        _ledger(trainer, rows)
        ck.poll()
    slope = ck.memory_slope()
    assert 150_000 < slope["mem_bytes_per_version"] < 300_000
    assert 150_000 < slope["aof_bytes_per_version"] < 300_000


def test_compacted_prompt_state_is_not_a_violation_but_double_counts_still_are(
    state: tuple[redis.Redis, Path],
) -> None:
    r, trainer = state
    ck = _checker(r, trainer)
    assert ck.poll() == []
    r.delete(K.prompt("e0-0"), K.prompt("e0-1"))  # finished for the epoch: the memory fix deletes them
    assert ck.poll() == [] and ck.summary["prompt_state_compacted"] is True
    r.hincrby(K.counters, "outcome:filtered", 1)  # an outcome counted twice
    assert {v.subject for v in ck.poll()} == {"admitted - outcomes=0"}  # 1 claim outstanding


def test_a_prompt_that_nothing_will_attempt_again_is_lost(state: tuple[redis.Redis, Path]) -> None:
    r, trainer = state
    ck = _checker(r, trainer)
    assert ck.poll() == []  # e0-3 seen queued, e0-2 requeued once and claimed again
    assert _finish(r, "e0-2", 2, "requeued") == "requeued"
    assert ck.poll() == []  # requeued and back in the queue: fine
    r.lrem(K.prompts, 0, "e0-2")  # ... until the queue loses it
    r.lrem(K.prompts, 0, "e0-3")  # e0-3 leaves the queue without a claim
    found = [v for v in ck.poll() if v.kind is Kind.PROMPT_LOST]
    assert {v.subject for v in found} == {"e0-2", "e0-3"}, found
    assert "requeued, yet the prompt is neither queued nor claimed" in str(found[0]) + str(found[1])


def test_a_finished_prompt_whose_state_expired_is_not_lost(state: tuple[redis.Redis, Path]) -> None:
    r, trainer = state
    ck = _checker(r, trainer)
    assert ck.poll() == []
    assert _claim(r, "owner-a", 1) == ["e0-3"]
    assert _finish(r, "e0-3", 1, "filtered") == "filtered"
    r.delete(K.prompt("e0-3"))  # its state expired (60 s after the outcome) before the next poll
    assert [v for v in ck.poll() if v.kind is Kind.PROMPT_LOST] == []
    assert ck.audit_log["e0-3"][-1][1:3] == (1, "filtered")  # the history outlives the state
