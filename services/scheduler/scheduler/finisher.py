"""The finisher's round: how planned commits, requeues and queued outcomes reach Redis and memory.

Kept apart from `rollout.py` (the loop that owns the state); these functions read and write the
`Rollout` they are given and run only on the finisher task, so outcomes are written by one writer.

A round builds one batch of FINISH items and keeps it in `ro._unwritten` until Redis answered it
and memory applied it: a Redis outage is waited for, any other error leaves the same batch to be
sent again by the next round (every item is idempotent: an attempt's outcome is set once, a repeat
answers `dup:<label>`), so no outcome is ever dropped by a failed round, and every answer — a
repeat's included — is applied, so memory equals Redis.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from asyncdapo.scheduler.group_state import DropReason, FinishItem, FinishResult, Outcome, RequeueReason
from asyncdapo.scheduler.ledger import Plan
from asyncdapo.scheduler.tasks import PromptTask, build_group

if TYPE_CHECKING:
    from asyncdapo.scheduler.rollout import Rollout

log = logging.getLogger(__name__)


def plan_batch(ro: Rollout) -> list[tuple[PromptTask, FinishItem]]:
    """Plan commits, aborts and requeues from the ledger and turn them, with every queued
    outcome, into FINISH items (the staleness of a commit is judged by the script, against the
    step that will consume it)."""
    # sync (verl's loop): filter and commit only once every prompt of the generation batch is done
    batch_running = ro.sync and len(ro.ledger) > ro.ledger.ready
    plan = ro.ledger.plan(ro.bound - ro.valid_produced) if len(ro.ledger) and not batch_running else Plan()
    if plan.abort:
        aborted = [ro.tasks[k] for k in plan.abort]
        if ro.cfg.rollout.requeue_aborted:
            ro._cancel(aborted, Outcome.REQUEUED, RequeueReason.EARLY_STOP)
        else:
            ro._cancel(aborted, Outcome.DROPPED, DropReason.EARLY_STOP)
    items = ro._to_finish
    ro._to_finish = []
    batch: list[tuple[PromptTask, FinishItem]] = []
    for task, outcome, reason in items:
        batch.append((task, ro.store.finish_call(task.pid, task.attempt, outcome, reason or "")))
    for key in plan.commit:
        task = ro.tasks[key]
        task.closed = True
        group = build_group(ro.cfg.name, task).SerializeToString()
        item = ro.store.finish_call(
            task.pid,
            task.attempt,
            Outcome.VALID,
            bound=ro.bound,
            group=group,
            min_version=task.progress.min_version,
        )
        batch.append((task, item))
    for key in reversed(plan.requeue):
        task = ro.tasks[key]
        task.closed = True
        batch.append(
            (task, ro.store.finish_call(task.pid, task.attempt, Outcome.REQUEUED, RequeueReason.OVER_BOUND))
        )
    return batch


async def finish_round(ro: Rollout) -> None:
    """One round of the finisher (the only writer of outcomes): write the batch (a new one when
    the previous was applied) in one Redis round trip (outcome, counters and group entry atomically
    per prompt), apply the answers in memory, and on reaching the bound stop admitting and cancel
    what is still in flight (async; sync lets its batch finish)."""
    from asyncdapo.scheduler.rollout import Phase

    if ro.fenced:
        return
    if not ro._unwritten:
        ro._unwritten = plan_batch(ro)
    batch = ro._unwritten
    async with ro.outcome_lock:  # status() never sees Redis and memory disagree
        if batch:
            results = await ro._r(lambda: ro.store.finish_many([item for _, item in batch]))
            ro._unwritten = []
            for (task, _), res in zip(batch, results, strict=True):
                apply_outcome(ro, task, res)
            if any(r.fenced for r in results):
                ro._on_fenced("finish")
                return
        reached = ro.valid_produced >= ro.bound and ro.phase == Phase.ROLLING
        if reached:
            ro.phase = Phase.BOUND
    if reached:
        ro.early_stops += 1
        ro.metrics.early_stops.inc()
        ro._spawn(ro.flush_counters())
        rest = [t for t in ro.tasks.values() if not t.closed]
        if rest and not ro.sync:
            ro._cancel(rest, Outcome.REQUEUED, RequeueReason.EARLY_STOP)
    ro._maybe_stopped()
    ro._update_gauges()
    ro._wake_admission.set()
    if ro._to_finish:
        ro._wake_finisher.set()


def apply_outcome(ro: Rollout, task: PromptTask, res: FinishResult) -> None:
    """Mirror one recorded outcome in memory: the task leaves the rollout, metrics and lengths.
    A repeat (`dup:`) is applied like a first answer: the first one was lost on the way."""
    ro.tasks.pop(task.key, None)
    ro.produced = max(ro.produced, res.produced)
    ro.credited = max(ro.credited, res.credited)
    recorded = res.recorded
    if recorded is None:
        if not res.fenced:
            log.warning("outcome of %s attempt %d: %s", task.pid, task.attempt, res.label)
        return
    if res.label.startswith("dup:"):
        log.info(
            "outcome of %s attempt %d was recorded by a call whose reply was lost: %s",
            task.pid,
            task.attempt,
            res.label,
        )
    outcome, reason = recorded
    ro.metrics.outcomes.labels(outcome, reason).inc()
    if outcome != Outcome.REQUEUED:
        ro.metrics.prompt_attempts.labels(outcome).observe(task.attempt)
    if outcome == Outcome.VALID:
        ro.metrics.groups.inc()
        ro.metrics.staleness.observe(ro.version - task.progress.min_version)
        for resp in task.responses:
            ro.lengths.committed += 1
            ro.lengths.committed_tokens += len(resp.token_ids)
    if not ro.tasks and ro.sync:
        ro.batch_admitted = 0  # the generation batch is done
