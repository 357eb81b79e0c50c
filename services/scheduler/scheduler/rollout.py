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
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from asyncdapo.config import EarlyStopOrder, FilterMetric, LongTailPolicy, RolloutMode, RunConfig
from asyncdapo.prompts import PromptRecord, PromptRecordError
from asyncdapo.redis_keys import ADMITTED, VALID_CREDITED, VALID_PRODUCED, RunKeys
from asyncdapo.scheduler.admission import AdmissionState, make_policy
from asyncdapo.scheduler.dispatch import DispatchPolicy
from asyncdapo.scheduler.dispatcher import Dispatcher
from asyncdapo.scheduler.group_state import (
    REDIS_WAIT_ERRORS,
    DropReason,
    FinishItem,
    GroupStore,
    Outcome,
    RecordStatus,
    RedisLink,
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
from asyncdapo.scheduler.queue import Claim, Fenced, PromptQueue
from asyncdapo.scheduler.scoring import BatcherConfig, ScoreBatcher, ScoreFailure, ScoreJob, Scorer
from asyncdapo.scheduler.tasks import (
    Kind,
    LengthStats,
    PromptTask,
    Request,
    Score,
    version_range,
)
from asyncdapo.scheduler.weights import sync_loop
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
        reconcile_every_s: float = 5.0,
    ) -> None:
        self.cfg = cfg
        self.redis = redis
        self.pool = pool
        self.metrics = metrics or SchedulerMetrics()
        self.keys = RunKeys(cfg.name)
        self.rtt = RoundTrips()
        self.redis_link = RedisLink()
        self.scripts = ScriptRunner(redis, self.rtt)
        self.store = GroupStore(self.scripts, self.keys, cfg.data.train_batch_size, cfg.rollout.max_staleness)
        self.queue = PromptQueue(redis, self.keys, self.scripts, self.store, self.rtt, owner=owner)
        self.claim_chunk = claim_chunk
        self.queue_poll_s = queue_poll_s
        self.reconcile_every_s = reconcile_every_s
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
        # valid groups XADDed and groups the trainer credited back (dropped): both only grow, and
        # the bound applies to their difference (`valid_produced`)
        self.produced = 0
        self.credited = 0
        self.admitted_seen = 0  # the highest `counters.admitted` a claim returned (rollback check)
        self.fenced = False  # another scheduler took the run over: this one does nothing more
        self.tasks: dict[tuple[str, int], PromptTask] = {}  # train attempts without an outcome
        self.seq = 0
        self.finished_groups = 0  # complete groups judged, for the running valid rate
        self.valid_groups = 0
        self.batch_admitted = 0  # sync mode: prompts in the current generation batch
        self.early_stops = 0
        self.lengths = LengthStats()
        self._to_finish: list[tuple[PromptTask, Outcome, DropReason | RequeueReason | None]] = []
        # a finisher batch sent to Redis but not yet applied: resent as is until it is (every
        # item is idempotent), so an error or an outage never loses an outcome
        self._unwritten: list[tuple[PromptTask, FinishItem]] = []
        self._wake_admission = asyncio.Event()
        self._wake_finisher = asyncio.Event()
        self._wake_sync = asyncio.Event()
        self._bg: list[asyncio.Task[Any]] = []
        self._spawned: set[asyncio.Task[Any]] = set()
        self.publish_lock = asyncio.Lock()
        self.outcome_lock = asyncio.Lock()
        self.syncing: set[str] = set()
        self.health_listeners: list[Callable[[bool], None]] = []
        self.last_status_counters: tuple[dict[Any, Any], int] = ({}, 0)
        self._count_seq = 0
        self._flushed = {"aborted_tokens": 0, "aborted_requests": 0, "early_stops": 0}
        self._rtt_reported = 0
        self._flush_lock = asyncio.Lock()
        self._claiming = False
        self._stop_reason = RequeueReason.STOPPED
        self._resync_needed = False
        self._last_reconcile = 0.0
        self.redis_link.listen(self._on_redis_link)

    @property
    def valid_produced(self) -> int:
        """Valid groups that count toward the bound: produced minus credited back."""
        return self.produced - self.credited

    @property
    def serving(self) -> bool:
        """Health: Redis answers and this scheduler still owns its run."""
        return self.redis_link.up and not self.fenced

    def _r(self, fn: Callable[[], Awaitable[Any]]) -> Awaitable[Any]:
        """A Redis operation that waits through an outage (and reports it through `redis_link`)."""
        return redis_retry(fn, link=self.redis_link)

    # ------------------------------------------------------------------ lifecycle
    async def open(self) -> None:
        """Load scripts, take the run over (a new fencing epoch), read the run's state from Redis,
        requeue every claim a predecessor left, start the loops."""
        await self._r(self.scripts.load)
        epoch = await self._r(self.queue.take_over)
        await self._read_state()
        recovered = await self._r(self.queue.recover)
        if recovered:
            log.info("epoch %d: requeued %d prompts claimed by a replaced scheduler", epoch, len(recovered))
            self.metrics.outcomes.labels("requeued", RequeueReason.SCHEDULER_RESTART.value).inc(
                len(recovered)
            )
        self._bg = [
            asyncio.create_task(self._admission_loop(), name="admission"),
            asyncio.create_task(self._finisher_loop(), name="finisher"),
            asyncio.create_task(self._housekeeping_loop(), name="housekeeping"),
            asyncio.create_task(sync_loop(self), name="weight-sync"),
        ]
        self._update_gauges()

    async def _read_state(self) -> None:
        """What this process keeps in memory about the run, from Redis: version, uri, counts."""
        w = _text_map(await self._r(lambda: self.redis.hgetall(self.keys.weights)))
        version = int(w.get("version", "0") or 0)
        if version < self.version and self.uri:
            # Redis lost the last publish (restored from an older state): the gateways run ours
            log.warning("redis holds weights v%d, we published v%d: writing it back", version, self.version)
            await self._r(
                lambda: self.redis.hset(self.keys.weights, mapping={"version": self.version, "uri": self.uri})
            )
        else:
            self.uri = w.get("uri", "")
            self._set_version(version)
        c = await self._r(
            lambda: self.redis.hmget(self.keys.counters, [VALID_PRODUCED, VALID_CREDITED, ADMITTED])
        )
        produced, credited, admitted = (int(x or 0) for x in c)
        if admitted < self.admitted_seen:
            await self._rolled_back(admitted)
        self.produced, self.credited = produced, credited
        self.admitted_seen = admitted

    async def _rolled_back(self, admitted: int) -> None:
        """Redis came back with an older state than we saw (it lost acknowledged writes: a
        restart under `appendfsync everysec`, a failover). Our tasks may hold attempts Redis never
        recorded: drop them all without writing anything and let reconciliation requeue whatever
        claims of ours Redis still has."""
        log.error(
            "redis rolled back (admitted %d < %d seen): dropping %d prompts in flight, requeueing claims",
            admitted,
            self.admitted_seen,
            len(self.tasks),
        )
        self._drop_in_memory()
        if self.phase == Phase.BOUND:
            self.phase = Phase.ROLLING
        self._last_reconcile = 0.0  # at once

    def _drop_in_memory(self) -> None:
        """Forget every train task without recording an outcome (abort what runs on gateways)."""
        tasks = list(self.tasks.values())
        for t in tasks:
            t.cancelled = True
            t.closed = True
        self._spawn(self.dispatcher.abort(tasks))
        self.tasks.clear()
        self._to_finish.clear()
        self._unwritten.clear()
        order = EarlyStopOrder.FIFO if self.sync else self.cfg.rollout.early_stop_order
        self.ledger = CommitLedger(order, abort_beyond_cutoff=not self.sync)
        self.batch_admitted = 0

    def _on_fenced(self, where: str) -> None:
        """A successor took the run over: stop for good, write nothing (it requeued our claims)."""
        if self.fenced:
            return
        self.fenced = True
        log.error(
            "fenced (%s): another scheduler took run %s over; this one stops (health NOT_SERVING)",
            where,
            self.cfg.name,
        )
        self.phase = Phase.STOPPED
        self._drop_in_memory()
        self._notify_health()

    def _on_redis_link(self, up: bool) -> None:
        self.metrics.redis_up.set(1 if up else 0)
        if up:
            self._resync_needed = True
        self._notify_health()

    def _notify_health(self) -> None:
        for fn in self.health_listeners:
            fn(self.serving)

    def start_run(self) -> None:
        if self.fenced:
            return
        if self.phase in (Phase.IDLE, Phase.STOPPED, Phase.STOPPING):
            self.phase = Phase.ROLLING if self.valid_produced < self.bound else Phase.BOUND
            self._wake_admission.set()

    def stop_run(self, abort_in_flight: bool, reason: RequeueReason = RequeueReason.STOPPED) -> None:
        if self.phase in (Phase.IDLE, Phase.STOPPED):
            self.phase = Phase.STOPPED
            return
        self.phase = Phase.STOPPING
        self._stop_reason = reason
        if abort_in_flight:
            self._cancel([t for t in self.tasks.values() if not t.closed], Outcome.REQUEUED, reason)
        self._maybe_stopped()

    async def shutdown(self, timeout_s: float = 10.0) -> None:
        """Graceful stop (SIGTERM): admit nothing more, abort what runs, requeue every claim at
        once (`requeued(shutdown)`), write the counters and give the lease up, so a successor
        starts from a clean queue. If Redis is away it gives up after `timeout_s`: the successor's
        take-over requeues what is left."""
        if self.fenced:
            return
        self.stop_run(abort_in_flight=True, reason=RequeueReason.SHUTDOWN)
        deadline = time.monotonic() + timeout_s
        while (self.tasks or self._claiming) and time.monotonic() < deadline:
            if self._claiming:
                await asyncio.sleep(0.01)
                continue
            self.stop_run(abort_in_flight=True, reason=RequeueReason.SHUTDOWN)  # late claims
            await asyncio.sleep(0.01)
        if self.tasks:
            log.warning(
                "shutdown: %d prompts not requeued in %.0f s; a successor requeues them",
                len(self.tasks),
                timeout_s,
            )
            return
        try:
            async with asyncio.timeout(max(deadline - time.monotonic(), 1.0)):
                await self.flush_counters()
                await self.queue.release_lease()
        except (TimeoutError, *REDIS_WAIT_ERRORS) as err:
            log.warning("shutdown: could not release the lease: %s", err)

    async def close(self) -> None:
        for t in self._bg:
            t.cancel()
        for t in self._bg:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        await self.batcher.close()
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
            or self._unwritten
            or self.batcher.pending()
            or self._claiming
            or self._spawned
            or any(gw.calls for gw in self.pool.members)
        )

    # ------------------------------------------------------------------ weights
    def _set_version(self, version: int) -> None:
        self.version = self.store.version = version
        self.bound = self.cfg.valid_group_bound(version)
        # a gateway that missed a weight update must not serve this run until it caught up
        self.dispatcher.set_min_weight_version(version if self.uri else 0)
        self.metrics.policy_version.set(version)
        self.metrics.valid_bound.set(self.bound)

    async def publish_weights(
        self, version: int, uri: str, mode: int, trainer_epoch: int = 0
    ) -> scheduler_pb2.PublishWeightsResponse:
        from asyncdapo.scheduler.weights import publish_weights

        return await publish_weights(self, version, uri, mode, trainer_epoch)

    def weights_published(self, version: int, uri: str) -> None:
        """The gateways were told: raise the bound and resume rolling out."""
        self.uri = uri
        self._set_version(version)
        if self.phase == Phase.BOUND and self.valid_produced < self.bound:
            self.phase = Phase.ROLLING
        self._wake_admission.set()
        self.dispatcher.pump()

    def wake_sync(self) -> None:
        """Look for gateways behind the current weights now (they re-sync in the background)."""
        self._wake_sync.set()

    def _on_gateway_up(self, gw: Gateway) -> None:
        self.wake_sync()
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
            try:
                got = await self._admit_some()
            except Fenced as err:
                self._on_fenced(str(err))
                continue
            except Exception:  # a bug must not end admission for good: say so and go on
                log.exception("admission round failed; retrying")
                await asyncio.sleep(0.5)
                continue
            if got is None:
                continue
            poll = self.queue_poll_s if got else min(poll * 2, 0.25)  # queue empty: poll, backing off

    async def _admit_some(self) -> int | None:
        """Claim what the policy admits now and hand it to the dispatcher. Returns the number of
        prompts claimed, or None when the policy admits nothing."""
        k = self.admissible(self.claim_chunk)
        if k == 0:
            return None
        n = self.cfg.rollout.n
        token = self.queue.new_token()  # a retry after a lost reply gets the same claims back
        self._claiming = True
        try:
            batch = await self._r(lambda: self.queue.claim(k, n, token))
            self.admitted_seen = max(self.admitted_seen, batch.admitted_total)
            claims = batch.claims
            if not claims:
                return 0
            records = await self._r(lambda: self.queue.load([x.pid for x in claims]))
            reqs: list[Request] = []
            for claim, rec in zip(claims, records, strict=True):
                reqs += self._admit(claim, rec)
        finally:
            self._claiming = False
        if self.phase != Phase.ROLLING:
            # the bound was reached (or the run stopped) while these were being claimed
            late = list({r.task.key: r.task for r in reqs}.values())
            why = self._stop_reason if self.phase == Phase.STOPPING else RequeueReason.EARLY_STOP
            self._cancel(late, Outcome.REQUEUED, why)
            return len(claims)
        self.dispatcher.submit(reqs)
        self._wake_admission.set()  # more may be admissible
        return len(claims)

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
            self._finish(task, Outcome.DROPPED, DropReason.BAD_PROMPT)
            return []
        if not task.prompt_token_ids or len(task.prompt_token_ids) > self.cfg.data.max_prompt_length:
            self._finish(task, Outcome.DROPPED, DropReason.PROMPT_TOO_LONG)
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
        self._fail_task(req.task, DropReason.GATEWAY_ERROR, detail)

    def _on_verifier_call(self, seconds: float, ok: bool) -> None:
        self.metrics.verifier_latency.observe(seconds)
        if not ok:
            self.metrics.verifier_errors.labels("call").inc()

    async def _on_scored(self, jobs: list[ScoreJob]) -> None:
        cfg = self.cfg
        use_acc = cfg.reward.filter_metric is FilterMetric.ACC
        scores: list[ResponseScore] = []
        owners: list[PromptTask] = []
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
            vmin, vmax = version_range(resp, self.version)
            metric = res.acc if use_acc else res.score
            scores.append(
                ResponseScore(task.pid, task.attempt, idx, metric, res.score + pen, vmin, vmax, length)
            )
            owners.append(task)
        if not scores:
            return
        # idempotent (response markers; the counters move inside the script): safe to retry
        progress = await self._r(lambda: self.store.record(scores))
        counted = tokens = 0
        for task, sc, p in zip(owners, scores, progress, strict=True):
            if p.status is RecordStatus.FENCED:
                self._on_fenced("record")
                return
            # a `dup` whose first answer never reached us (a lost reply, a retried batch) was
            # counted by Redis all the same: memory counts each response once, as Redis does
            if p.status is not RecordStatus.STALE and sc.idx not in task.recorded:
                task.recorded.add(sc.idx)
                counted += 1
                tokens += sc.length
            if p.complete and not task.group_complete and not task.closed:
                task.group_complete = True
                task.progress = p
                self._on_group_complete(task)
        self.lengths.completed += counted
        self.lengths.completed_tokens += tokens
        self.metrics.completions.inc(counted)
        self.metrics.generated_tokens.inc(tokens)

    async def _on_score_failed(self, jobs: list[ScoreJob], why: ScoreFailure) -> None:
        """Items the verifier judged unscorable for good (each alone: an invalid response, a
        math-verify timeout on every try); an outage never lands here by default, it is waited
        for — only with a finite `reward.verifier_max_retries` does a call give up."""
        self.metrics.verifier_errors.labels("gave_up").inc(len(jobs))
        reason = (
            DropReason.VERIFIER_ERROR if why is ScoreFailure.VERIFIER_UNAVAILABLE else DropReason.UNSCORABLE
        )
        for job in jobs:
            self._fail_task(job.ctx[0], reason, str(why))

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
    def _finish(
        self, task: PromptTask, outcome: Outcome, reason: DropReason | RequeueReason | None = None
    ) -> None:
        """Queue an outcome for the finisher (the only writer of outcomes)."""
        if task.closed:
            return
        task.closed = True
        self.ledger.finish(task.key)
        self._to_finish.append((task, outcome, reason))
        self._wake_finisher.set()

    def _fail_task(self, task: PromptTask, reason: DropReason, detail: str) -> None:
        if task.kind is Kind.EVAL:
            if task.future is not None and not task.future.done():
                task.future.set_exception(RuntimeError(f"{reason}: {detail}"))
            return
        if task.closed:
            return
        log.warning("dropping prompt %s attempt %d: %s (%s)", task.pid, task.attempt, reason, detail)
        self._cancel([task], Outcome.DROPPED, reason)

    def _cancel(self, tasks: list[PromptTask], outcome: Outcome, reason: DropReason | RequeueReason) -> None:
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
        """Write the counters kept in memory (aborts and early stops are batched, not written per
        event) with the idempotent COUNT script: a retry after a lost reply adds nothing twice."""
        async with self._flush_lock:
            d = self.dispatcher
            now = {
                "aborted_tokens": d.aborted_tokens,
                "aborted_requests": d.aborted_requests,
                "early_stops": self.early_stops,
            }
            deltas = {k: v - self._flushed[k] for k, v in now.items() if v != self._flushed[k]}
            if not deltas:
                return
            self._count_seq += 1
            seq = self._count_seq
            args: list[Any] = [seq, 86_400]
            for k, v in deltas.items():
                args += [k, v]
            keys = [self.keys.counters, self.keys.count_seq(self.queue.owner)]
            await self._r(lambda: self.scripts.run("count", keys, args))
            self._flushed = now

    # ------------------------------------------------------------------ housekeeping
    async def _housekeeping_loop(self) -> None:
        """Every second: the lease (or learn that we were fenced), the state re-read after a
        Redis outage, the trainer's credits, the counters, and every few seconds a
        reconciliation of our claims. Each step waits through a Redis outage; none can end the
        loop."""
        while True:
            await asyncio.sleep(1.0)
            if self.fenced:
                continue
            try:
                await self._housekeeping_round()
            except Fenced as err:
                self._on_fenced(str(err))
            except Exception:
                log.exception("housekeeping round failed; retrying")
            self._update_gauges()
            self._update_gateway_gauges()

    async def _housekeeping_round(self) -> None:
        lease = await self._r(self.queue.refresh_lease)
        if lease == 0:
            raise Fenced("lease refresh: a newer epoch holds the run")
        if lease < 0:  # Redis lost the run's state (no epoch): take it over again
            log.error("redis lost the run's fencing epoch: taking the run over again")
            await self._r(self.queue.take_over)
            self._resync_needed = True
        if self._resync_needed:
            self._resync_needed = False
            async with self.outcome_lock:
                await self._read_state()
            await self._r(self.queue.recover)
            self._last_reconcile = 0.0
        await self.flush_counters()
        c = await self._r(lambda: self.redis.hmget(self.keys.counters, [VALID_PRODUCED, VALID_CREDITED]))
        self.produced = max(self.produced, int(c[0] or 0))
        self.credited = max(self.credited, int(c[1] or 0))
        if self.phase == Phase.BOUND and self.valid_produced < self.bound:
            # the trainer credited dropped groups back: there is room again
            self.phase = Phase.ROLLING
            self._wake_admission.set()
        self.metrics.queue_depth.set(await self._r(self.queue.depth))
        if time.monotonic() - self._last_reconcile >= self.reconcile_every_s:
            await self.reconcile()

    async def reconcile(self) -> int:
        """Requeue claims of ours that no task holds (a claim whose reply was lost for good, a
        Redis rollback that restored claims we had finished): nothing stays claimed by nobody."""
        if self._claiming:
            return 0
        self._last_reconcile = time.monotonic()
        orphans = await self._r(lambda: self.queue.orphans(set()))
        if self._claiming:
            return 0  # a claim is being admitted: its tasks may not be registered yet
        orphans = [(pid, c) for pid, c in orphans if (pid, c.attempt) not in self.tasks]
        if not orphans:
            return 0
        res = await self._r(lambda: self.queue.requeue(orphans, RequeueReason.ORPHANED))
        if any(r.fenced for r in res):
            raise Fenced("reconcile: a newer epoch holds the run")
        n = sum(1 for r in res if r.label.startswith("requeued"))
        if n:
            log.warning("requeued %d claim(s) of ours that no task held", n)
            self.metrics.outcomes.labels("requeued", RequeueReason.ORPHANED.value).inc(n)
        return n

    def _update_gauges(self) -> None:
        m = self.metrics
        m.in_flight_prompts.set(len(self.tasks))
        m.valid_credited.set(self.credited)
        m.valid_produced.set(self.produced)
        m.redis_round_trips.inc(self.rtt.count - self._rtt_reported)
        self._rtt_reported = self.rtt.count

    def _update_gateway_gauges(self) -> None:
        """Per-gateway gauges: once a second (housekeeping), never per finisher round — that would
        cost O(gateways) per outcome batch."""
        for gw in self.pool.members:
            self.metrics.in_flight.labels(gw.address).set(gw.in_flight)

    def _spawn(self, coro: Awaitable[Any]) -> None:
        t = asyncio.ensure_future(coro)
        self._spawned.add(t)
        t.add_done_callback(self._spawned.discard)


def _text_map(m: dict[Any, Any]) -> dict[str, str]:
    return {
        (k.decode() if isinstance(k, bytes) else str(k)): (v.decode() if isinstance(v, bytes) else str(v))
        for k, v in m.items()
    }
