"""How weights reach the gateways decides which pods mount the workspace, the access mode of its
PVC and who may talk to whom: `stream` (the default) needs no shared volume, `snapshot` keeps one."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from test_operator_desired import REF, _args, _container, _desired, _pods, _spec

from asyncdapo.services.operator.desired import Lifecycle, OperatorDefaults

TRAINER_WEIGHTS = "tiny-math-trainer.ml.svc:50070"
STORE = "/var/run/asyncdapo/weights"


def _no_modes(**edits: Any) -> dict[str, Any]:
    """The CPU example with the access modes left to the operator."""
    return _spec(storage__accessModes=None, **edits)


def _snapshot(**edits: Any) -> dict[str, Any]:
    spec = _no_modes(**edits)
    spec["run"]["trainer"]["weight_transport"] = "snapshot"
    return spec


def _mounts_workspace(pod: dict[str, Any]) -> bool:
    return any("persistentVolumeClaim" in v for v in pod["volumes"]) or any(
        m["name"] == "workspace" for c in pod["containers"] for m in c["volumeMounts"]
    )


def _memory_volume(pod: dict[str, Any], mount: str) -> dict[str, Any]:
    (c,) = pod["containers"]
    (m,) = [m for m in c["volumeMounts"] if m["mountPath"] == mount]
    (v,) = [v for v in pod["volumes"] if v["name"] == m["name"]]
    return v["emptyDir"]


def _ingress_from(policy: dict[str, Any], port: int) -> list[list[str]]:
    """For each rule admitting `port`: the run components it admits."""
    out = []
    for rule in policy["spec"]["ingress"]:
        if {"protocol": "TCP", "port": port} in rule.get("ports", []):
            out.append(
                [
                    v
                    for peer in rule["from"]
                    for e in peer["podSelector"]["matchExpressions"]
                    for v in e["values"]
                ]
            )
    return out


def test_stream_needs_the_workspace_on_the_trainer_only() -> None:
    objs = _desired(_no_modes())
    pvc = objs[("PersistentVolumeClaim", "tiny-math-workspace")]
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert _mounts_workspace(_pods(objs[("Job", "tiny-math-trainer")])[0])
    assert _mounts_workspace(_pods(objs[("Job", "tiny-math-prepare")])[0])
    for kind, name in (("StatefulSet", "tiny-math-gateway"), ("Deployment", "tiny-math-scheduler")):
        pod = _pods(objs[(kind, name)])[0]
        assert not _mounts_workspace(pod), name
        assert pod["containers"][0]["workingDir"] == "/tmp"  # writable without the workspace
    gw = _container(objs, "StatefulSet", "tiny-math-gateway")
    assert _args(gw)["--weights-from"] == TRAINER_WEIGHTS and _args(gw)["--weight-store-dir"] == STORE
    assert "--model" not in gw["args"] and "--no-weight-store" not in gw["args"]
    sched = _container(objs, "Deployment", "tiny-math-scheduler")
    assert _args(sched)["--tokenizer-from"] == TRAINER_WEIGHTS and "--tokenizer" not in sched["args"]


def test_the_trainer_serves_its_weights_from_memory_on_a_named_port() -> None:
    objs = _desired(_no_modes(weightStore={"sizeLimit": "40Gi"}))
    trainer = _container(objs, "Job", "tiny-math-trainer")
    assert _args(trainer)["--weight-store-listen"] == "0.0.0.0:50070"
    assert _args(trainer)["--weight-store-advertise"] == TRAINER_WEIGHTS
    assert {"name": "weights", "containerPort": 50070, "protocol": "TCP"} in trainer["ports"]
    svc = objs[("Service", "tiny-math-trainer")]["spec"]
    assert {"name": "weights", "port": 50070, "targetPort": 50070, "protocol": "TCP"} in svc["ports"]
    # the advertised host is that Service: it resolves to the trainer pod
    labels = objs[("Job", "tiny-math-trainer")]["spec"]["template"]["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in svc["selector"].items())
    # the store is memory, capped at spec.weightStore.sizeLimit, on the trainer and on each gateway
    for kind, name in (("Job", "tiny-math-trainer"), ("StatefulSet", "tiny-math-gateway")):
        assert _memory_volume(_pods(objs[(kind, name)])[0], STORE) == {
            "medium": "Memory",
            "sizeLimit": "40Gi",
        }
    run = yaml.safe_load(objs[("ConfigMap", "tiny-math-config")]["data"]["run.yaml"])
    assert run["trainer"]["weight_store_dir"] == STORE and run["trainer"]["weight_transport"] == "stream"
    default = _desired(_no_modes())
    assert _memory_volume(_pods(default[("Job", "tiny-math-trainer")])[0], STORE)["sizeLimit"] == "64Gi"


def test_a_weight_store_dir_the_user_gave_is_kept() -> None:
    spec = _no_modes()
    spec["run"]["trainer"]["weight_store_dir"] = "checkpoints/store"  # e.g. on the workspace, not memory
    objs = _desired(spec)
    run = yaml.safe_load(objs[("ConfigMap", "tiny-math-config")]["data"]["run.yaml"])
    assert run["trainer"]["weight_store_dir"] == "checkpoints/store"
    trainer = _pods(objs[("Job", "tiny-math-trainer")])[0]
    assert not any(
        v.get("emptyDir", {}).get("medium") == "Memory" and v["name"] == "weights" for v in trainer["volumes"]
    )
    assert _args(trainer["containers"][0])["--weight-store-listen"] == "0.0.0.0:50070"  # still served


def test_stream_network_policies_admit_weight_traffic_and_nothing_more() -> None:
    objs = _desired(_no_modes())
    # gateways pull chunks from each other (the scheduler names the peer) on their gRPC port
    assert _ingress_from(objs[("NetworkPolicy", "tiny-math-gateway")], 50051) == [
        ["scheduler", "trainer", "gateway"]
    ]
    # the trainer's weight store: gateways (weights) and the scheduler (tokenizer), no one else
    assert _ingress_from(objs[("NetworkPolicy", "tiny-math-trainer")], 50070) == [["gateway", "scheduler"]]
    snap = _desired(_snapshot())
    assert _ingress_from(snap[("NetworkPolicy", "tiny-math-gateway")], 50051) == [["scheduler", "trainer"]]
    assert _ingress_from(snap[("NetworkPolicy", "tiny-math-trainer")], 50070) == []


def test_snapshot_keeps_the_shared_workspace() -> None:
    objs = _desired(_snapshot())
    assert objs[("PersistentVolumeClaim", "tiny-math-workspace")]["spec"]["accessModes"] == ["ReadWriteMany"]
    for kind, name in (
        ("StatefulSet", "tiny-math-gateway"),
        ("Deployment", "tiny-math-scheduler"),
        ("Job", "tiny-math-trainer"),
    ):
        pod = _pods(objs[(kind, name)])[0]
        assert _mounts_workspace(pod) and pod["containers"][0]["workingDir"] == "/workspace", name
    gw = _container(objs, "StatefulSet", "tiny-math-gateway")
    assert _args(gw)["--model"] == "runs/cache/tiny-model-sft" and "--no-weight-store" in gw["args"]
    assert "--weights-from" not in gw["args"]
    assert not any(m["mountPath"] == STORE for m in gw["volumeMounts"])
    assert "--tokenizer-from" not in _container(objs, "Deployment", "tiny-math-scheduler")["args"]
    trainer = _container(objs, "Job", "tiny-math-trainer")
    assert "--weight-store-listen" not in trainer["args"]
    assert [p["name"] for p in trainer["ports"]] == ["metrics"]
    assert [p["name"] for p in objs[("Service", "tiny-math-trainer")]["spec"]["ports"]] == ["metrics"]
    run = yaml.safe_load(objs[("ConfigMap", "tiny-math-config")]["data"]["run.yaml"])
    assert run["trainer"]["weight_store_dir"] == ""


@pytest.mark.parametrize(
    ("edits", "modes"),
    [
        ({}, ["ReadWriteOnce"]),
        ({"run__trainer__workers": 2}, ["ReadWriteMany"]),  # Ray workers on several nodes
        ({"storage__accessModes": ["ReadWriteOncePod"]}, ["ReadWriteOncePod"]),  # as given
        # switched on at any time, so it does not change the PVC (whose modes are immutable)
        ({"scheduler__responseLog": True}, ["ReadWriteOnce"]),
    ],
)
def test_the_default_access_mode_follows_who_mounts_the_workspace(
    edits: dict[str, Any], modes: list[str]
) -> None:
    spec = _spec(**{"storage__accessModes": None, **edits})
    objs = _desired(spec, defaults=OperatorDefaults(redis_url="redis://r:6379/0", kuberay=True))
    assert objs[("PersistentVolumeClaim", "tiny-math-workspace")]["spec"]["accessModes"] == modes


def test_the_response_log_brings_the_workspace_back_to_the_scheduler_only() -> None:
    objs = _desired(_no_modes(scheduler__responseLog=True))
    sched = _pods(objs[("Deployment", "tiny-math-scheduler")])[0]
    assert _mounts_workspace(sched) and sched["containers"][0]["workingDir"] == "/workspace"
    assert "--tokenizer-from" in sched["containers"][0]["args"]  # the tokenizer still from the trainer
    assert not _mounts_workspace(_pods(objs[("StatefulSet", "tiny-math-gateway")])[0])


def test_ray_workers_each_can_serve_the_weights() -> None:
    spec = _no_modes(run__trainer__workers=2)
    objs = _desired(
        spec, Lifecycle.RUNNING, REF, OperatorDefaults(redis_url="redis://r:6379/0", kuberay=True)
    )
    ray = objs[("RayJob", "tiny-math-trainer")]
    cluster = ray["spec"]["rayClusterSpec"]
    worker = cluster["workerGroupSpecs"][0]["template"]["spec"]
    head = cluster["headGroupSpec"]["template"]["spec"]
    # rank 0 runs on some worker pod: each has the port and the store; the head (driver) has neither
    assert {"name": "weights", "containerPort": 50070, "protocol": "TCP"} in worker["containers"][0]["ports"]
    assert _memory_volume(worker, STORE)["medium"] == "Memory"
    assert not any(m["mountPath"] == STORE for m in head["containers"][0]["volumeMounts"])
    assert "--weight-store-advertise tiny-math-trainer.ml.svc:50070" in ray["spec"]["entrypoint"]
