"""Scoring finished responses with the verifier: batched, bounded, and never lost.

`ScoreBatcher` collects responses as they finish and sends them in batches of up to
`verifier_batch_size` (after at most `linger_s`), at most `verifier_concurrency` batches at a time,
through a `Scorer`. The production scorer, `VerifierScorer`, detokenizes and scores through the
verifier's own client (`asyncdapo.runtime.verifier_client`), which holds the one retry policy: a verifier
that is away or failing is waited for (capped exponential backoff with jitter, forever with the
default `reward.verifier_max_retries: null`), an item over a per-item limit comes back `invalid`
alone. What the batcher does with each result:

- `ok` → `on_scored(jobs)`;
- `invalid` → `on_failed(jobs, ScoreFailure.ITEM_INVALID)` at once (sending it again cannot help);
- `timeout` / `error` (the verifier could not judge the item) → sent again up to `item_retries`
  times, then `on_failed(jobs, ITEM_TIMEOUT | ITEM_ERROR)`;
- the scorer raised `VerifierUnavailable` (only with a finite `verifier_max_retries`) →
  `on_failed(jobs, VERIFIER_UNAVAILABLE)`;
- any other exception in a batch task — the scorer, `on_scored`, `on_failed` — is logged with its
  traceback and that stage is retried after a capped backoff: a job is never silently lost.

A verifier failure is never a 0: `on_failed` is the only way out other than a verdict.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Gauge
from pydantic import ValidationError

from asyncdapo.contracts.config import RewardConfig
from asyncdapo.contracts.verifier_api import ItemResult, ItemStatus, ScoreItem
from asyncdapo.runtime.backoff import Backoff
from asyncdapo.runtime.verifier_client import (
    VERIFIER_RETRY_BACKOFF,
    Attempt,
    VerifierClient,
    VerifierUnavailable,
)
from asyncdapo.services.scheduler.metrics import SchedulerMetrics

log = logging.getLogger(__name__)
SLOW_CALL_S = 2.0


class ScoreFailure(StrEnum):
    """Why `on_failed` gives up on jobs (a metric label and the drop's detail)."""

    ITEM_INVALID = "item_invalid"  # over a per-item limit, or refused alone by the verifier
    ITEM_TIMEOUT = "item_timeout"  # the verifier timed out on it, item_retries times over
    ITEM_ERROR = "item_error"  # the verifier could not judge it (e.g. unparsable ground truth)
    VERIFIER_UNAVAILABLE = "verifier_unavailable"  # a finite reward.verifier_max_retries ran out


@dataclass(frozen=True, slots=True)
class ItemScore:
    status: str  # an ItemStatus value: ok | timeout | error | invalid
    score: float = 0.0
    acc: float = 0.0
    pred: str = ""
    error: str = ""


class Scorer(Protocol):
    async def score(self, items: Sequence[tuple[str, Sequence[int], str]]) -> list[ItemScore]:
        """Score (id, response token ids, ground truth) items: one result per item, in order.
        Waits through verifier failures by its own policy; raises `VerifierUnavailable` only when a
        finite retry budget is spent. Any other exception is a bug: the batcher logs and retries."""
        ...


class TextDecoder(Protocol):
    """Token ids → text. `ready()` is awaited before every `decode_batch`: a decoder whose tokenizer
    comes over the network (`streamed_tokenizer.StreamedDetokenizer`) fetches it there."""

    async def ready(self) -> None: ...

    def decode_batch(self, seqs: Sequence[Sequence[int]]) -> list[str]: ...


class Detokenizer:
    """Token ids → text with the served model's tokenizer (the `tokenizers` fast path)."""

    def __init__(self, model_dir: str | Path) -> None:
        from tokenizers import Tokenizer

        path = Path(model_dir) / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"model.path: no tokenizer.json in {model_dir} (needed to detokenize)")
        self.tok = Tokenizer.from_file(str(path))

    async def ready(self) -> None:
        return None  # loaded in __init__

    def decode_batch(self, seqs: Sequence[Sequence[int]]) -> list[str]:
        return self.tok.decode_batch([list(s) for s in seqs], skip_special_tokens=True)


