"""Async client of the verifier: the one the scheduler scores through.

`await VerifierClient(url).score(items)` returns one `ItemResult` per item, in order. Large inputs
are split into requests of at most `batch_size` items (ids unique within each), sent at most
`max_concurrency` at a time. The retry policy — the only one in the codebase — is:

- item-level limits the client knows (`ItemLimits`, the service's defaults) are checked before
  sending: an oversize item comes back `invalid` without travelling, the others are sent;
- the verifier away or failing (connection refused or broken, timeout, 408/425/429/5xx, a 200 whose
  body is not one valid result per item in order, any other 4xx for the request as a whole) → the
  same request again after a capped exponential backoff with full jitter (`backoff_base_s` 0.1 s,
  capped at `backoff_max_s` 2 s; a `Retry-After` is honoured up to the cap), **forever** by default
  (`max_retries=None`): an outage of any length delays scoring, it never fails it. With a finite
  `max_retries`, `VerifierUnavailable` (`VerifierRejected` after a 4xx) is raised once they are spent;
- a 413 or an item-level 422 (the server refused an item the client could not check) → the request
  is split in halves until the refused item is alone; it alone comes back `invalid`.

The client never turns a failure into a score: the caller gets verdicts, `invalid` items, or (only
with a finite `max_retries`) an exception. `waiting_items` counts the items of requests that failed
and wait for a retry; every attempt is reported to `on_attempt` (metrics), and the transitions
between "answering" and "failing" are logged once each.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from types import TracebackType

import httpx
from pydantic import ValidationError

from asyncdapo.contracts.verifier_api import (
    ItemLimits,
    ItemResult,
    ItemStatus,
    ScoreItem,
    ScoreRequest,
    ScoreResponse,
    check_item,
)
from asyncdapo.runtime.backoff import Backoff, Jitter

log = logging.getLogger(__name__)

RETRYABLE_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})


class VerifierError(RuntimeError):
    """Base of the verifier client's errors."""


class VerifierUnavailable(VerifierError):
    """The verifier did not answer successfully within a finite `max_retries`; nothing was scored."""


class VerifierRejected(VerifierUnavailable):
    """The last of a finite number of attempts was refused with a 4xx for the request as a whole."""

    def __init__(self, message: str, status_code: int, detail: str) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.detail = detail


class CallFailure(StrEnum):
    """Why one attempt failed (a metric label)."""

    CONNECT = "connect"  # connection refused, DNS: the verifier is away
    TIMEOUT = "timeout"  # the attempt ran past timeout_s
    TRANSPORT = "transport"  # the connection broke mid-request (e.g. the verifier died)
    UNAVAILABLE = "unavailable"  # 408/425/429/5xx: up, but cannot serve now (warming, overloaded)
    REJECTED = "rejected"  # another 4xx for the whole request: a deployment or client error
    MALFORMED = "malformed"  # a 200 that is not one valid result per item, in request order
    SPLIT = "split"  # 413 / item-level 422: the request is split, the refused item isolated


@dataclass(frozen=True, slots=True)
class Attempt:
    """One HTTP attempt: `failure` None means results came back."""

    items: int
    seconds: float
    failure: CallFailure | None = None
    detail: str = ""
    status_code: int | None = None
    retry_in_s: float | None = None  # set when the same request is sent again after this delay


# the wait before sending a failed request again: 0.1 s, doubled, at most 2 s, drawn from [0, d]
VERIFIER_RETRY_BACKOFF = Backoff(0.1, 2.0, jitter=Jitter.FULL)


@dataclass(slots=True)
class _Outcome:
    failure: CallFailure | None
    detail: str = ""
    status_code: int | None = None
    results: list[ItemResult] | None = None
    retry_after_s: float | None = None


