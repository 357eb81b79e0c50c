"""The response log's lines (`--response-log`): what `asyncdapo simulate --replay` reads back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asyncdapo.contracts.errors import AsyncdapoError
from asyncdapo.contracts.v1 import gateway_pb2
from asyncdapo.services.scheduler.response_log import LoggedResponse, ResponseEvent, ResponseLog
from asyncdapo.services.scheduler.tasks import Kind, PromptTask


def _task() -> PromptTask:
    return PromptTask(Kind.TRAIN, "p-7", 2, 0, 4, [1, 2, 3], "42", responses=[None] * 4)


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_judged_and_cut_lines_carry_the_task_the_length_and_the_timing(tmp_path: Path) -> None:
    task = _task()
    resp = gateway_pb2.GenerateResponse(token_ids=[5] * 9, queue_s=0.123456, generate_s=2.5)
    log = ResponseLog(tmp_path / "r.jsonl")
    log.judged([(LoggedResponse.of(task, 1, 9, resp), 1.0)])
    log.cut(ResponseEvent.ABORTED, LoggedResponse.of(task, 3, 4, resp))
    log.close()
    judged, cut = _lines(tmp_path / "r.jsonl")
    assert {k: v for k, v in judged.items() if k != "t"} == {
        "event": "judged", "pid": "p-7", "attempt": 2, "idx": 1, "tokens": 9, "prompt_tokens": 3,
        "queue_s": 0.1235, "generate_s": 2.5, "acc": 1.0,
    }  # fmt: skip
    assert (cut["event"], cut["idx"], cut["tokens"]) == ("aborted", 3, 4)
    assert "acc" not in cut


def test_a_response_its_task_no_longer_holds_is_logged_with_its_scored_length_and_no_timing(
    tmp_path: Path,
) -> None:
    """RECORD's round trip comes before the log: the task may have dropped the response by then,
    and the scoring path must not raise (it would skip waking the finisher)."""
    log = ResponseLog(tmp_path / "r.jsonl")
    log.judged([(LoggedResponse.of(_task(), 0, 17, None), 0.0)])
    log.close()
    (line,) = _lines(tmp_path / "r.jsonl")
    assert (line["tokens"], line["queue_s"], line["generate_s"]) == (17, 0.0, 0.0)


def test_a_restarted_scheduler_appends_and_a_missing_directory_is_named(tmp_path: Path) -> None:
    for _ in range(2):
        log = ResponseLog(tmp_path / "r.jsonl")
        log.cut(ResponseEvent.LATE, LoggedResponse.of(_task(), 0, 5, None))
        log.close()
    assert [x["event"] for x in _lines(tmp_path / "r.jsonl")] == ["late", "late"]
    with pytest.raises(AsyncdapoError, match="does not exist"):
        ResponseLog(tmp_path / "nowhere" / "r.jsonl")