class VerifierScorer:
    """The production `Scorer`: detokenize, then `VerifierClient.score` (its retry policy and its
    item-limit checks). Metrics on `metrics.registry`: `verifier_errors_total{kind}` per failed
    attempt (kind = the client's `CallFailure`: connect, timeout, transport, unavailable, rejected,
    malformed, split) and the gauge `verifier_waiting_items` (responses in verifier calls that failed
    and wait for their retry; more may queue behind them, up to `verifier_concurrency` calls)."""

    def __init__(
        self,
        url: str,
        detok: TextDecoder,
        reward: RewardConfig,
        metrics: SchedulerMetrics | None = None,
        **client_kw: Any,
    ) -> None:
        self.detok = detok
        self.metrics = metrics
        self.client = VerifierClient(
            url,
            # one attempt may hold a batch's items behind each other on a busy verifier
            timeout_s=reward.verifier_timeout_s * 4 + 10,
            max_retries=reward.verifier_max_retries,
            batch_size=reward.verifier_batch_size,
            max_concurrency=reward.verifier_concurrency,
            on_attempt=self._on_attempt,
            **client_kw,
        )
        self.waiting_items = Gauge(
            "asyncdapo_scheduler_verifier_waiting_items",
            "Responses whose verifier call failed and that wait for a retry (0 while the verifier answers).",
            registry=metrics.registry if metrics is not None else CollectorRegistry(),
        )
        self.waiting_items.set_function(lambda: self.client.waiting_items)

    async def score(self, items: Sequence[tuple[str, Sequence[int], str]]) -> list[ItemScore]:
        await self.detok.ready()
        texts, bad = self._decode([toks for _, toks, _ in items])
        wire = []
        for i, ((iid, _, gt), text) in enumerate(zip(items, texts, strict=True)):
            if i in bad:
                continue
            try:  # e.g. an empty ground truth: that item alone is invalid, not its whole batch
                wire.append(ScoreItem(id=iid, response=text, ground_truth=gt))
            except ValidationError as err:
                bad[i] = "not a valid score item: " + "; ".join(
                    f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors()
                )
        scored = iter(await self.client.score(wire))
        return [
            ItemScore(ItemStatus.INVALID.value, error=bad[i]) if i in bad else _item_score(next(scored))
            for i in range(len(items))
        ]

    def _decode(self, seqs: list[Sequence[int]]) -> tuple[list[str], dict[int, str]]:
        """Texts, and the items that cannot be detokenized (they alone fail as invalid)."""
        try:
            return self.detok.decode_batch(seqs), {}
        except Exception:  # find the culprit(s): one bad item must not block its batch forever
            texts, bad = [], {}
            for i, seq in enumerate(seqs):
                try:
                    texts.append(self.detok.decode_batch([seq])[0])
                except Exception as err:
                    texts.append("")
                    bad[i] = f"cannot detokenize the response: {type(err).__name__}: {err}"
            return texts, bad

    def _on_attempt(self, attempt: Attempt) -> None:
        if attempt.failure is not None and self.metrics is not None:
            self.metrics.verifier_errors.labels(attempt.failure.value).inc()

    async def aclose(self) -> None:
        await self.client.aclose()


def _item_score(res: ItemResult) -> ItemScore:
    if res.status is ItemStatus.OK:
        assert res.score is not None and res.acc is not None  # the client checked the invariant
        return ItemScore(ItemStatus.OK.value, float(res.score), float(res.acc), res.pred or "")
    return ItemScore(res.status.value, error=res.error or res.status.value)


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
    item_retries: int = 2
    linger_s: float = 0.002
    # item retries and retries after an unexpected exception: the verifier client's full-jitter shape
    backoff_base_s: float = VERIFIER_RETRY_BACKOFF.first_s
    backoff_max_s: float = VERIFIER_RETRY_BACKOFF.max_s

    @property
    def backoff(self) -> Backoff:
        return replace(VERIFIER_RETRY_BACKOFF, first_s=self.backoff_base_s, max_s=self.backoff_max_s)


@dataclass
class BatcherStats:
    calls: int = 0
    call_failures: int = 0
    item_failures: int = 0
    callback_failures: int = 0


_FAILED_ITEM = {
    ItemStatus.INVALID.value: ScoreFailure.ITEM_INVALID,
    ItemStatus.TIMEOUT.value: ScoreFailure.ITEM_TIMEOUT,
}


