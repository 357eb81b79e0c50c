"""NetworkPolicies of a run: every pod of a run is selected by one, so nothing is reachable by
accident. Ingress only (egress targets — API server, external Redis, storage — are cluster-specific).

| pods | admitted |
|---|---|
| gateway | gRPC control/generate port: this run's scheduler and trainer only, and (stream transport) this run's other gateways, which pull weight chunks from it (WeightStore on the same port); metrics: anyone |
| scheduler | gRPC: this run's trainer and the asyncdapo operator (GetRun); metrics: anyone |
| verifier (dedicated) | HTTP: this run's scheduler and the monitoring namespace (/metrics shares the port) |
| trainer | everything between this run's trainer pods (Ray head/workers); metrics: anyone; the Ray job API (8265) from the KubeRay operator; (stream transport) the weight store port from this run's gateways (weights) and scheduler (tokenizer) |
| redis (managed) | this run's scheduler and trainer |
| prepare | nothing |

`kubectl port-forward` (e.g. grpcurl against the scheduler) enters through the kubelet and is not
subject to these policies.
"""

from __future__ import annotations

from typing import Any

from asyncdapo.services.operator.objects import OperatorDefaults, RunRef, meta
from asyncdapo.services.operator.pods import (
    COMPONENT_LABEL,
    GRPC_PORT,
    METRICS_PORT,
    REDIS_PORT,
    RUN_LABEL,
    VERIFIER_PORT,
    WEIGHTS_PORT,
    selector,
)
from asyncdapo.services.operator.spec import TrainingRunSpec
from asyncdapo.services.operator.workspace import streams_weights

RAY_DASHBOARD_PORT = 8265


def _run_pods(ref: RunRef, *components: str) -> dict[str, Any]:
    return {
        "podSelector": {
            "matchLabels": {RUN_LABEL: ref.name},
            "matchExpressions": [{"key": COMPONENT_LABEL, "operator": "In", "values": list(components)}],
        }
    }


def _operator_pods() -> dict[str, Any]:
    return {
        "namespaceSelector": {},
        "podSelector": {
            "matchLabels": {"app.kubernetes.io/part-of": "asyncdapo", COMPONENT_LABEL: "operator"}
        },
    }


def _port(port: int) -> list[dict[str, Any]]:
    return [{"protocol": "TCP", "port": port}]


def _policy(ref: RunRef, component: str, ingress: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta(ref, f"{ref.name}-{component}", component),
        "spec": {
            "podSelector": {"matchLabels": selector(ref.name, component)},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }


def network_policies(
    spec: TrainingRunSpec, ref: RunRef, defaults: OperatorDefaults, *, rollout: bool
) -> list[dict[str, Any]]:
    """Policies for the run's pods; `rollout`: whether rollout/trainer workloads exist yet."""
    metrics_from_anyone = {"ports": _port(METRICS_PORT)}
    out = []
    if spec.prepare is not None:
        out.append(_policy(ref, "prepare", []))
    if spec.redis.managed is not None:
        out.append(
            _policy(
                ref, "redis", [{"from": [_run_pods(ref, "scheduler", "trainer")], "ports": _port(REDIS_PORT)}]
            )
        )
    if not rollout:
        return out
    stream = streams_weights(spec)
    # stream: a gateway pulls weight chunks from the peer the scheduler names (gateways relay)
    gateway_clients = ["scheduler", "trainer", "gateway"] if stream else ["scheduler", "trainer"]
    out.append(
        _policy(
            ref,
            "gateway",
            [
                {"from": [_run_pods(ref, *gateway_clients)], "ports": _port(GRPC_PORT)},
                metrics_from_anyone,
            ],
        )
    )
    out.append(
        _policy(
            ref,
            "scheduler",
            [
                {"from": [_run_pods(ref, "trainer"), _operator_pods()], "ports": _port(GRPC_PORT)},
                metrics_from_anyone,
            ],
        )
    )
    if not spec.verifier.url:
        monitoring = {"namespaceSelector": {"matchLabels": dict(defaults.monitoring_namespace_selector)}}
        out.append(
            _policy(
                ref,
                "verifier",
                [{"from": [_run_pods(ref, "scheduler"), monitoring], "ports": _port(VERIFIER_PORT)}],
            )
        )
    trainer_ingress = [{"from": [_run_pods(ref, "trainer")]}, metrics_from_anyone]
    if stream:  # the weight store: versions for gateways, the tokenizer for the scheduler
        trainer_ingress.append(
            {"from": [_run_pods(ref, "gateway", "scheduler")], "ports": _port(WEIGHTS_PORT)}
        )
    if spec.run.trainer.workers > 1:  # the KubeRay operator polls the Ray head's job API
        kuberay = {
            "namespaceSelector": {},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "kuberay-operator"}},
        }
        trainer_ingress.append({"from": [kuberay], "ports": _port(RAY_DASHBOARD_PORT)})
    out.append(_policy(ref, "trainer", trainer_ingress))
    return out
