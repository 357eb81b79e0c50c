"""VerifierClient: retries with backoff on transient failures, never a silent score on failure."""

from __future__ import annotations

import json
import random

import httpx
import pytest

from asyncdapo.verifier.client import (
    VerifierClient,
    VerifierError,
    VerifierRejected,
    VerifierUnavailable,
    backoff_delay,
)
from asyncdapo.verifier.schemas import ItemStatus, ScoreItem

ITEMS = [ScoreItem(id=f"i{k}", response=f"A: {k}", ground_truth="1") for k in range(5)]


def _ok(request: httpx.Request) -> httpx.Response:
    items = json.loads(request.content)["items"]
    results = [
        {"id": it["id"], "status": "ok", "score": 1.0, "acc": True, "pred": "1", "error": None}
        for it in items
    ]
    return httpx.Response(200, json={"results": results})


class Recorder:
    """A scripted server: answers from `script` in turn (a status code, an exception, or 'ok')."""

    def __init__(self, script: list[object]) -> None:
        self.script = list(script)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        step = self.script.pop(0) if self.script else "ok"
        if isinstance(step, Exception):
            raise step
        if step == "ok":
            return _ok(request)
        return httpx.Response(int(step), json={"detail": f"scripted {step}"})  # type: ignore[call-overload]


def _client(server: Recorder, sleeps: list[float], **kw: object) -> VerifierClient:
    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    return VerifierClient(
        "http://verifier.test",
        transport=httpx.MockTransport(server),
        rng=random.Random(0),
        sleep=sleep,
        **kw,  # type: ignore[arg-type]
    )


async def test_transient_failures_are_retried_with_growing_jittered_backoff() -> None:
    server = Recorder([httpx.ConnectError("refused"), 503, 502, "ok"])
    sleeps: list[float] = []
    async with _client(server, sleeps, retries=4, backoff_base_s=0.1, backoff_max_s=10.0) as client:
        results = await client.score(ITEMS)
    assert [r.id for r in results] == [it.id for it in ITEMS]
    assert all(r.status is ItemStatus.OK for r in results)
    assert len(server.requests) == 4
    # attempt k waits uniform(0, base * 2**k): bounded, and jittered (not all equal).
    assert len(sleeps) == 3
    for k, s in enumerate(sleeps):
        assert 0.0 <= s <= 0.1 * 2**k
    assert len(set(sleeps)) == 3


async def test_exhausted_retries_raise_unavailable_never_scores() -> None:
    server = Recorder([503] * 10)
    sleeps: list[float] = []
    async with _client(server, sleeps, retries=2) as client:
        with pytest.raises(VerifierUnavailable, match=r"3 attempt\(s\); last: HTTP 503"):
            await client.score(ITEMS)
    assert len(server.requests) == 3 and len(sleeps) == 2


async def test_read_timeouts_are_retried_then_unavailable() -> None:
    server = Recorder([httpx.ReadTimeout("slow")] * 3)
    async with _client(server, [], retries=2) as client:
        with pytest.raises(VerifierUnavailable, match="ReadTimeout"):
            await client.score(ITEMS)


async def test_client_errors_are_not_retried() -> None:
    server = Recorder([413])
    sleeps: list[float] = []
    async with _client(server, sleeps, retries=5) as client:
        with pytest.raises(VerifierRejected) as info:
            await client.score(ITEMS)
    assert info.value.status_code == 413 and "scripted 413" in info.value.detail
    assert len(server.requests) == 1 and sleeps == []


async def test_large_inputs_are_split_into_batches_and_reassembled_in_order() -> None:
    server = Recorder([])
    items = [ScoreItem(id=f"x{k}", response="A: 1", ground_truth="1") for k in range(10)]
    async with _client(server, [], batch_size=3, max_concurrency=2) as client:
        results = await client.score(items)
    assert [r.id for r in results] == [it.id for it in items]
    assert sorted(len(json.loads(r.content)["items"]) for r in server.requests) == [1, 3, 3, 3]


async def test_mismatched_results_are_an_error() -> None:
    def wrong_ids(request: httpx.Request) -> httpx.Response:
        response = _ok(request)
        body = response.json()
        body["results"].reverse()
        return httpx.Response(200, json=body)

    client = VerifierClient("http://verifier.test", transport=httpx.MockTransport(wrong_ids))
    with pytest.raises(VerifierError, match="do not match"):
        await client.score(ITEMS)
    await client.aclose()


async def test_empty_input_needs_no_request() -> None:
    server = Recorder([])
    async with _client(server, []) as client:
        assert await client.score([]) == []
    assert server.requests == []


def test_backoff_delay_is_capped() -> None:
    rng = random.Random(1)
    delays = [backoff_delay(30, 0.2, 5.0, rng) for _ in range(200)]
    assert max(delays) <= 5.0 and min(delays) >= 0.0
