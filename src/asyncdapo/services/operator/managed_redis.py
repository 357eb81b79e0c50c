"""A per-run Redis (`spec.redis.managed`): StatefulSet with AOF on a PVC and a Service (its
NetworkPolicy is in network.py). It requires a password (`requirepass`) from the run's Secret
(`{run}-redis-auth`, which reconcile.py creates once with a random value, or spec.redis's
passwordSecretRef); protected mode stays on (Redis' default). The password never appears in a command
line or an env value (`ps`, the pod spec, /proc/*/environ): an init container reads it from the Secret
mounted as a file and writes a config file into a memory-backed emptyDir, which redis-server loads
first (`AUTH_SCRIPT`; the chart's Redis runs the same script). Its AOF volume goes with the run: it holds rollout state that a restarted run
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
    redis_password_ref,
    service,
)
from asyncdapo.services.operator.pods import (
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

# The init container's script (`sh -c AUTH_SCRIPT redis-auth PASSWORD_FILE CONFIG_FILE`): every byte of
# the password hex-escaped inside double quotes, which Redis' config parser reads back exactly (quotes,
# spaces, backslashes, newlines included); the file readable by its owner only (the same UID runs
# redis-server). An empty password would turn authentication off, so it fails the pod instead.
AUTH_SCRIPT = r"""set -eu
umask 0377
rm -f "$2"
[ -s "$1" ] || { echo "redis-auth: the Redis password ($1, from its Secret) is empty or missing" >&2; exit 1; }
hex=$(od -An -v -tx1 "$1" | tr -d ' \n')
printf 'requirepass "%s"\n' "$(printf '%s' "$hex" | sed 's/../\\x&/g')" > "$2"
"""
AUTH_CONF = "/run/redis/auth.conf"
PASSWORD_FILE = "/run/secrets/redis/password"
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
        AUTH_CONF,  # requirepass (see AUTH_SCRIPT), loaded before the options below
        "--port", str(REDIS_PORT),
        "--dir", "/data",
        "--appendonly", "yes",
        "--appendfsync", "always",  # every acknowledged write durable (README, "Durability")
        "--save", "",
        # under the memory limit: Redis refuses writes (waited out by every service), never OOM-killed
        "--maxmemory", str(maxmemory_bytes(res["limits"]["memory"])),
        "--maxmemory-policy", "noeviction",
    ]  # fmt: skip
    # A managed Redis always has a password: the run's generated one or passwordSecretRef.
    secret = redis_password_ref(spec, ref, defaults)
    assert secret is not None
    image = managed.image or defaults.redis_image
    auth_init = {
        "name": "redis-auth",
        "image": image,
        "imagePullPolicy": pull_policy(spec, defaults),
        "command": ["sh", "-c", AUTH_SCRIPT, "redis-auth", PASSWORD_FILE, AUTH_CONF],
        "resources": {
            "requests": {"cpu": "10m", "memory": "16Mi"},
            "limits": {"cpu": "100m", "memory": "32Mi"},
        },
        "securityContext": container_security(),
        "volumeMounts": [
            {"name": "redis-password", "mountPath": PASSWORD_FILE.rsplit("/", 1)[0], "readOnly": True},
            {"name": "redis-auth", "mountPath": AUTH_CONF.rsplit("/", 1)[0]},
        ],
    }
    tcp = {"tcpSocket": {"port": REDIS_PORT}}
    container = {
        "name": "redis",
        "image": image,
        "imagePullPolicy": pull_policy(spec, defaults),
        "command": args[:1],
        "args": args[1:],
        "ports": [{"name": "redis", "containerPort": REDIS_PORT, "protocol": "TCP"}],
        "resources": res,
        "securityContext": container_security(),
        "volumeMounts": [
            {"name": "data", "mountPath": "/data"},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "redis-auth", "mountPath": AUTH_CONF.rsplit("/", 1)[0], "readOnly": True},
        ],
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
                    "initContainers": [auth_init],
                    "containers": [container],
                    "volumes": [
                        {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
                        {
                            "name": "redis-password",
                            "secret": {
                                "secretName": secret["name"],
                                "items": [{"key": secret["key"], "path": PASSWORD_FILE.rsplit("/", 1)[1]}],
                                "defaultMode": 0o440,  # group: fsGroup, the UID's own group
                            },
                        },
                        # memory-backed: the password never reaches the node's disk
                        {"name": "redis-auth", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
                    ],
                },
            },
            "volumeClaimTemplates": [
                {"metadata": {"name": "data", "labels": labels(ref.name, "redis")}, "spec": pvc_spec}
            ],
        },
    }
    svc = service(ref, "redis", [("redis", REDIS_PORT, REDIS_PORT)])
    return [sts, svc]
