"""Training progress for the TrainingRun status, read from the services themselves:
- the trainer's Prometheus endpoint (step, reward, accuracy, policy version, last checkpoint);
- the scheduler's `GetRun` (valid groups produced, the policy version gateways serve).

The operator reads no Redis directly: an external Redis' password lives in the user's Secret,
and the operator's RBAC deliberately grants no `get` on Secrets. Every source is optional: a
sample that cannot be taken leaves the field unknown (None) and status.py keeps the last value.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from asyncdapo.services.operator.pods import GRPC_PORT, METRICS_PORT
from asyncdapo.services.operator.status_machine import Progress

log = logging.getLogger(__name__)

# Trainer gauges the status reads (deploy/METRICS.md).
STEP = "asyncdapo_trainer_step"
POLICY_VERSION = "asyncdapo_trainer_version"
REWARD = "asyncdapo_trainer_reward_mean"
ACCURACY = "asyncdapo_trainer_acc_mean"
CHECKPOINT_INFO = "asyncdapo_trainer_checkpoint_info"  # label `path`, value: the checkpoint's step


def parse_trainer_metrics(text: str) -> Progress:
    """Pure: Prometheus text exposition → Progress (unknown gauges stay None)."""
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, float] = {}
    checkpoint: tuple[float, str] | None = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == CHECKPOINT_INFO and "path" in sample.labels:
                if checkpoint is None or sample.value >= checkpoint[0]:
                    checkpoint = (sample.value, sample.labels["path"])
            elif sample.name in (STEP, POLICY_VERSION, REWARD, ACCURACY) and not sample.labels:
                values[sample.name] = sample.value

    def as_int(name: str) -> int | None:
        return int(values[name]) if name in values else None

    return Progress(
        step=as_int(STEP),
        policy_version=as_int(POLICY_VERSION),
        reward=values.get(REWARD),
        accuracy=values.get(ACCURACY),
        last_checkpoint=checkpoint[1] if checkpoint else None,
    )


def resolve_endpoints(host: str, port: int) -> list[str]:
    """`host:port` of every address of a (headless) Service name."""
    import socket

    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addrs = sorted({str(info[4][0]) for info in infos})
    return [f"[{a}]:{port}" if ":" in a else f"{a}:{port}" for a in addrs]


def read_trainer_metrics(endpoints: list[str], timeout_s: float) -> Progress:
    """The progress of the first endpoint that exports a step. The trainer's metrics Service is
    headless over every trainer worker pod; only rank 0 exports the training metrics (the other
    ranks serve their rank only), so each endpoint is tried in turn."""
    import httpx

    for endpoint in endpoints:
        try:
            resp = httpx.get(f"http://{endpoint}/metrics", timeout=timeout_s)
            resp.raise_for_status()
        except httpx.HTTPError as err:
            log.debug("trainer metrics at %s unavailable: %s", endpoint, err)
            continue
        progress = parse_trainer_metrics(resp.text)
        if progress.step is not None:
            return progress
    return Progress()


def read_progress(run: str, namespace: str, timeout_s: float = 3.0) -> Progress:
    """Sample the trainer and the scheduler of a run (in-cluster DNS); failures give None fields."""
    progress = Progress()
    try:
        endpoints = resolve_endpoints(f"{run}-trainer.{namespace}.svc", METRICS_PORT)
        progress = read_trainer_metrics(endpoints, timeout_s)
    except Exception as err:  # a boundary: the trainer may be starting, restarting or finished
        log.debug("trainer metrics of %s/%s unavailable: %s", namespace, run, err)
    try:
        import grpc

        from asyncdapo.contracts.v1 import scheduler_pb2, scheduler_pb2_grpc

        with grpc.insecure_channel(f"{run}-scheduler.{namespace}.svc:{GRPC_PORT}") as channel:
            stub = scheduler_pb2_grpc.SchedulerStub(channel)
            st = stub.GetRun(scheduler_pb2.GetRunRequest(run=run), timeout=timeout_s)
        progress = replace(
            progress,
            valid_groups=st.valid_groups_produced,
            policy_version=progress.policy_version
            if progress.policy_version is not None
            else st.policy_version,
        )
    except Exception as err:  # a boundary: the scheduler may be scaled to zero
        log.debug("scheduler GetRun of %s/%s unavailable: %s", namespace, run, err)
    return progress
