"""VerifierClient: the one retry policy of the codebase — waits through failures (forever by default)
with capped jittered backoff, retries malformed answers, isolates a refused item, never a silent score."""

from __future__ import annotations

import json
import random
from collections.abc import Callable

import httpx
import pytest

from asyncdapo.contracts.verifier_api import ItemStatus, ScoreItem
from asyncdapo.runtime.backoff import Backoff, Jitter
from asyncdapo.runtime.verifier_client import (
    Attempt,
    CallFailure,
    VerifierClient,
    VerifierError,
    VerifierRejected,
    VerifierUnavailable,
)

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
    async with _client(server, sleeps, max_retries=4, backoff_base_s=0.1, backoff_max_s=10.0) as client:
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
    async with _client(server, sleeps, max_retries=2) as client:
        with pytest.raises(VerifierUnavailable, match=r"3 attempt\(s\); last: unavailable: HTTP 503"):
            await client.score(ITEMS)
    assert len(server.requests) == 3 and len(sleeps) == 2


async def test_read_timeouts_are_retried_then_unavailable() -> None:
    server = Recorder([httpx.ReadTimeout("slow")] * 3)
    async with _client(server, [], max_retries=2) as client:
        with pytest.raises(VerifierUnavailable, match="ReadTimeout"):
            await client.score(ITEMS)


async def test_request_level_client_errors_are_retried_and_named_when_retries_are_finite() -> None:
    # A 404/400 for the whole request is a deployment or client error, not the items' fault: it is
    # waited out like an outage (an operator fixes it), never turned into dropped items.
    server = Recorder([404, 400, "ok"])
    sleeps: list[float] = []
    async with _client(server, sleeps) as client:
        results = await client.score(ITEMS)
    assert all(r.status is ItemStatus.OK for r in results) and len(sleeps) == 2

    server = Recorder([404] * 5)
    async with _client(server, [], max_retries=1) as client:
        with pytest.raises(VerifierRejected) as info:
            await client.score(ITEMS)
    assert info.value.status_code == 404 and "scripted 404" in info.value.detail
    assert len(server.requests) == 2


async def test_large_inputs_are_split_into_batches_and_reassembled_in_order() -> None:
    server = Recorder([])
    items = [ScoreItem(id=f"x{k}", response="A: 1", ground_truth="1") for k in range(10)]
    async with _client(server, [], batch_size=3, max_concurrency=2) as client:
        results = await client.score(items)
    assert [r.id for r in results] == [it.id for it in items]
    assert sorted(len(json.loads(r.content)["items"]) for r in server.requests) == [1, 3, 3, 3]


def _damaged(kind: str) -> Callable[[httpx.Request], httpx.Response]:
    def answer(request: httpx.Request) -> httpx.Response:
        body = _ok(request).json()
        if kind == "bad json":
            return httpx.Response(200, content=b'{"results": [')
        if kind == "wrong count":
            body["results"].pop()
        elif kind == "ids out of order":
            body["results"].reverse()
        elif kind == "ok without score":
            body["results"][0]["score"] = None
        elif kind == "unknown status":
            body["results"][0]["status"] = "maybe"
        return httpx.Response(200, json=body)

    return answer


