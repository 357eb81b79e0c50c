"""The desired state of a TrainingRun: a pure function of (resource, operator defaults, lifecycle) to
the list of Kubernetes manifests the operator server-side-applies.

Invariants (unit-tested):
- deterministic: the same input gives byte-identical manifests (no clocks, no randomness — the
  gateway token Secret is created once by the handler, here it is only referenced);
- every object carries the run's labels and a controller ownerReference to the TrainingRun, so
  deleting the run garbage-collects everything — except a workspace PVC with `storage.retain`
  (the default), which holds the model, data and checkpoints and outlives the run;
- every pod satisfies the restricted Pod Security Standard (see pods.py);
- lifecycle SUSPENDED/FINISHED keeps state (config, workspace, Redis, the trainer Job's record) but
  runs no rollout pod: scheduler, gateways and verifier have 0 replicas and no HPA; the trainer Job
  (or RayJob) is suspended, except a Job that already succeeded;
- the gateway's gRPC port is reachable only from the same run's scheduler, trainer and (weight
  relay, stream transport) gateways; the trainer's weight store only from its gateways and scheduler.
"""

from __future__ import annotations

import json
from typing import Any

from asyncdapo.services.operator.managed_redis import managed_redis
from asyncdapo.services.operator.network import network_policies
from asyncdapo.services.operator.objects import (
    CPU_DEFAULTS,
    RETAINED_ANNOTATION,
    DesiredStateError,
    Lifecycle,
    OperatorDefaults,
    RunRef,
    config_yaml,
    image,
    make_container,
    meta,
    pull_policy,
    redis_env,
    redis_url,
)
from asyncdapo.services.operator.pod_settings import apply_pod_settings
from asyncdapo.services.operator.pods import env, pod_spec, resources, template_metadata, volumes
from asyncdapo.services.operator.rollout_workloads import gateway, scheduler, verifier
from asyncdapo.services.operator.spec import TrainingRunSpec
from asyncdapo.services.operator.trainer_job import trainer
from asyncdapo.services.operator.workspace import workspace_access_modes

__all__ = ["DesiredStateError", "Lifecycle", "OperatorDefaults", "RunRef", "desired_state", "object_key"]


def _config_map(spec: TrainingRunSpec, ref: RunRef) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta(ref, f"{ref.name}-config", "config"),
        "data": {"run.yaml": config_yaml(spec)},
    }


def _workspace_pvc(spec: TrainingRunSpec, ref: RunRef) -> dict[str, Any]:
    st = spec.storage
    pvc_spec: dict[str, Any] = {
        "accessModes": workspace_access_modes(spec),
        "resources": {"requests": {"storage": st.size}},
    }
    if st.storage_class_name:
        pvc_spec["storageClassName"] = st.storage_class_name
    retained = {RETAINED_ANNOTATION: f"{ref.namespace}/{ref.name}"} if st.retain else None
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": meta(ref, f"{ref.name}-workspace", "workspace", retained, owned=not st.retain),
        "spec": pvc_spec,
    }


def _prepare_job(spec: TrainingRunSpec, ref: RunRef, defaults: OperatorDefaults) -> dict[str, Any]:
    prep = spec.prepare
    assert prep is not None
    vols, mounts = volumes(spec, ref.name)
    container = make_container(
        "prepare",
        image(spec, defaults, gpu=False),
        pull_policy(spec, defaults),
        list(prep.command[1:]),
        env_vars=[*env(ref.name, spec.env), *redis_env(spec, ref, defaults)],
        mounts=mounts,
        res=resources(prep.resources, CPU_DEFAULTS["prepare"]),
        working_dir=spec.storage.mount_path,
    )
    container["command"] = [prep.command[0]]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta(ref, f"{ref.name}-prepare", "prepare"),
        "spec": {
            "backoffLimit": prep.backoff_limit,
            "template": {
                "metadata": template_metadata(spec, ref.name, "prepare"),
                "spec": pod_spec(spec, containers=[container], vols=vols, restart_policy="Never"),
            },
        },
    }


def desired_state(
    spec: TrainingRunSpec, ref: RunRef, defaults: OperatorDefaults, lifecycle: Lifecycle
) -> list[dict[str, Any]]:
    """Every object the run should have now, in apply order (dependencies first).

    Raises DesiredStateError when the spec cannot be realised in this cluster (no Redis, no KubeRay).
    """
    objs: list[dict[str, Any]] = [_config_map(spec, ref)]
    if spec.storage.size is not None:
        objs.append(_workspace_pvc(spec, ref))
    objs += managed_redis(spec, ref, defaults)
    if spec.prepare is not None:
        objs.append(_prepare_job(spec, ref, defaults))
    if lifecycle is Lifecycle.PREPARING:
        redis_url(spec, ref, defaults)  # surface a missing Redis before the prepare Job runs
        return _unshared(objs + network_policies(spec, ref, defaults, rollout=False), defaults)
    active = lifecycle is Lifecycle.RUNNING
    objs += verifier(spec, ref, defaults, active)
    objs += gateway(spec, ref, defaults, active)
    objs += scheduler(spec, ref, defaults, active)
    objs += trainer(spec, ref, defaults, lifecycle)
    objs += network_policies(spec, ref, defaults, rollout=True)
    return _unshared(objs, defaults)


def _unshared(objs: list[dict[str, Any]], defaults: OperatorDefaults) -> list[dict[str, Any]]:
    """Independent plain-JSON copies (no sub-dict shared between objects, no YAML anchors), with
    the operator's pod settings, each workload annotated with its justified policy-scanner exceptions."""
    out = json.loads(json.dumps(objs))
    apply_pod_settings(
        out,
        pod_security_context=defaults.pod_security_context,
        container_security_context=defaults.container_security_context,
        pull_secrets=defaults.pull_secrets,
    )
    for obj in out:
        skips = scanner_skips(list(_containers(obj)))
        if skips:
            obj["metadata"].setdefault("annotations", {}).update(skips)
    return out


def _containers(node: Any) -> Any:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("containers", "initContainers") and isinstance(value, list):
                yield from value
            else:
                yield from _containers(value)
    elif isinstance(node, list):
        for item in node:
            yield from _containers(item)


def scanner_skips(containers: list[dict[str, Any]]) -> dict[str, str]:
    """checkov skip annotations, only for the checks these containers actually fail, with the reason."""
    reasons = []
    if any("@sha256:" not in c["image"] for c in containers):
        reasons.append(
            "CKV_K8S_43=images are referenced by release tag from the operator settings or spec.images; "
            "give repository@sha256:digest there to pin digests"
        )
    if any(c.get("imagePullPolicy") != "Always" for c in containers):
        reasons.append(
            "CKV_K8S_15=IfNotPresent by default: release tags are immutable and GPU images are many GB; "
            "spec.images.pullPolicy: Always overrides it"
        )
    if any("secretKeyRef" in e.get("valueFrom", {}) for c in containers for e in c.get("env", [])):
        reasons.append(
            "CKV_K8S_35=Redis clients read the password from ASYNCDAPO_REDIS_PASSWORD (the services' "
            "contract) and spec.env valueFrom passes user secrets (HF_TOKEN) as tools expect them"
        )
    return {f"checkov.io/skip{i + 1}": r for i, r in enumerate(reasons)}


def object_key(obj: dict[str, Any]) -> tuple[str, str, str]:
    """(apiVersion, kind, name): identifies a child within the run's namespace."""
    return obj["apiVersion"], obj["kind"], obj["metadata"]["name"]
