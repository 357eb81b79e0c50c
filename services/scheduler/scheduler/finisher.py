"""The finisher's round: how planned commits, requeues and queued outcomes reach Redis and memory.

Kept apart from `rollout.py` (the loop that owns the state); these functions read and write the
`Rollout` they are given and run only on the finisher task, so outcomes are written by one writer.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from asyncdapo.scheduler.group_state import DropReason, FinishResult, Outcome, RequeueReason, redis_retry
from asyncdapo.scheduler.ledger import Plan
from asyncdapo.scheduler.tasks import PromptTask, build_group

if TYPE_CHECKING:
    from asyncdapo.scheduler.rollout import Rollout

log = logging.getLogger(__name__)


async def finish_round(ro: Rollout) -> None:
    """One round of the finisher (the only writer of outcomes): plan commits, aborts and requeues
    from the ledger, write every queued outcome in one Redis round trip (outcome, counters and
    group entry atomically per prompt), apply them in memory, and on reaching the bound stop
    admitting and cancel what is still in flight (async; sync lets its batch finish)."""
    from asyncdapo.scheduler.rollout import Phase

    # sync (verl's loop): filter and commit only once every prompt of the generation batch is done
    batch_running = ro.sync and len(ro.ledger) > ro.ledger.ready
    plan = ro.ledger.plan(ro.bound - ro.valid_produced) if len(ro.ledger) and not batch_running else Plan()
    if plan.abort:
        aborted = [ro.tasks[k] for k in plan.abort]
        if ro.cfg.rollout.requeue_aborted:
            ro._cancel(aborted, Outcome.REQUEUED, RequeueReason.EARLY_STOP.value)
        else:
            ro._cancel(aborted, Outcome.DROPPED, DropReason.EARLY_STOP.value)
    items = ro._to_finish
    ro._to_finish = []
    calls, owners = [], []
    for task, outcome, reason in items:
        calls.append(ro.store.finish_call(task.pid, task.attempt, outcome, reason))
        owners.append(task)
    oldest_trainable = ro.version - ro.cfg.rollout.max_staleness
    for key in plan.commit:
        task = ro.tasks[key]
        task.closed = True
        if task.progress.min_version < oldest_trainable:
            # Outlived its version (sync mode: the rest of a batch still running when the
            # trainer published). The trainer would drop it as stale, yet it would count
            # toward the bound and starve the step: it goes back to the queue instead.
            calls.append(
                ro.store.finish_call(task.pid, task.attempt, Outcome.REQUEUED, RequeueReason.OVER_BOUND)
            )
            owners.append(task)
            continue
        group = build_group(ro.cfg.name, task).SerializeToString()
        calls.append(
            ro.store.finish_call(
                task.pid, task.attempt, Outcome.VALID, bound=ro.bound, group=group, version=ro.version
            )
        )
        owners.append(task)
    for key in reversed(plan.requeue):
        task = ro.tasks[key]
        task.closed = True
        calls.append(ro.store.finish_call(task.pid, task.attempt, Outcome.REQUEUED, RequeueReason.OVER_BOUND))
        owners.append(task)
    async with ro.outcome_lock:  # status() never sees Redis and memory disagree
        if calls:
            results = await redis_retry(lambda: ro.store.finish_many(calls))
            for task, res in zip(owners, results, strict=True):
                apply_outcome(ro, task, res)
        reached = ro.valid_produced >= ro.bound and ro.phase == Phase.ROLLING
        if reached:
            ro.phase = Phase.BOUND
    if reached:
        ro.early_stops += 1
        ro.metrics.early_stops.inc()
        await redis_retry(lambda: ro._incr_counters(early_stops=1))
        rest = [t for t in ro.tasks.values() if not t.closed]
        if rest and not ro.sync:
            ro._cancel(rest, Outcome.REQUEUED, RequeueReason.EARLY_STOP.value)
    ro._maybe_stopped()
    ro._update_gauges()
    ro._wake_admission.set()
    if ro._to_finish:
        ro._wake_finisher.set()


def apply_outcome(ro: Rollout, task: PromptTask, res: FinishResult) -> None:
    """Mirror one recorded outcome in memory: the task leaves the rollout, metrics and lengths."""
    ro.tasks.pop(task.key, None)
    if res.label.startswith(("dup:", "stale")):
        log.warning("outcome of %s attempt %d was already recorded: %s", task.pid, task.attempt, res.label)
        return
    outcome, _, reason = res.label.partition(":")
    ro.metrics.outcomes.labels(outcome, reason).inc()
    if outcome != Outcome.REQUEUED:
        ro.metrics.prompt_attempts.labels(outcome).observe(task.attempt)
    if outcome == Outcome.VALID:
        ro.valid_produced = max(ro.valid_produced, res.valid_produced)
        ro.metrics.groups.inc()
        ro.metrics.staleness.observe(ro.version - task.progress.min_version)
        for resp in task.responses:
            ro.lengths.committed += 1
            ro.lengths.committed_tokens += len(resp.token_ids)
    if not ro.tasks and ro.sync:
        ro.batch_admitted = 0  # the generation batch is done
