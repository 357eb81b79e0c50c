"""Validation through the scheduler's eval mode (Scheduler.Evaluate: nothing filtered or stopped);
the request is built by `asyncdapo.services.trainer.eval_request`, the same builder `asyncdapo up` uses."""

from __future__ import annotations

from typing import Any


def evaluate(
    stub: Any, request: Any, metadata: list[tuple[str, str]], timeout_s: float = 3600.0
) -> dict[str, float]:
    resp = stub.Evaluate(request, metadata=metadata, timeout=timeout_s)
    return {
        "val/accuracy": resp.accuracy,
        "val/mean_response_length": resp.mean_response_length,
        "val/policy_version": float(resp.policy_version),
        "val/prompts": float(len(resp.results)),
    }
