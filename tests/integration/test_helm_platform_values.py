"""What a platform team sets in the chart: securityContexts (restricted by default, OpenShift's
random UID as an override), imagePullSecrets in both forms, commonLabels, the ServiceMonitor /
PrometheusRule namespace and labels, the monitoring namespace selector (chart and operator), operator
replicas with leader election, and a chart without symlinks. Rendered with Helm's engine, validated
against the Kubernetes schemas."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import required

helm = required.module("helm_python")
kubernetes_validate = required.module("kubernetes_validate")

from asyncdapo.services.operator import chart  # noqa: E402
from asyncdapo.services.operator.cli import _defaults, register  # noqa: E402
from asyncdapo.services.operator.desired import Lifecycle, RunRef, desired_state  # noqa: E402
from asyncdapo.services.operator.spec import parse_spec  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
K8S_VERSION = "1.33.0"
THIRD_PARTY = {"ServiceMonitor", "PrometheusRule"}
OPENSHIFT: dict[str, Any] = {
    "podSecurityContext": {"runAsUser": None, "runAsGroup": None, "fsGroup": None},
    "securityContext": {"runAsUser": None, "runAsGroup": None},
}


def _validate(docs: list[dict[str, Any]]) -> None:
    for doc in docs:
        if doc["kind"] not in THIRD_PARTY:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def _deployment(docs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == name)


def _operator_env(docs: list[dict[str, Any]]) -> dict[str, str]:
    c = _deployment(docs, "asyncdapo-operator")["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", "") for e in c["env"]}


def _operator_defaults(docs: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> Any:
    """The OperatorDefaults the chart's operator Deployment would start with (its env and args)."""
    import argparse

    c = _deployment(docs, "asyncdapo-operator")["spec"]["template"]["spec"]["containers"][0]
    for name, value in _operator_env(docs).items():
        if name.startswith("ASYNCDAPO_OPERATOR_"):
            monkeypatch.setenv(name, value)
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    return _defaults(parser.parse_args(c["args"]), kuberay=True)


def _run_pods(defaults: Any) -> list[dict[str, Any]]:
    import yaml

    tr = yaml.safe_load((REPO / "deploy/k8s/examples/tiny-math-cpu.yaml").read_text())
    spec = parse_spec(tr["spec"], tr["metadata"]["name"])
    ref = RunRef(tr["metadata"]["name"], "ml", "00000000-0000-0000-0000-000000000001")
    return desired_state(spec, ref, defaults, Lifecycle.RUNNING)