class ScoreBatcher:
    def __init__(
        self,
        scorer: Scorer,
        cfg: BatcherConfig,
        on_scored: Callable[[list[ScoreJob]], Awaitable[None]],
        on_failed: Callable[[list[ScoreJob], ScoreFailure], Awaitable[None]],
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
        self._rng = random.Random()
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
            t.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (err := task.exception()) is not None:  # _run catches: a bug
            log.error("score batch task failed", exc_info=err)

    async def close(self) -> None:
        """Stop: cancel the batches still scoring or waiting for the verifier (shutdown only)."""
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def drain(self) -> None:
        """Until every submitted job is scored or failed (item retries submit jobs again)."""
        while self._buf or self._tasks:
            self._flush()
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def _run(self, batch: list[ScoreJob]) -> None:
        async with self._sem:
            results = await self._score(batch)
        if results is None:
            await self._deliver(self.on_failed, batch, ScoreFailure.VERIFIER_UNAVAILABLE)
            return
        done: list[ScoreJob] = []
        retry: list[ScoreJob] = []
        failed: dict[ScoreFailure, list[ScoreJob]] = {}
        for job, res in zip(batch, results, strict=True):
            if res.status == ItemStatus.OK:
                job.result = res
                done.append(job)
            elif res.status != ItemStatus.INVALID and job.item_tries < self.cfg.item_retries:
                job.item_tries += 1
                retry.append(job)
            else:
                job.result = res
                failed.setdefault(_FAILED_ITEM.get(res.status, ScoreFailure.ITEM_ERROR), []).append(job)
        self.stats.item_failures += len(retry) + sum(len(jobs) for jobs in failed.values())
        if done:
            await self._deliver(self.on_scored, done)
        for reason, jobs in failed.items():
            log.warning(
                "%d response(s) cannot be scored (%s), first %s: %s",
                len(jobs),
                reason.value,
                jobs[0].id,
                jobs[0].result.error if jobs[0].result else "",
            )
            await self._deliver(self.on_failed, jobs, reason)
        if retry:
            await asyncio.sleep(self._backoff(min(j.item_tries for j in retry)))
            for job in retry:
                self.submit(job)

    async def _score(self, batch: list[ScoreJob]) -> list[ItemScore] | None:
        """The batch's results (the scorer waits out verifier failures), or None when a finite
        retry budget ran out. An unexpected exception is logged and the call retried."""
        items = [(j.id, j.token_ids, j.ground_truth) for j in batch]
        failures = 0
        while True:
            t0 = time.perf_counter()
            try:
                res = await self.scorer.score(items)
                if len(res) != len(items):
                    raise RuntimeError(f"the scorer returned {len(res)} results for {len(items)} items")
            except VerifierUnavailable as err:
                self.stats.call_failures += 1
                self.on_call(time.perf_counter() - t0, False)
                log.error(
                    "verifier retries (reward.verifier_max_retries) spent for %d items: %s", len(batch), err
                )
                return None
            except Exception:
                self.stats.call_failures += 1
                self.on_call(time.perf_counter() - t0, False)
                failures += 1
                delay = self._backoff(failures)
                log.exception(
                    "scoring %d items failed unexpectedly (try %d, first %s); retrying in %.1f s",
                    len(items),
                    failures,
                    items[0][0],
                    delay,
                )
                await asyncio.sleep(delay)
                continue
            dt = time.perf_counter() - t0
            if dt > SLOW_CALL_S:  # on the critical path of a rollout: say so
                log.warning("scoring took %.1f s for %d items (first %s)", dt, len(items), items[0][0])
            self.stats.calls += 1
            self.on_call(dt, True)
            return res

    async def _deliver(self, callback: Callable[..., Awaitable[None]], *args: Any) -> None:
        """Run a result callback until it returns: an exception (e.g. Redis away past its own
        retries) is logged and the same call retried, so the jobs are never lost."""
        failures = 0
        while True:
            try:
                await callback(*args)
                return
            except Exception:
                self.stats.callback_failures += 1
                failures += 1
                delay = self._backoff(failures)
                log.exception(
                    "%s failed for %d job(s) (try %d); retrying in %.1f s",
                    getattr(callback, "__name__", "score callback"),
                    len(args[0]),
                    failures,
                    delay,
                )
                await asyncio.sleep(delay)

    def _backoff(self, attempt: int) -> float:
        """The verifier client's capped full-jitter backoff, from `backoff_base_s` to `backoff_max_s`."""
        return self.cfg.backoff.delay(attempt - 1, self._rng)
