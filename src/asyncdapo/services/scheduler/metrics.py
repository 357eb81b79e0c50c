"""Prometheus metrics of the scheduler (prefix `asyncdapo_scheduler_`), one registry per instance
so that several schedulers can live in one test process."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from asyncdapo.runtime.metrics import TotalCounter
from asyncdapo.services.scheduler.policy.long_tail import LongTailAction

_LAT = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
_SLOW = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class SchedulerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        p = "asyncdapo_scheduler_"
        r = self.registry
        self.dispatch_latency = Histogram(
            p + "dispatch_latency_seconds",
            "Time from a request being dispatchable to its Generate call being issued.",
            buckets=_LAT,
            registry=r,
        )
        self.in_flight = Gauge(
            p + "in_flight_requests", "Requests in flight per gateway.", ["gateway"], registry=r
        )
        self.in_flight_prompts = Gauge(
            p + "in_flight_prompts", "Prompts admitted without an outcome.", registry=r
        )
        self.queue_depth = Gauge(p + "queue_depth", "Prompts waiting in the Redis queue.", registry=r)
        self.dispatch_queue = Gauge(
            p + "dispatch_queue_depth", "Requests waiting for a gateway slot.", registry=r
        )
        self.outcomes = Counter(
            p + "outcomes_total", "Prompt attempt outcomes.", ["outcome", "reason"], registry=r
        )
        self.early_stops = Counter(
            p + "early_stops_total", "Times the valid-group bound was reached.", registry=r
        )
        self.aborted_requests = Counter(
            p + "aborted_requests_total", "Requests aborted (early stop, stop, drain).", registry=r
        )
        self.aborted_tokens = Counter(p + "aborted_tokens_total", "Tokens of aborted requests.", registry=r)
        self.abort_fanout = Histogram(
            p + "abort_fanout_seconds",
            "Abort fan-out to every gateway, start to last reply.",
            buckets=_SLOW,
            registry=r,
        )
        self.completions = Counter(p + "completions_total", "Responses scored.", registry=r)
        self.generated_tokens = Counter(p + "generated_tokens_total", "Response tokens received.", registry=r)
        self.verifier_latency = Histogram(
            p + "verifier_latency_seconds", "Verifier call latency.", buckets=_SLOW, registry=r
        )
        self.verifier_errors = Counter(
            p + "verifier_errors_total", "Failed verifier calls and items.", ["kind"], registry=r
        )
        self.gateway_errors = Counter(
            p + "gateway_errors_total", "Generate calls that failed.", ["gateway", "code"], registry=r
        )
        self.redispatched = Counter(
            p + "redispatched_requests_total", "Requests dispatched again.", ["why"], registry=r
        )
        # no `version` label: one series per policy version would grow without bound
        self.groups = Counter(p + "groups_total", "Valid groups committed by this scheduler.", registry=r)
        self.staleness = Histogram(
            p + "group_staleness_versions",
            "Policy version at commit minus the oldest token version of the group.",
            buckets=(0, 1, 2, 3, 4, 6, 8, 16),
            registry=r,
        )
        self.prompt_attempts = Histogram(
            p + "prompt_attempts",
            "Attempt number of a prompt's final outcome (valid, filtered, dropped): 1 + the times an "
            "early stop aborted and requeued it.",
            ["outcome"],
            buckets=(1, 2, 3, 4, 6, 8, 16),
            registry=r,
        )
        self.long_tail = Counter(
            p + "long_tail_total",
            "pdsr actions: cap_continue = a fast-pool response reached its cap and continues on the heavy pool; "
            "cap_group = the first such response of a group; final = a response reached its final length.",
            ["action"],
            registry=r,
        )
        self.long_tail_tokens = Counter(
            p + "long_tail_tokens_total",
            "pdsr tokens by action: cap_continue = the partial tokens a continuation carries to the heavy pool "
            "(prefilled there again); final = final response lengths.",
            ["action"],
            registry=r,
        )
        self.policy_version = Gauge(p + "policy_version", "Current policy version.", registry=r)
        # a running total kept in Redis (survives scheduler restarts): a counter, mirrored with set()
        self.valid_produced = TotalCounter(
            p + "valid_groups_produced_total", "Valid groups produced in total (the run's, from Redis).", r
        )
        self.valid_bound = Gauge(p + "valid_groups_bound", "floor((v + 1 + s) * B).", registry=r)
        self.valid_credited = TotalCounter(
            p + "valid_groups_credited_total",
            "Valid groups the trainer dropped (stale, malformed, trimmed), credited back to the bound "
            "(the run's, from Redis); the bound applies to produced - credited.",
            r,
        )
        self.redis_up = Gauge(
            p + "redis_up", "1 while Redis answers, 0 while the scheduler waits for it.", registry=r
        )
        self.redis_up.set(1)
        self.redis_full = Gauge(
            p + "redis_full",
            "1 while Redis refuses writes at maxmemory (OOM; the writes wait, nothing is dropped), else 0.",
            registry=r,
        )
        self.gateway_weight_syncs = Counter(
            p + "gateway_weight_syncs_total",
            "Weight loads of one gateway outside a publish (it came back, failed or hung), by result.",
            ["result"],
            registry=r,
        )
        self.redis_round_trips = Counter(p + "redis_round_trips_total", "Redis round trips.", registry=r)
        self.publish_seconds = Histogram(
            p + "publish_weights_seconds", "PublishWeights fan-out duration.", buckets=_SLOW, registry=r
        )

    def set_in_flight_per_gateway(self, in_flight: Iterable[tuple[str, int]]) -> None:
        """(address, requests in flight) of every gateway: O(gateways), so once a second
        (housekeeping), never per finisher round."""
        for address, n in in_flight:
            self.in_flight.labels(address).set(n)


class MetricsObserver:
    """The rollout core's observations (`core.CoreObserver`) as the scheduler's Prometheus metrics:
    the core decides, this only counts."""

    def __init__(self, metrics: SchedulerMetrics) -> None:
        self.m = metrics

    def outcome(self, outcome: str, reason: str, attempt: int) -> None:
        self.m.outcomes.labels(outcome, reason).inc()
        if outcome != "requeued":
            self.m.prompt_attempts.labels(outcome).observe(attempt)

    def committed(self, staleness: int) -> None:
        self.m.groups.inc()
        self.m.staleness.observe(staleness)

    def completions(self, count: int, tokens: int) -> None:
        self.m.completions.inc(count)
        self.m.generated_tokens.inc(tokens)

    def early_stop(self) -> None:
        self.m.early_stops.inc()

    def long_tail(self, action: LongTailAction, tokens: int = 0) -> None:
        self.m.long_tail.labels(action.value).inc()
        if tokens:
            self.m.long_tail_tokens.labels(action.value).inc(tokens)