def _pods(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for d in docs:
        if d["kind"] == "Pod":
            out.append(d["spec"])
        tpl = d.get("spec", {}).get("template")
        if isinstance(tpl, dict) and "spec" in tpl:
            out.append(tpl["spec"])
    return out


def test_default_security_contexts_are_restricted_with_uid_10001(monkeypatch: pytest.MonkeyPatch) -> None:
    docs = chart.render()
    pods = _pods(docs)
    assert len(pods) >= 5  # operator, verifier, redis, three test pods
    for pod in pods:
        assert pod["securityContext"]["runAsUser"] == 10001 and pod["securityContext"]["fsGroup"] == 10001
        for c in pod["containers"]:
            assert c["securityContext"]["runAsUser"] == 10001
    # the run pods the chart's operator creates: the same contexts, as before the values existed
    runs = _pods(_run_pods(_operator_defaults(docs, monkeypatch)))
    assert runs and all(p["securityContext"]["runAsUser"] == 10001 for p in runs)


def test_openshift_override_renders_without_fixed_ids_and_validates(monkeypatch: pytest.MonkeyPatch) -> None:
    docs = chart.render(OPENSHIFT)
    _validate(docs)
    assert chart.lint(OPENSHIFT)["errors"] == []
    for name in ("asyncdapo-operator", "asyncdapo-verifier"):
        pod = _deployment(docs, name)["spec"]["template"]["spec"]
        assert pod["securityContext"] == {
            "runAsNonRoot": True,
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"},
        }
        (c,) = pod["containers"]
        assert not {"runAsUser", "runAsGroup"} & set(c["securityContext"])
        assert c["securityContext"]["readOnlyRootFilesystem"] and c["securityContext"]["capabilities"] == {
            "drop": ["ALL"]
        }
    # ... and the operator passes them on: no run pod pins a UID either
    run_docs = _run_pods(_operator_defaults(docs, monkeypatch))
    _validate(run_docs)
    for pod in _pods(run_docs):
        assert "runAsUser" not in pod["securityContext"] and "fsGroup" not in pod["securityContext"]
        for c in pod["containers"]:
            assert "runAsUser" not in c["securityContext"] and c["securityContext"]["runAsNonRoot"] is True


def test_a_components_security_context_replaces_the_charts() -> None:
    own = {"runAsNonRoot": True, "runAsUser": 2000, "seccompProfile": {"type": "RuntimeDefault"}}
    docs = chart.render({"verifier": {"podSecurityContext": own}, "runs": {"podSecurityContext": own}})
    _validate(docs)
    assert _deployment(docs, "asyncdapo-verifier")["spec"]["template"]["spec"]["securityContext"] == own
    assert (
        _deployment(docs, "asyncdapo-operator")["spec"]["template"]["spec"]["securityContext"]["runAsUser"]
        == 10001
    )
    assert '"runAsUser":2000' in _operator_env(docs)["ASYNCDAPO_OPERATOR_POD_SECURITY_CONTEXT"]


def test_redis_takes_the_charts_security_contexts_or_its_own() -> None:
    def redis_pod(values: dict[str, Any]) -> dict[str, Any]:
        docs = chart.render(values)
        _validate(docs)
        (sts,) = [
            d for d in docs if d["kind"] == "StatefulSet" and d["metadata"]["name"] == "asyncdapo-redis"
        ]
        pod: dict[str, Any] = sts["spec"]["template"]["spec"]
        return pod

    openshift = redis_pod(OPENSHIFT)  # the chart-wide override reaches Redis and its init container
    assert not {"runAsUser", "runAsGroup", "fsGroup"} & set(openshift["securityContext"])
    for c in [*openshift["initContainers"], *openshift["containers"]]:
        assert not {"runAsUser", "runAsGroup"} & set(c["securityContext"])
        assert c["securityContext"]["runAsNonRoot"] and c["securityContext"]["readOnlyRootFilesystem"]
    own_pod = {
        "runAsNonRoot": True,
        "runAsUser": 999,
        "fsGroup": 999,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    own = redis_pod({"redis": {"podSecurityContext": own_pod, "securityContext": {"runAsUser": 999}}})
    assert own["securityContext"] == own_pod
    assert all(
        c["securityContext"] == {"runAsUser": 999} for c in [*own["initContainers"], *own["containers"]]
    )
    assert redis_pod({"verifier": {"podSecurityContext": own_pod}})["securityContext"]["runAsUser"] == 10001


def test_image_pull_secrets_in_both_forms_reach_chart_and_run_pods(monkeypatch: pytest.MonkeyPatch) -> None:
    values = {
        "global": {"imagePullSecrets": [{"name": "mirror"}]},
        "imagePullSecrets": ["regcred", {"name": "other"}],
    }
    docs = chart.render(values)
    _validate(docs)
    want = [{"name": "mirror"}, {"name": "regcred"}, {"name": "other"}]
    for pod in _pods(docs):
        assert pod["imagePullSecrets"] == want
    runs = _pods(_run_pods(_operator_defaults(docs, monkeypatch)))
    assert runs and all(p["imagePullSecrets"] == want for p in runs)


def test_common_labels_on_every_object_without_overriding_the_charts() -> None:
    values = {
        "commonLabels": {"team": "ml-platform", "app.kubernetes.io/part-of": "other"},
        "monitoring": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}},
    }
    docs = chart.render(values)
    _validate(docs)
    templated = docs  # the CRD too: it is a template (templates/crds.yaml)
    assert "CustomResourceDefinition" in {d["kind"] for d in templated}
    assert len(templated) >= 25
    for d in templated:
        labels = d["metadata"]["labels"]
        assert labels["team"] == "ml-platform", (d["kind"], d["metadata"]["name"])
        assert labels["app.kubernetes.io/part-of"] == "asyncdapo"  # selectors rely on it
    for pod in (d["spec"]["template"] for d in templated if d["kind"] == "Deployment"):
        assert pod["metadata"]["labels"]["team"] == "ml-platform"


