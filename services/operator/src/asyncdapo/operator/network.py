"""NetworkPolicies of a run: every pod of a run is selected by one, so nothing is reachable by
accident. Ingress only (egress targets — API server, external Redis, storage — are cluster-specific).

| pods | admitted |
|---|---|
| gateway | gRPC control/generate port: this run's scheduler and trainer only; metrics: anyone |
| scheduler | gRPC: this run's trainer and the asyncdapo operator (GetRun); metrics: anyone |
| verifier (dedicated) | HTTP: this run's scheduler and the monitoring namespace (/metrics shares the port) |
| trainer | everything between this run's trainer pods (Ray head/workers); metrics: anyone; the Ray job API (8265) from the KubeRay operator |
| redis (managed) | this run's scheduler and trainer |
| prepare | nothing |

`kubectl port-forward` (e.g. grpcurl against the scheduler) enters through the kubelet and is not
subject to these policies.
"""

from __future__ import annotations

from typing import Any

from .objects import OperatorDefaults, RunRef, meta
from .pods import COMPONENT_LABEL, GRPC_PORT, METRICS_PORT, REDIS_PORT, RUN_LABEL, VERIFIER_PORT, selector
from .spec import TrainingRunSpec

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
    out.append(
        _policy(
            ref,
            "gateway",
            [
                {"from": [_run_pods(ref, "scheduler", "trainer")], "ports": _port(GRPC_PORT)},
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
        monitoring = {
            "namespaceSelector": {
                "matchLabels": {"kubernetes.io/metadata.name": defaults.monitoring_namespace}
            }
        }
        out.append(
            _policy(
                ref,
                "verifier",
                [{"from": [_run_pods(ref, "scheduler"), monitoring], "ports": _port(VERIFIER_PORT)}],
            )
        )
    trainer_ingress = [{"from": [_run_pods(ref, "trainer")]}, metrics_from_anyone]
    if spec.run.trainer.workers > 1:  # the KubeRay operator polls the Ray head's job API
        kuberay = {
            "namespaceSelector": {},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "kuberay-operator"}},
        }
        trainer_ingress.append({"from": [kuberay], "ports": _port(RAY_DASHBOARD_PORT)})
    out.append(_policy(ref, "trainer", trainer_ingress))
    return out
