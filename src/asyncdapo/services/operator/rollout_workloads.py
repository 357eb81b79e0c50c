"""Rollout workloads of a run: scheduler (Deployment + Service), gateways (StatefulSet + headless
Service + PodDisruptionBudget; network.py guards the control port), dedicated verifier (Deployment
+ Service + HPA). Scheduler and verifier run the slim control-plane image.

Stream transport (the default): gateways start from the trainer's weights and keep theirs in a
memory volume (relaying them to each other on their gRPC port); the scheduler fetches the tokenizer
from the trainer. Neither mounts the workspace (workspace.py says when they do).
"""

from __future__ import annotations

from typing import Any

from asyncdapo.services.operator.objects import (
    CPU_DEFAULTS,
    CPU_POD_DEFAULTS,
    GPU_POD_DEFAULTS,
    OperatorDefaults,
    RunRef,
    config_hash,
    control_plane_image,
    grpc_probe,
    image,
    make_container,
    meta,
    pull_policy,
    redis_env,
    redis_url,
    service,
    svc_host,
    verifier_url,
    weights_address,
)
from asyncdapo.services.operator.pods import (
    CONFIG_FILE,
    CONFIG_HASH_ANNOTATION,
    GRPC_PORT,
    METRICS_PORT,
    TOKEN_FILE,
    VERIFIER_PORT,
    WEIGHT_STORE_DIR,
    env,
    pod_spec,
    resources,
    selector,
    template_metadata,
    volumes,
)
from asyncdapo.services.operator.spec import GatewayEngine, GatewayPoolSpec, GatewaySpec, TrainingRunSpec
from asyncdapo.services.operator.workspace import (
    gateways_mount_workspace,
    scheduler_mounts_workspace,
    streams_weights,
)

# The working directory of a pod without the workspace: writable (an emptyDir), like the workspace.
SCRATCH_DIR = "/tmp"


def response_log_path(spec: TrainingRunSpec, ref: RunRef) -> str:
    """Where a run's scheduler writes its response log (`scheduler.responseLog`): named after the run,
    so runs sharing one workspace claim (`storage.claimName`) never write into one file."""
    return f"{spec.storage.mount_path.rstrip('/')}/{ref.name}.scheduler.responses.jsonl"


def scheduler(
    spec: TrainingRunSpec, ref: RunRef, defaults: OperatorDefaults, active: bool
) -> list[dict[str, Any]]:
    workspace = scheduler_mounts_workspace(spec)
    vols, mounts = volumes(spec, ref.name, workspace=workspace, token=True)
    args = [
        "scheduler",
        "--config", CONFIG_FILE,
        "--host", "0.0.0.0",
        "--port", str(GRPC_PORT),
        "--metrics-port", str(METRICS_PORT),
        "--redis", redis_url(spec, ref, defaults),
        "--verifier", verifier_url(spec, ref),
        "--gateways", f"dns:{svc_host(ref, 'gateway')}:{GRPC_PORT}",
        "--token-file", TOKEN_FILE,
        "--start",  # no one else would call StartRun: the run starts when its scheduler does
    ]  # fmt: skip
    if spec.scheduler.response_log:  # the workspace's root: the one directory that always exists
        args += ["--response-log", response_log_path(spec, ref)]
    if streams_weights(spec):  # from the trainer's weight store (snapshot: model.path's, on the workspace)
        args += ["--tokenizer-from", weights_address(ref)]
    container = make_container(
        "scheduler",
        control_plane_image(spec, defaults),
        pull_policy(spec, defaults),
        args,
        env_vars=[*env(ref.name, spec.env, spec.scheduler.env), *redis_env(spec, ref, defaults)],
        mounts=mounts,
        res=resources(spec.scheduler.resources, CPU_DEFAULTS["scheduler"]),
        working_dir=spec.storage.mount_path if workspace else SCRATCH_DIR,
        ports=[("grpc", GRPC_PORT), ("metrics", METRICS_PORT)],
        readinessProbe=grpc_probe(periodSeconds=5),
        livenessProbe=grpc_probe(periodSeconds=20, failureThreshold=6),
    )
    deploy = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta(ref, f"{ref.name}-scheduler", "scheduler"),
        "spec": {
            # One scheduler per run: two would both admit prompts and early-stop against each other.
            "replicas": 1 if active else 0,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": selector(ref.name, "scheduler")},
            "template": {
                "metadata": template_metadata(
                    spec, ref.name, "scheduler", {CONFIG_HASH_ANNOTATION: config_hash(spec)}
                ),
                "spec": pod_spec(spec, containers=[container], vols=vols),
            },
        },
    }
    svc = service(ref, "scheduler", [("grpc", GRPC_PORT, GRPC_PORT), ("metrics", METRICS_PORT, METRICS_PORT)])
    return [deploy, svc]


