"""kopf wiring: which events trigger a reconcile pass, and where the result goes.

- create / update of spec / resume (operator restart) / a timer every `interval` seconds: one
  `reconcile.reconcile` pass; its status goes to the status subresource;
- suspend is a spec update like any other (lifecycle SUSPENDED: rollout at zero replicas, trainer
  Job suspended); deletion needs no handler: every child has a controller ownerReference and the
  garbage collector removes it, so no finalizer ever blocks `kubectl delete`.

kopf's own bookkeeping goes to annotations (prefix asyncdapo.io), never into the structural status.
Importing this module registers the handlers in kopf's default registry: only `asyncdapo operator
run` imports it.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from typing import Any

import kopf
from prometheus_client import Counter, Gauge, Histogram

from .desired import OperatorDefaults
from .kube import Cluster
from .reconcile import ProgressReader, reconcile, status_patch
from .spec import API_GROUP, API_VERSION, PLURAL, Phase

log = logging.getLogger(__name__)

RECONCILES = Counter("asyncdapo_operator_reconcile_total", "Reconcile passes", ["trigger", "result"])
RECONCILE_SECONDS = Histogram("asyncdapo_operator_reconcile_seconds", "Duration of a reconcile pass")
RUN_PHASE = Gauge(
    "asyncdapo_operator_run_phase", "1 for the current phase of a run", ["namespace", "run", "phase"]
)
RUN_STEP = Gauge("asyncdapo_operator_run_step", "Training step in the run's status", ["namespace", "run"])

TIMER_INTERVAL_S = 30.0


def _record_phase(namespace: str, run: str, phase: Phase | None) -> None:
    for p in Phase:
        RUN_PHASE.labels(namespace, run, p.value).set(1.0 if p is phase else 0.0)


def _pass(trigger: str, body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo) -> None:
    cluster: Cluster = memo.cluster
    defaults: OperatorDefaults = memo.defaults
    read_progress: ProgressReader = memo.read_progress
    started = time.perf_counter()
    try:
        status = reconcile(dict(body), cluster, defaults, read_progress, datetime.now(UTC))
    except Exception:
        RECONCILES.labels(trigger, "error").inc()
        raise  # kopf retries with backoff and posts a Warning event
    finally:
        RECONCILE_SECONDS.observe(time.perf_counter() - started)
    RECONCILES.labels(trigger, "ok").inc()
    patch.status.update(status_patch(status))
    ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
    _record_phase(ns, name, status.phase)
    if status.step is not None:
        RUN_STEP.labels(ns, name).set(status.step)


@kopf.on.startup()
def _configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=API_GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=API_GROUP, key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING
    settings.execution.max_workers = 8


@kopf.on.create(API_GROUP, API_VERSION, PLURAL)
def on_create(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    _pass("create", body, patch, memo)


@kopf.on.update(API_GROUP, API_VERSION, PLURAL, field="spec")
def on_update(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    _pass("update", body, patch, memo)


@kopf.on.resume(API_GROUP, API_VERSION, PLURAL)
def on_resume(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    _pass("resume", body, patch, memo)


@kopf.timer(API_GROUP, API_VERSION, PLURAL, interval=TIMER_INTERVAL_S, initial_delay=5.0)
def on_timer(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    _pass("timer", body, patch, memo)


@kopf.on.delete(API_GROUP, API_VERSION, PLURAL, optional=True)
def on_delete(body: kopf.Body, **_: Any) -> None:
    """Nothing to do: children go with their ownerReference (optional=True: no finalizer)."""
    meta = body["metadata"]
    _record_phase(meta["namespace"], meta["name"], None)
    log.info("TrainingRun %s/%s deleted; children are garbage-collected", meta["namespace"], meta["name"])
