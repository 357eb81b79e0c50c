"""SIMULATOR: the scheduler's own rollout core driven on a virtual clock, against modelled engines,
a modelled verifier and a modelled trainer.

What runs for real (imported, never copied): `RolloutCore` (admission policy, claims to tasks, pdsr
cap-and-migrate routing, the commit ledger, early stop, requeue), the in-memory store with the Lua
scripts' semantics (`memstore`: claims, group statistics, FINISH with its bound and staleness
checks, the requeue at the queue head), and the dispatcher's queue (`dispatch_queue.DispatchQueue`:
head first, a prompt's requests in one `dispatch.pick` over the `eligible.EligibleIndex`'s
`GatewayView`s, stale requests dropped, re-dispatches and retries at the head, a request given up
after `max_tries`), placing requests through `transport.SimTransport`. What is modelled: the engines
(`engine.Engine`), the verifier (a pool of workers, a fixed cost per call and per item), the
trainer (step time from trained tokens, the checkpoint/snapshot, the weight fan-out with the
run's `weight_update_mode`) and the round trips to Redis (`ClusterProfile.redis_rtt_s`).

The driver does what `scheduler.rollout.Rollout` and `scheduler.dispatcher.Dispatcher` do with
asyncio and gRPC: an admission round claims what `core.admissible` allows, a finisher round writes
`core.next_finish_batch` and applies the store's answers, scored responses are recorded in
verifier-sized batches, every reply from a gateway (a response, an abort's answer) pumps the
dispatch queue. Each of those rounds is an event on the `VirtualClock`, one round trip after
whatever woke it. A response (`records.SimResponse`, a `tasks.ResponseView`) carries its length
(`range(n)` stands in for the token ids: `len` is all the core reads) and its version runs.
"""

from __future__ import annotations

import gc
import math
from collections import deque
from typing import Any

from asyncdapo.contracts.config import LongTailPolicy, PauseMode, RolloutMode, RunConfig
from asyncdapo.contracts.v1 import common_pb2
from asyncdapo.services.scheduler.core import Abort, Command, Dispatch, Redispatch, RolloutCore, ScoreResponse
from asyncdapo.services.scheduler.dispatch_queue import DispatchQueue, is_current
from asyncdapo.services.scheduler.eligible import EligibleIndex
from asyncdapo.services.scheduler.memstore import MemoryGroupStore, MemoryQueue, MemoryRun
from asyncdapo.services.scheduler.outcome_records import DropReason
from asyncdapo.services.scheduler.policy.dispatch import DispatchPolicy
from asyncdapo.services.scheduler.policy.long_tail import FAST, HEAVY
from asyncdapo.services.scheduler.tasks import PromptTask, Request
from asyncdapo.tools.simulate.clock import VirtualClock
from asyncdapo.tools.simulate.engine_model import DONE, Engine, Seq, seq_cost_table
from asyncdapo.tools.simulate.host_load import HostLoad
from asyncdapo.tools.simulate.profile import ClusterProfile, Placement
from asyncdapo.tools.simulate.prompt_feed import PromptFeed
from asyncdapo.tools.simulate.records import Counts, SimResponse, SimResult, StepRecord, TrainedGroup
from asyncdapo.tools.simulate.simulation_error import SimulationError
from asyncdapo.tools.simulate.transport import Gw, SimTransport
from asyncdapo.tools.simulate.verifier_model import VerifierModel
from asyncdapo.tools.simulate.workload import Attempt, Sampler

STOP, LENGTH, ABORT = (
    common_pb2.FINISH_REASON_STOP,
    common_pb2.FINISH_REASON_LENGTH,
    common_pb2.FINISH_REASON_ABORT,
)
CLAIM_CHUNK = 64  # Rollout's default claim_chunk
TRAIN_TICK_S = 0.005  # CPU profiles: how often the trainer's contended rate is re-read


