"""Prompt feed and groups reader against a real redis-server: resumable cursor, watermark,
replay of pending groups, drops, and the checkpoint-then-ack contract."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from asyncdapo.contracts.config import RunConfig
from asyncdapo.contracts.prompts import PromptRecord, epoch_order
from asyncdapo.contracts.redis_keys import GROUP_FIELD, GROUPS_CONSUMER_GROUP, RunKeys
from asyncdapo.contracts.v1 import common_pb2, rollout_pb2
from asyncdapo.contracts.verl_format import Example
from asyncdapo.services.trainer.data_feed import COUNTER_TOO_LONG, Cursor, PromptFeed
from asyncdapo.services.trainer.groups_reader import GroupDropReason, GroupsReader, classify

KEYS = RunKeys("io-test")


def _examples(n: int) -> list[Example]:
    return [
        Example(prompt=f"q{i} " + "x" * (i % 5), ground_truth=str(i), data_source="t", index=i)
        for i in range(n)
    ]


def _encode(ex: Example) -> tuple[list[int], str]:
    text = ex.prompt_text()
    return [ord(c) for c in text], text


def _feed(client: Any, n: int = 7, watermark: int = 4, max_len: int = 64, shuffle: bool = True) -> PromptFeed:
    return PromptFeed(client, KEYS, _examples(n), _encode, watermark=watermark, max_prompt_length=max_len,
                      seed=5, shuffle=shuffle)  # fmt: skip


def _queued(client: Any) -> list[str]:
    return [x.decode() for x in client.lrange(KEYS.prompts, 0, -1)]


def test_feed_keeps_watermark_and_resumes_without_repeats(redis_client: Any) -> None:
    feed = _feed(redis_client)
    feed.restore(None)
    assert feed.refill() == 4
    assert feed.refill() == 0  # already at the watermark
    popped = [redis_client.lpop(KEYS.prompts).decode() for _ in range(3)]
    assert feed.refill() == 3
    # a restarted trainer (new feed object) continues from the cursor stored in Redis
    feed2 = _feed(redis_client)
    assert feed2.restore(Cursor(0, 0)) == feed.cursor  # Redis wins over an older checkpoint copy
    popped += [redis_client.lpop(KEYS.prompts).decode() for _ in range(4)]
    feed2.refill()
    popped += _queued(redis_client)
    # epoch 0 is a permutation of all 7 rows, epoch 1 starts a new permutation
    order0 = epoch_order(7, 5, 0, True).tolist()
    order1 = epoch_order(7, 5, 1, True).tolist()
    assert popped[:7] == [f"e0-{i}" for i in order0]
    assert popped[7:] == [f"e1-{i}" for i in order1[: len(popped) - 7]]
    assert sorted(order0) == list(range(7)) and order0 != order1
    rec = PromptRecord.from_redis(redis_client.hgetall(KEYS.prompt_data(popped[0])))
    assert rec.ground_truth == str(order0[0]) and rec.epoch == 0 and rec.prompt_token_ids


def test_feed_falls_back_to_checkpoint_cursor_on_a_fresh_redis(redis_client: Any) -> None:
    feed = _feed(redis_client, shuffle=False)
    assert feed.restore(Cursor(2, 5)) == Cursor(2, 5)
    feed.refill()
    assert _queued(redis_client) == ["e2-5", "e2-6", "e3-0", "e3-1"]
    assert Cursor.from_dict(redis_client.hgetall(KEYS.trainer_feed)) == Cursor(3, 2)


def test_feed_skips_and_counts_too_long_prompts(redis_client: Any) -> None:
    feed = _feed(
        redis_client, n=5, watermark=3, max_len=4, shuffle=False
    )  # "q0 " fits, "q1 x" fits, rest not
    feed.refill()
    assert _queued(redis_client) == ["e0-0", "e0-1", "e1-0"]
    assert int(redis_client.hget(KEYS.counters, COUNTER_TOO_LONG)) == 3
    with pytest.raises(ValueError, match="max_prompt_length"):
        _feed(redis_client, n=5, watermark=50, max_len=1).refill()


def test_feed_truncates_long_prompts_as_data_truncation_says(redis_client: Any) -> None:
    from asyncdapo.contracts.config import PromptTruncation
    from asyncdapo.contracts.prompting import PromptTooLong
    from asyncdapo.contracts.prompts import load_prompt

    feed = PromptFeed(redis_client, KEYS, _examples(5), _encode, watermark=5, max_prompt_length=4, seed=5,
                      shuffle=False, truncation=PromptTruncation.LEFT)  # fmt: skip
    feed.refill()
    assert _queued(redis_client) == [f"e0-{i}" for i in range(5)]  # none dropped
    record = load_prompt(redis_client, KEYS, "e0-4")  # "q4 xxxx": its last 4 characters
    assert record is not None and list(record.prompt_token_ids) == [ord("x")] * 4
    assert not redis_client.hget(KEYS.counters, COUNTER_TOO_LONG)
    redis_client.delete(KEYS.prompts, KEYS.trainer_feed)
    strict = PromptFeed(redis_client, KEYS, _examples(5), _encode, watermark=5, max_prompt_length=4, seed=5,
                        shuffle=False, truncation=PromptTruncation.ERROR)  # fmt: skip
    with pytest.raises(PromptTooLong, match=r"training example 2 .*prompt of 5 tokens given"):
        strict.refill()


def test_feed_queues_a_dapo_math_17k_parquet(redis_client: Any, tiny_model_dir: Path, tmp_path: Path) -> None:
    """DAPO-Math-17k's rows (a UUID string as extra_info.index, ability MATH, the MATH_v2 style)
    go from parquet through the loader and the chat template into the queue; `middle` keeps the
    first floor(L/2) and the last ceil(L/2) tokens of a prompt over the limit L."""
    import uuid

    import pyarrow as pa
    import pyarrow.parquet as pq
    from transformers import AutoTokenizer

    from asyncdapo.contracts.config import PromptTruncation
    from asyncdapo.contracts.prompts import load_prompt
    from asyncdapo.contracts.verl_format import load_examples
    from asyncdapo.services.trainer.data_feed import make_encoder

    rows = [
        {
            "data_source": "math_dapo",
            "prompt": [{"content": f"Find {i} + 1. " + "Think. " * (30 * i), "role": "user"}],
            "ability": "MATH",
            "reward_model": {"ground_truth": str(i + 1), "style": "rule-lighteval/MATH_v2"},
            "extra_info": {"index": str(uuid.uuid4())},
        }
        for i in range(3)
    ]
    path = tmp_path / "dapo-math-17k.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    examples = load_examples([path])
    encode = make_encoder(AutoTokenizer.from_pretrained(tiny_model_dir), apply_chat_template=True)
    full = [encode(e)[0] for e in examples]
    limit = len(full[0]) + 1  # the first prompt fits; the longer ones are cut
    assert len(full[1]) > limit and len(full[2]) > limit
    feed = PromptFeed(redis_client, KEYS, examples, encode, watermark=3, max_prompt_length=limit, seed=5,
                      shuffle=False, truncation=PromptTruncation.MIDDLE)  # fmt: skip
    assert feed.refill() == 3
    for i, ids in enumerate(full):
        record = load_prompt(redis_client, KEYS, f"e0-{i}")
        assert record is not None
        assert (record.ground_truth, record.data_source) == (str(i + 1), "math_dapo")
        assert f"Find {i} + 1." in record.prompt_text
        head = limit // 2
        expected = ids if len(ids) <= limit else ids[:head] + ids[len(ids) - (limit - head) :]
        assert list(record.prompt_token_ids) == expected and len(expected) <= limit


def _group(pid: str, vmin: int = 0, vmax: int = 0) -> bytes:
    g = rollout_pb2.Group(
        run="io-test", prompt_id=pid, prompt_token_ids=[1, 2], min_version=vmin, max_version=vmax
    )
    for toks in ([3, 4], [5]):
        g.responses.add(
            token_ids=toks,
            version_runs=[common_pb2.VersionRun(version=vmin, num_tokens=len(toks))],
            reward=float(len(toks)),
        )
    return g.SerializeToString()


def test_classify_staleness_and_future() -> None:
    g = rollout_pb2.Group.FromString(_group("a", vmin=3, vmax=4))
    assert classify(g, 4, 1, 100, 8) == (None, "")
    assert classify(g, 5, 2, 100, 8)[0] is None
    assert classify(g, 5, 1, 100, 8)[0] is GroupDropReason.STALE
    assert classify(g, 3, 0, 100, 8)[0] is GroupDropReason.FUTURE
    assert classify(g, 4, 1, 4, 8)[0] is GroupDropReason.MALFORMED


@pytest.mark.parametrize(("s", "last_step"), [(0, 3), (0.1, 4), (0.5, 4), (1, 4), (1.5, 5), (2, 5)])
def test_a_group_trains_up_to_ceil_s_steps_after_its_version(s: float, last_step: int) -> None:
    """verl fully-async's staleness_threshold 0.1 or 0.5 lets a group of version 3 train at step 4
    (one version late), as s = 1 does; s = 0 keeps it on-policy."""
    cfg = RunConfig.model_validate({"rollout": {"max_staleness": s}})
    g = rollout_pb2.Group.FromString(_group("a", vmin=3, vmax=3))
    for step in range(3, 7):
        reason, detail = classify(g, step, cfg.staleness_window, 100, 8)
        if step <= last_step:
            assert reason is None, (step, detail)
        else:
            assert reason is GroupDropReason.STALE and detail == f"min_version 3 < {step} - {last_step - 3}"


def test_reader_replays_pending_then_reads_new_and_acks_checkpointed(redis_client: Any) -> None:
    ids = [redis_client.xadd(KEYS.groups, {GROUP_FIELD: _group(f"p{i}")}).decode() for i in range(5)]
    # a previous trainer (another consumer name) read 3 groups; its checkpoint covers the first one
    old = GroupsReader(redis_client, KEYS, consumer="old-pod")
    old.start([])
    assert [e.id for e in old.read(3, block_ms=10)] == ids[:3]

    new = GroupsReader(redis_client, KEYS, consumer="trainer-0")
    assert new.start(covered_by_checkpoint=[ids[0]]) == (2, 0)  # ids[1], ids[2] still pending
    got = new.read(1, block_ms=10) + new.read(5, block_ms=10)
    assert [e.id for e in got] == ids[1:3]  # replay first, oldest first, nothing twice
    fresh = new.read(5, block_ms=10)
    assert [e.id for e in fresh] == ids[3:]
    assert [e.group.prompt_id for e in fresh if e.group] == ["p3", "p4"]
    assert new.read(5, block_ms=10) == []
    assert new.pending_count() == 4
    new.ack([e.id for e in got + fresh])
    assert new.pending_count() == 0


def test_reader_drops_missing_and_malformed_entries(redis_client: Any) -> None:
    good = redis_client.xadd(KEYS.groups, {GROUP_FIELD: _group("ok")}).decode()
    bad = redis_client.xadd(KEYS.groups, {GROUP_FIELD: b"\xff\xff not a proto"}).decode()
    nofield = redis_client.xadd(KEYS.groups, {"x": b"1"}).decode()
    reader = GroupsReader(redis_client, KEYS)
    reader.start([])
    entries = reader.read(10, block_ms=10)
    redis_client.xdel(KEYS.groups, good)  # trimmed while pending: the replay sees no data
    assert {e.id: e.error for e in entries} == {
        good: None,
        bad: GroupDropReason.MALFORMED,
        nofield: GroupDropReason.MALFORMED,
    }
    reader.drop([(e, e.error) for e in entries if e.error])
    restarted = GroupsReader(redis_client, KEYS)
    assert restarted.start([]) == (0, 1)
    replay = restarted.read(10, block_ms=10)
    # XAUTOCLAIM removes deleted entries from the pending list, so nothing is left to replay
    assert replay == [] and restarted.pending_count() == 0
    assert int(redis_client.hget(KEYS.counters, "trainer:dropped:malformed")) == 2
    assert redis_client.xpending(KEYS.groups, GROUPS_CONSUMER_GROUP)["pending"] == 0