POOL_LABEL = "asyncdapo.io/pool"


def _pool_view(gw: GatewaySpec, pool: GatewayPoolSpec) -> GatewaySpec:
    """The gateway settings of one pool: its own where set, the gateway's otherwise."""
    return gw.model_copy(
        update={
            "replicas": pool.replicas,
            "gpus_per_pod": gw.gpus_per_pod if pool.gpus_per_pod is None else pool.gpus_per_pod,
            "resources": pool.resources or gw.resources,
            "env": [*gw.env, *pool.env],
            "node_selector": {**gw.node_selector, **pool.node_selector},
            "tolerations": [*gw.tolerations, *pool.tolerations],
            "priority_class_name": pool.priority_class_name or gw.priority_class_name,
            "pools": [],
        }
    )


def gateway(
    spec: TrainingRunSpec, ref: RunRef, defaults: OperatorDefaults, active: bool
) -> list[dict[str, Any]]:
    """The gateways' StatefulSet (one per pool when `gateway.pools` is set), their headless Service
    (all pools: the scheduler resolves every gateway through it; each reports its pool itself) and
    one PodDisruptionBudget over all of them."""
    gw = spec.gateway
    if gw.pools:
        sets = [_statefulset(spec, ref, defaults, active, _pool_view(gw, p), p.name) for p in gw.pools]
    else:
        sets = [_statefulset(spec, ref, defaults, active, gw, None)]
    svc = service(
        ref,
        "gateway",
        [("grpc", GRPC_PORT, GRPC_PORT), ("metrics", METRICS_PORT, METRICS_PORT)],
        headless=True,
    )
    # A node drain takes gateways down one at a time: the scheduler re-dispatches a lost gateway's
    # requests, but losing all at once would stall rollout (and reload every engine).
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": meta(ref, f"{ref.name}-gateway", "gateway"),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector(ref.name, "gateway")}},
    }
    return [*sets, svc, pdb]


def _statefulset(
    spec: TrainingRunSpec,
    ref: RunRef,
    defaults: OperatorDefaults,
    active: bool,
    gw: GatewaySpec,
    pool: str | None,
) -> dict[str, Any]:
    gpu = gw.gpus_per_pod > 0
    workspace = gateways_mount_workspace(spec)
    vols, mounts = volumes(
        spec, ref.name, workspace=workspace, config=False, token=True, shm=True, weight_store=not workspace
    )
    if workspace:  # snapshot: the base model and every version from the workspace
        weights = ["--model", spec.run.model.path, "--no-weight-store"]
    else:  # stream: the trainer's current version, then each version from the trainer or a peer
        weights = ["--weights-from", weights_address(ref), "--weight-store-dir", WEIGHT_STORE_DIR]
    args = [
        "gateway",
        *weights,
        "--host", "0.0.0.0",
        "--port", str(GRPC_PORT),
        "--metrics-port", str(METRICS_PORT),
        "--engine", gw.engine.value,
        "--token-file", TOKEN_FILE,
        "--max-concurrency", str(spec.run.rollout.max_concurrent_per_gateway),
        "--dtype", spec.run.model.dtype.value,
        "--max-model-len", str(spec.run.data.max_prompt_length + spec.run.data.max_response_length),
    ]  # fmt: skip
    if pool is not None:
        args += ["--pool", pool]
    if gw.gpus_per_pod > 1:  # one engine over the pod's GPUs
        args += ["--engine-arg", f"tensor_parallel_size={gw.gpus_per_pod}"]
    container = make_container(
        "gateway",
        image(spec, defaults, gpu=gpu and gw.engine is GatewayEngine.VLLM),
        pull_policy(spec, defaults),
        args,
        env_vars=env(ref.name, spec.env, gw.env),
        mounts=mounts,
        res=resources(gw.resources, GPU_POD_DEFAULTS if gpu else CPU_POD_DEFAULTS, gw.gpus_per_pod),
        working_dir=spec.storage.mount_path if workspace else SCRATCH_DIR,
        ports=[("grpc", GRPC_PORT), ("metrics", METRICS_PORT)],
        # Loading a large model takes minutes: the startup probe allows up to an hour.
        startupProbe=grpc_probe(periodSeconds=10, failureThreshold=360),
        readinessProbe=grpc_probe(periodSeconds=5),
        livenessProbe=grpc_probe(periodSeconds=20, failureThreshold=6),
    )
    match = selector(ref.name, "gateway")
    template = template_metadata(spec, ref.name, "gateway")
    name = f"{ref.name}-gateway"
    if pool is not None:
        match = {**match, POOL_LABEL: pool}
        template["labels"][POOL_LABEL] = pool
        name = f"{name}-{pool}"
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": meta(ref, name, "gateway", workload=True),
        "spec": {
            "replicas": gw.replicas if active else 0,
            # every pool's pods get their DNS names from the one headless Service
            "serviceName": f"{ref.name}-gateway",
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": match},
            "template": {
                "metadata": template,
                "spec": {
                    **pod_spec(spec, containers=[container], vols=vols, component=gw),
                    "terminationGracePeriodSeconds": 60,
                },
            },
        },
    }