class VerifierClient:
    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 60.0,
        max_retries: int | None = None,
        backoff_base_s: float = VERIFIER_RETRY_BACKOFF.first_s,
        backoff_max_s: float = VERIFIER_RETRY_BACKOFF.max_s,
        batch_size: int = 256,
        max_concurrency: int = 4,
        limits: ItemLimits | None = ItemLimits(),  # noqa: B008 (frozen dataclass)
        on_attempt: Callable[[Attempt], None] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        rng: random.Random | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """`timeout_s` bounds one HTTP attempt; it must exceed the server's per-item timeout times
        the items a worker may get, so keep it generous. `max_retries` None: retry forever.
        `limits` None: no check before sending (the server's `invalid` still applies)."""
        if (max_retries is not None and max_retries < 0) or batch_size < 1 or max_concurrency < 1:
            raise ValueError(
                "max_retries >= 0 (or None), batch_size >= 1 and max_concurrency >= 1 are required"
            )
        if not 0 < backoff_base_s <= backoff_max_s:
            raise ValueError("0 < backoff_base_s <= backoff_max_s is required")
        self.max_retries = max_retries
        self.backoff = replace(VERIFIER_RETRY_BACKOFF, first_s=backoff_base_s, max_s=backoff_max_s)
        self.batch_size = batch_size
        self.limits = limits
        self.on_attempt = on_attempt
        self.waiting_items = 0  # items of requests that failed and wait for a retry
        self._failing = 0  # requests between a failed attempt and their end
        self._failing_since = 0.0
        self._semaphore = asyncio.Semaphore(max_concurrency)
        self._rng = rng or random.Random()
        self._sleep = sleep
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"), timeout=httpx.Timeout(timeout_s, connect=5.0), transport=transport
        )

    @property
    def url(self) -> str:
        return str(self._http.base_url)

    async def score(self, items: Sequence[ScoreItem]) -> list[ItemResult]:
        results: list[ItemResult | None] = [None] * len(items)
        to_send: list[int] = []
        for index, item in enumerate(items):
            violation = check_item(item, self.limits) if self.limits is not None else None
            if violation is None:
                to_send.append(index)
            else:
                results[index] = _invalid(item.id, violation.message)
        requests = _split(to_send, items, self.batch_size)
        tasks = [asyncio.ensure_future(self._score_request([items[i] for i in req])) for req in requests]
        try:
            answers = await asyncio.gather(*tasks)
        except BaseException:  # one request failed for good: the others' results are useless
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        for req, answer in zip(requests, answers, strict=True):
            for index, result in zip(req, answer, strict=True):
                results[index] = result
        return [r for r in results if r is not None]

    async def ready(self) -> bool:
        try:
            return (await self._http.get("/readyz")).status_code == 200
        except httpx.HTTPError:
            return False

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> VerifierClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # ------------------------------------------------------------------ one request, retried
    async def _score_request(self, batch: list[ScoreItem]) -> list[ItemResult]:
        async with self._semaphore:  # a split request's halves go out in the same slot, one by one
            return await self._send(batch)

    async def _send(self, batch: list[ScoreItem]) -> list[ItemResult]:
        attempt = 0
        waiting = False
        try:
            while True:
                t0 = time.monotonic()
                out = await self._attempt(batch)
                seconds = time.monotonic() - t0
                if out.failure is None:
                    assert out.results is not None
                    self._report(Attempt(len(batch), seconds))
                    return out.results
                if out.failure is CallFailure.SPLIT:
                    self._report(Attempt(len(batch), seconds, out.failure, out.detail, out.status_code))
                    waiting = self._set_waiting(batch, waiting, False)
                    if len(batch) == 1:
                        log.warning("verifier refused item %r alone: %s", batch[0].id, out.detail)
                        return [_invalid(batch[0].id, f"refused by the verifier: {out.detail}")]
                    mid = len(batch) // 2
                    return [*await self._send(batch[:mid]), *await self._send(batch[mid:])]
                if self.max_retries is not None and attempt >= self.max_retries:
                    self._report(Attempt(len(batch), seconds, out.failure, out.detail, out.status_code))
                    message = (
                        f"verifier at {self.url} failed {attempt + 1} attempt(s); "
                        f"last: {out.failure.value}: {out.detail}"
                    )
                    if out.failure is CallFailure.REJECTED and out.status_code is not None:
                        raise VerifierRejected(message, out.status_code, out.detail)
                    raise VerifierUnavailable(message)
                delay = self.backoff.delay(attempt, self._rng)
                if out.retry_after_s is not None:
                    delay = max(delay, min(out.retry_after_s, self.backoff.max_s))
                self._report(Attempt(len(batch), seconds, out.failure, out.detail, out.status_code, delay))
                if not waiting:
                    waiting = self._set_waiting(batch, waiting, True, out)
                await self._sleep(delay)
                attempt += 1
        finally:
            self._set_waiting(batch, waiting, False)

    async def _attempt(self, batch: list[ScoreItem]) -> _Outcome:
        body = ScoreRequest(items=batch).model_dump_json()
        try:
            response = await self._http.post(
                "/v1/score", content=body, headers={"content-type": "application/json"}
            )
        except (httpx.ConnectError, httpx.ConnectTimeout) as err:
            return _Outcome(CallFailure.CONNECT, f"{type(err).__name__}: {err}")
        except httpx.TimeoutException as err:
            return _Outcome(CallFailure.TIMEOUT, f"{type(err).__name__}: {err}")
        except httpx.TransportError as err:
            return _Outcome(CallFailure.TRANSPORT, f"{type(err).__name__}: {err}")
        code = response.status_code
        if code == 200:
            try:
                return _Outcome(None, results=_results(response, batch))
            except ValueError as err:
                return _Outcome(CallFailure.MALFORMED, str(err), code)
        detail = f"HTTP {code}: {_detail(response)}"
        if code == 413 or (code == 422 and _item_level(response)):
            return _Outcome(CallFailure.SPLIT, detail, code)
        if code in RETRYABLE_STATUS:
            return _Outcome(CallFailure.UNAVAILABLE, detail, code, retry_after_s=_retry_after(response))
        return _Outcome(CallFailure.REJECTED, detail, code)

    def _report(self, attempt: Attempt) -> None:
        if self.on_attempt is None:
            return
        try:
            self.on_attempt(attempt)
        except Exception:  # an observer's bug must not fail scoring
            log.exception("verifier client: on_attempt callback failed")

    def _set_waiting(
        self, batch: list[ScoreItem], waiting: bool, now: bool, out: _Outcome | None = None
    ) -> bool:
        """Move a request into or out of the waiting state; log the client's failing ↔ answering
        transitions once each."""
        if waiting == now:
            return now
        if now:
            self.waiting_items += len(batch)
            self._failing += 1
            if self._failing == 1:
                self._failing_since = time.monotonic()
                level = logging.ERROR if out and out.failure is CallFailure.REJECTED else logging.WARNING
                log.log(
                    level,
                    "verifier at %s is failing (%s: %s); waiting and retrying with backoff (cap %.1f s, %s)",
                    self.url,
                    out.failure.value if out and out.failure else "?",
                    out.detail if out else "",
                    self.backoff.max_s,
                    "forever" if self.max_retries is None else f"at most {self.max_retries} retries",
                )
        else:
            self.waiting_items -= len(batch)
            self._failing -= 1
            if self._failing == 0:
                log.info(
                    "verifier at %s: no request waits for a retry any more (failures lasted %.1f s)",
                    self.url,
                    time.monotonic() - self._failing_since,
                )
        return now


