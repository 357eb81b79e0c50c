"""Shared pieces of the desired state: the run's identity, operator defaults, lifecycle, object
metadata with the owner reference, service/container builders and the URLs pods use.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import yaml

from .pods import GRPC_PORT, REDIS_PORT, VERIFIER_PORT, container_security, labels, selector
from .spec import API_GROUP, API_VERSION, KIND, TrainingRunSpec


class Lifecycle(StrEnum):
    PREPARING = "preparing"  # only the prepare Job (and what it needs) exists
    RUNNING = "running"
    SUSPENDED = "suspended"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


@dataclass(frozen=True)
class OperatorDefaults:
    """Cluster-wide settings of the operator (from the Helm chart), used where a spec is silent."""

    cpu_image: str = "ghcr.io/asyncdapo/asyncdapo-cpu:0.1.0"
    gpu_image: str = "ghcr.io/asyncdapo/asyncdapo-gpu:0.1.0"
    redis_image: str = "redis:7.4-alpine"
    pull_policy: str = "IfNotPresent"
    redis_url: str | None = None
    monitoring_namespace: str = "monitoring"  # may reach a dedicated verifier's /metrics
    kuberay: bool = False  # is the ray.io/v1 RayJob API served?


@dataclass(frozen=True)
class RunRef:
    """The TrainingRun object's identity."""

    name: str
    namespace: str
    uid: str


class DesiredStateError(ValueError):
    """The spec cannot be realised as it stands; `reason` is a CamelCase status reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


# --- helpers ---


def owner_reference(ref: RunRef) -> dict[str, Any]:
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": KIND,
        "name": ref.name,
        "uid": ref.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def meta(ref: RunRef, name: str, component: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": ref.namespace,
        "labels": labels(ref.name, component),
        "ownerReferences": [owner_reference(ref)],
    }
    if annotations:
        meta["annotations"] = annotations
    return meta


def config_yaml(spec: TrainingRunSpec) -> str:
    """The RunConfig every service loads with `--config` (all defaults made explicit)."""
    return yaml.safe_dump(spec.run.model_dump(mode="json"), sort_keys=False)


def config_hash(spec: TrainingRunSpec) -> str:
    return hashlib.sha256(config_yaml(spec).encode()).hexdigest()[:16]


def image(spec: TrainingRunSpec, defaults: OperatorDefaults, gpu: bool) -> str:
    if gpu:
        return spec.images.gpu or defaults.gpu_image
    return spec.images.cpu or defaults.cpu_image


def pull_policy(spec: TrainingRunSpec, defaults: OperatorDefaults) -> str:
    return spec.images.pull_policy.value if spec.images.pull_policy else defaults.pull_policy


def svc_host(ref: RunRef, component: str) -> str:
    return f"{ref.name}-{component}.{ref.namespace}.svc"


def redis_url(spec: TrainingRunSpec, ref: RunRef, defaults: OperatorDefaults, *, shell: bool = False) -> str:
    """The run's Redis URL as the pods see it; a password from a Secret is spliced in as the
    `REDIS_PASSWORD` env var (`$(VAR)` is expanded by the kubelet in args, `${VAR}` by a shell)."""
    r = spec.redis
    if r.managed is not None:
        url = f"redis://{svc_host(ref, 'redis')}:{REDIS_PORT}/0"
    elif r.url is not None:
        url = r.url
    elif defaults.redis_url:
        url = defaults.redis_url
    else:
        raise DesiredStateError(
            "NoRedis",
            "spec.redis: set url or managed; this operator has no default Redis "
            "(install the chart with redis.enabled=true or redis.external.url)",
        )
    if r.password_secret_ref is None:
        return url
    parts = urlsplit(url)
    if "@" in parts.netloc:
        raise DesiredStateError(
            "InvalidSpec", "spec.redis.url must not carry credentials when passwordSecretRef is set"
        )
    var = "${REDIS_PASSWORD}" if shell else "$(REDIS_PASSWORD)"
    return urlunsplit(parts._replace(netloc=f":{var}@{parts.netloc}"))


def redis_env(spec: TrainingRunSpec) -> list[dict[str, Any]]:
    ref = spec.redis.password_secret_ref
    if ref is None:
        return []
    return [{"name": "REDIS_PASSWORD", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}]


def client_env(spec: TrainingRunSpec) -> list[dict[str, Any]]:
    """Env of Redis clients (scheduler, trainer): the password for `$(REDIS_PASSWORD)` in their args."""
    return redis_env(spec)


def verifier_url(spec: TrainingRunSpec, ref: RunRef) -> str:
    return spec.verifier.url or f"http://{svc_host(ref, 'verifier')}:{VERIFIER_PORT}"


def grpc_probe(**extra: int) -> dict[str, Any]:
    return {"grpc": {"port": GRPC_PORT}, **extra}


def service(
    ref: RunRef, component: str, ports: list[tuple[str, int, int]], *, headless: bool = False
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "selector": selector(ref.name, component),
        "ports": [{"name": n, "port": p, "targetPort": t, "protocol": "TCP"} for n, p, t in ports],
    }
    if headless:
        spec["clusterIP"] = "None"
        spec["publishNotReadyAddresses"] = False
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta(ref, f"{ref.name}-{component}", component),
        "spec": spec,
    }


def make_container(
    name: str,
    image: str,
    pull_policy: str,
    args: list[str],
    *,
    env_vars: list[dict[str, Any]],
    mounts: list[dict[str, Any]],
    res: dict[str, Any],
    working_dir: str,
    ports: list[tuple[str, int]] = (),
    uid: int | None = None,
    **probes: dict[str, Any],
) -> dict[str, Any]:
    c: dict[str, Any] = {
        "name": name,
        "image": image,
        "imagePullPolicy": pull_policy,
        "args": args,
        "workingDir": working_dir,
        "env": env_vars,
        "resources": res,
        "securityContext": container_security(uid) if uid is not None else container_security(),
        "volumeMounts": mounts,
    }
    if ports:
        c["ports"] = [{"name": n, "containerPort": p, "protocol": "TCP"} for n, p in ports]
    c.update({k: v for k, v in probes.items() if v})
    return c


# --- components ---

CPU_DEFAULTS = {
    "scheduler": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "2Gi"}},
    "verifier": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "2Gi"}},
    "prepare": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}},
    "redis": {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"cpu": "1", "memory": "4Gi"}},
    "ray-head": {"requests": {"cpu": "1", "memory": "4Gi"}, "limits": {"cpu": "4", "memory": "8Gi"}},
}
GPU_POD_DEFAULTS = {"requests": {"cpu": "8", "memory": "64Gi"}, "limits": {"cpu": "16", "memory": "128Gi"}}
CPU_POD_DEFAULTS = {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"cpu": "4", "memory": "8Gi"}}