def test_monitoring_objects_go_to_their_namespace_with_their_labels() -> None:
    values = {
        "monitoring": {
            "serviceMonitor": {
                "enabled": True,
                "namespace": "monitoring",
                "labels": {"release": "kps"},
                "annotations": {"owner": "platform"},
                "runNamespaces": ["ml", "research"],
            },
            "prometheusRule": {"enabled": True, "namespace": "monitoring", "labels": {"release": "kps"}},
        }
    }
    docs = [d for d in chart.render(values) if d["kind"] in THIRD_PARTY]
    assert len(docs) == 3
    for d in docs:
        assert d["metadata"]["namespace"] == "monitoring" and d["metadata"]["labels"]["release"] == "kps"
    monitors = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ServiceMonitor"}
    # from another namespace, the chart's own ServiceMonitor still selects the release namespace's services
    assert monitors["asyncdapo"]["spec"]["namespaceSelector"] == {"matchNames": ["asyncdapo"]}
    assert monitors["asyncdapo-runs"]["spec"]["namespaceSelector"] == {"matchNames": ["ml", "research"]}
    assert monitors["asyncdapo"]["metadata"]["annotations"] == {"owner": "platform"}
    default = [d for d in chart.render({"monitoring": {"serviceMonitor": {"enabled": True}}})
               if d["kind"] == "ServiceMonitor"]  # fmt: skip
    assert {d["metadata"]["namespace"] for d in default} == {"asyncdapo"}
    assert next(d for d in default if d["metadata"]["name"] == "asyncdapo-runs")["spec"][
        "namespaceSelector"
    ] == {"any": True}


def test_monitoring_namespace_selector_reaches_chart_and_run_policies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    default = chart.render()
    defaults = _operator_defaults(default, monkeypatch)
    assert dict(defaults.monitoring_namespace_selector) == {"kubernetes.io/metadata.name": "monitoring"}
    selector = {"kubernetes.io/metadata.name": None, "team": "observability"}
    docs = chart.render({"networkPolicy": {"monitoringNamespaceSelector": {"matchLabels": selector}}})
    _validate(docs)
    want = {"matchLabels": {"team": "observability"}}
    pol = next(
        d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "asyncdapo-operator"
    )
    assert pol["spec"]["ingress"][0]["from"] == [{"namespaceSelector": want}]
    args = _deployment(docs, "asyncdapo-operator")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--monitoring-namespace-selector=team=observability" in args
    run_docs = _run_pods(_operator_defaults(docs, monkeypatch))
    verifier = next(
        d for d in run_docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"].endswith("-verifier")
    )
    assert {"namespaceSelector": want} in verifier["spec"]["ingress"][0]["from"]


def _lease_rbac(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        d["kind"]: d
        for d in docs
        if d["kind"] in ("Role", "RoleBinding")
        and d["metadata"]["name"] == "asyncdapo-operator-leader-election"
    }


