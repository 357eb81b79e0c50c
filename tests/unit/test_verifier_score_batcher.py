"""The scheduler's scoring path (ScoreBatcher + VerifierScorer, default settings): every job ends
scored or failed alone with a ScoreFailure reason — an exception anywhere is logged and retried,
never a silently lost job."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence

import httpx
import pytest

from asyncdapo.contracts.config import RewardConfig
from asyncdapo.runtime.verifier_client import VerifierUnavailable
from asyncdapo.services.scheduler.metrics import SchedulerMetrics
from asyncdapo.services.scheduler.score_batcher import (
    BatcherConfig,
    ItemScore,
    ScoreBatcher,
    ScoreFailure,
    ScoreJob,
    VerifierScorer,
)

Items = Sequence[tuple[str, Sequence[int], str]]


class Outcomes:
    """What the rollout would see: scored jobs and failed ones with their reason."""

    def __init__(self, fail_scored: int = 0) -> None:
        self.scored: list[str] = []
        self.failed: list[tuple[str, ScoreFailure]] = []
        self.fail_scored = fail_scored

    async def on_scored(self, jobs: list[ScoreJob]) -> None:
        if self.fail_scored:
            self.fail_scored -= 1
            raise ConnectionError("redis away")  # e.g. RECORD failing past its own retries
        self.scored += [j.id for j in jobs]

    async def on_failed(self, jobs: list[ScoreJob], reason: ScoreFailure) -> None:
        self.failed += [(j.id, reason) for j in jobs]


def _batcher(scorer: object, out: Outcomes) -> ScoreBatcher:
    return ScoreBatcher(scorer, BatcherConfig(), out.on_scored, out.on_failed)  # type: ignore[arg-type]


async def _score_all(batcher: ScoreBatcher, ids: list[str], ground_truth: str = "1") -> None:
    for i in ids:
        batcher.submit(ScoreJob(i, [1, 2], ground_truth, None))
    async with asyncio.timeout(30):
        await batcher.drain()


class Scripted:
    """A scorer answering per item id from `statuses` (a list consumed per call), else ok."""

    def __init__(self, statuses: dict[str, list[str]] | None = None, raise_first: int = 0) -> None:
        self.statuses = statuses or {}
        self.raise_first = raise_first
        self.calls = 0

    async def score(self, items: Items) -> list[ItemScore]:
        self.calls += 1
        if self.raise_first:
            self.raise_first -= 1
            raise KeyError("a bug in the scorer")
        out = []
        for item_id, _, _ in items:
            script = self.statuses.get(item_id) or ["ok"]
            status = script.pop(0) if len(script) > 1 else script[0]
            out.append(
                ItemScore(status, 1.0, 1.0, "1") if status == "ok" else ItemScore(status, error=status)
            )
        return out


async def test_exception_in_on_scored_is_logged_and_retried_not_lost(
    caplog: pytest.LogCaptureFixture,
) -> None:
    out = Outcomes(fail_scored=2)
    batcher = _batcher(Scripted(), out)
    with caplog.at_level(logging.ERROR, logger="asyncdapo.services.scheduler.score_batcher"):
        await _score_all(batcher, [f"j{k}" for k in range(5)])
    assert sorted(out.scored) == [f"j{k}" for k in range(5)] and out.failed == []
    assert batcher.stats.callback_failures == 2 and batcher.pending() == 0
    assert sum("redis away" in (r.exc_text or "") for r in caplog.records) == 2


async def test_unexpected_scorer_exception_is_retried() -> None:
    out = Outcomes()
    scorer = Scripted(raise_first=2)
    batcher = _batcher(scorer, out)
    await _score_all(batcher, ["a", "b"])
    assert sorted(out.scored) == ["a", "b"] and scorer.calls == 3 and batcher.stats.call_failures == 2


async def test_items_fail_alone_with_their_reason() -> None:
    out = Outcomes()
    scorer = Scripted(
        {
            "invalid": ["invalid"],  # never sent again
            "slow": ["timeout"],  # timeout every time: item_retries (2) more tries, then given up
            "flaky": ["error", "ok"],  # one error, then judged
            "gold": ["error"],
        }
    )
    batcher = _batcher(scorer, out)
    await _score_all(batcher, ["ok1", "invalid", "slow", "flaky", "gold", "ok2"])
    assert sorted(out.scored) == ["flaky", "ok1", "ok2"]
    assert sorted(out.failed) == [
        ("gold", ScoreFailure.ITEM_ERROR),
        ("invalid", ScoreFailure.ITEM_INVALID),
        ("slow", ScoreFailure.ITEM_TIMEOUT),
    ]
    assert scorer.calls == 3  # first batch, then the retried items twice


async def test_close_cancels_batches_waiting_for_the_verifier() -> None:
    class Hung:
        async def score(self, items: Items) -> list[ItemScore]:
            await asyncio.sleep(3600)
            raise AssertionError("unreachable")

    out = Outcomes()
    batcher = _batcher(Hung(), out)
    batcher.submit(ScoreJob("a", [1], "1", None))
    await asyncio.sleep(0.05)
    assert batcher.pending() == 1
    async with asyncio.timeout(5):
        await batcher.close()
    assert batcher.pending() == 0 and out.scored == [] and out.failed == []


async def test_finite_retries_spent_fail_the_batch_as_verifier_unavailable() -> None:
    class Down:
        async def score(self, items: Items) -> list[ItemScore]:
            raise VerifierUnavailable("verifier failed 2 attempt(s)")

    out = Outcomes()
    await _score_all(_batcher(Down(), out), ["a", "b"])
    assert out.failed == [("a", ScoreFailure.VERIFIER_UNAVAILABLE), ("b", ScoreFailure.VERIFIER_UNAVAILABLE)]


class FakeDetok:
    """Token ids → text: id 99 cannot be decoded (as a corrupt response would)."""

    async def ready(self) -> None:
        return None

    def decode_batch(self, seqs: Sequence[Sequence[int]]) -> list[str]:
        if any(99 in s for s in seqs):
            raise ValueError("token 99 out of vocabulary")
        return ["A: " + "".join(map(str, s)) for s in seqs]


async def test_verifier_scorer_waits_out_failures_with_metrics_and_fails_bad_items_alone() -> None:
    answers = [httpx.ConnectError("refused"), httpx.ConnectError("refused"), 503]
    seen: list[list[str]] = []

    def verifier(request: httpx.Request) -> httpx.Response:
        items = json.loads(request.content)["items"]
        seen.append([it["id"] for it in items])
        if answers:
            step = answers.pop(0)
            if isinstance(step, Exception):
                raise step
            return httpx.Response(step, json={"detail": "warming up"})
        results = [
            {"id": it["id"], "status": "ok", "score": 1.0, "acc": True, "pred": "1", "error": None}
            for it in items
        ]
        return httpx.Response(200, json={"results": results})

    metrics = SchedulerMetrics()
    scorer = VerifierScorer(
        "http://verifier.test",
        FakeDetok(),
        RewardConfig(),
        metrics,
        transport=httpx.MockTransport(verifier),
    )
    waiting: list[float] = []
    real_sleep = scorer.client._sleep

    async def sleep(seconds: float) -> None:
        waiting.append(metrics.registry.get_sample_value("asyncdapo_scheduler_verifier_waiting_items") or 0)
        await real_sleep(seconds)

    scorer.client._sleep = sleep
    out = Outcomes()
    batcher = _batcher(scorer, out)
    for k in range(4):
        batcher.submit(ScoreJob(f"r{k}", [1, 2] if k != 2 else [99], "12", None))
    batcher.submit(ScoreJob("huge", [7] * 140_000, "12", None))  # "A: 777…": over 128 KiB
    batcher.submit(ScoreJob("no-gold", [1, 2], "", None))  # an empty ground truth
    async with asyncio.timeout(30):
        await batcher.drain()
    await scorer.aclose()

    assert sorted(out.scored) == ["r0", "r1", "r3"]
    assert sorted(out.failed) == [
        ("huge", ScoreFailure.ITEM_INVALID),
        ("no-gold", ScoreFailure.ITEM_INVALID),
        ("r2", ScoreFailure.ITEM_INVALID),
    ]
    assert all(not {"huge", "r2", "no-gold"} & set(ids) for ids in seen)  # never sent
    assert waiting == [3, 3, 3]  # the three sent items waited through three failed attempts
    assert metrics.registry.get_sample_value("asyncdapo_scheduler_verifier_waiting_items") == 0

    def errors(kind: str) -> float:
        return (
            metrics.registry.get_sample_value("asyncdapo_scheduler_verifier_errors_total", {"kind": kind})
            or 0
        )

    assert (errors("connect"), errors("unavailable"), errors("malformed")) == (2, 1, 0)
