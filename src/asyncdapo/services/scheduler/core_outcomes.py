"""The rollout core's outcome half: which admitted attempt gets which outcome, in which batch the
driver writes it, and how the store's answers are mirrored in memory.

`CoreOutcomes` is a base of `asyncdapo.services.scheduler.core.RolloutCore` (import the core from there): the
two halves share one state — an outcome moves the same `tasks`, `ledger`, `phase` and counts that
admission and scoring move — so they are one object split over two files by responsibility, not two
objects that would have to mirror each other. The state is declared here (for the type checker)
and set in `RolloutCore.__init__`.

Flow: an attempt gets its outcome queued (`_queue_outcome`: filtered, dropped, requeued) or its
complete valid group waits ready in the commit ledger → `next_finish_batch` plans commits in ledger
order, requeues beyond the bound, aborts what the plan cuts, and hands out one batch → the driver
writes it → `finish_applied` mirrors the answers (`_apply`) and stops admitting once the bound is
reached. A batch is replaced only after it was applied (`unwritten`), so a failed write is resent
as is.
"""

from __future__ import annotations

import logging
from abc import abstractmethod
from collections.abc import Callable, Sequence

from asyncdapo.contracts.config import EarlyStopOrder, RunConfig
from asyncdapo.contracts.v1 import scheduler_pb2
from asyncdapo.services.scheduler.core_commands import Abort, Command, CoreObserver, Phase, Reason, RunCounts
from asyncdapo.services.scheduler.outcome_records import (
    DropReason,
    FinishItem,
    FinishResult,
    Outcome,
    RequeueReason,
)
from asyncdapo.services.scheduler.policy.commit_order import CommitLedger, Plan
from asyncdapo.services.scheduler.policy.long_tail import ProbeWindow
from asyncdapo.services.scheduler.tasks import Kind, PromptTask, TaskKey

log = logging.getLogger(__name__)


