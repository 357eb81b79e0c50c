"""Prometheus metrics of one verifier instance (own registry, so several apps can share a process).

Names follow deploy/METRICS.md (`asyncdapo_verifier_`), which the dashboards and alerts read.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from asyncdapo.contracts.verifier_api import ItemStatus
from asyncdapo.services.verifier.worker_pool import RestartReason

_LATENCY_BUCKETS = (0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class VerifierMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "asyncdapo_verifier_requests",
            "Score requests by HTTP status code.",
            ["code"],
            registry=self.registry,
        )
        self.items = Counter(
            "asyncdapo_verifier_items", "Scored items by outcome.", ["status"], registry=self.registry
        )
        self.request_latency = Histogram(
            "asyncdapo_verifier_request_seconds",
            "Time from a valid score request's arrival to its response.",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.item_seconds = Histogram(
            "asyncdapo_verifier_item_seconds",
            "Time one item spent in math-verify inside a worker.",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.worker_restarts = Counter(
            "asyncdapo_verifier_worker_restarts",
            "Worker processes replaced, by reason (timeout: killed by the watchdog; crash: died).",
            ["reason"],
            registry=self.registry,
        )
        self.stalled_items = Counter(
            "asyncdapo_verifier_stalled_items",
            "Items that ran past stall_after_s while other items waited (a spare worker took their place).",
            registry=self.registry,
        )
        self.workers_ready = Gauge(
            "asyncdapo_verifier_workers_ready", "Worker processes warmed and serving.", registry=self.registry
        )
        self.queued_items = Gauge(
            "asyncdapo_verifier_queued_items", "Items waiting for a worker.", registry=self.registry
        )
        for status in ItemStatus:
            self.items.labels(status=status.value)
        for reason in RestartReason:
            self.worker_restarts.labels(reason=reason.value)

    def on_item(self, status: ItemStatus, seconds: float) -> None:
        self.items.labels(status=status.value).inc()
        self.item_seconds.observe(seconds)

    def on_restart(self, reason: RestartReason) -> None:
        self.worker_restarts.labels(reason=reason.value).inc()

    def track_pool(self, workers_ready: Callable[[], float], queued: Callable[[], float]) -> None:
        self.workers_ready.set_function(workers_ready)
        self.queued_items.set_function(queued)
