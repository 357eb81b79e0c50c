"""A per-run Redis (`spec.redis.managed`): StatefulSet with AOF on a PVC and a Service (its
NetworkPolicy is in network.py). It requires a password (`--requirepass`) from the run's
`{run}-redis-auth` Secret, which reconcile.py creates once with a random value; protected mode stays
on (Redis' default). Its AOF volume goes with the run: it holds rollout state that a restarted run
rebuilds (the trainer resumes from the workspace's checkpoints), not user data.

Its data set is capped at `MAXMEMORY_FRACTION` of the container's memory limit with `maxmemory-policy
noeviction`: past the cap Redis refuses writes (OOM), which every service waits out and reports
(`*_redis_full`), instead of the kernel OOM-killing Redis at the limit. The rest of the limit is
headroom Redis' `used_memory` does not count: allocator fragmentation, client buffers and the
copy-on-write pages of the AOF-rewrite child."""

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

MAXMEMORY_FRACTION = 0.75  # of the container's memory limit (the rest: see the module docstring)
_SUFFIX = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}  # fmt: skip


def quantity_bytes(quantity: str) -> int:
    """A Kubernetes memory quantity ("4Gi", "512Mi", "8G", "1073741824") in bytes."""
    digits = quantity.rstrip("kKMGTi")
    return int(float(digits) * _SUFFIX[quantity[len(digits) :]])


def maxmemory_bytes(memory_limit: str) -> int:
    return int(quantity_bytes(memory_limit) * MAXMEMORY_FRACTION)


def managed_redis(spec: TrainingRunSpec, ref: RunRef, defaults: OperatorDefaults) -> list[dict[str, Any]]:
    managed = spec.redis.managed
    if managed is None:
        return []
    res = resources(Resources(), CPU_DEFAULTS["redis"])
    args = [
        "redis-server",
        "--port", str(REDIS_PORT),
        "--dir", "/data",
        "--appendonly", "yes",
        "--appendfsync", "always",  # every acknowledged write durable (README, "Durability")
        "--save", "",
        # under the memory limit: Redis refuses writes (waited out by every service), never OOM-killed
        "--maxmemory", str(maxmemory_bytes(res["limits"]["memory"])),
        "--maxmemory-policy", "noeviction",
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
        "resources": res,
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
