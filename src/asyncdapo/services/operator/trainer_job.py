"""The trainer workload: a Job for one worker, a KubeRay RayJob (Ray Train) for several, and a
headless Service over the pods that serve the trainer's metrics.

RayJob layout: the submitter pod runs `ray job submit`; the `asyncdapo trainer` driver runs on the
Ray head, which advertises no CPU and no GPU to Ray, so no training worker lands there; each worker
pod holds one Ray Train worker (its GPUs, or one advertised CPU on a CPU run). Head and submitter
have their own (small) resources: `spec.trainer.resources` are per worker. Every worker pod serves
/metrics on METRICS_PORT (rank 0 the trainer's metrics, the others their rank), so the metrics
Service has no endpoint that refuses connections; progress.py reads the endpoint that has a step.

Stream transport (`run.trainer.weight_transport: stream`): rank 0 serves the published weights from
a WeightStore on WEIGHTS_PORT, kept in a memory volume (pods.WEIGHT_STORE_DIR). Every pod that may
hold rank 0 (the Job pod, each Ray worker) has that volume and port; gateways and the scheduler
reach it through the same headless Service (objects.weights_address).

With Kueue (`kueue.x-k8s.io/queue-name` on the TrainingRun, propagated here), `spec.suspend` of the
Job / RayJob belongs to Kueue: the operator sets it only to suspend the run.
"""

from __future__ import annotations

import shlex
from typing import Any

from asyncdapo.services.operator.objects import (
    CPU_DEFAULTS,
    CPU_POD_DEFAULTS,
    GPU_POD_DEFAULTS,
    DesiredStateError,
    Lifecycle,
    OperatorDefaults,
    RunRef,
    config_hash,
    image,
    make_container,
    meta,
    pull_policy,
    redis_env,
    redis_url,
    service,
    svc_host,
    trainer_store_in_memory_volume,
    weights_address,
)
from asyncdapo.services.operator.pods import (
    CONFIG_FILE,
    CONFIG_HASH_ANNOTATION,
    GRPC_PORT,
    METRICS_PORT,
    ROLE_LABEL,
    TOKEN_FILE,
    WEIGHTS_PORT,
    env,
    pod_spec,
    resources,
    template_metadata,
    volumes,
)
from asyncdapo.services.operator.spec import Resources, TrainingRunSpec
from asyncdapo.services.operator.workspace import streams_weights

# ROLE_LABEL values of trainer pods; the metrics Service selects METRICS_ROLE.
METRICS_ROLE = "worker"
HEAD_ROLE = "ray-head"
SUBMITTER_ROLE = "ray-submitter"


def trainer_args(spec: TrainingRunSpec, ref: RunRef, defaults: OperatorDefaults) -> list[str]:
    args = ["trainer", "--config", CONFIG_FILE, "--model", spec.run.model.path]
    if spec.run.data.train_files:
        args += ["--data", ",".join(spec.run.data.train_files)]
    args += [
        "--redis", redis_url(spec, ref, defaults),
        "--scheduler", f"{svc_host(ref, 'scheduler')}:{GRPC_PORT}",
        "--token-file", TOKEN_FILE,
        "--metrics-port", str(METRICS_PORT),
    ]  # fmt: skip
    if streams_weights(spec):
        args += [
            "--weight-store-listen", f"0.0.0.0:{WEIGHTS_PORT}",
            "--weight-store-advertise", weights_address(ref),
        ]  # fmt: skip
    return args


