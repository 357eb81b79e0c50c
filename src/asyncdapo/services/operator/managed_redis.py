"""A per-run Redis (`spec.redis.managed`): StatefulSet with AOF on a PVC and a Service (its
NetworkPolicy is in network.py). It requires a password (`--requirepass`) from the run's
`{run}-redis-auth` Secret, which reconcile.py creates once with a random value; protected mode stays
on (Redis' default). Its AOF volume goes with the run: it holds rollout state that a restarted run
rebuilds (the trainer resumes from the workspace's checkpoints), not user data."""

from __future__ import annotations

from typing import Any

from asyncdapo.services.operator.objects import (
    CPU_DEFAULTS,
    OperatorDefaults,
    RunRef,
    meta,
    pull_policy,
    redis_env,
    service,
)
from asyncdapo.services.operator.pods import (
    REDIS_PASSWORD_ENV,
    REDIS_PORT,
    UID,
    container_security,
    labels,
    pod_identity,
    resources,
    selector,
    template_metadata,
)
from asyncdapo.services.operator.spec import Resources, TrainingRunSpec


def managed_redis(spec: TrainingRunSpec, ref: RunRef, defaults: OperatorDefaults) -> list[dict[str, Any]]:
    managed = spec.redis.managed
    if managed is None:
        return []
    args = [
        "redis-server",
        "--port", str(REDIS_PORT),
        "--dir", "/data",
        "--appendonly", "yes",
        "--appendfsync", "always",  # every acknowledged write durable (README, "Durability")
        "--save", "",
        # $(VAR) is expanded by the kubelet; the NetworkPolicy admits this run's clients only.
        "--requirepass", f"$({REDIS_PASSWORD_ENV})",
    ]  # fmt: skip
    tcp = {"tcpSocket": {"port": REDIS_PORT}}
    container = {
        "name": "redis",
        "image": managed.image or defaults.redis_image,
        "imagePullPolicy": pull_policy(spec, defaults),
        "command": args[:1],
        "args": args[1:],
        "env": redis_env(spec, ref, defaults),
        "ports": [{"name": "redis", "containerPort": REDIS_PORT, "protocol": "TCP"}],
        "resources": resources(Resources(), CPU_DEFAULTS["redis"]),
        "securityContext": container_security(),
        "volumeMounts": [{"name": "data", "mountPath": "/data"}, {"name": "tmp", "mountPath": "/tmp"}],
        "readinessProbe": {**tcp, "periodSeconds": 5},
        "livenessProbe": {**tcp, "periodSeconds": 20, "failureThreshold": 6},
    }
    pvc_spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": managed.size}},
    }
    if managed.storage_class_name:
        pvc_spec["storageClassName"] = managed.storage_class_name
    sts = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": meta(ref, f"{ref.name}-redis", "redis"),
        "spec": {
            "replicas": 1,
            "serviceName": f"{ref.name}-redis",
            "selector": {"matchLabels": selector(ref.name, "redis")},
            "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Delete", "whenScaled": "Retain"},
            "template": {
                "metadata": template_metadata(spec, ref.name, "redis"),
                "spec": {
                    **pod_identity(spec),
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": UID,
                        "runAsGroup": UID,
                        "fsGroup": UID,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [container],
                    "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}}],
                },
            },
            "volumeClaimTemplates": [
                {"metadata": {"name": "data", "labels": labels(ref.name, "redis")}, "spec": pvc_spec}
            ],
        },
    }
    svc = service(ref, "redis", [("redis", REDIS_PORT, REDIS_PORT)])
    return [sts, svc]