class CoreOutcomes:
    """The commit plan, the outcome batch and its application; see the module docstring."""

    # set by RolloutCore.__init__ (core.py), which documents each
    cfg: RunConfig
    sync: bool
    pdsr: bool
    probes: ProbeWindow
    observer: CoreObserver
    encode_group: Callable[[str, PromptTask], bytes]
    ledger: CommitLedger[TaskKey]
    tasks: dict[TaskKey, PromptTask]
    counts: RunCounts
    phase: scheduler_pb2.RunPhase
    fenced: bool
    failure: str
    version: int
    bound: int
    produced: int
    credited: int
    _to_finish: list[tuple[PromptTask, Outcome, Reason | None]]
    unwritten: list[tuple[PromptTask, FinishItem]]
    recording: set[PromptTask]
    wants_finish: bool

    @abstractmethod
    def fence(self) -> list[Command]:
        """Run control (RolloutCore): a store answer said a successor owns the run."""

    def _new_ledger(self) -> CommitLedger[TaskKey]:
        # sync mode (verl's loop) commits in batch order and never aborts the running batch
        order = EarlyStopOrder.FIFO if self.sync else self.cfg.rollout.early_stop_order
        return CommitLedger(order, abort_beyond_cutoff=not self.sync)

    @property
    def valid_produced(self) -> int:
        """Valid groups that count toward the bound: produced minus credited back."""
        return self.produced - self.credited

    def has_outcomes_to_write(self) -> bool:
        """Outcomes queued or a batch not yet applied (ready groups waiting for their fifo turn
        are in `tasks`)."""
        return bool(self._to_finish or self.unwritten)

    def _maybe_stopped(self) -> None:
        # a stop ends when the last in-flight attempt has its outcome
        if self.phase == Phase.STOPPING and not self.tasks:
            self.phase = Phase.STOPPED

    def cancel(self, tasks: list[PromptTask], outcome: Outcome, reason: Reason) -> list[Command]:
        """Give each task the outcome and abort its requests everywhere (queued ones are skipped by
        the dispatcher); requeues are queued latest-admitted first, so that after the pushes to the
        queue head the earliest-admitted prompt is first."""
        if not tasks:
            return []
        for t in sorted(tasks, key=lambda t: t.seq, reverse=True):
            if self.pdsr and t.kind is Kind.TRAIN and not t.cancelled:
                self._censor(t)
            t.cancelled = True
            self._queue_outcome(t, outcome, reason)
        return [Abort(tasks)]

    def _censor(self, task: PromptTask) -> None:
        """pdsr: the responses a cancel stops get no final length, and they are the long ones (early
        stop aborts what still runs): each enters L_cut's window as a right-censored length — the
        tokens it is known to have reached. Here that is its partial tokens: a capped response
        continuing on the heavy pool is ≥ its cap (it leaves `running` for the window); one still
        on its first dispatch is only ≥ 0 (not kept) until its abort reply says how far it got
        (`RolloutCore.aborted`, from the driver)."""
        for req in task.live.values():
            cont = req.continuation
            self.probes.add_censored(len(cont.token_ids) if cont is not None else 0, req)

    def _queue_outcome(self, task: PromptTask, outcome: Outcome, reason: Reason | None = None) -> None:
        if task.closed:
            return
        task.closed = True
        self.ledger.finish(task.key)
        self._to_finish.append((task, outcome, reason))
        self.wants_finish = True

    def next_finish_batch(
        self, finish_call: Callable[..., FinishItem]
    ) -> tuple[list[tuple[PromptTask, FinishItem]], list[Command]]:
        """The batch to write now: the unwritten one again, or a new one planned from the ledger
        (commits, requeues past the bound, aborts beyond a fifo cut-off) and every queued outcome.
        `finish_call` builds a store item (GroupStore.finish_call's signature)."""
        if self.fenced:
            return [], []
        if self.unwritten:
            return self.unwritten, []
        self.wants_finish = False
        cmds: list[Command] = []
        # sync (verl's loop): filter and commit only once every prompt of the generation batch is done
        batch_running = self.sync and len(self.ledger) > self.ledger.ready
        # An attempt's outcome waits for the answers to its responses' RECORDs: FINISH deletes the
        # attempt's response markers, so a RECORD retried after a lost reply would find the attempt
        # ended (`stale`) and memory would miss responses that Redis counted. A ready group with
        # one unanswered (Redis completed it, memory saw it complete on another response) holds the
        # whole plan: the ledger's order must not be split.
        plannable = (
            len(self.ledger)
            and not batch_running
            and not any(t.group_complete and not t.closed for t in self.recording)
        )
        plan = self.ledger.plan(self.bound - self.valid_produced) if plannable else Plan[TaskKey]()
        if plan.abort:
            aborted = [self.tasks[k] for k in plan.abort]
            if self.cfg.rollout.requeue_aborted:
                cmds += self.cancel(aborted, Outcome.REQUEUED, RequeueReason.EARLY_STOP)
            else:
                cmds += self.cancel(aborted, Outcome.DROPPED, DropReason.EARLY_STOP)
        if self.recording:
            items = [x for x in self._to_finish if not x[0].recording]
            self._to_finish = [x for x in self._to_finish if x[0].recording]
        else:
            items, self._to_finish = self._to_finish, []
        batch = [(t, finish_call(t.pid, t.attempt, o, r or "")) for t, o, r in items]
        for key in plan.commit:
            task = self.tasks[key]
            task.closed = True
            assert task.progress is not None, "a ready group is complete"
            group = self.encode_group(self.cfg.name, task)
            item = finish_call(
                task.pid,
                task.attempt,
                Outcome.VALID,
                bound=self.bound,
                group=group,
                min_version=task.progress.min_version,
            )
            batch.append((task, item))
        for key in reversed(plan.requeue):
            task = self.tasks[key]
            task.closed = True
            if self.sync:  # verl keeps the first B valid groups of a batch: the rest is spent
                item = finish_call(task.pid, task.attempt, Outcome.DROPPED, DropReason.SURPLUS)
            else:
                item = finish_call(task.pid, task.attempt, Outcome.REQUEUED, RequeueReason.OVER_BOUND)
            batch.append((task, item))
        self.unwritten = batch
        return batch, cmds

    def finish_applied(
        self, batch: Sequence[tuple[PromptTask, FinishItem]], results: Sequence[FinishResult]
    ) -> tuple[bool, list[Command]]:
        """The store's answers for `batch`. Returns (fenced, commands): on reaching the bound the
        rollout stops admitting and (async) cancels what is still in flight."""
        self.unwritten = []
        fenced = False
        for (task, _), res in zip(batch, results, strict=True):
            self._apply(task, res)
            fenced = fenced or res.fenced
        if fenced:
            return True, self.fence()
        cmds: list[Command] = []
        if self.valid_produced >= self.bound and self.phase == Phase.ROLLING:
            self.phase = Phase.BOUND
            self.counts.early_stops += 1
            self.observer.early_stop()
            rest = [t for t in self.tasks.values() if not t.closed]
            if rest and not self.sync:
                cmds = self.cancel(rest, Outcome.REQUEUED, RequeueReason.EARLY_STOP)
        self._check_gen_batches()
        self._maybe_stopped()
        return False, cmds

    def _check_gen_batches(self) -> None:
        """sync: after `max_num_gen_batches` whole generation batches without B valid groups, the
        run stops, as verl's loop does (it raises): the data is too hard or too easy for the model."""
        limit = self.cfg.rollout.max_num_gen_batches
        c = self.counts
        if not (self.sync and limit and self.phase == Phase.ROLLING and not self.tasks):
            return
        if c.gen_batches >= limit and self.valid_produced < self.bound:
            self.failure = (
                f"{c.gen_batches} generation batches gave {self.valid_produced - self.version * self.cfg.data.train_batch_size}"
                f" of {self.cfg.data.train_batch_size} valid groups (rollout.max_num_gen_batches={limit}): "
                "almost every group is all-right or all-wrong; the data does not suit the model"
            )
            log.error("sync rollout stops: %s", self.failure)
            self.phase = Phase.STOPPED

    def _apply(self, task: PromptTask, res: FinishResult) -> None:
        """Mirror one written outcome in memory: the task leaves the rollout; counts and lengths.
        A repeat (`dup:`) is applied like a first answer: the first one was lost on the way."""
        self.tasks.pop(task.key, None)
        self.produced = max(self.produced, res.produced)
        self.credited = max(self.credited, res.credited)
        recorded = res.recorded
        if recorded is None:
            if not res.fenced:
                log.warning("outcome of %s attempt %d: %s", task.pid, task.attempt, res.label)
            return
        outcome, reason = recorded
        self.observer.outcome(outcome, reason, task.attempt)
        if outcome == Outcome.VALID:
            assert task.progress is not None, "a committed group is complete"
            self.observer.committed(self.version - task.progress.min_version)
            lengths = self.counts.lengths
            for resp in task.responses:
                if resp is not None:
                    lengths.committed += 1
                    lengths.committed_tokens += len(resp.token_ids)
        if not self.tasks and self.sync:
            self.counts.batch_admitted = 0  # the generation batch is done