def _invalid(item_id: str, error: str) -> ItemResult:
    return ItemResult(id=item_id, status=ItemStatus.INVALID, error=error)


def _split(indices: list[int], items: Sequence[ScoreItem], batch_size: int) -> list[list[int]]:
    """Requests of at most `batch_size` items, a new one also where an id would repeat (the
    service refuses duplicate ids; the caller's ids are normally unique)."""
    requests: list[list[int]] = []
    current: list[int] = []
    ids: set[str] = set()
    for index in indices:
        item_id = items[index].id
        if len(current) == batch_size or item_id in ids:
            requests.append(current)
            current, ids = [], set()
        current.append(index)
        ids.add(item_id)
    if current:
        requests.append(current)
    return requests


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    return str(body.get("detail", body) if isinstance(body, dict) else body)[:500]


def _item_level(response: httpx.Response) -> bool:
    """A 422 that names items (a per-item limit of an older service, or pydantic errors located in
    `items[i]`): splitting isolates the refused item. Anything else is a request-level refusal."""
    try:
        body = response.json()
    except ValueError:
        return False
    if not isinstance(body, dict):
        return False
    if body.get("limit") in ("max_response_bytes", "max_ground_truth_bytes"):
        return True
    errors = body.get("detail")
    return (
        isinstance(errors, list)
        and bool(errors)
        and all(
            isinstance(e, dict)
            and isinstance(loc := e.get("loc"), list)
            and loc[:2] == ["body", "items"]
            and len(loc) > 2
            and isinstance(loc[2], int)
            for e in errors
        )
    )


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return max(0.0, float(response.headers["retry-after"]))
    except (KeyError, ValueError):
        return None


def _results(response: httpx.Response, batch: Sequence[ScoreItem]) -> list[ItemResult]:
    """The results of a 200, checked against the wire invariants; ValueError when they do not hold
    (the request is then retried: the answer was damaged, not the request)."""
    try:
        results = ScoreResponse.model_validate_json(response.content).results
    except ValidationError as err:
        raise ValueError(f"malformed score response: {str(err)[:300]}") from None
    if [r.id for r in results] != [item.id for item in batch]:
        raise ValueError(
            f"results do not match the request's ids one to one, in order "
            f"({len(results)} results for {len(batch)} items)"
        )
    for r in results:
        if (r.status is ItemStatus.OK) != (r.score is not None and r.acc is not None):
            raise ValueError(f"result {r.id!r}: status {r.status.value} with score {r.score}, acc {r.acc}")
    return results
