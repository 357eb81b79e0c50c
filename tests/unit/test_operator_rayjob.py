"""The multi-worker trainer (a KubeRay RayJob): the four defects of the first RayJob path, each as a
test of the desired state — Retrying is not Failed; the Ray head and the submitter do not inherit
the workers' resources; GPUs come from the config, not from the head's torch; the metrics Service
selects only pods that serve metrics, and the progress reader finds rank 0 among them."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_operator_reconcile import T0, UID, FakeCluster

from asyncdapo.contracts.config import RunConfig
from asyncdapo.services.operator.desired import Lifecycle, OperatorDefaults, RunRef, desired_state
from asyncdapo.services.operator.objects import CPU_DEFAULTS
from asyncdapo.services.operator.reconcile import ray_job_state, reconcile, status_patch
from asyncdapo.services.operator.service_progress import read_trainer_metrics
from asyncdapo.services.operator.spec import parse_spec
from asyncdapo.services.operator.status_machine import Progress
from asyncdapo.services.trainer.launch import worker_resources

REPO = Path(__file__).resolve().parents[2]
GPU_EXAMPLE = REPO / "deploy" / "k8s" / "examples" / "qwen3-8b-dapo-gpu.yaml"


def _raw() -> dict[str, Any]:
    return yaml.safe_load(GPU_EXAMPLE.read_text())


def _objs(
    raw: dict[str, Any] | None = None, lifecycle: Lifecycle = Lifecycle.RUNNING
) -> dict[tuple[str, str], Any]:
    raw = raw or _raw()
    spec = parse_spec(raw["spec"], raw["metadata"]["name"])
    ref = RunRef("dapo-qwen3-8b", "ml", "uid-r")
    objs = desired_state(spec, ref, OperatorDefaults(kuberay=True), lifecycle)
    return {(o["kind"], o["metadata"]["name"]): o for o in objs}


def _templates(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    cluster = job["spec"]["rayClusterSpec"]
    return {
        "head": cluster["headGroupSpec"]["template"],
        "worker": cluster["workerGroupSpecs"][0]["template"],
        "submitter": job["spec"]["submitterPodTemplate"],
    }


# --- 1. Retrying is not Failed ---------------------------------------------------------------


def test_rayjob_retrying_is_not_terminal() -> None:
    retrying = ray_job_state(
        {"jobDeploymentStatus": "Retrying", "jobStatus": "FAILED", "failed": 1, "message": "worker OOM"}
    )
    assert not retrying.failed and not retrying.succeeded
    assert "retrying after 1 failed attempt" in retrying.message and "worker OOM" in retrying.message
    assert ray_job_state({"jobDeploymentStatus": "Running", "jobStatus": "FAILED"}).failed is False
    assert ray_job_state({"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}).active == 1
    done = ray_job_state({"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"})
    assert done.succeeded
    failed = ray_job_state({"jobDeploymentStatus": "Failed", "jobStatus": "FAILED", "reason": "AppFailed"})
    assert failed.failed and failed.reason == "AppFailed"
    invalid = ray_job_state({"jobDeploymentStatus": "ValidationFailed", "message": "bad spec"})
    assert invalid.failed and invalid.reason == "RayJobValidationFailed"
    stopped = ray_job_state({"jobDeploymentStatus": "Complete", "jobStatus": "STOPPED"})
    assert stopped.failed and not stopped.succeeded
    assert ray_job_state({"jobDeploymentStatus": "Suspended"}).suspended


def test_a_run_whose_rayjob_retries_keeps_running() -> None:
    cluster = FakeCluster(kuberay=True)
    body = _raw()
    body["metadata"].update({"namespace": "ml", "uid": UID, "generation": 1})
    prog = lambda run, ns: Progress()  # noqa: E731
    status = status_patch(reconcile(body, cluster, OperatorDefaults(kuberay=True), prog, T0))
    cluster.set_status(
        "RayJob",
        "dapo-qwen3-8b-trainer",
        {"jobDeploymentStatus": "Retrying", "jobStatus": "FAILED", "failed": 1},
    )
    body["status"] = status
    status = status_patch(
        reconcile(body, cluster, OperatorDefaults(kuberay=True), prog, T0 + timedelta(minutes=5))
    )
    assert status["phase"] == "Pending" and "completionTime" not in status
    trainer = {c["type"]: c for c in status["conditions"]}["TrainerRunning"]
    assert "retrying after 1 failed attempt" in trainer["message"]
    cluster.set_status(
        "RayJob",
        "dapo-qwen3-8b-trainer",
        {"jobDeploymentStatus": "Failed", "jobStatus": "FAILED", "reason": "AppFailed"},
    )
    body["status"] = status
    status = status_patch(
        reconcile(body, cluster, OperatorDefaults(kuberay=True), prog, T0 + timedelta(minutes=9))
    )
    assert status["phase"] == "Failed" and status["reason"] == "AppFailed"


# --- 2. head and submitter have their own resources ------------------------------------------


def test_head_and_submitter_do_not_inherit_worker_resources() -> None:
    raw = _raw()
    assert raw["spec"]["trainer"]["resources"]["limits"]["memory"] == "192Gi"
    t = _templates(_objs(raw)[("RayJob", "dapo-qwen3-8b-trainer")])
    res = {k: v["spec"]["containers"][0]["resources"] for k, v in t.items()}
    assert res["worker"]["limits"] == {"cpu": "16", "memory": "192Gi", "nvidia.com/gpu": 1}
    assert res["head"] == {k: dict(sorted(v.items())) for k, v in CPU_DEFAULTS["ray-head"].items()}
    assert res["submitter"] == {k: dict(sorted(v.items())) for k, v in CPU_DEFAULTS["ray-submitter"].items()}
    raw["spec"]["trainer"]["rayHead"] = {"resources": {"limits": {"memory": "16Gi"}}}
    head = _templates(_objs(raw)[("RayJob", "dapo-qwen3-8b-trainer")])["head"]["spec"]["containers"][0]
    assert head["resources"]["limits"] == {"cpu": "4", "memory": "16Gi"}
    # the head runs the driver only: it offers Ray no CPU and no GPU for workers
    cluster = _objs(raw)[("RayJob", "dapo-qwen3-8b-trainer")]["spec"]["rayClusterSpec"]
    assert cluster["headGroupSpec"]["rayStartParams"] == {"num-cpus": "0", "num-gpus": "0"}
    assert cluster["workerGroupSpecs"][0]["rayStartParams"] == {}  # GPUs from the pod's limits


def test_cpu_workers_advertise_one_cpu_each() -> None:
    raw = _raw()
    raw["spec"]["trainer"]["gpusPerWorker"] = 0
    cluster = _objs(raw)[("RayJob", "dapo-qwen3-8b-trainer")]["spec"]["rayClusterSpec"]
    assert cluster["workerGroupSpecs"][0]["rayStartParams"] == {"num-cpus": "1"}


# --- 3. use_gpu from the config ---------------------------------------------------------------


def test_gpus_per_worker_comes_from_the_config_not_the_head() -> None:
    run = yaml.safe_load(_objs()[("ConfigMap", "dapo-qwen3-8b-config")]["data"]["run.yaml"])
    assert run["trainer"]["gpus_per_worker"] == 1  # from spec.trainer.gpusPerWorker
    cfg = RunConfig.model_validate(run)
    # the driver runs on the GPU-less Ray head: it sees no CUDA, the workers still get their GPU
    assert worker_resources(cfg, cuda_on_driver=False) == (True, {"GPU": 1.0})
    cpu = cfg.model_copy(update={"trainer": cfg.trainer.model_copy(update={"gpus_per_worker": 0})})
    assert worker_resources(cpu, cuda_on_driver=True) == (False, {"CPU": 1.0})
    local = cfg.model_copy(update={"trainer": cfg.trainer.model_copy(update={"gpus_per_worker": None})})
    assert worker_resources(local, cuda_on_driver=True) == (True, {"GPU": 1.0})  # a local run
    assert worker_resources(local, cuda_on_driver=False) == (False, {"CPU": 1.0})


def test_conflicting_gpu_settings_are_refused() -> None:
    raw = _raw()
    raw["spec"]["run"]["trainer"]["gpus_per_worker"] = 2
    with pytest.raises(ValueError, match="gpus_per_worker"):
        parse_spec(raw["spec"], "dapo-qwen3-8b")


# --- 4. the metrics Service selects the pods that serve -------------------------------------


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


@pytest.mark.parametrize("workers", [1, 8])
def test_metrics_service_selects_only_pods_that_serve_metrics(workers: int) -> None:
    raw = _raw()
    raw["spec"]["run"]["trainer"]["workers"] = workers
    objs = _objs(raw)
    svc = objs[("Service", "dapo-qwen3-8b-trainer")]
    assert svc["spec"]["clusterIP"] == "None"  # headless: the progress reader sees every endpoint
    # ... and gateways dial rank 0's weight store through it (rank 0 may be any worker pod)
    assert svc["spec"]["ports"] == [
        {"name": "metrics", "port": 9090, "targetPort": 9090, "protocol": "TCP"},
        {"name": "weights", "port": 50070, "targetPort": 50070, "protocol": "TCP"},
    ]
    if workers == 1:
        templates = {"job": objs[("Job", "dapo-qwen3-8b-trainer")]["spec"]["template"]}
    else:
        templates = _templates(objs[("RayJob", "dapo-qwen3-8b-trainer")])
    selected = set()
    for name, tpl in templates.items():
        ports = {p.get("name") for c in tpl["spec"]["containers"] for p in c.get("ports", [])}
        serves = {"metrics", "weights"} <= ports
        assert serves or not ports & {"metrics", "weights"}, name
        picked = _selects(svc["spec"]["selector"], tpl["metadata"]["labels"])
        assert picked == serves, name
        if picked:
            selected.add(name)
    assert selected == ({"job"} if workers == 1 else {"worker"})


class _Metrics(BaseHTTPRequestHandler):
    body = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: Any) -> None: ...


@pytest.fixture()
def endpoints() -> Iterator[list[str]]:
    rank1 = "# TYPE asyncdapo_trainer_worker_rank gauge\nasyncdapo_trainer_worker_rank 1.0\n"
    rank0 = (
        "# TYPE asyncdapo_trainer_step gauge\nasyncdapo_trainer_step 12.0\n"
        "# TYPE asyncdapo_trainer_reward_mean gauge\nasyncdapo_trainer_reward_mean 0.4\n"
        '# TYPE asyncdapo_trainer_checkpoint_info gauge\nasyncdapo_trainer_checkpoint_info{path="/w/ckpt/step-12"} 12.0\n'
    )
    servers = []
    for text in (rank1, rank0):
        handler = type("H", (_Metrics,), {"body": text.encode()})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    try:
        yield [f"127.0.0.1:{s.server_address[1]}" for s in servers]
    finally:
        for s in servers:
            s.shutdown()
            s.server_close()


def test_progress_comes_from_the_endpoint_that_has_a_step(endpoints: list[str]) -> None:
    for order in (endpoints, endpoints[::-1]):
        p = read_trainer_metrics(order, timeout_s=2.0)
        assert (p.step, p.reward, p.last_checkpoint) == (12, 0.4, "/w/ckpt/step-12")
    assert read_trainer_metrics(endpoints[:1], timeout_s=2.0) == Progress()  # rank 1 alone: unknown
    assert read_trainer_metrics(["127.0.0.1:1", endpoints[1]], timeout_s=2.0).step == 12  # a dead one
