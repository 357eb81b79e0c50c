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
- housekeeping (`Housekeeper`, housekeeping.py): lease (or learn that we were fenced), the state
  re-read after a Redis outage, the trainer's credits, counters, reconciliation of our claims;
  weight updates and re-sync (`WeightPublisher`, weight_publisher.py); GetRun (`RunStatusReader`).
  Each owns its own state and sees this driver only through a small Protocol.

Concurrency model: one asyncio loop; every core call is synchronous, so the core's state has a
single writer at any time. Redis calls wait through outages (`runtime.redis_outage.RedisWaiter`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from asyncdapo.contracts import redis_keys as rk
from asyncdapo.contracts.config import PauseMode, RunConfig
from asyncdapo.contracts.redis_keys import RunKeys
from asyncdapo.contracts.v1 import common_pb2, gateway_pb2, scheduler_pb2
from asyncdapo.runtime.backoff import Backoff, Jitter
from asyncdapo.runtime.redis_conn import is_unavailable
from asyncdapo.runtime.redis_outage import RedisWaiter
from asyncdapo.services.scheduler.claim_records import Fenced
from asyncdapo.services.scheduler.core import (
    Abort,
    Command,
    Dispatch,
    Phase,
    Redispatch,
    RolloutCore,
    ScoreResponse,
)
from asyncdapo.services.scheduler.dispatcher import FINISH_ABORT, Dispatcher
from asyncdapo.services.scheduler.eval_waiters import EvalWaiters
from asyncdapo.services.scheduler.gateway_pool import Gateway, GatewayPool
from asyncdapo.services.scheduler.group_state import GroupStore, RoundTrips, ScriptRunner
from asyncdapo.services.scheduler.housekeeping import Housekeeper
from asyncdapo.services.scheduler.metrics import MetricsObserver, SchedulerMetrics
from asyncdapo.services.scheduler.outcome_records import DropReason, Outcome, RequeueReason
from asyncdapo.services.scheduler.policy.dispatch import DispatchPolicy
from asyncdapo.services.scheduler.queue import PromptQueue
from asyncdapo.services.scheduler.response_log import LoggedResponse, ResponseEvent, ResponseLog
from asyncdapo.services.scheduler.run_status import RunStatusReader
from asyncdapo.services.scheduler.score_batcher import (
    BatcherConfig,
    ScoreBatcher,
    ScoreFailure,
    ScoreJob,
    Scorer,
)
from asyncdapo.services.scheduler.tasks import Kind, LengthStats, PromptTask, Request
from asyncdapo.services.scheduler.weight_publisher import WeightPublisher

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = ["Phase", "Rollout"]

log = logging.getLogger(__name__)

# the wait between Redis attempts while Redis is away: 50 ms, doubled, at most 2 s, each wait drawn
# from [d/2, d] so that the loops waiting together do not retry in step
SCHEDULER_REDIS_BACKOFF = Backoff(0.05, 2.0, jitter=Jitter.EQUAL)
QUEUE_POLL_MAX_S = 0.25  # the admission's poll, doubled from `queue_poll_s` while the queue stays empty


class Rollout:
    def __init__(
        self,
        cfg: RunConfig,
        redis: Redis,
        pool: GatewayPool,
        scorer: Scorer,
        metrics: SchedulerMetrics | None = None,
        owner: str | None = None,
        claim_chunk: int = 64,
        queue_poll_s: float = 0.05,
        reconcile_every_s: float = 5.0,
        response_log: ResponseLog | None = None,
    ) -> None:
        self.cfg = cfg
        self.redis = redis
        self.pool = pool
        self.metrics = metrics or SchedulerMetrics()
        self.keys = RunKeys(cfg.name)
        self.rtt = RoundTrips()
        self.redis_link = RedisWaiter(SCHEDULER_REDIS_BACKOFF)
        self.scripts = ScriptRunner(redis, self.rtt)
        self.store = GroupStore(self.scripts, self.keys, cfg.data.train_batch_size, cfg.staleness_window)
        self.queue = PromptQueue(redis, self.keys, self.scripts, self.store, self.rtt, owner=owner)
        self.response_log = response_log
        self.claim_chunk = claim_chunk
        self.queue_poll_s = queue_poll_s
        self.core = RolloutCore(cfg, MetricsObserver(self.metrics), pool_exists=self._pool_exists)
        ro = cfg.rollout
        self.dispatcher = Dispatcher(
            pool,
            DispatchPolicy(max_in_flight=ro.max_concurrent_per_gateway),
            self.metrics,
            on_response=self._on_response,
            on_give_up=self._on_give_up,
            on_aborted=lambda req, n: self.core.aborted(req, n),
            on_cut=self._on_cut if response_log is not None else None,
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
        self.weights = WeightPublisher(self, pool, ro, self.metrics, redis, self.keys, self._r)
        pool.on_down = self.dispatcher.cancel_calls
        pool.on_up = self._on_gateway_up
        pool.on_load = self._on_gateway_load

        self._wake_admission = asyncio.Event()
        self._wake_finisher = asyncio.Event()
        self._bg: list[asyncio.Task[Any]] = []
        self._spawned: set[asyncio.Task[Any]] = set()
        self.outcome_lock = asyncio.Lock()
        self.health_listeners: list[Callable[[bool], None]] = []
        self.status_reader = RunStatusReader(
            cfg,
            self.core,
            redis,
            self.keys,
            self.outcome_lock,
            self.redis_link,
            self.rtt,
            lambda: self.queue.epoch,
        )
        self.housekeeper = Housekeeper(
            self,
            self.core,
            redis,
            self.keys,
            self.queue,
            self.scripts,
            self.metrics,
            self.outcome_lock,
            self._r,
            reconcile_every_s,
        )
        self._rtt_reported = 0
        self._claiming = False
        self.evals = EvalWaiters()  # what the callers of `submit_eval` await
        self.redis_link.on_change(self._on_redis_link)

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

    def sampling(self, validation: bool = False) -> common_pb2.SamplingParams:
        return self.core.sampling(validation)

    def admissible(self, limit: int | None = None) -> int:
        return self.core.admissible(limit)

    def _pool_exists(self, label: str) -> bool:
        return any(g.pool == label for g in self.pool.members)

    def _r(self, fn: Callable[[], Awaitable[Any]]) -> Awaitable[Any]:
        """A Redis operation that waits through an outage (and reports it through `redis_link`)."""
        return self.redis_link.acall(lambda _attempt: fn(), "a scheduler Redis operation")

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
        await self.housekeeper.read_state()
        recovered = await self._r(self.queue.recover)
        if recovered:
            log.info("epoch %d: requeued %d prompts claimed by a replaced scheduler", epoch, len(recovered))
            self.metrics.outcomes.labels(Outcome.REQUEUED, RequeueReason.SCHEDULER_RESTART).inc(
                len(recovered)
            )
        self._bg = [
            asyncio.create_task(self._admission_loop(), name="admission"),
            asyncio.create_task(self._finisher_loop(), name="finisher"),
            asyncio.create_task(self.housekeeper.loop(), name="housekeeping"),
            asyncio.create_task(self.weights.sync_loop(), name="weight-sync"),
        ]
        self._update_gauges()

    def set_version(self, version: int, uri: str | None = None) -> None:
        self.core.set_version(version, uri)
        self.store.version = version  # FINISH's staleness rule never judges older than this
        # a gateway that missed a weight update must not serve this run until it caught up
        self.dispatcher.set_min_weight_version(version if self.core.uri else 0)
        self.metrics.policy_version.set(version)
        self.metrics.valid_bound.set(self.core.bound)

    def on_fenced(self, where: str) -> None:
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
        self.metrics.redis_full.set(1 if self.redis_link.full else 0)
        if up:
            self.housekeeper.redis_came_back()
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
                await self.housekeeper.flush_counters()
                await self.queue.release_lease()
        except Exception as err:
            if not (isinstance(err, TimeoutError) or is_unavailable(err)):
                raise
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
        self, version: int, uri: str, mode: PauseMode | None = None, trainer_epoch: int = 0
    ) -> scheduler_pb2.PublishWeightsResponse:
        return await self.weights.publish(version, uri, mode, trainer_epoch)

    def weights_published(self, version: int, uri: str) -> None:
        """The gateways were told: raise the bound and resume rolling out."""
        self.set_version(version, uri)
        self.core.weights_published(version, uri)
        self._wake_admission.set()
        self.dispatcher.pump()

    def gateways_changed(self) -> None:
        self.dispatcher.pump()

    def wake_sync(self) -> None:
        """Look for gateways behind the current weights now (they re-sync in the background)."""
        self.weights.wake()

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
        idle = Backoff(self.queue_poll_s, QUEUE_POLL_MAX_S).delays()
        poll = idle.next()
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(poll):  # not wait_for: it can swallow a cancellation (3.11)
                    await self._wake_admission.wait()
            self._wake_admission.clear()
            try:
                got = await self._admit_some()
            except Fenced as err:
                self.on_fenced(str(err))
                continue
            except Exception:  # a bug must not end admission for good: say so and go on
                log.exception("admission round failed; retrying")
                await asyncio.sleep(0.5)
                continue
            if got is None:
                continue
            if got:
                idle.reset()
            poll = idle.next()  # the queue was empty: poll less often, up to QUEUE_POLL_MAX_S

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
    def submit_eval(self, tasks: Sequence[PromptTask]) -> list[asyncio.Future[PromptTask]]:
        """Dispatch evaluation tasks (`Kind.EVAL`); futures as `EvalWaiters.expect` (eval_waiters.py)."""
        futures = self.evals.expect(tasks)
        self.dispatcher.submit([r for t in tasks for r in t.make_requests()])
        return futures

    def _on_response(self, req: Request, gw: Gateway, resp: gateway_pb2.GenerateResponse) -> None:
        self._run(self.core.response(req, gw.address, resp))  # train and eval: the core scores both

    def _on_cut(self, req: Request, resp: gateway_pb2.GenerateResponse) -> None:
        """A reply of a cancelled task's request (`Dispatcher.on_cut`): into the response log."""
        task = req.task
        if self.response_log is None or task.kind is not Kind.TRAIN:
            return
        event = ResponseEvent.ABORTED if resp.finish_reason == FINISH_ABORT else ResponseEvent.LATE
        self.response_log.cut(event, LoggedResponse.of(task, req.idx, len(resp.token_ids), resp))

    def _on_give_up(self, req: Request, detail: str, refused: bool = False) -> None:
        task = req.task
        if task.kind is Kind.EVAL:
            self.evals.gave_up(task, detail, refused)
            return
        self._run(self.core.fail(task, DropReason.GATEWAY_ERROR, detail))

    def _on_verifier_call(self, seconds: float, ok: bool) -> None:
        self.metrics.verifier_latency.observe(seconds)
        if not ok:
            self.metrics.verifier_errors.labels("call").inc()

    async def _on_scored(self, jobs: list[ScoreJob]) -> None:
        train: list[tuple[PromptTask, int, float, str]] = []
        owners: list[PromptTask] = []
        for job in jobs:
            task, idx = job.ctx
            res = job.result
            assert res is not None
            if task.kind is Kind.EVAL:
                if self.core.eval_scored(task, idx, res.acc, res.pred):
                    self.evals.resolve(task)
                continue
            train.append((task, idx, res.acc, res.pred))
        scores = self.core.scores_to_record(train)
        if not scores:
            return
        owners = [self.tasks[(s.pid, s.attempt)] for s in scores]
        # idempotent (response markers; the counters move inside the script): safe to retry
        progress = await self._r(lambda: self.store.record(scores))
        if not self.core.recorded(owners, scores, progress):
            self.on_fenced("record")
            return
        if self.response_log is not None:
            acc = {(t.pid, t.attempt, i): a for t, i, a, _ in train}
            self.response_log.judged(
                (LoggedResponse.of(t, s.idx, s.length, t.responses[s.idx]), acc[(s.pid, s.attempt, s.idx)])
                for s, t in zip(scores, owners, strict=True)
            )
        self._wake_finisher_if_needed()

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
                self.evals.resolve(task, f"{reason}: {why}")
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
            self.on_fenced("finish")
            return
        if self.core.counts.early_stops != self.housekeeper.flushed(rk.EARLY_STOPS):
            self._spawn(self.housekeeper.flush_counters())
        self._run(commands)
        self._update_gauges()
        self._wake_admission.set()

    async def status(self) -> scheduler_pb2.RunStatus:
        return await self.status_reader.read()

    async def reconcile(self) -> int:
        """Requeue claims of ours that no task holds (`Housekeeper.reconcile`)."""
        return await self.housekeeper.reconcile()

    # ------------------------------------------------------------------ what the housekeeper sees
    # (`housekeeping.HousekeptRun`; `set_version` and `on_fenced` above serve it too)
    @property
    def claiming(self) -> bool:
        return self._claiming

    def counters_now(self) -> dict[str, int]:
        d = self.dispatcher
        return {
            rk.ABORTED_TOKENS: d.aborted_tokens,
            rk.ABORTED_REQUESTS: d.aborted_requests,
            rk.EARLY_STOPS: self.core.counts.early_stops,
        }

    def run_commands(self, commands: Iterable[Command]) -> None:
        self._run(commands)

    def wake_admission(self) -> None:
        self._wake_admission.set()

    def update_gauges(self, per_gateway: bool) -> None:
        self._update_gauges()
        if per_gateway:
            self.metrics.set_in_flight_per_gateway((gw.address, gw.in_flight) for gw in self.pool.members)

    # ------------------------------------------------------------------ gauges
    def _update_gauges(self) -> None:
        m = self.metrics
        m.in_flight_prompts.set(len(self.tasks))
        m.valid_credited.set(self.core.credited)
        m.valid_produced.set(self.core.produced)
        m.redis_round_trips.inc(self.rtt.count - self._rtt_reported)
        self._rtt_reported = self.rtt.count

    def _spawn(self, coro: Awaitable[Any]) -> None:
        t = asyncio.ensure_future(coro)
        self._spawned.add(t)
        t.add_done_callback(self._spawned.discard)
