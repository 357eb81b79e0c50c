"""The run loop: admit prompts, dispatch their requests, score, record, commit or filter, early-stop.

Flow of one prompt attempt:
  claim (Lua) → `PromptTask` with n `Request`s at the tail of the dispatch queue → the
  `Dispatcher` places them (prompt-level FIFO) → Generate → each finished response is batched to
  the verifier → reward = score + overlong penalty → `record` (Lua, one round trip per batch) →
  the response completing the group hands the task on: filtered, or ready in the commit ledger →
  `finish` (Lua: XADD the whole group, or requeue past the bound).

Concurrency model: one asyncio loop. The finisher is the only coroutine that plans commits and
records outcomes, so the ledger and the bound accounting have a single writer. Invariants:
- every claimed attempt gets exactly one outcome (Lua `finish` sets it once; a task leaves
  `self.tasks` only through the finisher);
- at most `bound` valid groups exist (checked again inside `finish`);
- a cancelled task's late replies only count aborted tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable
from dataclasses import replace
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from asyncdapo.config import EarlyStopOrder, FilterMetric, LongTailPolicy, RolloutMode, RunConfig
from asyncdapo.prompts import PromptRecord, PromptRecordError
from asyncdapo.redis_keys import RunKeys
from asyncdapo.scheduler.admission import AdmissionState, make_policy
from asyncdapo.scheduler.dispatch import DispatchPolicy
from asyncdapo.scheduler.dispatcher import Dispatcher
from asyncdapo.scheduler.group_state import (
    DropReason,
    GroupStore,
    Outcome,
    RequeueReason,
    ResponseScore,
    RoundTrips,
    ScriptRunner,
    is_valid,
    redis_retry,
)
from asyncdapo.scheduler.ledger import CommitLedger
from asyncdapo.scheduler.metrics import SchedulerMetrics
from asyncdapo.scheduler.pdsr import PdsrRouter
from asyncdapo.scheduler.pool import Gateway, GatewayPool
from asyncdapo.scheduler.queue import Claim, PromptQueue
from asyncdapo.scheduler.scoring import BatcherConfig, ScoreBatcher, ScoreFailure, ScoreJob, Scorer
from asyncdapo.scheduler.tasks import (
    Kind,
    LengthStats,
    PromptTask,
    Request,
    Score,
    version_range,
)
from asyncdapo.v1 import common_pb2, gateway_pb2, scheduler_pb2

log = logging.getLogger(__name__)


class Phase:
    IDLE = scheduler_pb2.RUN_PHASE_IDLE
    ROLLING = scheduler_pb2.RUN_PHASE_ROLLING
    BOUND = scheduler_pb2.RUN_PHASE_BOUND
    STOPPING = scheduler_pb2.RUN_PHASE_STOPPING
    STOPPED = scheduler_pb2.RUN_PHASE_STOPPED


class Rollout:
    def __init__(
        self,
        cfg: RunConfig,
        redis: Any,
        pool: GatewayPool,
        scorer: Scorer,
        metrics: SchedulerMetrics | None = None,
        owner: str | None = None,
        claim_chunk: int = 64,
        queue_poll_s: float = 0.05,
    ) -> None:
        self.cfg = cfg
        self.redis = redis
        self.pool = pool
        self.metrics = metrics or SchedulerMetrics()
        self.keys = RunKeys(cfg.name)
        self.rtt = RoundTrips()
        self.scripts = ScriptRunner(redis, self.rtt)
        self.store = GroupStore(self.scripts, self.keys)
        self.queue = PromptQueue(redis, self.keys, self.scripts, self.store, self.rtt, owner=owner)
        self.claim_chunk = claim_chunk
        self.queue_poll_s = queue_poll_s
        ro = cfg.rollout
        self.sync = ro.mode is RolloutMode.SYNC
        self.policy = make_policy(cfg)
        # sync mode (verl's loop) commits in batch order and never aborts the running batch
        order = EarlyStopOrder.FIFO if self.sync else ro.early_stop_order
        self.ledger = CommitLedger(order, abort_beyond_cutoff=not self.sync)
        self.dispatcher = Dispatcher(
            pool,
            DispatchPolicy(max_in_flight=ro.max_concurrent_per_gateway),
            self.metrics,
            on_response=self._on_response,
            on_give_up=self._on_give_up,
            seed_base=ro.seed,
        )
        self.batcher = ScoreBatcher(
            scorer,
            BatcherConfig(
                batch_size=cfg.reward.verifier_batch_size,
                concurrency=cfg.reward.verifier_concurrency,
            ),
            on_scored=self._on_scored,
            on_failed=self._on_score_failed,
            on_call=self._on_verifier_call,
        )
        self.pdsr = (
            PdsrRouter(cfg, pool, self.dispatcher, self.metrics)
            if ro.long_tail.policy is LongTailPolicy.PDSR
            else None
        )
        pool.on_down = self.dispatcher.cancel_calls
        pool.on_up = self._on_gateway_up
        pool.on_load = self._on_gateway_load

        self.phase = Phase.IDLE
        self.version = 0
        self.uri = ""
        self.bound = cfg.valid_group_bound(0)
        self.valid_produced = 0
        self.tasks: dict[tuple[str, int], PromptTask] = {}  # train attempts without an outcome
        self.seq = 0
        self.finished_groups = 0  # complete groups judged, for the running valid rate
        self.valid_groups = 0
        self.batch_admitted = 0  # sync mode: prompts in the current generation batch
        self.early_stops = 0
        self.lengths = LengthStats()
        self._to_finish: list[tuple[PromptTask, Outcome, str]] = []
        self._wake_admission = asyncio.Event()
        self._wake_finisher = asyncio.Event()
        self._bg: list[asyncio.Task[Any]] = []
        self._spawned: set[asyncio.Task[Any]] = set()
        self.publish_lock = asyncio.Lock()
        self.outcome_lock = asyncio.Lock()
        self.syncing: set[str] = set()
        self._flushed = {"aborted_tokens": 0, "aborted_requests": 0}
        self._rtt_reported = 0
        self._claiming = False

    # ------------------------------------------------------------------ lifecycle
    async def open(self) -> None:
        """Load scripts, read the run's state from Redis, take the lease, recover dead claims."""
        await redis_retry(self.scripts.load)
        w = _text_map(await redis_retry(lambda: self.redis.hgetall(self.keys.weights)))
        self.uri = w.get("uri", "")
        self._set_version(int(w.get("version", "0") or 0))
        produced = await redis_retry(lambda: self.redis.hget(self.keys.counters, "valid_produced"))
        self.valid_produced = int(produced or 0)
        await redis_retry(self.queue.refresh_lease)
        recovered = await redis_retry(self.queue.recover)
        if recovered:
            log.info("requeued %d prompts claimed by a scheduler that is gone", len(recovered))
            self.metrics.outcomes.labels("requeued", RequeueReason.SCHEDULER_RESTART.value).inc(
                len(recovered)
            )
        self._bg = [
            asyncio.create_task(self._admission_loop(), name="admission"),
            asyncio.create_task(self._finisher_loop(), name="finisher"),
            asyncio.create_task(self._housekeeping_loop(), name="housekeeping"),
        ]
        self._update_gauges()

    def start_run(self) -> None:
        if self.phase in (Phase.IDLE, Phase.STOPPED, Phase.STOPPING):
            self.phase = Phase.ROLLING if self.valid_produced < self.bound else Phase.BOUND
            self._wake_admission.set()

    def stop_run(self, abort_in_flight: bool) -> None:
        if self.phase in (Phase.IDLE, Phase.STOPPED):
            self.phase = Phase.STOPPED
            return
        self.phase = Phase.STOPPING
        if abort_in_flight:
            self._cancel([t for t in self.tasks.values() if not t.closed], Outcome.REQUEUED, "stopped")
        self._maybe_stopped()

    async def close(self) -> None:
        for t in self._bg:
            t.cancel()
        for t in self._bg:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self.dispatcher.close()

    async def wait_idle(self, timeout_s: float) -> None:
        """Until no prompt is in flight, every outcome is recorded, every abort fan-out answered
        and no call of ours is open on any gateway."""
        deadline = time.monotonic() + timeout_s
        while self._busy():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(self.tasks)} prompts still in flight after {timeout_s:.0f} s")
            await asyncio.sleep(0.01)

    def _busy(self) -> bool:
        return bool(
            self.tasks
            or self._to_finish
            or self.batcher.pending()
            or self._claiming
            or self._spawned
            or any(gw.calls for gw in self.pool.members)
        )

    # ------------------------------------------------------------------ weights
    def _set_version(self, version: int) -> None:
        self.version = version
        self.bound = self.cfg.valid_group_bound(version)
        # a gateway that missed a weight update must not serve this run until it caught up
        self.dispatcher.set_min_weight_version(version if self.uri else 0)
        self.metrics.policy_version.set(version)
        self.metrics.valid_bound.set(self.bound)

    async def publish_weights(
        self, version: int, uri: str, mode: int
    ) -> scheduler_pb2.PublishWeightsResponse:
        from asyncdapo.scheduler.weights import publish_weights

        return await publish_weights(self, version, uri, mode)

    def weights_published(self, version: int, uri: str) -> None:
        """The gateways were told: raise the bound and resume rolling out."""
        self.uri = uri
        self._set_version(version)
        if self.phase == Phase.BOUND and self.valid_produced < self.bound:
            self.phase = Phase.ROLLING
        self._wake_admission.set()
        self.dispatcher.pump()

    def _on_gateway_up(self, gw: Gateway) -> None:
        from asyncdapo.scheduler.weights import resync

        if self.uri and gw.weight_version < self.version and gw.address not in self.syncing:
            self._spawn(resync(self, gw))
        self.dispatcher.pump()

    def _on_gateway_load(self, gw: Gateway) -> None:
        # A report can unblock requests that no gateway took (the gateway resumed after a weight
        # update, or its older report said paused or stale weights): place them now.
        if self.dispatcher.pending:
            self.dispatcher.pump()

    # ------------------------------------------------------------------ admission
    def admission_state(self) -> AdmissionState:
        return AdmissionState(
            valid_produced=self.valid_produced,
            bound=self.bound,
            in_flight_prompts=len(self.tasks),
            max_in_flight=self.cfg.rollout.max_concurrent_prompts,
            finished_groups=self.finished_groups,
            valid_groups=self.valid_groups,
            batch_admitted=self.batch_admitted,
            ready_valid=self.ledger.ready,
        )

    def admissible(self, limit: int | None = None) -> int:
        """How many prompts the policy admits right now (at most `limit`)."""
        if self.phase != Phase.ROLLING:
            return 0
        s = self.admission_state()
        k = 0
        while k < (s.max_in_flight if limit is None else min(limit, s.max_in_flight)):
            d = self.policy.decide(
                replace(s, in_flight_prompts=s.in_flight_prompts + k, batch_admitted=s.batch_admitted + k)
            )
            if not d.ok:
                break
            k += 1
        return k

    async def _admission_loop(self) -> None:
        poll = self.queue_poll_s
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(poll):  # not wait_for: it can swallow a cancellation (3.11)
                    await self._wake_admission.wait()
            self._wake_admission.clear()
            k = self.admissible(self.claim_chunk)
            if k == 0:
                continue
            n = self.cfg.rollout.n
            self._claiming = True
            try:
                claims = await redis_retry(lambda k=k, n=n: self.queue.claim(k, n))
                if not claims:
                    poll = min(poll * 2, 0.25)  # queue empty: poll, backing off
                    continue
                poll = self.queue_poll_s
                records = await redis_retry(lambda c=claims: self.queue.load([x.pid for x in c]))
                reqs: list[Request] = []
                for claim, rec in zip(claims, records, strict=True):
                    reqs += self._admit(claim, rec)
            finally:
                self._claiming = False
            if self.phase != Phase.ROLLING:
                # the bound was reached (or the run stopped) while these were being claimed
                late = list({r.task.key: r.task for r in reqs}.values())
                self._cancel(late, Outcome.REQUEUED, RequeueReason.EARLY_STOP.value)
                continue
            self.dispatcher.submit(reqs)
            self._wake_admission.set()  # more may be admissible

    def _admit(self, claim: Claim, rec: PromptRecord | PromptRecordError) -> list[Request]:
        ro = self.cfg.rollout
        ok = isinstance(rec, PromptRecord)
        task = PromptTask(
            kind=Kind.TRAIN,
            pid=claim.pid,
            attempt=claim.attempt,
            seq=self.seq,
            n=ro.n,
            prompt_token_ids=rec.prompt_token_ids if ok else [],
            ground_truth=rec.ground_truth if ok else "",
            data_source=rec.data_source if ok else "",
            sampling=self.sampling(),
            version_admitted=self.version,
        )
        self.seq += 1
        self.tasks[task.key] = task
        self.batch_admitted += 1
        if not ok or not task.ground_truth:
            log.warning("dropping prompt %s: %s", claim.pid, rec if not ok else "empty ground_truth")
            self._finish(task, Outcome.DROPPED, DropReason.BAD_PROMPT.value)
            return []
        if not task.prompt_token_ids or len(task.prompt_token_ids) > self.cfg.data.max_prompt_length:
            self._finish(task, Outcome.DROPPED, DropReason.PROMPT_TOO_LONG.value)
            return []
        self.ledger.admit(task.key)
        if self.pdsr is not None:
            return self.pdsr.first_requests(task)
        return task.make_requests()

    def sampling(self, temperature: float | None = None) -> common_pb2.SamplingParams:
        ro = self.cfg.rollout
        return common_pb2.SamplingParams(
            max_tokens=self.cfg.data.max_response_length,
            temperature=ro.temperature if temperature is None else temperature,
            top_p=ro.top_p,
            top_k=ro.top_k,
        )

    # ------------------------------------------------------------------ responses and scores
    def _on_response(self, req: Request, gw: Gateway, resp: gateway_pb2.GenerateResponse) -> None:
        task = req.task
        if self.pdsr is not None and task.kind is Kind.TRAIN and self.pdsr.continues(req, resp):
            return
        task.responses[req.idx] = resp
        task.response_gateway[req.idx] = gw.address
        self.batcher.submit(ScoreJob(req.rid, resp.token_ids, task.ground_truth, (task, req.idx)))

    def _on_give_up(self, req: Request, detail: str) -> None:
        self._fail_task(req.task, DropReason.GATEWAY_ERROR.value, detail)

    def _on_verifier_call(self, seconds: float, ok: bool) -> None:
        self.metrics.verifier_latency.observe(seconds)
        if not ok:
            self.metrics.verifier_errors.labels("call").inc()

    async def _on_scored(self, jobs: list[ScoreJob]) -> None:
        cfg = self.cfg
        use_acc = cfg.reward.filter_metric is FilterMetric.ACC
        scores: list[ResponseScore] = []
        owners: list[PromptTask] = []
        tokens = 0
        for job in jobs:
            task, idx = job.ctx
            if task.closed:
                continue
            resp = task.responses[idx]
            res = job.result
            length = len(resp.token_ids)
            pen = cfg.overlong_penalty(length)
            task.scores[idx] = Score(res.score, res.acc, res.pred, res.score + pen, pen)
            if task.kind is Kind.EVAL:
                if all(s is not None for s in task.scores) and not task.future.done():
                    task.future.set_result(task)
                continue
            tokens += length
            self.lengths.completed += 1
            self.lengths.completed_tokens += length
            vmin, vmax = version_range(resp, self.version)
            metric = res.acc if use_acc else res.score
            scores.append(ResponseScore(task.pid, task.attempt, idx, metric, res.score + pen, vmin, vmax))
            owners.append(task)
        if not scores:
            return
        self.metrics.completions.inc(len(scores))
        self.metrics.generated_tokens.inc(tokens)
        counters = self.keys.counters

        def bump(pipe: Any) -> None:
            pipe.hincrby(counters, "completions", len(scores))
            pipe.hincrby(counters, "generated_tokens", tokens)

        progress = await redis_retry(lambda: self.store.record(scores, bump))
        for task, p in zip(owners, progress, strict=True):
            if p.complete and not task.group_complete and not task.closed:
                task.group_complete = True
                task.progress = p
                self._on_group_complete(task)

    async def _on_score_failed(self, jobs: list[ScoreJob], why: ScoreFailure) -> None:
        self.metrics.verifier_errors.labels("gave_up").inc(len(jobs))
        for job in jobs:
            self._fail_task(job.ctx[0], DropReason.VERIFIER_ERROR.value, why)

    def _on_group_complete(self, task: PromptTask) -> None:
        r = self.cfg.reward
        valid = is_valid(task.progress.metric_std, r.filter_eps) if r.filter_groups else True
        self.finished_groups += 1
        if valid:
            self.valid_groups += 1
            self.ledger.set_ready(task.key)
            self._wake_finisher.set()
        else:
            self._finish(task, Outcome.FILTERED)

    # ------------------------------------------------------------------ outcomes
    def _finish(self, task: PromptTask, outcome: Outcome, reason: str = "") -> None:
        """Queue an outcome for the finisher (the only writer of outcomes)."""
        if task.closed:
            return
        task.closed = True
        self.ledger.finish(task.key)
        self._to_finish.append((task, outcome, reason))
        self._wake_finisher.set()

    def _fail_task(self, task: PromptTask, reason: str, detail: str) -> None:
        if task.kind is Kind.EVAL:
            if task.future is not None and not task.future.done():
                task.future.set_exception(RuntimeError(f"{reason}: {detail}"))
            return
        if task.closed:
            return
        log.warning("dropping prompt %s attempt %d: %s (%s)", task.pid, task.attempt, reason, detail)
        self._cancel([task], Outcome.DROPPED, reason)

    def _cancel(self, tasks: list[PromptTask], outcome: Outcome, reason: str) -> None:
        """Abort the requests of `tasks` everywhere (queued ones are skipped by the dispatcher)
        and give each the outcome; requeues are queued latest-admitted first, so that after the
        LPUSHes the earliest-admitted prompt is at the head."""
        for t in sorted(tasks, key=lambda t: t.seq, reverse=True):
            t.cancelled = True
            self._finish(t, outcome, reason)
        self._spawn(self.dispatcher.abort(tasks))

    async def _finisher_loop(self) -> None:
        while True:
            await self._wake_finisher.wait()
            self._wake_finisher.clear()
            try:
                await self._finish_round()
            except Exception:
                log.exception("finisher round failed; retrying")
                await asyncio.sleep(0.5)
                self._wake_finisher.set()

    async def _finish_round(self) -> None:
        from asyncdapo.scheduler.finisher import finish_round

        await finish_round(self)

    def _maybe_stopped(self) -> None:
        if self.phase == Phase.STOPPING and not self.tasks:
            self.phase = Phase.STOPPED

    async def status(self) -> scheduler_pb2.RunStatus:
        from asyncdapo.scheduler.status import run_status

        return await run_status(self)

    async def flush_counters(self) -> None:
        """Write the abort counters kept in memory (they are batched, not written per reply)."""
        d = self.dispatcher
        now = {"aborted_tokens": d.aborted_tokens, "aborted_requests": d.aborted_requests}
        deltas = {k: v - self._flushed[k] for k, v in now.items()}
        await self._incr_counters(**deltas)
        self._flushed = now

    # ------------------------------------------------------------------ helpers
    async def _incr_counters(self, **deltas: int) -> None:
        deltas = {k: v for k, v in deltas.items() if v}
        if not deltas:
            return
        pipe = self.redis.pipeline(transaction=False)
        for k, v in deltas.items():
            pipe.hincrby(self.keys.counters, k, v)
        await pipe.execute()
        self.rtt.count += 1

    async def _housekeeping_loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            try:
                await self.queue.refresh_lease()
                await self.flush_counters()
                self.metrics.queue_depth.set(await self.queue.depth())
            except (RedisConnectionError, RedisTimeoutError) as err:
                log.warning("housekeeping: redis unavailable: %s", err)
            self._update_gauges()

    def _update_gauges(self) -> None:
        m = self.metrics
        m.in_flight_prompts.set(len(self.tasks))
        m.valid_produced.set(self.valid_produced)
        m.redis_round_trips.inc(self.rtt.count - self._rtt_reported)
        self._rtt_reported = self.rtt.count
        for gw in self.pool.members:
            m.in_flight.labels(gw.address).set(gw.in_flight)

    def _spawn(self, coro: Awaitable[Any]) -> None:
        t = asyncio.ensure_future(coro)
        self._spawned.add(t)
        t.add_done_callback(self._spawned.discard)


def _text_map(m: dict[Any, Any]) -> dict[str, str]:
    return {
        (k.decode() if isinstance(k, bytes) else str(k)): (v.decode() if isinstance(v, bytes) else str(v))
        for k, v in m.items()
    }