def _container(
    spec: TrainingRunSpec,
    ref: RunRef,
    defaults: OperatorDefaults,
    name: str,
    args: list[str],
    res: dict[str, Any],
    *,
    redis: bool,
    metrics: bool,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """`metrics`: a pod that serves /metrics and may hold rank 0, hence the weight store."""
    weights = metrics and streams_weights(spec)
    in_memory = weights and trainer_store_in_memory_volume(spec)
    vols, mounts = volumes(spec, ref.name, token=True, shm=True, weight_store=in_memory)
    ports = [("metrics", METRICS_PORT)] if metrics else []
    if weights:
        ports.append(("weights", WEIGHTS_PORT))
    tr = spec.trainer
    container = make_container(
        name,
        # one image for every pod of a Ray cluster: Ray and Python versions must match
        image(spec, defaults, gpu=tr.gpus_per_worker > 0),
        pull_policy(spec, defaults),
        args,
        env_vars=[*env(ref.name, spec.env, tr.env), *(redis_env(spec, ref, defaults) if redis else [])],
        mounts=mounts,
        res=res,
        working_dir=spec.storage.mount_path,
        ports=ports,
    )
    return container, vols


def _worker_resources(spec: TrainingRunSpec) -> dict[str, Any]:
    tr = spec.trainer
    return resources(
        tr.resources, GPU_POD_DEFAULTS if tr.gpus_per_worker else CPU_POD_DEFAULTS, tr.gpus_per_worker
    )


def _template(spec: TrainingRunSpec, ref: RunRef, role: str, pod: dict[str, Any]) -> dict[str, Any]:
    md = template_metadata(spec, ref.name, "trainer", {CONFIG_HASH_ANNOTATION: config_hash(spec)})
    md["labels"][ROLE_LABEL] = role
    return {"metadata": md, "spec": pod}


def _suspend(ref: RunRef, lifecycle: Lifecycle) -> dict[str, Any]:
    suspend = lifecycle in (Lifecycle.SUSPENDED, Lifecycle.FAILED)
    if ref.queued and not suspend:
        return {}  # Kueue suspends the workload at creation and resumes it on admission
    return {"suspend": suspend}


def trainer(
    spec: TrainingRunSpec, ref: RunRef, defaults: OperatorDefaults, lifecycle: Lifecycle
) -> list[dict[str, Any]]:
    ports = [("metrics", METRICS_PORT, METRICS_PORT)]
    if streams_weights(spec):
        ports.append(("weights", WEIGHTS_PORT, WEIGHTS_PORT))
    svc = service(ref, "trainer", ports, headless=True, extra_selector={ROLE_LABEL: METRICS_ROLE})
    tr = spec.trainer
    if spec.run.trainer.workers <= 1:
        container, vols = _container(
            spec, ref, defaults, "trainer", trainer_args(spec, ref, defaults), _worker_resources(spec),
            redis=True, metrics=True,
        )  # fmt: skip
        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": meta(ref, f"{ref.name}-trainer", "trainer", workload=True),
            "spec": {
                **_suspend(ref, lifecycle),
                "backoffLimit": tr.backoff_limit,
                "completions": 1,
                "parallelism": 1,
                "template": _template(
                    spec,
                    ref,
                    METRICS_ROLE,
                    pod_spec(spec, containers=[container], vols=vols, component=tr, restart_policy="Never"),
                ),
            },
        }
        return [job, svc]
    if not defaults.kuberay:
        raise DesiredStateError(
            "KubeRayMissing",
            f"run.trainer.workers={spec.run.trainer.workers} needs KubeRay (RayJob ray.io/v1), "
            "which this cluster does not serve; install KubeRay or set run.trainer.workers: 1",
        )
    return [_ray_job(spec, ref, defaults, lifecycle), svc]


def _ray_job(
    spec: TrainingRunSpec, ref: RunRef, defaults: OperatorDefaults, lifecycle: Lifecycle
) -> dict[str, Any]:
    """Ray Train: the `asyncdapo trainer` driver runs on the head (no GPU), workers hold the GPUs."""
    tr = spec.trainer
    entrypoint = shlex.join(["asyncdapo", *trainer_args(spec, ref, defaults)])
    head_res = resources(tr.ray_head.resources, CPU_DEFAULTS["ray-head"])
    head, head_vols = _container(spec, ref, defaults, "ray-head", [], head_res, redis=True, metrics=False)
    worker, worker_vols = _container(
        spec, ref, defaults, "ray-worker", [], _worker_resources(spec), redis=True, metrics=True
    )
    sub_res = resources(Resources(), CPU_DEFAULTS["ray-submitter"])
    submitter, sub_vols = _container(
        spec, ref, defaults, "ray-job-submitter", [], sub_res, redis=False, metrics=False
    )
    for c in (head, worker, submitter):
        del c["args"]  # KubeRay supplies `ray start` / `ray job submit`
    workers = spec.run.trainer.workers
    # One Ray Train worker per worker pod: a GPU worker asks for the pod's GPUs; a CPU worker pod
    # advertises one CPU (launch.py asks for one per worker; Ray Train v2's controller reserves none).
    worker_params = {} if tr.gpus_per_worker else {"num-cpus": "1"}
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": meta(ref, f"{ref.name}-trainer", "trainer", workload=True),
        "spec": {
            "entrypoint": entrypoint,
            **_suspend(ref, lifecycle),
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": 600,
            "backoffLimit": tr.backoff_limit,
            "submissionMode": "K8sJobMode",
            "submitterPodTemplate": _template(
                spec,
                ref,
                SUBMITTER_ROLE,
                pod_spec(spec, containers=[submitter], vols=sub_vols, restart_policy="Never"),
            ),
            "rayClusterSpec": {
                "headGroupSpec": {
                    # the driver and Ray's control plane only: no task or actor is placed here
                    "rayStartParams": {"num-cpus": "0", "num-gpus": "0"},
                    "template": _template(
                        spec, ref, HEAD_ROLE, pod_spec(spec, containers=[head], vols=head_vols)
                    ),
                },
                "workerGroupSpecs": [
                    {
                        "groupName": "trainer",
                        "replicas": workers,
                        "minReplicas": workers,
                        "maxReplicas": workers,
                        "rayStartParams": worker_params,
                        "template": _template(
                            spec,
                            ref,
                            METRICS_ROLE,
                            pod_spec(spec, containers=[worker], vols=worker_vols, component=tr),
                        ),
                    }
                ],
            },
        },
    }
