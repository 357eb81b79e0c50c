"""The rollout core: the scheduler's decisions and the run state they need, without I/O.

`RolloutCore` takes events — prompts claimed, a response finished, scores recorded, outcomes
written, weights published, credits read, the run fenced or rolled back — and answers with
commands (`Dispatch`, `Redispatch`, `Abort`, `ScoreResponse`) and with the batches the driver must write
(`scores_to_record`, `next_finish_batch`). It never awaits, never touches Redis, gRPC or a clock;
`asyncdapo.services.scheduler.rollout.Rollout` drives it with asyncio, Redis and the gateways, and the
simulator (`asyncdapo simulate`) drives the same object on a virtual clock.

This module is the core's public entry. It holds admission, responses, scores and run control;
the outcome half — the commit plan, the finish batch and how the store's answers are applied —
is `core_outcomes.CoreOutcomes`, a base of `RolloutCore`; the commands, phases, observer and
counts are in `core_commands`, and every one of those names is importable from here.

Flow of one prompt attempt:
  claimed → `PromptTask` with n `Request`s (pdsr: the probe first) → Dispatch → each finished
  response → ScoreResponse → the verdict's score (`RunConfig.reward_of`) + overlong penalty = reward →
  record (one batch per verifier batch) →
  the response completing the group hands the task on: filtered, or ready in the commit ledger →
  the finish batch (commit the ready ones in ledger order, requeue beyond the bound, abort what the
  plan cuts) → outcomes applied.

Invariants (each checked by tests/unit/test_scheduler_core.py):
- every admitted attempt gets exactly one outcome: it enters `tasks` when admitted and leaves only
  when a written outcome for it is applied (`finish_applied`), or when the run is fenced or rolled
  back (then Redis, not this process, owns its outcome);
- an attempt is queued for an outcome at most once (`closed`), and a finish batch is replaced only
  after it was applied (`unwritten`), so a failed write is resent as is;
- at most `bound` valid groups count toward the bound (`valid_produced`, checked again by the
  store's FINISH);
- a cancelled task's late responses are never scored.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace

from asyncdapo.contracts.config import FilterMetric, LongTailPolicy, RolloutMode, RunConfig
from asyncdapo.contracts.prompts import PromptRecord, PromptRecordError
from asyncdapo.contracts.v1 import common_pb2
from asyncdapo.services.scheduler.claim_records import Claim

# the core's vocabulary, re-exported: drivers and tests import every name from this module
from asyncdapo.services.scheduler.core_commands import (
    Abort,
    Command,
    CoreObserver,
    Dispatch,
    NullObserver,
    Phase,
    Reason,
    Redispatch,
    RunCounts,
    ScoreResponse,
)
from asyncdapo.services.scheduler.core_outcomes import CoreOutcomes
from asyncdapo.services.scheduler.group_records import GroupProgress, RecordStatus, ResponseScore, is_valid
from asyncdapo.services.scheduler.outcome_records import DropReason, FinishItem, Outcome, RequeueReason
from asyncdapo.services.scheduler.policy.admission import AdmissionPolicy, AdmissionState, make_policy
from asyncdapo.services.scheduler.policy.long_tail import (
    FAST,
    HEAVY,
    LongTailAction,
    ProbeWindow,
    capped,
    route,
)
from asyncdapo.services.scheduler.tasks import (
    Kind,
    LengthStats,
    PromptTask,
    Request,
    ResponseView,
    Score,
    TaskKey,
    build_group,
    version_range,
)

__all__ = [
    "Abort",
    "Command",
    "CoreObserver",
    "Dispatch",
    "NullObserver",
    "Phase",
    "Reason",
    "Redispatch",
    "RolloutCore",
    "RunCounts",
    "ScoreResponse",
]

log = logging.getLogger(__name__)


def _encode_group(run: str, task: PromptTask) -> bytes:
    return build_group(run, task).SerializeToString()


class RolloutCore(CoreOutcomes):
    """Admission, dispatch, responses and scores, run control; the outcome half (commit plan,
    finish batch, applying the store's answers) is `CoreOutcomes` (core_outcomes.py)."""

    def __init__(
        self,
        cfg: RunConfig,
        observer: CoreObserver | None = None,
        pool_exists: Callable[[str], bool] = lambda label: False,
        policy: AdmissionPolicy | None = None,
        encode_group: Callable[[str, PromptTask], bytes] | None = None,
    ) -> None:
        self.cfg = cfg
        # (verdict, response length) -> (score, overlong penalty): RunConfig's method is Python
        # reading nested pydantic fields, ~3 % of a simulated run when called per response
        self._reward_of: dict[tuple[bool, int], tuple[float, float]] = {}
        # the stream entry of a committed group; the simulator, whose responses carry lengths and
        # no tokens, passes its own (it trains from its own records, not from the bytes)
        self.encode_group = encode_group or _encode_group
        self.observer: CoreObserver = observer or NullObserver()
        self.pool_exists = pool_exists  # does some gateway carry this pool label (pdsr)
        ro = cfg.rollout
        self.sync = ro.mode is RolloutMode.SYNC
        self.policy = policy or make_policy(cfg)
        self.ledger = self._new_ledger()
        self.pdsr = ro.long_tail.policy is LongTailPolicy.PDSR
        self.probes = ProbeWindow()
        self.phase = Phase.IDLE
        self.stop_reason: RequeueReason = RequeueReason.STOPPED
        self.version = 0
        self.uri = ""
        self.bound = cfg.valid_group_bound(0)
        # valid groups XADDed and groups the trainer credited back (dropped): both only grow, and
        # the bound applies to their difference (`valid_produced`)
        self.produced = 0
        self.credited = 0
        self.admitted_seen = 0  # the highest `counters.admitted` a claim returned (rollback check)
        self.fenced = False  # another scheduler owns the run: this one decides nothing more
        self.failure = ""  # why the run stopped by itself (sync: max_num_gen_batches), "" if it did not
        self.tasks: dict[TaskKey, PromptTask] = {}  # train attempts without an outcome
        self.counts = RunCounts()
        self._to_finish: list[tuple[PromptTask, Outcome, Reason | None]] = []
        # a finish batch handed out and not yet applied: handed out again until it is
        self.unwritten: list[tuple[PromptTask, FinishItem]] = []
        # attempts with a RECORD unanswered (`PromptTask.recording`): their outcomes and commits
        # wait for the answer (`next_finish_batch`)
        self.recording: set[PromptTask] = set()
        # something for the finisher since its last batch (an outcome queued, a group judged)
        self.wants_finish = False

    # ------------------------------------------------------------------ queries
    @property
    def lengths(self) -> LengthStats:
        return self.counts.lengths

    def admission_state(self) -> AdmissionState:
        c = self.counts
        return AdmissionState(
            valid_produced=self.valid_produced,
            bound=self.bound,
            in_flight_prompts=len(self.tasks),
            max_in_flight=self.cfg.rollout.max_concurrent_prompts,
            finished_groups=c.finished_groups,
            valid_groups=c.valid_groups,
            batch_admitted=c.batch_admitted,
            ready_valid=self.ledger.ready,
        )

    def admissible(self, limit: int | None = None) -> int:
        """How many prompts the policy admits right now (at most `limit`)."""
        if self.phase != Phase.ROLLING or self.fenced:
            return 0
        s = self.admission_state()
        k = 0
        cap = s.max_in_flight if limit is None else min(limit, s.max_in_flight)
        while k < cap:
            d = self.policy.decide(
                replace(s, in_flight_prompts=s.in_flight_prompts + k, batch_admitted=s.batch_admitted + k)
            )
            if not d.ok:
                break
            k += 1
        return k

    def sampling(self, validation: bool = False) -> common_pb2.SamplingParams:
        """Sampling of training rollouts, or of validation (rollout.val_temperature / val_top_p /
        val_top_k, verl's val_kwargs)."""
        ro = self.cfg.rollout
        return common_pb2.SamplingParams(
            max_tokens=self.cfg.data.max_response_length,
            temperature=ro.val_temperature if validation else ro.temperature,
            top_p=ro.val_top_p if validation else ro.top_p,
            top_k=ro.val_top_k if validation else ro.top_k,
        )

    # ------------------------------------------------------------------ run control
    def start(self) -> None:
        if self.fenced:
            return
        if self.phase in (Phase.IDLE, Phase.STOPPED, Phase.STOPPING):
            self.phase = Phase.ROLLING if self.valid_produced < self.bound else Phase.BOUND

    def stop(self, abort_in_flight: bool, reason: RequeueReason = RequeueReason.STOPPED) -> list[Command]:
        if self.phase in (Phase.IDLE, Phase.STOPPED):
            self.phase = Phase.STOPPED
            return []
        self.phase = Phase.STOPPING
        self.stop_reason = reason
        out: list[Command] = []
        if abort_in_flight:
            out = self.cancel([t for t in self.tasks.values() if not t.closed], Outcome.REQUEUED, reason)
        self._maybe_stopped()
        return out

    def set_version(self, version: int, uri: str | None = None) -> None:
        self.version = version
        if uri is not None:
            self.uri = uri
        self.bound = self.cfg.valid_group_bound(version)

    def weights_published(self, version: int, uri: str) -> None:
        """The gateways serve `version`: raise the bound, resume rolling out."""
        self.set_version(version, uri)
        self.counts.gen_batches = 0  # a new step
        self._reopen_if_room()

    def credits_read(self, produced: int, credited: int) -> bool:
        """The counters as Redis has them now (both only grow); True when there is room again."""
        self.produced = max(self.produced, produced)
        self.credited = max(self.credited, credited)
        return self._reopen_if_room()

    def _reopen_if_room(self) -> bool:
        if self.phase == Phase.BOUND and self.valid_produced < self.bound:
            self.phase = Phase.ROLLING
            return True
        return False

    def reset_counts(self, produced: int, credited: int, admitted: int) -> bool:
        """Redis' counts after an outage. Returns True when Redis lost writes we saw (a rollback):
        the caller then drops what it has in flight (`drop_in_memory`)."""
        rolled_back = admitted < self.admitted_seen
        self.produced, self.credited, self.admitted_seen = produced, credited, admitted
        return rolled_back

    def drop_in_memory(self) -> list[Command]:
        """Forget every train task without recording an outcome (Redis owns them now: a successor
        requeued them, or a rollback lost their claims); abort what they run."""
        tasks = list(self.tasks.values())
        for t in tasks:
            t.cancelled = True
            t.closed = True
        self.tasks.clear()
        self.probes.forget_running()
        self._to_finish.clear()
        self.unwritten.clear()
        self.recording.clear()
        self.ledger = self._new_ledger()
        self.counts.batch_admitted = 0
        if self.phase == Phase.BOUND:
            self.phase = Phase.ROLLING
        return [Abort(tasks)] if tasks else []

    def fence(self) -> list[Command]:
        """A successor took the run over: stop for good, write nothing more."""
        if self.fenced:
            return []
        self.fenced = True
        out = self.drop_in_memory()
        self.phase = Phase.STOPPED
        return out

    # ------------------------------------------------------------------ admission
    def claimed(
        self, claims: Sequence[Claim], records: Sequence[PromptRecord | PromptRecordError]
    ) -> list[Command]:
        """Claimed prompts become tasks: their first requests to dispatch, or, when the bound was
        reached (or the run stopped) while they were being claimed, at once requeued."""
        reqs: list[Request] = []
        for claim, rec in zip(claims, records, strict=True):
            reqs += self._admit(claim, rec)
        if self.phase != Phase.ROLLING:
            late = list({r.task.key: r.task for r in reqs}.values())
            why = self.stop_reason if self.phase == Phase.STOPPING else RequeueReason.EARLY_STOP
            return self.cancel(late, Outcome.REQUEUED, why)
        return [Dispatch(reqs)] if reqs else []

    def _admit(self, claim: Claim, rec: PromptRecord | PromptRecordError) -> list[Request]:
        ro = self.cfg.rollout
        ok = isinstance(rec, PromptRecord)
        task = PromptTask(
            kind=Kind.TRAIN,
            pid=claim.pid,
            attempt=claim.attempt,
            seq=self.counts.seq,
            n=ro.n,
            prompt_token_ids=rec.prompt_token_ids if isinstance(rec, PromptRecord) else [],
            ground_truth=rec.ground_truth if isinstance(rec, PromptRecord) else "",
            data_source=rec.data_source if isinstance(rec, PromptRecord) else "",
            sampling=self.sampling(),
            version_admitted=self.version,
        )
        self.counts.seq += 1
        self.tasks[task.key] = task
        if self.sync and self.counts.batch_admitted == 0:
            self.counts.gen_batches += 1  # a new generation batch starts
        self.counts.batch_admitted += 1
        if not ok or not task.ground_truth:
            log.warning("dropping prompt %s: %s", claim.pid, rec if not ok else "empty ground_truth")
            self._queue_outcome(task, Outcome.DROPPED, DropReason.BAD_PROMPT)
            return []
        if not task.prompt_token_ids or len(task.prompt_token_ids) > self.cfg.data.max_prompt_length:
            self._queue_outcome(task, Outcome.DROPPED, DropReason.PROMPT_TOO_LONG)
            return []
        self.ledger.admit(task.key)
        reqs = task.make_requests()
        if self.pdsr:
            # every response starts at once on the fast pool, capped once the window knows L_cut
            cap = self._fast_cap()
            for r in reqs:
                r.pool, r.max_tokens = self._pool(FAST), cap
        return reqs

    def _fast_cap(self) -> int:
        """max_tokens on the fast pool: cap_factor · L_cut (0: no cap yet, or not below the run's)."""
        lt, full = self.cfg.rollout.long_tail, self.cfg.data.max_response_length
        r = route(0, self.probes.l_cut(lt.offload_fraction), lt.cap_factor, full)
        return r.max_tokens if r.max_tokens < full else 0

    def _pool(self, label: str) -> str:
        """`label` when some gateway carries it, else "" (any gateway): a missing pool never stalls."""
        return label if self.pool_exists(label) else ""

    # ------------------------------------------------------------------ responses and scores
    def response(self, req: Request, gateway: str, resp: ResponseView) -> list[Command]:
        """A finished (stop/length) response of a live request, train or eval, from the gateway at
        address `gateway`: score it — unless pdsr continues a train response on the heavy pool."""
        task = req.task
        out: list[Command] = []
        if self.pdsr and task.kind is Kind.TRAIN:
            more, final = self._long_tail(req, resp)
            out += more
            if not final:
                return out
        task.responses[req.idx] = resp
        task.response_gateway[req.idx] = gateway
        out.append(ScoreResponse(req.rid, resp.token_ids, task.ground_truth, task, req.idx))
        return out

    def _long_tail(self, req: Request, resp: ResponseView) -> tuple[list[Command], bool]:
        """pdsr (cap and migrate): a fast-pool response that reached its cap is not final — it
        continues on the heavy pool from its partial tokens, uncapped; every final response's
        length feeds the window that sets L_cut (a continuing one: as "≥ its partial tokens" until it
        ends). Returns (commands, final)."""
        full = self.cfg.data.max_response_length
        length = len(resp.token_ids)
        if req.max_tokens and capped(length, req.max_tokens, full):
            self.observer.long_tail(LongTailAction.CAP_CONTINUE, length)
            self.counts.capped_responses += 1
            self.counts.continued_tokens += length
            if not req.task.routed:
                req.task.routed = True  # this group has a response on the heavy pool
                self.counts.capped_groups += 1
                self.observer.long_tail(LongTailAction.CAP_GROUP)
            req.continuation = resp
            req.pool = self._pool(HEAVY)
            req.max_tokens = 0
            req.task.live[req.idx] = req
            self.probes.continuing(req, length)  # ≥ length while it runs on (censored)
            return [Redispatch(req)], False
        self.probes.add(length, req)
        self.counts.long_tail_responses += 1
        self.observer.long_tail(LongTailAction.FINAL, length)
        return [], True

    def aborted(self, req: Request, tokens: int) -> None:
        """The abort reply of a cancelled task's request: `tokens` generated when it stopped. pdsr:
        a first-dispatch response (the cancel could only say ≥ 0) enters the window as ≥ tokens."""
        if self.pdsr and req.task.kind is Kind.TRAIN and req.continuation is None:
            self.probes.add_censored(tokens, req)

    def scores_to_record(self, scored: Sequence[tuple[PromptTask, int, float, str]]) -> list[ResponseScore]:
        """(task, idx, acc, pred) of train responses the verifier judged → what to record: the
        score of the verdict (reward.correct_reward / incorrect_reward) and the reward, score +
        overlong penalty (`RunConfig.reward_of`). Responses of tasks closed meanwhile are left out.
        Each one left in is `recording` until `recorded` answers it: its task's outcome waits for
        that (`next_finish_batch`)."""
        by = self.cfg.reward.filter_metric
        out: list[ResponseScore] = []
        for task, idx, acc, pred in scored:
            if task.closed:
                self._record_answered(task, idx)  # a batch delivered again: its first RECORD raised
                continue
            task.recording.add(idx)
            self.recording.add(task)
            resp = task.responses[idx]
            assert resp is not None, "a scored response is stored"
            length = len(resp.token_ids)
            sc = task.scores[idx] = self.score_of(acc, pred, length)
            vmin, vmax = version_range(resp, self.version)
            metric = acc if by is FilterMetric.ACC else sc.score if by is FilterMetric.SCORE else sc.reward
            out.append(ResponseScore(task.pid, task.attempt, idx, metric, sc.reward, vmin, vmax, length))
        return out

    def eval_scored(self, task: PromptTask, idx: int, acc: float, pred: str) -> bool:
        """The verifier's verdict on response `idx` of an evaluation task → its `Score` (`score_of`,
        as a train response's). True once every response of the task is scored: the driver then
        answers the evaluation."""
        resp = task.responses[idx]
        assert resp is not None, "a scored response is stored"
        task.scores[idx] = self.score_of(acc, pred, len(resp.token_ids))
        return all(s is not None for s in task.scores)

    def score_of(self, acc: float, pred: str, length: int) -> Score:
        """The verifier's verdict on a response of `length` tokens → its `Score`: the score
        `RunConfig.reward_of` gives the verdict and the reward, score + overlong penalty — the one
        place the reward is formed, for train (`scores_to_record`) and eval (`eval_scored`)."""
        key = (acc > 0.0, length)
        shaped = self._reward_of.get(key)
        if shaped is None:
            shaped = self._reward_of[key] = self.cfg.reward_of(key[0], length)
        score, pen = shaped
        return Score(score, acc, pred, score + pen, pen)

    def recorded(
        self, owners: Sequence[PromptTask], scores: Sequence[ResponseScore], progress: Sequence[GroupProgress]
    ) -> bool:
        """The store counted these responses. Returns False when it refused them (fenced: the
        caller then calls `fence`). Memory counts each response once, as the store does — a `dup`
        whose first answer never arrived included."""
        counted = tokens = 0
        for task, sc, p in zip(owners, scores, progress, strict=True):
            if p.status is RecordStatus.FENCED:
                return False
            self._record_answered(task, sc.idx)
            if p.status is not RecordStatus.STALE and sc.idx not in task.recorded:
                task.recorded.add(sc.idx)
                counted += 1
                tokens += sc.length
            if p.complete and not task.group_complete and not task.closed:
                task.group_complete = True
                task.progress = p
                self._group_complete(task, p)
        self.counts.lengths.completed += counted
        self.counts.lengths.completed_tokens += tokens
        self.observer.completions(counted, tokens)
        return True

    def _record_answered(self, task: PromptTask, idx: int) -> None:
        task.recording.discard(idx)
        if not task.recording:
            self.recording.discard(task)
            if task.closed or task.group_complete:
                self.wants_finish = True  # its outcome or its commit may have waited for this answer

    def _group_complete(self, task: PromptTask, progress: GroupProgress) -> None:
        r = self.cfg.reward
        valid = is_valid(progress.metric_std, r.filter_eps) if r.filter_groups else True
        self.counts.finished_groups += 1
        if valid:
            self.counts.valid_groups += 1
            self.ledger.set_ready(task.key)
            self.wants_finish = True
        else:
            self._queue_outcome(task, Outcome.FILTERED)

    # ------------------------------------------------------------------ failures and cancels
    def fail(self, task: PromptTask, reason: DropReason, detail: str) -> list[Command]:
        """A train task cannot complete (a request failed everywhere, a response unscorable)."""
        if task.closed or task.kind is not Kind.TRAIN:
            return []
        log.warning("dropping prompt %s attempt %d: %s (%s)", task.pid, task.attempt, reason, detail)
        return self.cancel([task], Outcome.DROPPED, reason)
