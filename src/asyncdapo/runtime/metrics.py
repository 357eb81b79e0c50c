"""Metric types shared by the services' metrics modules (their names: deploy/METRICS.md)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector


class TotalCounter(Collector):
    """A counter (`<name>_total`) whose value is a running total kept elsewhere — in Redis (durable
    across restarts) or inside an engine — and mirrored with `set`. Prometheus conventions want
    running totals typed as counters so that `rate()` / `increase()` apply; a total that goes down
    (the engine restarted) is exported as is, which `rate()` reads as a counter reset."""

    def __init__(self, name: str, documentation: str, registry: CollectorRegistry) -> None:
        self._name = name.removesuffix("_total")
        self._doc = documentation
        self._value = 0.0
        self._lock = threading.Lock()
        registry.register(self)

    def set(self, value: float) -> None:
        with self._lock:
            self._value = float(value)

    def get(self) -> float:
        with self._lock:
            return self._value

    def describe(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(self._name, self._doc)

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(self._name, self._doc)
        family.add_metric([], self.get())
        yield family
