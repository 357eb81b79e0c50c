"""The trainer workload: a Job for one worker, a KubeRay RayJob (Ray Train) for several, and a
Service exposing its metrics.
"""

from __future__ import annotations

import shlex
from typing import Any

from .objects import (
    CPU_DEFAULTS,
    CPU_POD_DEFAULTS,
    GPU_POD_DEFAULTS,
    DesiredStateError,
    Lifecycle,
    OperatorDefaults,
    RunRef,
    client_env,
    config_hash,
    image,
    make_container,
    meta,
    pull_policy,
    redis_url,
    service,
    svc_host,
)
from .pods import (
    CONFIG_FILE,
    CONFIG_HASH_ANNOTATION,
    GRPC_PORT,
    METRICS_PORT,
    TOKEN_FILE,
    env,
    labels,
    pod_spec,
    resources,
    volumes,
)
from .spec import TrainingRunSpec


def trainer_args(
    spec: TrainingRunSpec, ref: RunRef, defaults: OperatorDefaults, *, shell: bool = False
) -> list[str]:
    args = ["trainer", "--config", CONFIG_FILE, "--model", spec.run.model.path]
    if spec.run.data.train_files:
        args += ["--data", ",".join(spec.run.data.train_files)]
    return [
        *args,
        "--redis", redis_url(spec, ref, defaults, shell=shell),
        "--scheduler", f"{svc_host(ref, 'scheduler')}:{GRPC_PORT}",
        "--token-file", TOKEN_FILE,
        "--metrics-port", str(METRICS_PORT),
    ]  # fmt: skip


def _trainer_container(
    spec: TrainingRunSpec, ref: RunRef, defaults: OperatorDefaults, name: str, args: list[str], gpus: int
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    vols, mounts = volumes(spec, ref.name, token=True, shm=True)
    tr = spec.trainer
    container = make_container(
        name,
        image(spec, defaults, gpu=tr.gpus_per_worker > 0),
        pull_policy(spec, defaults),
        args,
        env_vars=[*env(ref.name, tr.env), *client_env(spec)],
        mounts=mounts,
        res=resources(tr.resources, GPU_POD_DEFAULTS if tr.gpus_per_worker else CPU_POD_DEFAULTS, gpus),
        working_dir=spec.storage.mount_path,
        ports=[("metrics", METRICS_PORT)],
    )
    return container, vols


def trainer(
    spec: TrainingRunSpec, ref: RunRef, defaults: OperatorDefaults, lifecycle: Lifecycle
) -> list[dict[str, Any]]:
    suspend = lifecycle in (Lifecycle.SUSPENDED, Lifecycle.FAILED)
    svc = service(ref, "trainer", [("metrics", METRICS_PORT, METRICS_PORT)])
    tr = spec.trainer
    template_meta = {
        "labels": labels(ref.name, "trainer"),
        "annotations": {CONFIG_HASH_ANNOTATION: config_hash(spec)},
    }
    if spec.run.trainer.workers <= 1:
        container, vols = _trainer_container(
            spec, ref, defaults, "trainer", trainer_args(spec, ref, defaults), tr.gpus_per_worker
        )
        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": meta(ref, f"{ref.name}-trainer", "trainer"),
            "spec": {
                "suspend": suspend,
                "backoffLimit": tr.backoff_limit,
                "completions": 1,
                "parallelism": 1,
                "template": {
                    "metadata": template_meta,
                    "spec": pod_spec(
                        spec, containers=[container], vols=vols, component=tr, restart_policy="Never"
                    ),
                },
            },
        }
        return [job, svc]
    if not defaults.kuberay:
        raise DesiredStateError(
            "KubeRayMissing",
            f"run.trainer.workers={spec.run.trainer.workers} needs KubeRay (RayJob ray.io/v1), "
            "which this cluster does not serve; install KubeRay or set run.trainer.workers: 1",
        )
    return [_ray_job(spec, ref, defaults, suspend, template_meta), svc]


def _ray_job(
    spec: TrainingRunSpec,
    ref: RunRef,
    defaults: OperatorDefaults,
    suspend: bool,
    template_meta: dict[str, Any],
) -> dict[str, Any]:
    """Ray Train: the `asyncdapo trainer` driver runs on the head (no GPU), workers hold the GPUs."""
    tr = spec.trainer
    # Shell-quoted; the password placeholder stays expandable (double quotes) on the head's shell.
    entrypoint = " ".join(
        f'"{a}"' if "${REDIS_PASSWORD}" in a else shlex.quote(a)
        for a in ["asyncdapo", *trainer_args(spec, ref, defaults, shell=True)]
    )
    head, head_vols = _trainer_container(spec, ref, defaults, "ray-head", [], 0)
    head["resources"] = resources(tr.resources, CPU_DEFAULTS["ray-head"])
    worker, worker_vols = _trainer_container(spec, ref, defaults, "ray-worker", [], tr.gpus_per_worker)
    for c in (head, worker):
        del c["args"]  # KubeRay supplies `ray start`
    submitter, sub_vols = _trainer_container(spec, ref, defaults, "ray-job-submitter", [], 0)
    del submitter["args"]
    submitter["resources"] = resources(tr.resources, CPU_DEFAULTS["scheduler"])
    workers = spec.run.trainer.workers
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": meta(ref, f"{ref.name}-trainer", "trainer"),
        "spec": {
            "entrypoint": entrypoint,
            "suspend": suspend,
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": 600,
            "backoffLimit": tr.backoff_limit,
            "submissionMode": "K8sJobMode",
            "submitterPodTemplate": {
                "metadata": template_meta,
                "spec": pod_spec(spec, containers=[submitter], vols=sub_vols, restart_policy="Never"),
            },
            "rayClusterSpec": {
                "headGroupSpec": {
                    "rayStartParams": {"num-gpus": "0"},
                    "template": {
                        "metadata": template_meta,
                        "spec": pod_spec(spec, containers=[head], vols=head_vols),
                    },
                },
                "workerGroupSpecs": [
                    {
                        "groupName": "trainer",
                        "replicas": workers,
                        "minReplicas": workers,
                        "maxReplicas": workers,
                        "rayStartParams": {},
                        "template": {
                            "metadata": template_meta,
                            "spec": pod_spec(spec, containers=[worker], vols=worker_vols, component=tr),
                        },
                    }
                ],
            },
        },
    }
