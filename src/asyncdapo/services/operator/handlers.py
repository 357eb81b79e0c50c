"""kopf wiring: which events trigger a reconcile pass, and where the result goes.

- create / update of spec / resume (operator restart): one `reconcile.reconcile` pass; its status
  goes to the status subresource through kopf's patch;
- every `periodic.INTERVAL_S`: a pass for each run that still has work (periodic.py), from an
  `on.startup` task over an index of TrainingRuns — not a kopf timer, which would put a finalizer
  on every run;
- a finished run (Succeeded, or Failed for a reason the spec cannot fix) gets no pass unless its
  spec changes (periodic.has_work);
- a phase change posts an Event on the run: Normal, or Warning for Failed (a pass that raises
  posts a Warning too);
- suspend is a spec update like any other (lifecycle SUSPENDED: rollout at zero replicas, trainer
  Job suspended); deletion needs no handler: every child has a controller ownerReference and the
  garbage collector removes it (a retained workspace PVC has none and stays), so no finalizer ever
  blocks `kubectl delete`. `tests/unit/test_operator_handlers.py` checks kopf's registry for it.

kopf's own bookkeeping goes to annotations (prefix asyncdapo.io), never into the structural status.
Importing this module registers the handlers in kopf's default registry: only `asyncdapo operator
run` (and that test) imports it.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import threading
import time
from datetime import UTC, datetime
from typing import Any

import kopf
from prometheus_client import Counter, Gauge, Histogram

from asyncdapo.services.operator import periodic
from asyncdapo.services.operator.desired import OperatorDefaults
from asyncdapo.services.operator.kube import Cluster, event_manifest
from asyncdapo.services.operator.reconcile import ProgressReader, reconcile, status_patch
from asyncdapo.services.operator.resource_status import Phase, TrainingRunStatus, parse_status
from asyncdapo.services.operator.spec import API_GROUP, API_VERSION, PLURAL
from asyncdapo.services.operator.status_machine import phase_event

log = logging.getLogger(__name__)

RECONCILES = Counter("asyncdapo_operator_reconcile_total", "Reconcile passes", ["trigger", "result"])
RECONCILE_SECONDS = Histogram("asyncdapo_operator_reconcile_seconds", "Duration of a reconcile pass")
RUN_PHASE = Gauge(
    "asyncdapo_operator_run_phase", "1 for the current phase of a run", ["namespace", "run", "phase"]
)
RUN_STEP = Gauge("asyncdapo_operator_run_step", "Training step in the run's status", ["namespace", "run"])

_locks_guard = threading.Lock()
_locks: dict[tuple[str, str], threading.Lock] = {}


def _lock(ns: str, name: str) -> threading.Lock:
    """One pass at a time per run (a spec update may meet the periodic pass)."""
    with _locks_guard:
        return _locks.setdefault((ns, name), threading.Lock())


def _record_phase(namespace: str, run: str, phase: Phase | None) -> None:
    for p in Phase:
        RUN_PHASE.labels(namespace, run, p.value).set(1.0 if p is phase else 0.0)


def _post(cluster: Cluster, body: dict[str, Any], type_: str, reason: str, message: str) -> None:
    try:
        cluster.post_event(event_manifest(body, type_, reason, message, datetime.now(UTC)))
    except Exception as err:  # a boundary: an Event lost is not worth a failed pass
        log.warning("cannot post event %s on %s: %s", reason, body["metadata"]["name"], err)


def run_pass(trigger: str, body: dict[str, Any], memo: Any) -> TrainingRunStatus:
    """One reconcile pass; posts the phase-change Event and returns the new status (not written)."""
    cluster: Cluster = memo.cluster
    defaults: OperatorDefaults = memo.defaults
    read_progress: ProgressReader = memo.read_progress
    ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
    started = time.perf_counter()
    with _lock(ns, name):
        try:
            status = reconcile(body, cluster, defaults, read_progress, datetime.now(UTC))
        except Exception as err:
            RECONCILES.labels(trigger, "error").inc()
            _post(cluster, body, "Warning", "ReconcileError", f"{type(err).__name__}: {err}")
            raise
        finally:
            RECONCILE_SECONDS.observe(time.perf_counter() - started)
    RECONCILES.labels(trigger, "ok").inc()
    event = phase_event(parse_status(body.get("status")), status)
    if event is not None:
        _post(cluster, body, event.type, event.reason, event.message)
    _record_phase(ns, name, status.phase)
    if status.step is not None:
        RUN_STEP.labels(ns, name).set(status.step)
    return status


def _kopf_pass(trigger: str, body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo) -> None:
    plain = copy.deepcopy(dict(body))
    if trigger == "resume" and not periodic.has_work(plain):
        return  # a finished run: nothing to re-apply after an operator restart
    patch.status.update(status_patch(run_pass(trigger, plain, memo)))


async def _periodic_pass(body: dict[str, Any], memo: kopf.Memo) -> None:
    status = await asyncio.to_thread(run_pass, "periodic", body, memo)
    meta = body["metadata"]
    await asyncio.to_thread(memo.cluster.patch_status, meta["namespace"], meta["name"], status_patch(status))


@kopf.index(API_GROUP, API_VERSION, PLURAL)
def trainingruns(
    namespace: str | None, name: str, body: kopf.Body, **_: Any
) -> dict[tuple[str | None, str], Any]:
    """Every TrainingRun the operator watches, for the periodic pass (an index needs no finalizer)."""
    return {(namespace, name): copy.deepcopy(dict(body))}


@kopf.on.startup()
def _configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=API_GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=API_GROUP, key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING
    settings.execution.max_workers = 8


# kopf passes each index as a keyword argument named after it, which its ActivityFn protocol
# (the decorator's parameter type) cannot declare
@kopf.on.startup()  # type: ignore[arg-type]
async def _start_periodic(memo: kopf.Memo, trainingruns: kopf.Index, **_: Any) -> None:
    interval = getattr(memo, "interval_s", periodic.INTERVAL_S)
    delay = getattr(memo, "initial_delay_s", 5.0)

    async def one(body: dict[str, Any]) -> None:
        await _periodic_pass(body, memo)

    memo.periodic_task = asyncio.create_task(
        periodic.run_forever(trainingruns, one, interval_s=interval, initial_delay_s=delay)
    )


@kopf.on.cleanup()
async def _stop_periodic(memo: kopf.Memo, **_: Any) -> None:
    task = getattr(memo, "periodic_task", None)
    if task is not None:
        task.cancel()


@kopf.on.create(API_GROUP, API_VERSION, PLURAL)
def on_create(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    _kopf_pass("create", body, patch, memo)


@kopf.on.update(API_GROUP, API_VERSION, PLURAL, field="spec")
def on_update(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    _kopf_pass("update", body, patch, memo)


@kopf.on.resume(API_GROUP, API_VERSION, PLURAL)
def on_resume(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    _kopf_pass("resume", body, patch, memo)


@kopf.on.delete(API_GROUP, API_VERSION, PLURAL, optional=True)
def on_delete(body: kopf.Body, **_: Any) -> None:
    """Nothing to do: children go with their ownerReference (optional=True: no finalizer)."""
    meta = body["metadata"]
    _record_phase(meta["namespace"], meta["name"], None)
    log.info("TrainingRun %s/%s deleted; children are garbage-collected", meta["namespace"], meta["name"])
