"""Async client of the verifier, for the scheduler.

`await VerifierClient(url).score(items)` returns one `ItemResult` per item, in order. Large inputs are
split into requests of at most `batch_size` items sent concurrently (at most `max_concurrency` at
once). A request that fails for a transient reason (connection error, timeout, 429, 5xx) is retried
with exponential backoff and full jitter; when the retries are spent `VerifierUnavailable` is
raised. A 4xx answer means the request itself is wrong and raises `VerifierRejected` at once. The
client never turns a failure into a score: the caller gets verdicts or an exception.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType

import httpx
from pydantic import ValidationError

from asyncdapo.verifier.schemas import ItemResult, ScoreItem, ScoreRequest, ScoreResponse

RETRYABLE_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})


class VerifierError(RuntimeError):
    """Base of the verifier client's errors."""


class VerifierUnavailable(VerifierError):
    """The verifier did not answer successfully within the retries; nothing was scored."""


class VerifierRejected(VerifierError):
    """The verifier refused the request (4xx): retrying the same request cannot help."""

    def __init__(self, status_code: int, detail: str) -> None:
        super().__init__(f"verifier rejected the request ({status_code}): {detail}")
        self.status_code = status_code
        self.detail = detail


def backoff_delay(attempt: int, base_s: float, max_s: float, rng: random.Random) -> float:
    """Full-jitter exponential backoff: uniform in [0, min(max_s, base_s * 2**attempt)]."""
    return rng.uniform(0.0, min(max_s, base_s * (2**attempt)))


class VerifierClient:
    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 60.0,
        retries: int = 4,
        backoff_base_s: float = 0.2,
        backoff_max_s: float = 5.0,
        batch_size: int = 256,
        max_concurrency: int = 4,
        transport: httpx.AsyncBaseTransport | None = None,
        rng: random.Random | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """`timeout_s` bounds one HTTP attempt; it must exceed the server's per-item timeout times
        the items a worker may get, so keep it generous; `retries` is the number of re-attempts."""
        if retries < 0 or batch_size < 1 or max_concurrency < 1:
            raise ValueError("retries >= 0, batch_size >= 1 and max_concurrency >= 1 are required")
        self.retries = retries
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.batch_size = batch_size
        self._semaphore = asyncio.Semaphore(max_concurrency)
        self._rng = rng or random.Random()
        self._sleep = sleep
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"), timeout=httpx.Timeout(timeout_s, connect=5.0), transport=transport
        )

    async def score(self, items: Sequence[ScoreItem]) -> list[ItemResult]:
        if not items:
            return []
        batches = [items[i : i + self.batch_size] for i in range(0, len(items), self.batch_size)]
        tasks = [asyncio.ensure_future(self._score_batch(batch)) for batch in batches]
        try:
            answers = await asyncio.gather(*tasks)
        except BaseException:  # one batch failed for good: the others' results are useless
            for task in tasks:
                task.cancel()
            raise
        return [result for answer in answers for result in answer]

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

    async def _score_batch(self, batch: Sequence[ScoreItem]) -> list[ItemResult]:
        body = ScoreRequest(items=list(batch)).model_dump_json()
        headers = {"content-type": "application/json"}
        last_failure = "no attempt made"
        async with self._semaphore:
            for attempt in range(self.retries + 1):
                if attempt:
                    await self._sleep(
                        backoff_delay(attempt - 1, self.backoff_base_s, self.backoff_max_s, self._rng)
                    )
                try:
                    response = await self._http.post("/v1/score", content=body, headers=headers)
                except httpx.TransportError as err:  # connect/read failures and timeouts
                    last_failure = f"{type(err).__name__}: {err}"
                    continue
                if response.status_code in RETRYABLE_STATUS:
                    last_failure = f"HTTP {response.status_code}: {response.text[:200]}"
                    continue
                if response.status_code != 200:
                    raise VerifierRejected(response.status_code, _detail(response))
                return _results(response, batch)
        raise VerifierUnavailable(
            f"verifier at {self._http.base_url} failed {self.retries + 1} attempt(s); last: {last_failure}"
        )


def _detail(response: httpx.Response) -> str:
    try:
        return str(response.json().get("detail", response.text))
    except ValueError:
        return response.text[:500]


def _results(response: httpx.Response, batch: Sequence[ScoreItem]) -> list[ItemResult]:
    try:
        results = ScoreResponse.model_validate_json(response.content).results
    except ValidationError as err:
        raise VerifierError(f"verifier sent a malformed score response: {err}") from err
    if [r.id for r in results] != [item.id for item in batch]:
        raise VerifierError("verifier's results do not match the request's ids one to one, in order")
    return results