def test_two_operator_replicas_elect_a_leader_through_a_lease() -> None:
    values = {"operator": {"replicas": 2}, "commonLabels": {"team": "ml-platform"}}
    docs = chart.render(values)
    _validate(docs)
    assert chart.lint(values)["errors"] == []
    op = _deployment(docs, "asyncdapo-operator")
    assert op["spec"]["replicas"] == 2
    assert op["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    c = op["spec"]["template"]["spec"]["containers"][0]
    assert c["args"][-3:] == [
        "--leader-election",
        "--leader-election-namespace=asyncdapo",
        "--leader-election-lease-name=asyncdapo-operator",
    ]
    pod_name = next(e for e in c["env"] if e["name"] == "POD_NAME")
    assert pod_name["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    # the flags are the operator's own: its parser reads them as the chart means them
    import argparse

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(c["args"])
    assert args.leader_election and args.leader_election_namespace == "asyncdapo"
    assert args.leader_election_lease_name == "asyncdapo-operator"
    # RBAC: the Lease in the release namespace only; create any, read and renew that one
    rbac = _lease_rbac(docs)
    role, binding = rbac["Role"], rbac["RoleBinding"]
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == "asyncdapo"
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["asyncdapo-operator"],
            "verbs": ["get", "update"],
        },
    ]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "asyncdapo-operator-leader-election",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "asyncdapo-operator", "namespace": "asyncdapo"}
    ]
    (pdb,) = [
        d
        for d in docs
        if d["kind"] == "PodDisruptionBudget" and d["metadata"]["name"] == "asyncdapo-operator"
    ]
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == op["spec"]["selector"]["matchLabels"]
    for d in (role, binding, pdb):
        assert d["metadata"]["labels"]["team"] == "ml-platform"


def test_one_operator_replica_keeps_recreate_and_still_elects() -> None:
    """The default: one replica, replaced with Recreate; it still takes the Lease, so an old pod on a
    lost node that still runs cannot reconcile alongside its replacement."""
    docs = chart.render()
    _validate(docs)
    op = _deployment(docs, "asyncdapo-operator")
    assert op["spec"]["replicas"] == 1 and op["spec"]["strategy"] == {"type": "Recreate"}
    assert "--leader-election" in op["spec"]["template"]["spec"]["containers"][0]["args"]
    assert set(_lease_rbac(docs)) == {"Role", "RoleBinding"}
    assert not [
        d
        for d in docs
        if d["kind"] == "PodDisruptionBudget" and d["metadata"]["name"] == "asyncdapo-operator"
    ]


def test_values_schema_refuses_a_typo_in_each_new_section() -> None:
    for bad, where in (
        ({"podSecurityContext": {"runAsUsr": 1}}, "runAsUsr"),
        ({"operator": {"securityContext": {"readOnlyRootFileSystem": True}}}, "readOnlyRootFileSystem"),
        ({"runs": {"podSecurityContexts": {}}}, "podSecurityContexts"),
        ({"redis": {"securityContext": {"runAsUsr": 1}}}, "runAsUsr"),
        ({"imagePullSecrets": [{"nam": "regcred"}]}, "/imagePullSecrets/0"),
        ({"commonLabels": {"team": 1}}, "/commonLabels/team"),
        ({"monitoring": {"serviceMonitor": {"namespce": "monitoring"}}}, "namespce"),
        (
            {"monitoring": {"prometheusRule": {"namespace": "Not_A_Namespace"}}},
            "/monitoring/prometheusRule/namespace",
        ),
        ({"networkPolicy": {"monitoringNamespaceSelector": {"matchLabel": {"a": "b"}}}}, "matchLabel"),
        ({"operator": {"replica": 2}}, "replica"),
        ({"operator": {"replicas": 0}}, "/operator/replicas"),
    ):
        with pytest.raises(helm.HelmValuesError, match=re.escape(where)):
            chart.render(bad)


def test_chart_ships_no_symlinks_and_the_deploy_paths_point_into_it() -> None:
    chart_dir = REPO / "deploy" / "helm" / "asyncdapo"
    links = [p for p in chart_dir.rglob("*") if p.is_symlink()]
    assert links == []
    # the chart's copies are the only ones: deploy/dashboards and deploy/alerts lead into the chart
    for name in ("dashboards", "alerts"):
        assert (REPO / "deploy" / name).resolve() == (chart_dir / name).resolve()
    assert sorted(p.name for p in (chart_dir / "dashboards").glob("*.json")) == [
        "gateways.json", "rollout.json", "trainer.json", "verifier.json"
    ]  # fmt: skip
