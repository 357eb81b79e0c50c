"""Reconcile passes of the operator against an in-memory API server.

FakeCluster is a fake, labelled as such: no Kubernetes API server can run here. It keeps what a
real one would for these tests — objects by key, server-side apply replacing the applied fields
but keeping status, Job templates immutable, ownerReference garbage collection on delete.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import required
import yaml

from asyncdapo.services.operator.desired import OperatorDefaults
from asyncdapo.services.operator.kube import ImmutableFieldError, owned_by
from asyncdapo.services.operator.reconcile import reconcile, status_patch
from asyncdapo.services.operator.resource_status import Phase
from asyncdapo.services.operator.status_machine import Progress

REPO = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 1, 1, tzinfo=UTC)
UID = "7d0f-run-uid"

Key = tuple[str, str, str, str]


class FakeCluster:
    """In-memory stand-in for the API server (fake: no cluster here)."""

    def __init__(self, kuberay: bool = False) -> None:
        self.objects: dict[Key, dict[str, Any]] = {}
        self.kuberay = kuberay
        self.applies = 0
        self.creates: list[Key] = []
        self.events: list[dict[str, Any]] = []
        self.status_patches: list[tuple[str, str, dict[str, Any]]] = []

    @staticmethod
    def key(obj: dict[str, Any]) -> Key:
        m = obj["metadata"]
        return obj["apiVersion"], obj["kind"], m.get("namespace", ""), m["name"]

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.applies += 1
        k = self.key(obj)
        old = self.objects.get(k)
        if old is not None and obj["kind"] == "Job" and old["spec"]["template"] != obj["spec"]["template"]:
            raise ImmutableFieldError(f"Job {k[3]}: spec.template: field is immutable")
        new = copy.deepcopy(obj)
        if old is not None and "status" in old:
            new["status"] = old["status"]
        self.objects[k] = new
        return new

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.objects.get((api_version, kind, namespace, name)))

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> None:
        obj = self.objects.pop((api_version, kind, namespace, name), None)
        uid = (obj or {}).get("metadata", {}).get("uid")
        if uid:  # garbage collection of dependents
            for k in [k for k, o in self.objects.items() if owned_by(o, uid)]:
                self.delete(*k)

    def create_if_absent(self, obj: dict[str, Any]) -> None:
        k = self.key(obj)
        if k not in self.objects:
            self.creates.append(k)
            self.objects[k] = copy.deepcopy(obj)

    def list_labelled(
        self, api_version: str, kind: str, namespace: str, selector: str
    ) -> list[dict[str, Any]]:
        label, value = selector.split("=")
        return [
            copy.deepcopy(o)
            for (a, k, ns, _), o in self.objects.items()
            if (a, k, ns) == (api_version, kind, namespace)
            and o["metadata"].get("labels", {}).get(label) == value
        ]

    def serves(self, api_version: str, kind: str) -> bool:
        return kind != "RayJob" or self.kuberay

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.status_patches.append((namespace, name, copy.deepcopy(status)))

    def post_event(self, event: dict[str, Any]) -> None:
        self.events.append(copy.deepcopy(event))

    # --- test helpers: what controllers and kubelets would do ---

    def set_status(self, kind: str, name: str, status: dict[str, Any]) -> None:
        for k, o in self.objects.items():
            if k[1] == kind and k[3] == name:
                o["status"] = status
                return
        raise KeyError((kind, name))

    def names(self, kind: str) -> set[str]:
        return {k[3] for k in self.objects if k[1] == kind}

    def obj(self, kind: str, name: str) -> dict[str, Any]:
        return next(o for k, o in self.objects.items() if k[1] == kind and k[3] == name)

    def bring_up(self, run: str) -> None:
        """Every workload becomes ready; the trainer Job gets an active pod."""
        for kind, comp in (
            ("Deployment", "scheduler"),
            ("StatefulSet", "gateway"),
            ("Deployment", "verifier"),
        ):
            if f"{run}-{comp}" in self.names(kind):
                replicas = self.obj(kind, f"{run}-{comp}")["spec"].get("replicas", 1)
                self.set_status(kind, f"{run}-{comp}", {"readyReplicas": replicas})
        if f"{run}-redis" in self.names("StatefulSet"):
            self.set_status("StatefulSet", f"{run}-redis", {"readyReplicas": 1})
        self.set_status("Job", f"{run}-trainer", {"active": 1})


def _run(generation: int = 1, status: dict[str, Any] | None = None, **spec_changes: Any) -> dict[str, Any]:
    body = yaml.safe_load((REPO / "deploy" / "k8s" / "examples" / "tiny-math-cpu.yaml").read_text())
    body["metadata"].update({"namespace": "ml", "uid": UID, "generation": generation})
    body["spec"].update(spec_changes)
    if status is not None:
        body["status"] = status
    return body


DEFAULTS = OperatorDefaults()


def _pass(
    cluster: FakeCluster, body: dict[str, Any], now: datetime, progress: Progress | None = None
) -> dict:
    status = reconcile(body, cluster, DEFAULTS, lambda run, ns: progress or Progress(), now)
    return status_patch(status)


def test_create_prepare_then_run_then_succeed() -> None:
    cluster = FakeCluster()
    status = _pass(cluster, _run(), T0)
    assert status["phase"] == "Preparing"
    assert cluster.names("Job") == {"tiny-math-prepare"}
    # the run's token, and the managed Redis' password (generated once, read by its clients)
    assert cluster.names("Secret") == {"tiny-math-token", "tiny-math-redis-auth"}
    assert "tiny-math-gateway" not in cluster.names("StatefulSet")

    cluster.set_status("Job", "tiny-math-prepare", {"conditions": [{"type": "Complete", "status": "True"}]})
    status = _pass(cluster, _run(status=status), T0 + timedelta(minutes=1))
    # The same pass that saw the prepare Job finish created the rollout and the trainer.
    assert {"tiny-math-gateway", "tiny-math-redis"} <= cluster.names("StatefulSet")
    assert cluster.names("Job") == {"tiny-math-prepare", "tiny-math-trainer"}
    assert status["phase"] == "Pending" and status["reason"] == "WaitingForRollout"

    cluster.bring_up("tiny-math")
    progress = Progress(step=4, policy_version=4, reward=0.3, valid_groups=40)
    status = _pass(cluster, _run(status=status), T0 + timedelta(minutes=2), progress)
    assert status["phase"] == "Running" and status["step"] == 4 and status["validGroups"] == 40
    assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "True"

    cluster.set_status("Job", "tiny-math-trainer", {"conditions": [{"type": "Complete", "status": "True"}]})
    status = _pass(cluster, _run(status=status), T0 + timedelta(hours=1))
    assert status["phase"] == "Succeeded" and status["step"] == 20
    # GPUs (here: CPUs) are released in the same pass; the records stay.
    assert cluster.obj("StatefulSet", "tiny-math-gateway")["spec"]["replicas"] == 0
    assert cluster.obj("Deployment", "tiny-math-scheduler")["spec"]["replicas"] == 0
    assert "tiny-math-trainer" in cluster.names("Job")


def test_reconcile_is_idempotent_and_never_rotates_the_token() -> None:
    cluster = FakeCluster()
    status = _pass(cluster, _run(), T0)
    cluster.set_status("Job", "tiny-math-prepare", {"conditions": [{"type": "Complete", "status": "True"}]})
    status = _pass(cluster, _run(status=status), T0)
    cluster.bring_up("tiny-math")
    status = _pass(cluster, _run(status=status), T0)
    snapshot = copy.deepcopy(cluster.objects)
    token = cluster.obj("Secret", "tiny-math-token")["stringData"]["token"]
    password = cluster.obj("Secret", "tiny-math-redis-auth")["stringData"]["password"]
    again = _pass(cluster, _run(status=status), T0)
    assert again == status
    assert cluster.objects == snapshot
    assert cluster.obj("Secret", "tiny-math-token")["stringData"]["token"] == token
    assert cluster.obj("Secret", "tiny-math-redis-auth")["stringData"]["password"] == password
    assert len(cluster.creates) == 2 and len(password) >= 32


def _running(cluster: FakeCluster) -> dict[str, Any]:
    status = _pass(cluster, _run(), T0)
    cluster.set_status("Job", "tiny-math-prepare", {"conditions": [{"type": "Complete", "status": "True"}]})
    status = _pass(cluster, _run(status=status), T0)
    cluster.bring_up("tiny-math")
    status = _pass(cluster, _run(status=status), T0)
    assert status["phase"] == "Running"
    return status


def test_suspend_scales_to_zero_and_resume_brings_it_back() -> None:
    cluster = FakeCluster()
    status = _running(cluster)
    status = _pass(cluster, _run(generation=2, status=status, suspend=True), T0 + timedelta(minutes=5))
    assert status["phase"] == "Suspended" and status["observedGeneration"] == 2
    assert cluster.obj("StatefulSet", "tiny-math-gateway")["spec"]["replicas"] == 0
    assert cluster.obj("Deployment", "tiny-math-scheduler")["spec"]["replicas"] == 0
    assert cluster.obj("Job", "tiny-math-trainer")["spec"]["suspend"] is True
    assert "tiny-math-redis" in cluster.names("StatefulSet")  # state is kept

    status = _pass(cluster, _run(generation=3, status=status, suspend=False), T0 + timedelta(minutes=9))
    assert cluster.obj("StatefulSet", "tiny-math-gateway")["spec"]["replicas"] == 1
    assert cluster.obj("Job", "tiny-math-trainer")["spec"]["suspend"] is False
    assert status["phase"] in ("Running", "Pending")


def test_spec_change_prunes_what_is_no_longer_desired() -> None:
    cluster = FakeCluster()
    status = _running(cluster)
    assert "tiny-math-verifier" in cluster.names("Deployment")
    shared = {"url": "http://asyncdapo-verifier.asyncdapo.svc:8080"}
    _pass(cluster, _run(generation=2, status=status, verifier=shared), T0)
    assert "tiny-math-verifier" not in cluster.names("Deployment")
    assert "tiny-math-verifier" not in cluster.names("Service")
    assert "tiny-math-verifier" not in cluster.names("NetworkPolicy")
    # Objects that merely carry the label but belong to someone else are left alone.
    cluster.objects[("v1", "ConfigMap", "ml", "user-notes")] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "user-notes", "namespace": "ml", "labels": {"asyncdapo.io/run": "tiny-math"}},
    }
    _pass(cluster, _run(generation=2, status=status, verifier=shared), T0)
    assert "user-notes" in cluster.names("ConfigMap")


def test_changed_job_template_replaces_the_job() -> None:
    cluster = FakeCluster()
    status = _running(cluster)
    images = {"cpu": "registry.example/asyncdapo-cpu:0.2.0"}
    _pass(cluster, _run(generation=2, status=status, images=images), T0)
    assert "tiny-math-trainer" not in cluster.names("Job")  # deleted: its template is immutable
    _pass(cluster, _run(generation=2, status=status, images=images), T0)
    trainer = cluster.obj("Job", "tiny-math-trainer")
    assert trainer["spec"]["template"]["spec"]["containers"][0]["image"] == images["cpu"]


def test_invalid_spec_is_reported_and_creates_nothing() -> None:
    cluster = FakeCluster()
    body = _run()
    body["spec"]["run"]["rollout"]["n"] = 0
    status = _pass(cluster, body, T0)
    assert status["phase"] == "Failed" and status["reason"] == "InvalidSpec"
    assert "spec.run.rollout.n" in status["message"]
    assert cluster.objects == {}


def test_invalid_spec_names_every_problem_in_the_configs_one_style() -> None:
    cluster = FakeCluster()
    body = _run()
    body["spec"]["run"]["rollout"]["n"] = 0
    body["spec"]["run"]["rollout"]["temprature"] = 0.7
    body["spec"]["gateway"] = {**body["spec"].get("gateway", {}), "replicsa": 2}
    body["spec"]["storage"]["size"] = "lots"
    status = _pass(cluster, body, T0)
    assert status["reason"] == "InvalidSpec"
    assert set(status["message"].splitlines()) == {
        "spec.run.rollout.n: 0 given; must be >= 1",
        "spec.run.rollout.temprature: unknown key; did you mean spec.run.rollout.temperature?",
        "spec.gateway.replicsa: unknown key; did you mean spec.gateway.replicas?",
        "spec.storage.size: 'lots' given; must be a Kubernetes quantity such as 4, 500m or 32Gi",
    }
    one = _run()
    one["spec"]["run"]["rollout"]["n"] = 1  # impossible with dynamic sampling: refused like `config check`
    message = _pass(FakeCluster(), one, T0)["message"]
    assert message.startswith("spec.run.rollout.n: 1 given; must be >= 2 with reward.filter_groups")
    assert cluster.objects == {}


def test_several_workers_without_kuberay_waits_for_kuberay() -> None:
    cluster = FakeCluster(kuberay=False)
    body = _run()
    del body["spec"]["prepare"]
    body["spec"]["run"]["trainer"]["workers"] = 2
    status = _pass(cluster, body, T0)
    assert status["phase"] == "Failed" and status["reason"] == "KubeRayMissing"
    assert "completionTime" not in status  # not terminal: installing KubeRay lets it proceed


def _delete_run(cluster: FakeCluster) -> None:
    owner = {
        "apiVersion": "asyncdapo.io/v1alpha1",
        "kind": "TrainingRun",
        "metadata": {"name": "tiny-math", "namespace": "ml", "uid": UID},
    }
    cluster.objects[FakeCluster.key(owner)] = owner
    assert len(cluster.objects) > 15
    cluster.delete("asyncdapo.io/v1alpha1", "TrainingRun", "ml", "tiny-math")


def test_delete_garbage_collects_every_child_but_keeps_the_workspace() -> None:
    cluster = FakeCluster()
    _running(cluster)
    _delete_run(cluster)
    # storage.retain (default true): model, data and checkpoints outlive the run
    assert list(cluster.objects) == [("v1", "PersistentVolumeClaim", "ml", "tiny-math-workspace")]
    pvc = cluster.obj("PersistentVolumeClaim", "tiny-math-workspace")
    assert pvc["metadata"]["annotations"]["asyncdapo.io/retained-from"] == "ml/tiny-math"
    # a run created again under the same name adopts it (server-side apply, same field manager)
    status = _pass(cluster, _run(), T0)
    assert status["phase"] == "Preparing" and "tiny-math-workspace" in cluster.names("PersistentVolumeClaim")


def test_retain_false_deletes_the_workspace_with_the_run() -> None:
    cluster = FakeCluster()
    status = _running(cluster)
    _pass(cluster, _run(generation=2, status=status, storage={"size": "2Gi", "accessModes": ["ReadWriteOnce"],
                                                                "retain": False}), T0)  # fmt: skip
    assert owned_by(cluster.obj("PersistentVolumeClaim", "tiny-math-workspace"), UID)
    _delete_run(cluster)
    assert cluster.objects == {}


def test_deletion_needs_no_finalizer() -> None:
    """See tests/unit/test_operator_handlers.py for the whole kopf registry."""
    kopf = required.module("kopf")
    from asyncdapo.services.operator import handlers

    registry = kopf.get_default_registry()
    deletion = [h for h in registry._changing.get_all_handlers() if h.fn is handlers.on_delete]
    assert deletion and all(h.requires_finalizer is False for h in deletion)
    names = {h.fn.__name__ for h in registry._changing.get_all_handlers()}
    assert {"on_create", "on_update", "on_resume", "on_delete"} <= names
    assert registry._spawning.get_all_handlers() == []  # no timer, no daemon: they need finalizers
    assert Phase.RUNNING.value == "Running"
