"""The operator's kopf wiring: no handler that needs a finalizer (kopf's own registry is inspected),
a periodic pass that skips finished runs, and Events on phase changes."""

from __future__ import annotations

import asyncio
import copy
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import kopf
import kubernetes_validate
import pytest
from test_operator_reconcile import T0, FakeCluster, _run

from asyncdapo.services.operator import handlers, periodic
from asyncdapo.services.operator.desired import OperatorDefaults
from asyncdapo.services.operator.kube import event_manifest
from asyncdapo.services.operator.resource_status import TrainingRunStatus, parse_status
from asyncdapo.services.operator.status_machine import Progress, phase_event


def finalizer_handlers(registry: kopf.OperatorRegistry) -> list[str]:
    """Handlers for which kopf adds its finalizer to every matching object (what
    processing.py asks the changing and spawning registries: `requires_finalizer`)."""
    found = []
    for reg in (registry._changing, registry._spawning):
        for h in reg.get_all_handlers():
            if h.requires_finalizer:
                found.append(f"{type(h).__name__} {h.id}")
    # timers and daemons: kopf needs a finalizer to stop them before an object goes
    found += [f"{type(h).__name__} {h.id}" for h in registry._spawning.get_all_handlers()]
    return sorted(set(found))


def test_no_handler_requires_a_finalizer() -> None:
    registry = kopf.get_default_registry()
    ours = [h for reg in (registry._changing, registry._indexing) for h in reg.get_all_handlers()]
    assert {h.id for h in ours} >= {"on_create", "on_update/spec", "on_resume", "on_delete", "trainingruns"}
    assert finalizer_handlers(registry) == []
    activities = {h.id for h in registry._activities.get_all_handlers()}
    assert {"_start_periodic", "_stop_periodic"} <= activities  # the periodic pass replaces a timer


def test_the_check_would_catch_a_timer_or_a_mandatory_delete_handler() -> None:
    reg = kopf.OperatorRegistry()

    @kopf.timer("asyncdapo.io", "v1alpha1", "trainingruns", interval=30, registry=reg)
    def tick(**_: Any) -> None: ...

    @kopf.on.delete("asyncdapo.io", "v1alpha1", "trainingruns", registry=reg)
    def gone(**_: Any) -> None: ...

    found = finalizer_handlers(reg)
    assert len(found) == 2 and found[0].startswith("ChangingHandler") and found[0].endswith(".gone")
    assert found[1].startswith("TimerHandler") and found[1].endswith(".tick")


