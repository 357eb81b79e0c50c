"""Shared pieces of the desired state: the run's identity, operator defaults, lifecycle, object
metadata with the owner reference, service/container builders and the URLs pods use.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit

import yaml

from asyncdapo.contracts.config import WeightTransport
from asyncdapo.services.operator.pod_settings import DEFAULT_MONITORING_SELECTOR
from asyncdapo.services.operator.pods import (
    GRPC_PORT,
    REDIS_PASSWORD_ENV,
    REDIS_PORT,
    VERIFIER_PORT,
    WEIGHT_STORE_DIR,
    WEIGHTS_PORT,
    container_security,
    labels,
    selector,
)
from asyncdapo.services.operator.spec import API_GROUP, API_VERSION, KIND, TrainingRunSpec

# TrainingRun labels and annotations copied onto the run's GPU workloads (trainer Job / RayJob,
# gateway StatefulSet): Kueue admits those by `kueue.x-k8s.io/queue-name` (and priority-class).
PROPAGATED_PREFIXES = ("kueue.x-k8s.io/",)
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
# Annotation on a workspace PVC the operator created and keeps after the run is deleted.
RETAINED_ANNOTATION = "asyncdapo.io/retained-from"
REDIS_AUTH_KEY = "password"


class Lifecycle(StrEnum):
    PREPARING = "preparing"  # only the prepare Job (and what it needs) exists
    RUNNING = "running"
    SUSPENDED = "suspended"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


@dataclass(frozen=True)
class OperatorDefaults:
    """Cluster-wide settings of the operator (from the Helm chart), used where a spec is silent."""

    control_plane_image: str = "ghcr.io/asyncdapo/asyncdapo-control-plane:0.1.0"  # scheduler, verifier
    cpu_image: str = "ghcr.io/asyncdapo/asyncdapo-cpu:0.1.0"
    gpu_image: str = "ghcr.io/asyncdapo/asyncdapo-gpu:0.1.0"
    redis_image: str = "redis:7.4-alpine"
    pull_policy: str = "IfNotPresent"
    redis_url: str | None = None
    # The default Redis' password (the chart's Secret): copied into each run's `{run}-redis-auth`
    # Secret by reconcile.py; never rendered into a manifest (desired state only names the Secret).
    redis_password: str | None = field(default=None, repr=False)
    # Namespaces (matchLabels) that may reach a dedicated verifier's /metrics.
    monitoring_namespace_selector: tuple[tuple[str, str], ...] = DEFAULT_MONITORING_SELECTOR
    # The run pods' securityContexts (None: pods.py's restricted ones, UID 10001), and the
    # imagePullSecrets of runs whose spec.images names none (pod_settings.py).
    pod_security_context: Mapping[str, Any] | None = None
    container_security_context: Mapping[str, Any] | None = None
    pull_secrets: tuple[str, ...] = ()
    kuberay: bool = False  # is the ray.io/v1 RayJob API served?


@dataclass(frozen=True)
class RunRef:
    """The TrainingRun object's identity."""

    name: str
    namespace: str
    uid: str
    # the TrainingRun's labels / annotations under PROPAGATED_PREFIXES (see `propagated`)
    workload_labels: tuple[tuple[str, str], ...] = ()
    workload_annotations: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, metadata: Mapping[str, Any], namespace: str | None = None) -> RunRef:
        """The identity of a TrainingRun from its metadata."""
        return cls(
            name=metadata["name"],
            namespace=metadata.get("namespace") or namespace or "default",
            uid=metadata.get("uid", ""),
            workload_labels=propagated(metadata.get("labels")),
            workload_annotations=propagated(metadata.get("annotations")),
        )

    @property
    def queued(self) -> bool:
        """Kueue admits the run's workloads: it owns their `suspend` and scheduling gates."""
        return any(k == QUEUE_NAME_LABEL for k, _ in self.workload_labels)


def propagated(values: Mapping[str, str] | None) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in (values or {}).items() if k.startswith(PROPAGATED_PREFIXES)))


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


def meta(
    ref: RunRef,
    name: str,
    component: str,
    annotations: dict[str, str] | None = None,
    *,
    owned: bool = True,
    workload: bool = False,
) -> dict[str, Any]:
    """Object metadata; `owned`: garbage-collected with the run; `workload`: a GPU workload that
    carries the run's propagated (Kueue) labels and annotations."""
    lbl = labels(ref.name, component)
    ann = dict(annotations or {})
    if workload:
        lbl = {**dict(ref.workload_labels), **lbl}
        ann = {**dict(ref.workload_annotations), **ann}
    meta: dict[str, Any] = {"name": name, "namespace": ref.namespace, "labels": lbl}
    if ann:
        meta["annotations"] = dict(sorted(ann.items()))
    if owned:
        meta["ownerReferences"] = [owner_reference(ref)]
    return meta


def effective_run(spec: TrainingRunSpec) -> Any:  # -> RunConfig
    """spec.run with what the workload decides made explicit: the GPUs of each trainer worker, and
    (stream transport) the trainer's weight store on its memory volume (pods.WEIGHT_STORE_DIR)."""
    t = spec.run.trainer
    update: dict[str, Any] = {}
    if t.gpus_per_worker is None:
        update["gpus_per_worker"] = spec.trainer.gpus_per_worker
    if trainer_store_in_memory_volume(spec):
        update["weight_store_dir"] = WEIGHT_STORE_DIR
    if not update:
        return spec.run
    return spec.run.model_copy(update={"trainer": t.model_copy(update=update)})