def verifier(
    spec: TrainingRunSpec, ref: RunRef, defaults: OperatorDefaults, active: bool
) -> list[dict[str, Any]]:
    v = spec.verifier
    if v.url:
        return []
    vols, mounts = volumes(spec, ref.name, config=False)
    http = {"port": VERIFIER_PORT}
    verifier_args = [
        "verifier",
        "--host", "0.0.0.0",
        "--port", str(VERIFIER_PORT),
        "--workers", str(v.workers),
        "--timeout-s", str(spec.run.reward.verifier_timeout_s),
    ]  # fmt: skip
    container = make_container(
        "verifier",
        control_plane_image(spec, defaults),
        pull_policy(spec, defaults),
        verifier_args,
        env_vars=env(ref.name, spec.env),
        mounts=mounts,
        res=resources(v.resources, CPU_DEFAULTS["verifier"]),
        working_dir="/tmp",
        ports=[("http", VERIFIER_PORT)],
        readinessProbe={"httpGet": {**http, "path": "/readyz"}, "periodSeconds": 5},
        livenessProbe={"httpGet": {**http, "path": "/healthz"}, "periodSeconds": 20, "failureThreshold": 6},
    )
    autoscale = v.autoscaling.enabled and active
    deploy_spec: dict[str, Any] = {
        "selector": {"matchLabels": selector(ref.name, "verifier")},
        "template": {
            "metadata": template_metadata(spec, ref.name, "verifier"),
            "spec": pod_spec(spec, containers=[container], vols=vols),
        },
    }
    if not autoscale:  # with an HPA, replicas belong to the HPA (not to this apply)
        deploy_spec = {"replicas": v.replicas if active else 0, **deploy_spec}
    objs: list[dict[str, Any]] = [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": meta(ref, f"{ref.name}-verifier", "verifier"),
            "spec": deploy_spec,
        },
        service(
            ref,
            "verifier",
            [("http", VERIFIER_PORT, VERIFIER_PORT), ("metrics", METRICS_PORT, VERIFIER_PORT)],
        ),
    ]
    if autoscale:
        a = v.autoscaling
        objs.append(
            {
                "apiVersion": "autoscaling/v2",
                "kind": "HorizontalPodAutoscaler",
                "metadata": meta(ref, f"{ref.name}-verifier", "verifier"),
                "spec": {
                    "scaleTargetRef": {
                        "apiVersion": "apps/v1",
                        "kind": "Deployment",
                        "name": f"{ref.name}-verifier",
                    },
                    "minReplicas": a.min_replicas,
                    "maxReplicas": a.max_replicas,
                    "metrics": [
                        {
                            "type": "Resource",
                            "resource": {
                                "name": "cpu",
                                "target": {
                                    "type": "Utilization",
                                    "averageUtilization": a.target_cpu_utilization_percentage,
                                },
                            },
                        }
                    ],
                },
            }
        )
    return objs
