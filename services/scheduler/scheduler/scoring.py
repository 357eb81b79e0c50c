"""Scoring finished responses with the verifier: batched, bounded, retried.

`ScoreBatcher` collects responses as they finish and sends them in batches of up to
`verifier_batch_size` (after at most `linger_s`), at most `verifier_concurrency` batches at a time.
A batch whose call fails (connection refused, 5xx, timeout) is retried with exponential backoff and
full jitter up to `verifier_max_retries` times; items the verifier itself could not judge
(`timeout`/`error`) are retried up to `item_retries` times. What still fails is reported through
`on_failed` (the rollout drops the prompt as `verifier_error`): a verifier failure is never a 0.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx

log = logging.getLogger(__name__)
SLOW_CALL_S = 2.0


@dataclass(frozen=True, slots=True)
class ItemScore:
    status: str  # ok | timeout | error
    score: float = 0.0
    acc: float = 0.0
    pred: str = ""
    error: str = ""


class VerifierUnavailable(RuntimeError):
    """The verifier could not be reached or kept failing."""

    permanent = False


class VerifierRejected(VerifierUnavailable):
    """The verifier refused the request (4xx): sending it again cannot help."""

    permanent = True


RETRYABLE_STATUS = frozenset({408, 425, 429})


class Scorer(Protocol):
    async def score(self, items: Sequence[tuple[str, Sequence[int], str]]) -> list[ItemScore]:
        """Score (id, response token ids, ground truth) items, in order; one attempt, raises
        `VerifierUnavailable` when the call as a whole failed."""
        ...


class Detokenizer:
    """Token ids → text with the served model's tokenizer (the `tokenizers` fast path)."""

    def __init__(self, model_dir: str | Path) -> None:
        from tokenizers import Tokenizer

        path = Path(model_dir) / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"model.path: no tokenizer.json in {model_dir} (needed to detokenize)")
        self.tok = Tokenizer.from_file(str(path))

    def decode_batch(self, seqs: Sequence[Sequence[int]]) -> list[str]:
        return self.tok.decode_batch([list(s) for s in seqs], skip_special_tokens=True)


class HttpVerifier:
    """One `POST /v1/score` per call (asyncdapo.verifier's wire schema)."""

    def __init__(self, url: str, detok: Detokenizer, timeout_s: float) -> None:
        self.url = url.rstrip("/") + "/v1/score"
        self.detok = detok
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=2.0))

    async def score(self, items: Sequence[tuple[str, Sequence[int], str]]) -> list[ItemScore]:
        texts = self.detok.decode_batch([toks for _, toks, _ in items])
        body = {
            "items": [
                {"id": iid, "response": text, "ground_truth": gt}
                for (iid, _, gt), text in zip(items, texts, strict=True)
            ]
        }
        try:
            r = await self.client.post(self.url, json=body)
        except httpx.HTTPError as err:
            raise VerifierUnavailable(f"{type(err).__name__}: {err}") from err
        if 400 <= r.status_code < 500 and r.status_code not in RETRYABLE_STATUS:
            raise VerifierRejected(f"HTTP {r.status_code}: {r.text[:200]}")
        if r.status_code != 200:
            raise VerifierUnavailable(f"HTTP {r.status_code}: {r.text[:200]}")
        results = r.json().get("results", [])
        if len(results) != len(items):
            raise VerifierUnavailable(f"{len(results)} results for {len(items)} items")
        out = []
        for (iid, _, _), res in zip(items, results, strict=True):
            if res.get("id") != iid:
                raise VerifierUnavailable(f"result id {res.get('id')!r} does not match item {iid!r}")
            if res["status"] == "ok":
                out.append(
                    ItemScore("ok", float(res["score"]), float(bool(res["acc"])), res.get("pred") or "")
                )
            else:
                out.append(ItemScore(res["status"], error=res.get("error") or res["status"]))
        return out

    async def aclose(self) -> None:
        await self.client.aclose()


@dataclass(slots=True)
class ScoreJob:
    id: str
    token_ids: Sequence[int]
    ground_truth: str
    ctx: Any  # the caller's handle, passed back untouched
    item_tries: int = 0
    result: ItemScore | None = None