def _status(phase: str | None, reason: str | None = None, generation: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if phase:
        out["phase"] = phase
    if reason:
        out["reason"] = reason
    if generation is not None:
        out["observedGeneration"] = generation
    return out


@pytest.mark.parametrize(
    ("status", "generation", "work"),
    [
        (_status(None), 1, True),  # new
        (_status("Running", "Running", 1), 1, True),
        (_status("Suspended", "Suspended", 2), 2, True),  # a suspended run is watched (deadline)
        (_status("Succeeded", "TrainingCompleted", 3), 3, False),
        (_status("Failed", "TrainerFailed", 3), 3, False),
        (_status("Succeeded", "TrainingCompleted", 3), 4, True),  # its spec changed since
        (_status("Failed", "NoRedis", 3), 3, True),  # a spec error: fixing the cluster lets it go on
    ],
)
def test_only_runs_with_work_get_a_pass(status: dict[str, Any], generation: int, work: bool) -> None:
    body = {"metadata": {"name": "r", "namespace": "ml", "generation": generation}, "status": status}
    assert periodic.has_work(body) is work
    body["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert periodic.has_work(body) is False


def _memo(cluster: FakeCluster, progress: Progress | None = None) -> SimpleNamespace:
    return SimpleNamespace(
        cluster=cluster,
        defaults=OperatorDefaults(),
        read_progress=lambda run, ns: progress or Progress(),
    )


def test_periodic_sweep_reconciles_running_runs_and_leaves_finished_ones_alone() -> None:
    cluster = FakeCluster()
    memo = _memo(cluster)
    running = _run()
    done = _run()
    done["metadata"]["name"] = "old"
    done["status"] = _status("Succeeded", "TrainingCompleted", 1)
    passes: list[str] = []

    async def one(body: dict[str, Any]) -> None:
        passes.append(body["metadata"]["name"])
        await handlers._periodic_pass(body, memo)

    index = {("ml", "tiny-math"): [running], ("ml", "old"): [done]}
    n = asyncio.run(periodic.sweep(periodic.snapshot(index), one, concurrency=4))
    assert n == 1 and passes == ["tiny-math"]
    assert [(ns, name) for ns, name, _ in cluster.status_patches] == [("ml", "tiny-math")]
    assert cluster.status_patches[0][2]["phase"] == "Preparing"
    assert all(k[3] != "old-config" for k in cluster.objects)  # nothing applied for the finished run


def test_a_failing_pass_does_not_stop_the_sweep() -> None:
    seen: list[str] = []

    async def one(body: dict[str, Any]) -> None:
        seen.append(body["metadata"]["name"])
        if body["metadata"]["name"] == "a":
            raise RuntimeError("API server went away")

    bodies = [{"metadata": {"name": n, "namespace": "ml", "generation": 1}} for n in ("a", "b", "c")]
    assert asyncio.run(periodic.sweep(bodies, one, concurrency=1)) == 3
    assert seen == ["a", "b", "c"]


def test_run_forever_sweeps_the_live_index_until_cancelled() -> None:
    index: dict[Any, list[dict[str, Any]]] = {}
    seen: list[str] = []

    async def one(body: dict[str, Any]) -> None:
        seen.append(body["metadata"]["name"])

    async def main() -> None:
        task = asyncio.create_task(periodic.run_forever(index, one, interval_s=0.0, initial_delay_s=0.0))
        index[("ml", "r1")] = [{"metadata": {"name": "r1", "namespace": "ml", "generation": 1}}]
        for _ in range(100):
            if seen:
                break
            await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert seen == ["r1"]


def test_phase_changes_post_events() -> None:
    cluster = FakeCluster()
    memo = _memo(cluster)
    body = _run()
    status = handlers.run_pass("create", body, memo)
    assert status.phase is not None and status.phase.value == "Preparing"
    (event,) = cluster.events
    assert (event["type"], event["reason"]) == ("Normal", "Preparing")
    assert event["involvedObject"]["kind"] == "TrainingRun" and event["involvedObject"]["name"] == "tiny-math"
    kubernetes_validate.validate(event, "1.33.0", strict=True)
    # the same phase again: no new Event
    body["status"] = status.model_dump(mode="json", by_alias=True, exclude_none=True)
    handlers.run_pass("periodic", copy.deepcopy(body), memo)
    assert len(cluster.events) == 1
    # a spec the operator refuses: a Warning naming the reason
    bad = copy.deepcopy(body)
    bad["spec"]["run"]["rollout"]["n"] = 0
    handlers.run_pass("update", bad, memo)
    assert (cluster.events[-1]["type"], cluster.events[-1]["reason"]) == ("Warning", "InvalidSpec")
    assert "spec.run.rollout.n" in cluster.events[-1]["message"]


def test_a_pass_that_raises_posts_a_warning() -> None:
    cluster = FakeCluster()

    def broken(obj: dict[str, Any]) -> dict[str, Any]:
        raise RuntimeError("admission webhook denied the request")

    cluster.apply = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        handlers.run_pass("periodic", _run(), _memo(cluster))
    (event,) = cluster.events
    assert (event["type"], event["reason"]) == ("Warning", "ReconcileError")
    assert "admission webhook" in event["message"]


def test_phase_event_rules() -> None:
    def st(phase: str | None, reason: str | None = None, message: str | None = None) -> TrainingRunStatus:
        return parse_status(
            {k: v for k, v in (("phase", phase), ("reason", reason), ("message", message)) if v}
        )

    assert phase_event(st("Running", "Running"), st("Running", "Running")) is None
    e = phase_event(st("Running", "Running"), st("Succeeded", "TrainingCompleted", "done"))
    assert e is not None and (e.type, e.reason, e.message) == (
        "Normal",
        "TrainingCompleted",
        "Running -> Succeeded: done",
    )
    e = phase_event(st("Running"), st("Failed", "TrainerFailed", "OOMKilled"))
    assert e is not None and e.type == "Warning" and e.reason == "TrainerFailed"
    e = phase_event(st("Failed", "NoRedis"), st("Failed", "KubeRayMissing"))  # still failed, new reason
    assert e is not None and e.reason == "KubeRayMissing"
    assert phase_event(st("Failed", "NoRedis"), st("Failed", "NoRedis")) is None
    e = phase_event(st(None), st("Pending", "WaitingForRollout"))
    assert e is not None and e.message.startswith("new -> Pending")


def test_event_manifest_is_a_valid_core_v1_event() -> None:
    ev = event_manifest(_run(), "Warning", "x" * 300, "m" * 5000, datetime(2026, 1, 1, tzinfo=UTC))
    assert len(ev["reason"]) == 128 and len(ev["message"]) == 1024
    assert ev["firstTimestamp"] == "2026-01-01T00:00:00Z" and ev["metadata"]["generateName"] == "tiny-math."
    kubernetes_validate.validate(ev, "1.33.0", strict=True)
    assert T0.year == 2026


def test_startup_task_reconciles_from_the_index_until_cleanup() -> None:
    """The handlers kopf calls on startup and cleanup, with the index kopf passes (a dict here)."""
    cluster = FakeCluster()
    memo = _memo(cluster)
    memo.interval_s, memo.initial_delay_s = 0.0, 0.0
    index = {("ml", "tiny-math"): [_run()]}

    async def main() -> None:
        await handlers._start_periodic(memo=memo, trainingruns=index)
        for _ in range(200):
            if cluster.status_patches:
                break
            await asyncio.sleep(0.02)
        await handlers._stop_periodic(memo=memo)
        with pytest.raises(asyncio.CancelledError):
            await memo.periodic_task

    asyncio.run(main())
    assert cluster.status_patches and cluster.status_patches[0][:2] == ("ml", "tiny-math")
    assert cluster.events and cluster.events[0]["reason"] == "Preparing"
