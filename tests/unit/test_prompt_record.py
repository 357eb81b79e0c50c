"""PromptRecord: the prompt-queue record shared by trainer and scheduler."""

from __future__ import annotations

import pytest

from asyncdapo.contracts.prompts import PromptRecord, PromptRecordError, prompt_id, queue_prompts
from asyncdapo.contracts.redis_keys import RunKeys


def _rec() -> PromptRecord:
    return PromptRecord(
        id=prompt_id(2, 17),
        prompt_token_ids=[5, 0, 99],
        prompt_text="What is 1+1? ünï",
        ground_truth="2",
        data_source="synthetic",
        epoch=2,
        index=17,
    )


def test_round_trip_through_bytes_like_redis_returns_them() -> None:
    rec = _rec()
    as_bytes = {k.encode(): v.encode() for k, v in rec.to_redis().items()}
    assert PromptRecord.from_redis(as_bytes) == rec
    assert PromptRecord.from_redis(rec.to_redis()) == rec
    assert rec.id == "e2-17"


def test_missing_field_is_named() -> None:
    m = _rec().to_redis()
    del m["ground_truth"]
    with pytest.raises(PromptRecordError, match="ground_truth"):
        PromptRecord.from_redis(m)


@pytest.mark.parametrize("bad", ["[1,", "[1, -2]", '{"a": 1}', '["x"]'])
def test_malformed_token_ids_are_rejected(bad: str) -> None:
    m = _rec().to_redis()
    m["prompt_token_ids"] = bad
    with pytest.raises(PromptRecordError, match="prompt_token_ids"):
        PromptRecord.from_redis(m)


def test_bad_epoch_is_named() -> None:
    m = _rec().to_redis()
    m["epoch"] = "one"
    with pytest.raises(PromptRecordError, match="epoch"):
        PromptRecord.from_redis(m)


def test_queue_prompts_writes_data_before_ids() -> None:
    calls: list[tuple[str, str]] = []

    class Pipe:
        def hset(self, key: str, mapping: dict[str, str]) -> None:
            calls.append(("hset", key))

        def rpush(self, key: str, *ids: str) -> None:
            calls.append(("rpush", key + ":" + ",".join(ids)))

    keys = RunKeys("r")
    n = queue_prompts(Pipe(), keys, [_rec()])
    assert n == 1
    assert calls == [("hset", keys.prompt_data("e2-17")), ("rpush", keys.prompts + ":e2-17")]
