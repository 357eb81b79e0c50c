"""The scheduler's rollout counters as step metrics (`rollout/*`), from its `GetRun` status.

One definition for `asyncdapo up` (progress line, report) and for the trainer, which adds them to
each step record so the trackers show rollout and training side by side, as verl's logger does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


def status_metrics(st: Any) -> dict[str, Any]:
    """rollout/* metrics of a `RunStatus`; `rollout/outcomes` (a mapping) is for the report only."""
    outcomes = dict(st.outcomes)
    # Requeued prompts were aborted, not completed: they say nothing about group variance.
    finished = sum(v for k, v in outcomes.items() if k != "requeued")
    return {
        "rollout/policy_version": st.policy_version,
        "rollout/valid_groups": st.valid_groups_produced,
        "rollout/valid_group_ratio": (outcomes.get("valid", 0) / finished) if finished else 0.0,
        "rollout/early_stops": st.early_stops,
        "rollout/aborted_requests": st.aborted_requests,
        "rollout/aborted_tokens": st.aborted_tokens,
        "rollout/generated_tokens": st.generated_tokens,
        "rollout/completions": st.completions,
        "rollout/queue_depth": st.queue_depth,
        "rollout/outcomes": outcomes,
    }


def scheduler_status_source(notifier: Any, run: str, timeout_s: float = 2.0) -> Callable[[], dict[str, Any]]:
    """A function returning the scheduler's rollout/* counters now, through `notifier` (the
    trainer's scheduler client: `scheduler_stub()`, `metadata()`); {} when the scheduler cannot
    answer: a step record never fails for the scheduler's status."""

    def fetch() -> dict[str, Any]:
        import grpc

        from asyncdapo.contracts.v1 import scheduler_pb2

        try:
            req = scheduler_pb2.GetRunRequest(run=run)
            st = notifier.scheduler_stub().GetRun(req, metadata=notifier.metadata(), timeout=timeout_s)
        except grpc.RpcError as err:
            log.warning("rollout status for the step record unavailable: %s", err.code())
            return {}
        return {k: v for k, v in status_metrics(st).items() if k != "rollout/outcomes"}

    return fetch