class Simulation:
    """One run of `cfg` on `cluster` with `workload` until `versions` training steps are done."""

    def __init__(self, cfg: RunConfig, cluster: ClusterProfile, workload: Sampler, versions: int) -> None:
        ro = cfg.rollout
        check_supported(cfg, cluster)
        if cluster.host is not None and cluster.trainer.stream_chunks > 1:
            raise SimulationError(
                "a CPU host profile trains a version at once: trainer.stream_chunks must be 1"
            )
        if cluster.trainer.stream_chunks > cfg.data.train_batch_size:
            raise SimulationError(
                f"trainer.stream_chunks {cluster.trainer.stream_chunks} exceeds the batch of "
                f"{cfg.data.train_batch_size} groups"
            )
        self.cfg = cfg
        self.cluster = cluster
        self.workload = workload
        self.versions = versions
        self.B = cfg.data.train_batch_size
        self.s = cfg.staleness_window  # ceil(s): the version window; the bound is cfg.valid_group_bound
        self.n = ro.n
        self.cap = cfg.data.max_response_length
        self.clock = VirtualClock()
        # CPU profiles: other processes' runnable threads slow every thread of ours, round trips too
        others = cluster.host.others if cluster.host is not None else 1.0
        self.rtt = cluster.redis_rtt_s * others
        self.run = MemoryRun()
        self.store = MemoryGroupStore(self.run, self.B, self.s)
        self.queue = MemoryQueue(self.run, "sim", clock_ms=self.clock.ms)
        self.queue.store = self.store
        self.queue.take_over()
        self.counts = Counts()
        self.pdsr = ro.long_tail.policy is LongTailPolicy.PDSR
        # gateways: pdsr splits them into a fast and a heavy pool
        n_heavy = max(1, round(cluster.engines * cluster.heavy_fraction)) if self.pdsr else 0
        self.gws: list[Gw] = []
        seq_costs = seq_cost_table(cluster.engine)
        for i in range(cluster.engines):
            pool = (HEAVY if i < n_heavy else FAST) if self.pdsr else ""
            eng = Engine(self.clock, cluster.engine, self._on_finish, self._on_drained, f"gw{i}", seq_costs)
            self.gws.append(Gw(f"gw{i}", eng, pool))
        self.by_engine = {id(g.engine): g for g in self.gws}
        # CPU profiles: the host's cores shared by engines, control plane and trainer
        self.load = (
            HostLoad(cluster.host, self.clock, self._busy_engines) if cluster.host is not None else None
        )
        self._train_left = self._train_at = 0.0  # CPU profiles: its uncontended work left, and since when
        if self.load is not None:
            for g in self.gws:
                g.engine.stretch = self.load.engine_stretch
        self.labels = {g.pool for g in self.gws if g.pool}
        self.core = RolloutCore(
            cfg,
            observer=self.counts,
            pool_exists=self.labels.__contains__,
            encode_group=lambda run, task: b"",
        )
        self.policy = DispatchPolicy(max_in_flight=ro.max_concurrent_per_gateway)
        self.index = EligibleIndex(self.policy, seed=1)
        # the answers of each attempt in flight, by task (a task is its attempt: identity, no key tuple)
        self.attempts: dict[PromptTask, Attempt] = {}
        # the dispatcher's queue, placing through the simulated gateways; the transport's
        # latencies: a dispatched request's way to its engine, and the time a finished response
        # takes to reach the scheduler
        self.transport = SimTransport(
            self.clock,
            self.gws,
            self.index,
            self._natural,
            self.cap,
            cluster.dispatch_s,
            cluster.dispatch_per_request_s,
        )
        self.dispatch = DispatchQueue(self.index, self.transport)
        # id(request) -> where it runs and its natural length (the core never reads it)
        self._placed: dict[int, tuple[Gw, Seq, int]] = self.transport.placed
        self._transit = self.transport.transit  # id(seq) of the requests on their way
        self.reply_s = cluster.reply_s
        self.verifier = VerifierModel(
            self.clock,
            cluster.verifier,
            cfg.reward.verifier_batch_size,
            cfg.reward.verifier_concurrency,
            cluster.host.others if cluster.host is not None else 1.0,
            self._scored,
        )
        self.prompts = PromptFeed(workload, cfg.data)
        self.aborted_tokens = 0
        self._admit_pending = False
        self._finish_pending = False
        # trainer
        self.stream: deque[TrainedGroup] = deque()
        self.version = 0
        self.trainer_busy = False
        self.t_free = 0.0
        self.steps: list[StepRecord] = []
        self._sync_left = 0
        self._sync_t0 = 0.0
        self._step: dict[str, Any] = {}
        self._transfer_s = 0.0  # the weight update in progress: its bytes' transfer with engines paused
        self._chunk = (
            0  # the part of the version's batch the trainer takes next (TrainerProfile.stream_chunks)
        )
        self.credited = 0

    # ------------------------------------------------------------------ run
    def simulate(self, max_sim_s: float = 1e9) -> SimResult:
        self.core.start()
        self._kick_admission()
        # a run allocates millions of objects and leaves (next to) none in reference cycles: with
        # the collector on, its passes over the young objects found nothing and cost ~15 % of the
        # run (512 engines); whatever cycles there are, are collected once, at the end
        enabled = gc.isenabled()
        gc.disable()
        try:
            self.clock.run(lambda: self.version >= self.versions, max_time=max_sim_s)
        finally:
            if enabled:
                gc.enable()
            gc.collect(0)
        if self.version < self.versions:
            why = self.core.failure or (
                "the event queue ran dry" if not self.clock.pending() else "time limit"
            )
            raise SimulationError(f"stopped after {self.version} of {self.versions} steps: {why}")
        for g in self.gws:  # account the engines up to now
            g.engine._interrupt()
        engines = [g.engine for g in self.gws]
        return SimResult(
            steps=self.steps,
            counts=self.counts,
            sim_s=self.clock.now,
            engines=len(engines),
            busy_s=sum(e.busy_s for e in engines),
            decode_tokens=sum(e.decode_tokens for e in engines),
            prefill_tokens=sum(e.prefill_tokens for e in engines),
            aborted_tokens=self.aborted_tokens,
            preemptions=sum(e.preemptions for e in engines),
            events=self.clock.events,
        )

    # ------------------------------------------------------------------ commands
    def _do(self, commands: list[Command]) -> None:
        """Carry out what the core decided, as `Rollout._run` and the dispatcher do: each Dispatch
        and Redispatch pumps the queue."""
        dispatch = self.dispatch
        for c in commands:
            if isinstance(c, ScoreResponse):  # the common case first
                self.verifier.queue.append(c)
            elif isinstance(c, Dispatch):
                dispatch.submit(c.requests)
                dispatch.pump()
            elif isinstance(c, Redispatch):
                dispatch.resubmit(c.request)
                dispatch.pump()
            elif isinstance(c, Abort):
                for t in c.tasks:
                    self._abort_task(t)
                dispatch.pump()  # the abort replies freed their gateways (abort_s 0: at once)
        self.verifier.send_soon()

    def _abort_task(self, task: PromptTask) -> None:
        for req in list(task.live.values()):
            placed = self._placed.get(id(req))
            if placed is None or placed[1].state == DONE:  # gone, or finished with its reply in transit
                continue
            if not self.transport.in_transit(placed[1]) and self.cluster.abort_s > 0:
                # the abort travels to the engine, which steps the request until it arrives
                self.clock.after(self.cluster.abort_s, self._abort_arrives, req)
            else:
                self._abort_reply(req)
        # nothing reads a cancelled task's live requests again (the dispatcher skips them, late
        # finishes are dropped): without them the task and its requests form no reference cycle
        # and are freed as soon as the core lets go of the task
        task.live.clear()
        self.attempts.pop(task, None)

    def _abort_arrives(self, req: Request) -> None:
        """An abort reaches `req`'s engine after abort_s: its reply frees the gateway, and, as
        every reply to the dispatcher does, pumps the queue."""
        self._abort_reply(req)
        self.dispatch.pump()

    def _abort_reply(self, req: Request) -> None:
        """An abort reaches `req`'s engine (or catches it on its way there); a request that finished
        meanwhile is left to its reply, which drops it."""
        placed = self._placed.get(id(req))
        if placed is None or placed[1].state == DONE:
            return
        self.transport.release(req)
        g, seq, _ = placed
        if self.transport.recall(seq):  # aborted before it reached its engine
            seq.state = DONE
            self.aborted_tokens += seq.gen
        else:
            self.aborted_tokens += g.engine.abort(seq)
        self.core.aborted(req, seq.gen)  # the abort reply's length, as the dispatcher passes it

    # ------------------------------------------------------------------ dispatch
    def _attempt(self, task: PromptTask) -> Attempt:
        a = self.attempts.get(task)
        if a is None:
            a = self.attempts[task] = self.workload.attempt(
                _feed_index(task.pid, self.workload.dataset_size), task.attempt, task.n
            )
        return a

    def _natural(self, req: Request) -> int:
        """The length `req`'s response has when nothing cuts it (its workload sample)."""
        return self._attempt(req.task).lengths[req.idx]

    def _busy_engines(self) -> int:
        return sum(1 for g in self.gws if g.engine.running)

    def _on_finish(self, seq: Seq) -> None:
        if self.load is not None:
            self.load.cpu_work(self.load.host.completion_cpu_s)
        if self.reply_s:
            self.clock.after(self.reply_s, self._replied, seq)
        else:
            self._replied(seq)

    def _replied(self, seq: Seq) -> None:
        """The scheduler holds a finished response: the core takes it (unless it is stale), and the
        queue is pumped, as after every reply."""
        req: Request = seq.owner
        placed = self.transport.release(req)
        assert placed is not None, "a reply comes from the gateway its request was placed on"
        g, _, natural = placed
        task = req.task
        if is_current(req):
            reason = STOP if seq.gen >= natural else LENGTH
            del task.live[req.idx]
            self._do(self.core.response(req, g.address, SimResponse(seq.gen, seq.runs, reason)))
        elif task.cancelled:  # it finished while its abort was on the way: generated for nothing
            self.aborted_tokens += seq.gen
        self.dispatch.pump()

    def _on_drained(self, engine: Engine) -> None:
        g = self.by_engine[id(engine)]
        if self._step.get("mode") == "wait" and g.paused and not g.resuming:
            g.resuming = True
            self.clock.after(self._transfer_s + self.cluster.engine.reload_s, self._resume_one, g)

    # ------------------------------------------------------------------ verifier
    def _scored(self, jobs: list[ScoreResponse]) -> None:
        """A verifier call answered: the scores recorded as the scheduler records them."""
        scored = []
        cap = self.cap
        for j in jobs:
            task = j.task
            if task.closed:
                continue
            a = self._attempt(task)
            length = len(j.token_ids)
            right = a.right[j.idx] and length < cap and length >= a.lengths[j.idx]
            scored.append((task, j.idx, 1.0, "1") if right else (task, j.idx, 0.0, "0"))
        judged = self.core.counts.finished_groups
        if scored:
            scores = self.core.scores_to_record(scored)
            # one score per open task, in order (scores_to_record leaves out only closed ones)
            owners = [x[0] for x in scored]
            if not self.core.recorded(owners, scores, self.store.record(scores)):
                raise SimulationError("the store refused scores (fenced): nothing else owns a simulated run")
        if self.core.wants_finish:
            self._kick_finisher()
        if self.core.counts.finished_groups != judged:  # the running valid rate moved
            self._kick_admission()

    # ------------------------------------------------------------------ admission and finisher
    def _kick_admission(self) -> None:
        if not self._admit_pending:
            self._admit_pending = True
            self.clock.after(self.rtt, self._admit_round)

    def _feed(self, k: int) -> None:
        """The trainer's feed: keep the queue at least k + watermark deep."""
        want = k + self.cfg.data.prompt_queue_watermark - self.queue.depth()
        if want <= 0:
            return
        self.run.push(self.prompts.records(want))

    def _admit_round(self, _: Any = None) -> None:
        self._admit_pending = False
        k = self.core.admissible(CLAIM_CHUNK)
        if not k:
            return
        self._feed(k)
        batch = self.queue.claim(k, self.n)
        self.core.admitted_seen = max(self.core.admitted_seen, batch.admitted_total)
        if batch.claims:
            self._do(self.core.claimed(batch.claims, self.queue.load([c.pid for c in batch.claims])))
        self._kick_admission()
        if self.core.has_outcomes_to_write() or self.core.wants_finish:
            self._kick_finisher()

    def _kick_finisher(self) -> None:
        if not self._finish_pending:
            self._finish_pending = True
            self.clock.after(self.rtt, self._finish_round)

    def _finish_round(self, _: Any = None) -> None:
        self._finish_pending = False
        committed = False
        for _round in range(1000):
            batch, cmds = self.core.next_finish_batch(self.store.finish_call)
            self._do(cmds)
            if not batch:
                break
            results = self.store.finish_many([item for _, item in batch])
            for (task, _item), res in zip(batch, results, strict=True):
                self.attempts.pop(task, None)
                if res.label == "valid":
                    self._commit(task)
                    committed = True
            fenced, cmds = self.core.finish_applied(batch, results)
            if fenced:
                raise SimulationError("fenced: nothing else owns a simulated run")
            self._do(cmds)
        self._kick_admission()
        if committed:
            self._maybe_train()

    def _commit(self, task: PromptTask) -> None:
        progress = task.progress
        assert progress is not None, "a committed group is complete"
        lengths = [len(r.token_ids) for r in task.responses if r is not None]
        self.stream.append(
            TrainedGroup(
                _index(task.pid), task.attempt, progress.min_version, lengths, len(task.prompt_token_ids)
            )
        )

    # ------------------------------------------------------------------ trainer and weight sync
    def _maybe_train(self) -> None:
        if self.trainer_busy or self.version >= self.versions:
            return
        # groups too stale for this step are dropped and credited back (groups_reader)
        floor = self.version - self.s
        while self.stream and self.stream[0].min_version < floor:
            self.stream.popleft()
            self.credited += 1
            self.run.incr("valid_credited")
        if self.credited and self.core.credits_read(
            self.run.counters.get("valid_produced", 0), self.run.counters.get("valid_credited", 0)
        ):
            self._kick_admission()
        # the trainer takes the version's B groups in `stream_chunks` parts as they arrive (1: all at once)
        chunks = self.cluster.trainer.stream_chunks
        size = self.B * (self._chunk + 1) // chunks - self.B * self._chunk // chunks
        if len(self.stream) < size:
            return
        batch = [self.stream.popleft() for _ in range(size)]
        tokens = sum(sum(g.lengths) + g.prompt * len(g.lengths) for g in batch)
        resp_tokens = sum(sum(g.lengths) for g in batch)
        cl = self.cluster
        t = cl.trainer
        train_s = t.step_s(tokens, size * self.n) - t.base_s * (1.0 - 1.0 / chunks)
        last = self._chunk == chunks - 1
        if last:
            train_s += cl.step_end_s()
        self.trainer_busy = True
        lengths = [x for g in batch for x in g.lengths]
        if self._chunk == 0:
            self._step = {
                "t_free": self.t_free,
                "train_s": 0.0,
                "tokens": 0,
                "prompt_tokens": 0,
                "sequences": 0,
                "staleness": [],
                "attempts": [],
                "longest": 0,
            }
        st = self._step
        st["t_data"] = self.clock.now
        st["train_s"] += train_s
        st["tokens"] += resp_tokens
        st["prompt_tokens"] += tokens - resp_tokens
        st["sequences"] += len(lengths)
        st["lengths_mean"] = st["tokens"] / max(st["sequences"], 1)
        st["staleness"] += [self.version - g.min_version for g in batch]
        st["attempts"] += [g.attempt for g in batch]
        st["longest"] = max(st["longest"], max(lengths, default=0))
        if self.load is None:
            if last:
                self._chunk = 0
                self.clock.after(train_s, self._trained)
            else:
                self.clock.after(train_s, self._chunk_trained)
            return
        # the trainer computes on cores the engines may be stepping on: its rate, 1 / stretch, follows
        # the engines' state through the step (re-read every TRAIN_TICK_S of virtual time), where the
        # real engines and trainer slow each other for as long as they overlap
        self.load.training = True
        self._train_left = train_s  # uncontended seconds of training still to do
        self._train_tick()

    def _chunk_trained(self, _: Any = None) -> None:
        """A part of the version's batch is trained: the trainer takes the next as soon as it is there."""
        self._chunk += 1
        self.trainer_busy = False
        self._maybe_train()

    def _train_tick(self, rate: float | None = None) -> None:
        assert self.load is not None
        now = self.clock.now
        if rate is not None:
            self._train_left -= (now - self._train_at) * rate
        if self._train_left <= 1e-9:
            self._step["train_s"] = now - self._step["t_data"]
            self._trained()
            return
        rate = 1.0 / self.load.trainer_stretch()
        self._train_at = now
        self.clock.after(min(TRAIN_TICK_S, self._train_left / rate), self._train_tick, rate)

    def _trained(self, _: Any = None) -> None:
        if self.load is not None:
            self.load.training = False
        self._step["t_trained"] = self.clock.now
        self._sync_t0 = self.clock.now
        # the bytes' way to the engines: fetched while they generate (stream), or with them paused
        ws = self.cluster.weight_sync
        transfer = ws.transfer_s(len(self.gws))
        if ws.overlaps_generation and transfer > 0:
            self.clock.after(transfer, self._pause_all, 0.0)
        else:
            self._pause_all(transfer)

    def _pause_all(self, transfer_s: float) -> None:
        """Pause every gateway for the update; each resumes `pause_s + transfer_s + reload_s` later
        (`wait`: once drained, `transfer_s + reload_s` after)."""
        mode = self.cfg.rollout.weight_update_mode
        self._step["mode"] = mode.value
        self._sync_left = len(self.gws)
        self._transfer_s = transfer_s
        e = self.cluster.engine
        for g in self.gws:
            g.paused = True
            self.transport.changed(g)
            if mode is PauseMode.WAIT:
                g.engine.pause("wait")
                if not g.engine.running:
                    g.resuming = True
                    self.clock.after(e.pause_s + transfer_s + e.reload_s, self._resume_one, g)
                continue
            returned = g.engine.pause(mode.value)
            for seq in returned:  # pause abort: the partial responses continue elsewhere
                self._aborted_by_gateway(seq)
            g.resuming = True
            self.clock.after(e.pause_s + transfer_s + e.reload_s, self._resume_one, g)
        self.dispatch.pump()  # after the abort replies, as the dispatcher does (every gateway is paused)

    def _aborted_by_gateway(self, seq: Seq) -> None:
        """A weight update with pause abort stopped `seq`: the dispatcher retries it from its
        partial tokens at the head of the queue, or gives it up after `max_tries` dispatches
        (the core drops its group, as `Rollout` does for a request the dispatcher gave up)."""
        req: Request = seq.owner
        self.transport.release(req)
        if not is_current(req):
            return
        if not self.dispatch.retry(req, SimResponse(seq.gen, seq.runs, ABORT)):
            detail = f"request failed {req.tries} times (aborted_by_gateway)"
            self._do(self.core.fail(req.task, DropReason.GATEWAY_ERROR, detail))

    def _resume_one(self, g: Gw) -> None:
        new = self.version + 1
        g.engine.resume(new)
        g.version = new
        g.paused = g.resuming = False
        self._sync_left -= 1
        if self._sync_left:
            return
        # every gateway serves `new`: raise the bound (PublishWeights returns)
        self.version = new
        self.store.version = new
        st = self._step
        self.steps.append(
            StepRecord(
                version=new,
                t_free=st["t_free"],
                t_data=st["t_data"],
                t_trained=st["t_trained"],
                t_published=self.clock.now,
                train_s=st["train_s"],
                sync_s=self.clock.now - self._sync_t0,
                tokens=st["tokens"],
                lengths_mean=st["lengths_mean"],
                staleness=st["staleness"],
                attempts=st["attempts"],
                longest=st["longest"],
                prompt_tokens=st["prompt_tokens"],
            )
        )
        self.index.set_policy(DispatchPolicy(max_in_flight=self.policy.max_in_flight, min_weight_version=new))
        self.transport.refresh_all()
        if self.load is not None:
            self.load.cpu_work(self.load.host.version_cpu_s)
        self.core.weights_published(new, f"sim://v{new}")
        self.trainer_busy = False
        self.t_free = self.clock.now
        self.dispatch.pump()
        self._kick_admission()
        self._maybe_train()


def _index(pid: str) -> int:
    return int(pid.rsplit("-", 1)[1])


def _feed_index(pid: str, rows: int | None) -> int:
    """`e{epoch}-{row}` → epoch × rows + row (a workload without a dataset: the row alone, epoch 0)."""
    epoch, row = pid[1:].split("-", 1)
    return int(epoch) * rows + int(row) if rows else int(row)


def check_supported(cfg: RunConfig, cluster: ClusterProfile | None = None) -> None:
    if (
        cluster is not None
        and cluster.placement is Placement.COLOCATED
        and cfg.rollout.mode is not RolloutMode.SYNC
    ):
        raise SimulationError(
            f"cluster {cluster.name!r} is colocated (the trainer takes the engines' GPUs in turns): "
            "only sync mode runs there; give async modes a disaggregated cluster"
        )
    if cfg.rollout.mode is RolloutMode.SYNC and cfg.rollout.long_tail.policy is LongTailPolicy.PDSR:
        raise SimulationError("pdsr in sync mode is not a configuration the scheduler runs")
    if not math.isfinite(cfg.data.max_response_length):
        raise SimulationError("max_response_length must be finite")