def trainer_store_in_memory_volume(spec: TrainingRunSpec) -> bool:
    """Stream transport with `trainer.weight_store_dir` left to the operator: the trainer keeps its
    weight store on the pod's memory volume. A directory the user names (e.g. on the workspace, for a
    model too large for memory) is kept, and no memory volume is mounted for it."""
    t = spec.run.trainer
    return t.weight_transport is WeightTransport.STREAM and t.weight_store_dir in ("", WEIGHT_STORE_DIR)


def config_yaml(spec: TrainingRunSpec) -> str:
    """The RunConfig every service loads with `--config` (all defaults made explicit)."""
    return yaml.safe_dump(effective_run(spec).model_dump(mode="json"), sort_keys=False)


def config_hash(spec: TrainingRunSpec) -> str:
    return hashlib.sha256(config_yaml(spec).encode()).hexdigest()[:16]


def control_plane_image(spec: TrainingRunSpec, defaults: OperatorDefaults) -> str:
    """The slim image (no torch, no vLLM) of the scheduler and a dedicated verifier."""
    return spec.images.control_plane or defaults.control_plane_image


def image(spec: TrainingRunSpec, defaults: OperatorDefaults, gpu: bool) -> str:
    if gpu:
        return spec.images.gpu or defaults.gpu_image
    return spec.images.cpu or defaults.cpu_image


def pull_policy(spec: TrainingRunSpec, defaults: OperatorDefaults) -> str:
    return spec.images.pull_policy.value if spec.images.pull_policy else defaults.pull_policy


def svc_host(ref: RunRef, component: str) -> str:
    return f"{ref.name}-{component}.{ref.namespace}.svc"


def weights_address(ref: RunRef) -> str:
    """HOST:PORT of the trainer's WeightStore as gateways and the scheduler dial it: the trainer's
    headless Service, not a pod IP. Gateways need the address when their pods are rendered, before
    any trainer pod exists; a restarted trainer pod gets a new IP; and with Ray the serving rank 0
    lands on any worker pod — the Service resolves to the worker pods and gRPC connects to the one
    that listens."""
    return f"{svc_host(ref, 'trainer')}:{WEIGHTS_PORT}"


def redis_url(spec: TrainingRunSpec, ref: RunRef, defaults: OperatorDefaults) -> str:
    """The run's Redis URL as the pods see it (never with a password: clients read it from
    ASYNCDAPO_REDIS_PASSWORD, see `redis_env`)."""
    r = spec.redis
    if r.managed is not None:
        return f"redis://{svc_host(ref, 'redis')}:{REDIS_PORT}/0"
    if r.url is not None:
        if r.password_secret_ref is not None and "@" in urlsplit(r.url).netloc:
            raise DesiredStateError(
                "InvalidSpec",
                "spec.redis.url: a URL with credentials given; must carry none when passwordSecretRef is "
                "set (the password comes from that Secret)",
            )
        if urlsplit(r.url).password is not None:
            # the URL is rendered into the pods' args and env and the run's ConfigMap, in clear
            raise DesiredStateError(
                "InvalidSpec",
                "spec.redis.url: the URL carries a password (redis://USER:PASSWORD@HOST), which would be "
                "rendered into the run's pods in clear; put it in a Secret, name it in "
                "spec.redis.passwordSecretRef, and give the URL without it",
            )
        return r.url
    if defaults.redis_url:
        return defaults.redis_url
    raise DesiredStateError(
        "NoRedis",
        "spec.redis: neither url nor managed given; this operator has no default Redis, so set one "
        "(or install the chart with redis.enabled=true or redis.external.url)",
    )


def redis_auth_secret_name(ref: RunRef) -> str:
    """The Secret the operator creates for a managed Redis (a generated password) or for the
    operator's default Redis (a copy of its password: a pod reads Secrets of its own namespace only)."""
    return f"{ref.name}-redis-auth"


def redis_password_ref(
    spec: TrainingRunSpec, ref: RunRef, defaults: OperatorDefaults
) -> dict[str, str] | None:
    """{name, key} of the Secret holding the run's Redis password, or None (no password)."""
    r = spec.redis
    if r.password_secret_ref is not None:
        return {"name": r.password_secret_ref.name, "key": r.password_secret_ref.key}
    if r.managed is not None or (r.url is None and defaults.redis_password):
        return {"name": redis_auth_secret_name(ref), "key": REDIS_AUTH_KEY}
    return None


def redis_env(spec: TrainingRunSpec, ref: RunRef, defaults: OperatorDefaults) -> list[dict[str, Any]]:
    """Env of every pod that talks to Redis (scheduler, trainer, prepare; the managed Redis itself)."""
    secret = redis_password_ref(spec, ref, defaults)
    if secret is None:
        return []
    return [{"name": REDIS_PASSWORD_ENV, "valueFrom": {"secretKeyRef": secret}}]


def verifier_url(spec: TrainingRunSpec, ref: RunRef) -> str:
    return spec.verifier.url or f"http://{svc_host(ref, 'verifier')}:{VERIFIER_PORT}"


def grpc_probe(**extra: int) -> dict[str, Any]:
    return {"grpc": {"port": GRPC_PORT}, **extra}


def service(
    ref: RunRef,
    component: str,
    ports: list[tuple[str, int, int]],
    *,
    headless: bool = False,
    extra_selector: dict[str, str] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "selector": {**selector(ref.name, component), **(extra_selector or {})},
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
    ports: Sequence[tuple[str, int]] = (),
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
    "ray-submitter": {
        "requests": {"cpu": "100m", "memory": "256Mi"},
        "limits": {"cpu": "1", "memory": "1Gi"},
    },
}
GPU_POD_DEFAULTS = {"requests": {"cpu": "8", "memory": "64Gi"}, "limits": {"cpu": "16", "memory": "128Gi"}}
CPU_POD_DEFAULTS = {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"cpu": "4", "memory": "8Gi"}}