@pytest.mark.parametrize(
    "kind", ["bad json", "wrong count", "ids out of order", "ok without score", "unknown status"]
)
async def test_malformed_200_is_retried_like_an_outage(kind: str) -> None:
    damaged = _damaged(kind)
    calls: list[int] = []
    attempts: list[Attempt] = []

    def server(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return damaged(request) if len(calls) <= 2 else _ok(request)

    async def sleep(seconds: float) -> None:
        pass

    client = VerifierClient(
        "http://verifier.test",
        transport=httpx.MockTransport(server),
        sleep=sleep,
        on_attempt=attempts.append,
    )
    results = await client.score(ITEMS)
    await client.aclose()
    assert [r.id for r in results] == [it.id for it in ITEMS]
    assert all(r.status is ItemStatus.OK and r.score == 1.0 for r in results)
    assert [a.failure for a in attempts] == [CallFailure.MALFORMED, CallFailure.MALFORMED, None]
    assert all(a.retry_in_s is not None for a in attempts[:2])


async def test_malformed_200_with_finite_retries_raises_naming_it() -> None:
    client = VerifierClient(
        "http://verifier.test", transport=httpx.MockTransport(_damaged("ids out of order")), max_retries=0
    )
    with pytest.raises(VerifierError, match="malformed: results do not match"):
        await client.score(ITEMS)
    await client.aclose()


async def test_outage_of_any_length_is_waited_out_with_capped_backoff_by_default() -> None:
    # 200 failed attempts (minutes of outage at the 2 s cap) and no give-up: defaults only.
    server = Recorder([httpx.ConnectError("refused")] * 150 + [503] * 50 + ["ok"])
    sleeps: list[float] = []
    waiting: list[int] = []
    client = _client(server, sleeps)

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        waiting.append(client.waiting_items)

    client._sleep = sleep
    results = await client.score(ITEMS)
    await client.aclose()
    assert all(r.status is ItemStatus.OK for r in results) and len(server.requests) == 201
    assert max(sleeps) <= 2.0 and sum(sleeps) > 100  # capped, jittered, and it kept going
    assert set(waiting) == {len(ITEMS)} and client.waiting_items == 0


async def test_retry_after_is_honoured_up_to_the_cap() -> None:
    def busy(request: httpx.Request) -> httpx.Response:
        if len(seen) < 2:
            seen.append(1)
            return httpx.Response(503, headers={"Retry-After": "1" if not seen[1:] else "30"})
        return _ok(request)

    seen: list[int] = []
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    async with VerifierClient(
        "http://verifier.test", transport=httpx.MockTransport(busy), sleep=sleep, rng=random.Random(0)
    ) as client:
        await client.score(ITEMS)
    assert sleeps[0] >= 1.0 and sleeps[1] == 2.0


async def test_oversize_item_is_invalid_before_sending_and_the_rest_is_scored() -> None:
    server = Recorder([])
    items = [*ITEMS[:2], ScoreItem(id="huge", response="€" * 50_000, ground_truth="1"), *ITEMS[2:]]
    async with _client(server, []) as client:  # default limits: the service's defaults
        results = await client.score(items)
    assert [r.id for r in results] == [it.id for it in items]
    huge = results[2]
    assert huge.status is ItemStatus.INVALID and huge.score is None and huge.acc is None
    assert "max_response_bytes=131072" in (huge.error or "") and "150000" in (huge.error or "")
    assert all(r.status is ItemStatus.OK for k, r in enumerate(results) if k != 2)
    sent = [it["id"] for req in server.requests for it in json.loads(req.content)["items"]]
    assert "huge" not in sent and len(sent) == len(ITEMS)


async def test_item_the_server_refuses_is_isolated_by_splitting() -> None:
    # A service with a stricter limit than the client knows (or an older one answering 422 for an
    # oversize item): the request is halved until the refused item is alone.
    def strict(request: httpx.Request) -> httpx.Response:
        items = json.loads(request.content)["items"]
        bad = [k for k, it in enumerate(items) if it["id"] == "i3"]
        if bad:
            loc = ["body", "items", bad[0], "response"]
            return httpx.Response(422, json={"detail": [{"loc": loc, "msg": "too long", "type": "x"}]})
        return _ok(request)

    requests: list[int] = []

    def server(request: httpx.Request) -> httpx.Response:
        requests.append(len(json.loads(request.content)["items"]))
        return strict(request)

    async with VerifierClient("http://verifier.test", transport=httpx.MockTransport(server)) as client:
        results = await client.score(ITEMS)
    assert [r.status for r in results] == [ItemStatus.OK] * 3 + [ItemStatus.INVALID, ItemStatus.OK]
    assert "422" in (results[3].error or "") and "too long" in (results[3].error or "")
    assert len(requests) <= 2 * 3 + 1  # log2 splits, not one request per item


async def test_413_splits_the_request() -> None:
    def small(request: httpx.Request) -> httpx.Response:
        items = json.loads(request.content)["items"]
        if len(items) > 2:
            return httpx.Response(413, json={"detail": "too many", "limit": "max_items_per_request"})
        return _ok(request)

    async with VerifierClient("http://verifier.test", transport=httpx.MockTransport(small)) as client:
        results = await client.score(ITEMS)
    assert [r.id for r in results] == [it.id for it in ITEMS]
    assert all(r.status is ItemStatus.OK for r in results)


async def test_body_level_422_is_not_split_but_retried() -> None:
    server = Recorder([422, "ok"])  # {"detail": "scripted 422"}: not located in an item
    async with _client(server, []) as client:
        results = await client.score(ITEMS)
    assert all(r.status is ItemStatus.OK for r in results)
    assert [len(json.loads(r.content)["items"]) for r in server.requests] == [5, 5]


async def test_repeated_ids_go_to_separate_requests() -> None:
    server = Recorder([])
    items = [ITEMS[0], ITEMS[1], ITEMS[0]]
    async with _client(server, []) as client:
        results = await client.score(items)
    assert [r.id for r in results] == ["i0", "i1", "i0"]
    assert [len(json.loads(r.content)["items"]) for r in server.requests] in ([2, 1], [1, 2])


async def test_empty_input_needs_no_request() -> None:
    server = Recorder([])
    async with _client(server, []) as client:
        assert await client.score([]) == []
    assert server.requests == []


def test_backoff_delay_is_capped() -> None:
    rng = random.Random(1)
    delays = [Backoff(0.2, 5.0, jitter=Jitter.FULL).delay(30, rng) for _ in range(200)]
    assert max(delays) <= 5.0 and min(delays) >= 0.0
