"""The rollout driver: the asyncio, Redis and gRPC around the rollout core.

`RolloutCore` (core.py) decides; `Rollout` carries out what it decides and feeds it what happened:
- admission loop: asks the core how many prompts it admits, CLAIMs them (Lua, with a client
  token), loads their records, hands both to the core, dispatches what it answers;
- the dispatcher's callbacks (a finished response, a request given up) → the core → the verifier
  batcher (`ScoreJob`s), the dispatcher (`Dispatch`, `Redispatch`) or an abort fan-out (`Abort`);
- the batcher's callbacks (scored, failed) → RECORD (Lua) → the core;
- finisher loop (the only writer of outcomes): takes the core's finish batch, writes it (FINISH,
  one round trip), gives the answers back to the core, and acts on what it answers (abort the
  rest at the bound);
- housekeeping: lease (or learn that we were fenced), the state re-read after a Redis outage, the
  trainer's credits, counters, reconciliation of our claims; weight sync (weights.py).

Concurrency model: one asyncio loop; every core call is synchronous, so the core's state has a
single writer at any time. Redis calls wait through outages (`RedisLink`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from asyncdapo.config import RunConfig
from asyncdapo.redis_keys import ADMITTED, VALID_CREDITED, VALID_PRODUCED, RunKeys
from asyncdapo.scheduler.core import (
    Abort,
    Command,
    Dispatch,
    Phase,
    Redispatch,
    RolloutCore,
    ScoreResponse,
)
from asyncdapo.scheduler.dispatch import DispatchPolicy
from asyncdapo.scheduler.dispatcher import Dispatcher
from asyncdapo.scheduler.group_state import (
    REDIS_WAIT_ERRORS,
    DropReason,
    GroupStore,
    RedisLink,
    RequeueReason,
    RoundTrips,
    ScriptRunner,
    redis_retry,
)
from asyncdapo.scheduler.longtail import LongTailAction
from asyncdapo.scheduler.metrics import SchedulerMetrics
from asyncdapo.scheduler.pool import Gateway, GatewayPool
from asyncdapo.scheduler.queue import Fenced, PromptQueue
from asyncdapo.scheduler.scoring import BatcherConfig, ScoreBatcher, ScoreFailure, ScoreJob, Scorer
from asyncdapo.scheduler.tasks import Kind, LengthStats, PromptTask, Request, Score
from asyncdapo.scheduler.weights import sync_loop
from asyncdapo.v1 import common_pb2, gateway_pb2, scheduler_pb2

__all__ = ["Phase", "Rollout"]

log = logging.getLogger(__name__)


class MetricsObserver:
    """The core's observations as the scheduler's Prometheus metrics."""

    def __init__(self, metrics: SchedulerMetrics) -> None:
        self.m = metrics

    def outcome(self, outcome: str, reason: str, attempt: int) -> None:
        self.m.outcomes.labels(outcome, reason).inc()
        if outcome != "requeued":
            self.m.prompt_attempts.labels(outcome).observe(attempt)

    def committed(self, staleness: int) -> None:
        self.m.groups.inc()
        self.m.staleness.observe(staleness)

    def completions(self, count: int, tokens: int) -> None:
        self.m.completions.inc(count)
        self.m.generated_tokens.inc(tokens)

    def early_stop(self) -> None:
        self.m.early_stops.inc()

    def long_tail(self, action: LongTailAction) -> None:
        self.m.long_tail.labels(action.value).inc()


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
        self.core = RolloutCore(cfg, MetricsObserver(self.metrics), pool_exists=self._pool_exists)
        ro = cfg.rollout
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
                batch_size=cfg.reward.verifier_batch_size, concurrency=cfg.reward.verifier_concurrency
            ),
            on_scored=self._on_scored,
            on_failed=self._on_score_failed,
            on_call=self._on_verifier_call,
        )
        pool.on_down = self.dispatcher.cancel_calls
        pool.on_up = self._on_gateway_up
        pool.on_load = self._on_gateway_load

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
        self._resync_needed = False
        self._last_reconcile = 0.0
        self.redis_link.listen(self._on_redis_link)

    # ------------------------------------------------------------------ the core's state
    @property
    def phase(self) -> int:
        return self.core.phase

    @property
    def version(self) -> int:
        return self.core.version

    @property
    def uri(self) -> str:
        return self.core.uri

    @property
    def bound(self) -> int:
        return self.core.bound

    @property
    def produced(self) -> int:
        return self.core.produced

    @property
    def credited(self) -> int:
        return self.core.credited

    @property
    def valid_produced(self) -> int:
        """Valid groups that count toward the bound: produced minus credited back."""
        return self.core.valid_produced

    @property
    def tasks(self) -> dict[tuple[str, int], PromptTask]:
        return self.core.tasks

    @property
    def lengths(self) -> LengthStats:
        return self.core.lengths

    @property
    def fenced(self) -> bool:
        return self.core.fenced

    @property
    def pdsr(self) -> RolloutCore | None:
        """The core when the long-tail policy is pdsr (its probe window: `pdsr.probes`)."""
        return self.core if self.core.pdsr else None

    @property
    def serving(self) -> bool:
        """Health: Redis answers and this scheduler still owns its run."""
        return self.redis_link.up and not self.core.fenced

    def sampling(self, temperature: float | None = None) -> common_pb2.SamplingParams:
        return self.core.sampling(temperature)

    def admissible(self, limit: int | None = None) -> int:
        return self.core.admissible(limit)

    def _pool_exists(self, label: str) -> bool:
        return any(g.pool == label for g in self.pool.members)

    def _r(self, fn: Callable[[], Awaitable[Any]]) -> Awaitable[Any]:
        """A Redis operation that waits through an outage (and reports it through `redis_link`)."""
        return redis_retry(fn, link=self.redis_link)

    # ------------------------------------------------------------------ commands
    def _run(self, commands: Iterable[Command]) -> None:
        """Carry out what the core decided."""
        for c in commands:
            if isinstance(c, Dispatch):
                self.dispatcher.submit(c.requests)
            elif isinstance(c, Redispatch):
                self.dispatcher.resubmit(c.request)
            elif isinstance(c, Abort):
                self._spawn(self.dispatcher.abort(c.tasks))
            elif isinstance(c, ScoreResponse):
                self.batcher.submit(ScoreJob(c.request_id, c.token_ids, c.ground_truth, (c.task, c.idx)))
        self._wake_finisher_if_needed()

    def _wake_finisher_if_needed(self) -> None:
        if self.core.wants_finish or self.core.unwritten:
            self._wake_finisher.set()

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
        if version < self.core.version and self.core.uri:
            # Redis lost the last publish (restored from an older state): the gateways run ours
            log.warning("redis holds weights v%d, we published v%d: writing it back", version, self.version)
            v, uri = self.core.version, self.core.uri
            await self._r(lambda: self.redis.hset(self.keys.weights, mapping={"version": v, "uri": uri}))
        else:
            self._set_version(version, w.get("uri", ""))
        c = await self._r(
            lambda: self.redis.hmget(self.keys.counters, [VALID_PRODUCED, VALID_CREDITED, ADMITTED])
        )
        produced, credited, admitted = (int(x or 0) for x in c)
        seen = self.core.admitted_seen
        if self.core.reset_counts(produced, credited, admitted):
            # Redis lost acknowledged writes (a restart under `appendfsync everysec`, a failover):
            # our tasks may hold attempts it never recorded. Drop them without writing anything;
            # reconciliation requeues whatever claims of ours Redis still has.
            log.error(
                "redis rolled back (admitted %d < %d seen): dropping %d prompts in flight, requeueing claims",
                admitted,
                seen,
                len(self.tasks),
            )
            self._run(self.core.drop_in_memory())
            self._last_reconcile = 0.0

    def _set_version(self, version: int, uri: str | None = None) -> None:
        self.core.set_version(version, uri)
        self.store.version = version  # FINISH's staleness rule never judges older than this
        # a gateway that missed a weight update must not serve this run until it caught up
        self.dispatcher.set_min_weight_version(version if self.core.uri else 0)
        self.metrics.policy_version.set(version)
        self.metrics.valid_bound.set(self.core.bound)

    def _on_fenced(self, where: str) -> None:
        """A successor took the run over: stop for good, write nothing (it requeued our claims)."""
        if self.core.fenced:
            return
        log.error(
            "fenced (%s): another scheduler took run %s over; this one stops (health NOT_SERVING)",
            where,
            self.cfg.name,
        )
        self._run(self.core.fence())
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
        self.core.start()
        self._wake_admission.set()

    def stop_run(self, abort_in_flight: bool, reason: RequeueReason = RequeueReason.STOPPED) -> None:
        self._run(self.core.stop(abort_in_flight, reason))

    async def shutdown(self, timeout_s: float = 10.0) -> None:
        """Graceful stop (SIGTERM): admit nothing more, abort what runs, requeue every claim at
        once (`requeued(shutdown)`), write the counters and give the lease up, so a successor
        starts from a clean queue. If Redis is away it gives up after `timeout_s`: the successor's
        take-over requeues what is left."""
        if self.core.fenced:
            return
        self.stop_run(abort_in_flight=True, reason=RequeueReason.SHUTDOWN)
        deadline = time.monotonic() + timeout_s
        while (self.tasks or self._claiming) and time.monotonic() < deadline:
            if not self._claiming:
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
            or self.core.has_outcomes_to_write()
            or self.batcher.pending()
            or self._claiming
            or self._spawned
            or any(gw.calls for gw in self.pool.members)
        )

    # ------------------------------------------------------------------ weights
    async def publish_weights(
        self, version: int, uri: str, mode: int, trainer_epoch: int = 0
    ) -> scheduler_pb2.PublishWeightsResponse:
        from asyncdapo.scheduler.weights import publish_weights

        return await publish_weights(self, version, uri, mode, trainer_epoch)

    def weights_published(self, version: int, uri: str) -> None:
        """The gateways were told: raise the bound and resume rolling out."""
        self._set_version(version, uri)
        self.core.weights_published(version, uri)
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
        """Claim what the core admits now and hand it over. Returns the number of prompts claimed,
        or None when the core admits nothing."""
        k = self.core.admissible(self.claim_chunk)
        if k == 0:
            return None
        n = self.cfg.rollout.n
        token = self.queue.new_token()  # a retry after a lost reply gets the same claims back
        self._claiming = True
        try:
            batch = await self._r(lambda: self.queue.claim(k, n, token))
            self.core.admitted_seen = max(self.core.admitted_seen, batch.admitted_total)
            claims = batch.claims
            if not claims:
                return 0
            records = await self._r(lambda: self.queue.load([x.pid for x in claims]))
            commands = self.core.claimed(claims, records)
        finally:
            self._claiming = False
        self._run(commands)
        self._wake_admission.set()  # more may be admissible
        return len(claims)

    # ------------------------------------------------------------------ responses and scores
    def _on_response(self, req: Request, gw: Gateway, resp: gateway_pb2.GenerateResponse) -> None:
        if req.task.kind is Kind.EVAL:
            task = req.task
            task.responses[req.idx] = resp
            task.response_gateway[req.idx] = gw.address
            self.batcher.submit(ScoreJob(req.rid, resp.token_ids, task.ground_truth, (task, req.idx)))
            return
        self._run(self.core.response(req, gw.address, resp))

    def _on_give_up(self, req: Request, detail: str) -> None:
        task = req.task
        if task.kind is Kind.EVAL:
            if task.future is not None and not task.future.done():
                task.future.set_exception(RuntimeError(f"{DropReason.GATEWAY_ERROR}: {detail}"))
            return
        self._run(self.core.fail(task, DropReason.GATEWAY_ERROR, detail))

    def _on_verifier_call(self, seconds: float, ok: bool) -> None:
        self.metrics.verifier_latency.observe(seconds)
        if not ok:
            self.metrics.verifier_errors.labels("call").inc()

    async def _on_scored(self, jobs: list[ScoreJob]) -> None:
        train: list[tuple[PromptTask, int, float, float, str]] = []
        owners: list[PromptTask] = []
        for job in jobs:
            task, idx = job.ctx
            res = job.result
            assert res is not None
            if task.kind is Kind.EVAL:
                self._eval_scored(task, idx, res.score, res.acc, res.pred)
                continue
            train.append((task, idx, res.score, res.acc, res.pred))
        scores = self.core.scores_to_record(train)
        if not scores:
            return
        owners = [self.tasks[(s.pid, s.attempt)] for s in scores]
        # idempotent (response markers; the counters move inside the script): safe to retry
        progress = await self._r(lambda: self.store.record(scores))
        if not self.core.recorded(owners, scores, progress):
            self._on_fenced("record")
            return
        self._wake_finisher_if_needed()

    def _eval_scored(self, task: PromptTask, idx: int, score: float, acc: float, pred: str) -> None:
        resp = task.responses[idx]
        assert resp is not None
        pen = self.cfg.overlong_penalty(len(resp.token_ids))
        task.scores[idx] = Score(score, acc, pred, score + pen, pen)
        if all(s is not None for s in task.scores) and task.future is not None and not task.future.done():
            task.future.set_result(task)

    async def _on_score_failed(self, jobs: list[ScoreJob], why: ScoreFailure) -> None:
        """Items the verifier judged unscorable for good (each alone: an invalid response, a
        math-verify timeout on every try); an outage never lands here by default, it is waited
        for — only with a finite `reward.verifier_max_retries` does a call give up."""
        self.metrics.verifier_errors.labels("gave_up").inc(len(jobs))
        reason = (
            DropReason.VERIFIER_ERROR if why is ScoreFailure.VERIFIER_UNAVAILABLE else DropReason.UNSCORABLE
        )
        for job in jobs:
            task = job.ctx[0]
            if task.kind is Kind.EVAL:
                if task.future is not None and not task.future.done():
                    task.future.set_exception(RuntimeError(f"{reason}: {why}"))
                continue
            self._run(self.core.fail(task, reason, str(why)))

    # ------------------------------------------------------------------ outcomes
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
        """One round of the finisher (the only writer of outcomes): write the core's batch in one
        Redis round trip (outcome, counters and group entry atomically per prompt), give the
        answers back. A failed write leaves the batch with the core, which hands it out again."""
        if self.core.fenced:
            return
        batch, commands = self.core.next_finish_batch(self.store.finish_call)
        self._run(commands)
        if not batch:
            self._wake_admission.set()  # a plan may have freed room (fifo aborts)
            return
        async with self.outcome_lock:  # status() never sees Redis and memory disagree
            results = await self._r(lambda: self.store.finish_many([item for _, item in batch]))
            fenced, commands = self.core.finish_applied(batch, results)
        if fenced:
            self._on_fenced("finish")
            return
        if self.core.counts.early_stops != self._flushed["early_stops"]:
            self._spawn(self.flush_counters())
        self._run(commands)
        self._update_gauges()
        self._wake_admission.set()

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
                "early_stops": self.core.counts.early_stops,
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
            if self.core.fenced:
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
        if self.core.credits_read(int(c[0] or 0), int(c[1] or 0)):
            self._wake_admission.set()  # the trainer credited dropped groups back: room again
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
        m.valid_credited.set(self.core.credited)
        m.valid_produced.set(self.core.produced)
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
