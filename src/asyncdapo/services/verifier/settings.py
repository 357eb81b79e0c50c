"""Verifier knobs: CLI flags override environment variables (`ASYNCDAPO_VERIFIER_*`) override defaults."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from asyncdapo.contracts.verifier_api import MAX_GROUND_TRUTH_BYTES, MAX_RESPONSE_BYTES


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class VerifierSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ASYNCDAPO_VERIFIER_", extra="forbid", frozen=True)

    host: str = Field(default="127.0.0.1", description="Address to bind.")
    port: int = Field(default=8000, ge=0, le=65535, description="Port to bind.")
    workers: int = Field(default_factory=_cores, ge=1, le=256, description="Scoring processes.")
    spare_workers: int = Field(
        # from `workers`, not the machine: in a pod, the affinity mask shows every core of the node
        default_factory=lambda data: max(1, -(-data.get("workers", 1) // 8)),
        ge=0,
        le=256,
        description="Extra scoring processes that take new work while a worker is stuck on a slow item "
        "(past stall_after_s), so one slow item does not hold up the requests behind it.",
    )
    stall_after_s: float = Field(
        default=0.025,
        gt=0,
        le=600,
        description="An item running longer than this no longer counts against `workers` (math-verify "
        "takes ~1 ms on a typical item).",
    )
    timeout_s: float = Field(
        default=5.0, gt=0, le=600, description="Hard per-item time budget, enforced by killing the worker."
    )
    cooperative_timeout: bool = Field(
        default=True,
        description="Also arm an in-worker alarm at 90% of timeout_s, ending interruptible stalls "
        "without losing the worker process (the hard kill remains the backstop).",
    )
    max_items_per_request: int = Field(default=1024, ge=1, description="Larger requests get 413.")
    max_response_bytes: int = Field(
        default=MAX_RESPONSE_BYTES,
        ge=1,
        description="UTF-8 bytes of one item's `response`; larger items get 422.",
    )
    max_ground_truth_bytes: int = Field(
        default=MAX_GROUND_TRUTH_BYTES,
        ge=1,
        description="UTF-8 bytes of one item's `ground_truth`; larger items get 422.",
    )
    max_request_bytes: int = Field(
        default=64 * 1024 * 1024, ge=1, description="Request body bytes (Content-Length); larger get 413."
    )
    max_queued_items: int = Field(
        default=65536, ge=1, description="Items waiting for a worker; beyond it requests get 503 (retry)."
    )
    max_chunk: int = Field(default=32, ge=1, le=1024, description="Most items sent to a worker at once.")
    start_method: Literal["forkserver", "spawn"] = Field(
        default="forkserver", description="How worker processes are started (never fork: threads)."
    )
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"

    @property
    def soft_timeout_s(self) -> float | None:
        return 0.9 * self.timeout_s if self.cooperative_timeout else None