@dataclass
class BatcherConfig:
    batch_size: int = 32
    concurrency: int = 8
    max_retries: int = 5
    item_retries: int = 2
    linger_s: float = 0.002
    backoff_base_s: float = 0.1
    backoff_max_s: float = 2.0


@dataclass
class BatcherStats:
    calls: int = 0
    call_failures: int = 0
    item_failures: int = 0


class ScoreBatcher:
    def __init__(
        self,
        scorer: Scorer,
        cfg: BatcherConfig,
        on_scored: Callable[[list[ScoreJob]], Awaitable[None]],
        on_failed: Callable[[list[ScoreJob], str], Awaitable[None]],
        on_call: Callable[[float, bool], None] | None = None,
    ) -> None:
        self.scorer = scorer
        self.cfg = cfg
        self.on_scored = on_scored
        self.on_failed = on_failed
        self.on_call = on_call or (lambda seconds, ok: None)
        self._buf: list[ScoreJob] = []
        self._sem = asyncio.Semaphore(cfg.concurrency)
        self._flush_handle: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.stats = BatcherStats()

    def submit(self, job: ScoreJob) -> None:
        self._buf.append(job)
        if len(self._buf) >= self.cfg.batch_size:
            self._flush()
        elif self._flush_handle is None:
            self._flush_handle = asyncio.get_running_loop().call_later(self.cfg.linger_s, self._flush)

    def pending(self) -> int:
        return len(self._buf) + len(self._tasks)

    def _flush(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        while self._buf:
            batch, self._buf = self._buf[: self.cfg.batch_size], self._buf[self.cfg.batch_size :]
            t = asyncio.create_task(self._run(batch))
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)

    async def drain(self) -> None:
        self._flush()
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def _run(self, batch: list[ScoreJob]) -> None:
        async with self._sem:
            results = await self._call_with_retries(batch)
        if results is None:
            await self.on_failed(batch, "verifier unavailable")
            return
        done, retry, failed = [], [], []
        for job, res in zip(batch, results, strict=True):
            if res.status == "ok":
                job.result = res
                done.append(job)
            elif job.item_tries < self.cfg.item_retries:
                job.item_tries += 1
                retry.append(job)
            else:
                job.result = res
                failed.append(job)
        self.stats.item_failures += len(retry) + len(failed)
        if done:
            await self.on_scored(done)
        if failed:
            await self.on_failed(failed, f"verifier item {failed[0].result.status}")  # type: ignore[union-attr]
        if retry:
            await asyncio.sleep(self._backoff(min(j.item_tries for j in retry)))
            for job in retry:
                self.submit(job)

    async def _call_with_retries(self, batch: list[ScoreJob]) -> list[ItemScore] | None:
        items = [(j.id, j.token_ids, j.ground_truth) for j in batch]
        for attempt in range(self.cfg.max_retries + 1):
            t0 = time.perf_counter()
            try:
                res = await self.scorer.score(items)
            except VerifierUnavailable as err:
                self.stats.call_failures += 1
                self.on_call(time.perf_counter() - t0, False)
                if attempt == self.cfg.max_retries or err.permanent:
                    log.error(
                        "verifier failed %d times, giving up on %d items: %s", attempt + 1, len(batch), err
                    )
                    return None
                log.warning("verifier call failed (try %d): %s", attempt + 1, err)
                await asyncio.sleep(self._backoff(attempt + 1))
                continue
            dt = time.perf_counter() - t0
            if dt > SLOW_CALL_S:  # on the critical path of a rollout: say so
                log.warning("verifier call took %.1f s for %d items (first %s)", dt, len(items), items[0][0])
            self.stats.calls += 1
            self.on_call(dt, True)
            return res
        return None

    def _backoff(self, attempt: int) -> float:
        """Exponential backoff with jitter: uniform in [cap/2, cap] ("equal jitter"), so retries of
        many batches spread out but never hammer a recovering verifier early."""
        cap = min(self.cfg.backoff_max_s, self.cfg.backoff_base_s * (2 ** (attempt - 1)))
        return random.uniform(cap / 2, cap)
