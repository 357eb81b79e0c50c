"""Pod-template building blocks shared by every workload of a run: restricted security, the standard
volumes (config, workspace, writable caches on a read-only root), labels, placement, resources.

Every pod satisfies the `restricted` Pod Security Standard: non-root, no privilege escalation, all
capabilities dropped, RuntimeDefault seccomp, read-only root filesystem (writable paths are
emptyDirs: /tmp, /cache, /dev/shm where NCCL/vLLM need shared memory, and the weight store of the
stream transport), no service-account token (also with `spec.serviceAccountName`: workload-identity
webhooks project their own token).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from asyncdapo.services.operator.spec import EnvVar, Placement, Resources, Toleration, TrainingRunSpec

APP = "asyncdapo"
RUN_LABEL = "asyncdapo.io/run"
COMPONENT_LABEL = "app.kubernetes.io/component"
# Which pods of a component serve /metrics (the trainer's: its Job pod or the Ray workers, not the
# Ray head or the job submitter); the component's metrics Service selects on it.
ROLE_LABEL = "asyncdapo.io/role"
# Every Redis client of a run reads the password from this variable (valueFrom.secretKeyRef).
REDIS_PASSWORD_ENV = "ASYNCDAPO_REDIS_PASSWORD"
CONFIG_HASH_ANNOTATION = "asyncdapo.io/config-hash"
MANAGED_BY = "asyncdapo-operator"

UID = 10001
CONFIG_DIR = "/etc/asyncdapo"
CONFIG_FILE = f"{CONFIG_DIR}/run.yaml"
TOKEN_DIR = "/var/run/asyncdapo/token"
TOKEN_FILE = f"{TOKEN_DIR}/token"
CACHE_DIR = "/cache"
# `trainer.weight_transport: stream`: where the trainer and each gateway keep the weight versions
# they serve (a `medium: Memory` emptyDir of its own, so its cap is not shared with NCCL's /dev/shm).
WEIGHT_STORE_DIR = "/var/run/asyncdapo/weights"

GRPC_PORT = 50051
WEIGHTS_PORT = 50070  # the trainer's WeightStore (gateways serve theirs on GRPC_PORT)
METRICS_PORT = 9090
VERIFIER_PORT = 8080
REDIS_PORT = 6379


def labels(run: str, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": APP,
        "app.kubernetes.io/instance": run,
        "app.kubernetes.io/part-of": APP,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        COMPONENT_LABEL: component,
        RUN_LABEL: run,
    }


def selector(run: str, component: str) -> dict[str, str]:
    return {RUN_LABEL: run, COMPONENT_LABEL: component}


def pod_security(uid: int = UID) -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": uid,
        "fsGroup": uid,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security(uid: int = UID) -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": uid,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def template_metadata(
    spec: TrainingRunSpec, run: str, component: str, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    """A pod template's metadata: the run's `podLabels` / `podAnnotations` under the operator's own
    (which win: selectors and NetworkPolicies depend on them)."""
    out: dict[str, Any] = {"labels": {**spec.pod_labels, **labels(run, component)}}
    merged = {**spec.pod_annotations, **(annotations or {})}
    if merged:
        out["annotations"] = dict(sorted(merged.items()))
    return out


def env(run: str, *extra: Sequence[EnvVar]) -> list[dict[str, Any]]:
    """Caches point into the /cache emptyDir (the root filesystem is read-only); HF_HUB_OFFLINE
    because models and data come from the workspace volume (or the trainer's weight store), never
    from a download at runtime.
    `extra`: the run-wide `env`, then the component's; a later variable of the same name wins."""
    base: list[dict[str, Any]] = [
        {"name": "ASYNCDAPO_RUN", "value": run},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        {"name": "HOME", "value": "/tmp"},
        {"name": "XDG_CACHE_HOME", "value": CACHE_DIR},
        {"name": "HF_HOME", "value": f"{CACHE_DIR}/huggingface"},
        {"name": "HF_HUB_OFFLINE", "value": "1"},
        {"name": "TRITON_CACHE_DIR", "value": f"{CACHE_DIR}/triton"},
        {"name": "TORCHINDUCTOR_CACHE_DIR", "value": f"{CACHE_DIR}/inductor"},
        {"name": "VLLM_CACHE_ROOT", "value": f"{CACHE_DIR}/vllm"},
        {"name": "RAY_TMPDIR", "value": "/tmp/ray"},
    ]
    user: dict[str, dict[str, Any]] = {}
    for group in extra:
        for e in group:
            user.pop(e.name, None)
            user[e.name] = e.manifest()
    return [e for e in base if e["name"] not in user] + list(user.values())


def volumes(
    spec: TrainingRunSpec,
    run: str,
    *,
    workspace: bool = True,
    config: bool = True,
    token: bool = False,
    shm: bool = False,
    weight_store: bool = False,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(pod volumes, container volumeMounts) for a run pod; `weight_store`: the memory-backed
    WEIGHT_STORE_DIR, capped at `spec.weightStore.sizeLimit`."""
    vols: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    if workspace:
        claim = spec.storage.claim_name or f"{run}-workspace"
        vols.append({"name": "workspace", "persistentVolumeClaim": {"claimName": claim}})
        mounts.append({"name": "workspace", "mountPath": spec.storage.mount_path})
    vols += [
        {"name": "tmp", "emptyDir": {"sizeLimit": "4Gi"}},
        {"name": "cache", "emptyDir": {"sizeLimit": "32Gi"}},
    ]
    mounts += [
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "cache", "mountPath": CACHE_DIR},
    ]
    if config:
        vols.append({"name": "config", "configMap": {"name": f"{run}-config"}})
        mounts.append({"name": "config", "mountPath": CONFIG_DIR, "readOnly": True})
    if token:
        vols.append({"name": "token", "secret": {"secretName": f"{run}-token", "defaultMode": 0o440}})
        mounts.append({"name": "token", "mountPath": TOKEN_DIR, "readOnly": True})
    if shm:
        vols.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}})
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    if weight_store:
        size = spec.weight_store.size_limit
        vols.append({"name": "weights", "emptyDir": {"medium": "Memory", "sizeLimit": size}})
        mounts.append({"name": "weights", "mountPath": WEIGHT_STORE_DIR})
    return vols, mounts


def resources(user: Resources, defaults: dict[str, dict[str, str]], gpus: int = 0) -> dict[str, Any]:
    """User requests/limits over the component's defaults; GPUs are requested and limited alike."""
    out: dict[str, dict[str, Any]] = {}
    for kind in ("requests", "limits"):
        merged: dict[str, Any] = dict(defaults.get(kind, {}))
        merged.update({k: v for k, v in getattr(user, kind).items()})
        if gpus:
            merged["nvidia.com/gpu"] = gpus
        out[kind] = dict(sorted(merged.items()))
    return out


def placement(spec: TrainingRunSpec, component: Placement | None = None) -> dict[str, Any]:
    node_selector = dict(spec.node_selector)
    tolerations: list[Toleration] = list(spec.tolerations)
    if component is not None:
        node_selector.update(component.node_selector)
        tolerations.extend(component.tolerations)
    out: dict[str, Any] = {}
    if node_selector:
        out["nodeSelector"] = dict(sorted(node_selector.items()))
    if tolerations:
        out["tolerations"] = [t.model_dump(by_alias=True, exclude_none=True) for t in tolerations]
    return out


def pod_identity(spec: TrainingRunSpec, component: Placement | None = None) -> dict[str, Any]:
    """serviceAccountName and priorityClassName of a run pod (the component's priority wins)."""
    out: dict[str, Any] = {}
    if spec.service_account_name:
        out["serviceAccountName"] = spec.service_account_name
    priority = (component.priority_class_name if component else None) or spec.priority_class_name
    if priority:
        out["priorityClassName"] = priority
    return out


def pod_spec(
    spec: TrainingRunSpec,
    *,
    containers: list[dict[str, Any]],
    vols: list[dict[str, Any]],
    component: Placement | None = None,
    restart_policy: str | None = None,
    uid: int = UID,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": pod_security(uid),
        "containers": containers,
        "volumes": vols,
        **placement(spec, component),
    }
    out.update(pod_identity(spec, component))
    if restart_policy:
        out["restartPolicy"] = restart_policy
    if spec.images.pull_secrets:
        out["imagePullSecrets"] = [{"name": n} for n in spec.images.pull_secrets]
    return out
