"""The Helm chart, rendered with Helm's own engine (helm-python-sdk: the Go SDK, no helm binary),
validated against the official Kubernetes schemas and scanned by checkov together with the
operator's manifests for the example TrainingRuns; the plain manifests and Dockerfiles checked."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import required
import yaml

helm = required.module("helm_python")
kubernetes_validate = required.module("kubernetes_validate")

from asyncdapo.services.operator import chart  # noqa: E402
from asyncdapo.services.operator.desired import Lifecycle, OperatorDefaults, RunRef, desired_state  # noqa: E402
from asyncdapo.services.operator.spec import parse_spec  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
K8S_VERSIONS = ("1.33.0", "1.35.0")  # oldest supported by the chart's kubeVersion we test, and a current one
# Third-party CRDs: their schemas are not shipped with kubernetes-validate; test_third_party_schemas.py
# validates these objects against the vendored prometheus-operator and KubeRay CRDs.
THIRD_PARTY = {"ServiceMonitor", "PrometheusRule", "RayJob"}

NON_DEFAULT: dict[str, Any] = {
    "image": {
        "controlPlane": {
            "repository": "registry.example/asyncdapo-control-plane",
            "tag": "0.1.0@sha256:" + "a" * 64,
        },
        "cpu": {"repository": "registry.example/asyncdapo-cpu", "tag": "0.1.0@sha256:" + "b" * 64},
        "pullPolicy": "Always",
    },
    "imagePullSecrets": ["regcred"],
    "operator": {"watchNamespaces": ["ml", "research"], "nodeSelector": {"pool": "system"}},
    "verifier": {"replicas": 3, "autoscaling": {"enabled": False}, "workers": 4},
    "redis": {"enabled": False, "external": {"url": "redis://redis.data.svc:6379/1"}},
    "monitoring": {
        "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
        "prometheusRule": {"enabled": True},
        "dashboards": {"enabled": True, "annotations": {"grafana_folder": "asyncdapo"}},
    },
}


def _by_kind(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


@pytest.fixture(scope="module")
def default_docs() -> list[dict[str, Any]]:
    return chart.render()


@pytest.fixture(scope="module")
def custom_docs() -> list[dict[str, Any]]:
    return chart.render(NON_DEFAULT)


def _pod_specs(doc: dict[str, Any]) -> list[dict[str, Any]]:
    tpl = doc.get("spec", {}).get("template")
    return [tpl["spec"]] if isinstance(tpl, dict) and "spec" in tpl else []


def test_helm_lint_passes_for_default_and_custom_values() -> None:
    for values in (None, NON_DEFAULT):
        report = chart.lint(values)
        assert report["errors"] == []
        assert [m for m in report["messages"] if m["severity"] >= 2] == [], report["messages"]


def test_values_schema_rejects_bad_values() -> None:
    for bad, where in (
        ({"verifier": {"replicas": 0}}, "/verifier/replicas"),
        ({"redis": {"enabld": False}}, "enabld"),
        ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
        ({"monitoring": {"serviceMonitor": {"interval": "often"}}}, "/monitoring/serviceMonitor/interval"),
    ):
        with pytest.raises(helm.HelmValuesError, match=re.escape(where)):
            chart.render(bad)


def test_default_render(default_docs: list[dict[str, Any]]) -> None:
    objs = _by_kind(default_docs)
    assert ("CustomResourceDefinition", "trainingruns.asyncdapo.io") in objs
    for key in [("Deployment", "asyncdapo-operator"), ("Deployment", "asyncdapo-verifier"),
                ("StatefulSet", "asyncdapo-redis"), ("HorizontalPodAutoscaler", "asyncdapo-verifier"),
                ("ClusterRoleBinding", "asyncdapo-operator")]:  # fmt: skip
        assert key in objs, key
    assert not [k for k in objs if k[0] in ("ServiceMonitor", "PrometheusRule")]  # opt-in (needs their CRDs)
    dashboards = [
        d for (k, _), d in objs.items() if k == "ConfigMap" and "dashboard" in d["metadata"]["name"]
    ]
    assert len(dashboards) == 4
    for cm in dashboards:
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        (text,) = cm["data"].values()
        assert json.loads(text)["panels"]
    op = objs[("Deployment", "asyncdapo-operator")]["spec"]["template"]["spec"]["containers"][0]
    monitoring = "--monitoring-namespace-selector=kubernetes.io/metadata.name=monitoring"
    election = [
        "--leader-election",
        "--leader-election-namespace=asyncdapo",
        "--leader-election-lease-name=asyncdapo-operator",
    ]
    assert op["args"] == ["operator", "run", "--all-namespaces", monitoring, *election]
    env = {e["name"]: e.get("value") for e in op["env"]}
    assert env["ASYNCDAPO_OPERATOR_REDIS_URL"] == "redis://asyncdapo-redis.asyncdapo.svc:6379/0"
    assert env["ASYNCDAPO_OPERATOR_CPU_IMAGE"] == "ghcr.io/asyncdapo/asyncdapo-cpu:0.1.0"
    redis = objs[("StatefulSet", "asyncdapo-redis")]
    args = redis["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--appendonly") + 1] == "yes"
    assert redis["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "20Gi"


def test_custom_render(custom_docs: list[dict[str, Any]]) -> None:
    objs = _by_kind(custom_docs)
    assert not [k for k in objs if k[1] == "asyncdapo-redis" and k[0] != "NetworkPolicy"]
    assert ("NetworkPolicy", "asyncdapo-redis") not in objs
    bindings = [
        d for d in custom_docs if d["kind"] == "RoleBinding" and d["roleRef"]["kind"] == "ClusterRole"
    ]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["ml", "research"]
    assert ("ClusterRoleBinding", "asyncdapo-operator") not in objs  # namespaced: no cluster-wide writes
    op = objs[("Deployment", "asyncdapo-operator")]
    c = op["spec"]["template"]["spec"]["containers"][0]
    assert c["args"][:4] == ["operator", "run", "--namespace=ml", "--namespace=research"]
    assert c["image"].endswith("@sha256:" + "a" * 64) and c["imagePullPolicy"] == "Always"
    assert "annotations" not in op["metadata"]  # nothing to skip: digest pinned, pull Always
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["ASYNCDAPO_OPERATOR_REDIS_URL"] == "redis://redis.data.svc:6379/1"
    assert op["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    verifier = objs[("Deployment", "asyncdapo-verifier")]
    assert verifier["spec"]["replicas"] == 3 and ("HorizontalPodAutoscaler", "asyncdapo-verifier") not in objs
    sm = objs[("ServiceMonitor", "asyncdapo-runs")]
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert sm["spec"]["namespaceSelector"] == {"any": True}
    assert {"sourceLabels": ["__meta_kubernetes_pod_label_asyncdapo_io_run"], "targetLabel": "run"} in (
        sm["spec"]["endpoints"][0]["relabelings"]
    )
    rule = objs[("PrometheusRule", "asyncdapo")]
    source = yaml.safe_load((REPO / "deploy" / "alerts" / "asyncdapo.rules.yaml").read_text())
    assert rule["spec"]["groups"] == source["groups"]


@pytest.mark.parametrize("which", ["default", "custom"])
def test_every_object_validates_against_kubernetes_schemas(
    which: str, request: pytest.FixtureRequest
) -> None:
    docs = request.getfixturevalue(f"{which}_docs")
    validated = 0
    for doc in docs:
        if doc["kind"] in THIRD_PARTY:
            _check_third_party(doc)
            continue
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)
        validated += 1
    assert validated >= 15


def _check_third_party(doc: dict[str, Any]) -> None:
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"
    spec = doc["spec"]
    if doc["kind"] == "ServiceMonitor":
        assert spec["selector"] and all(e["port"] == "metrics" for e in spec["endpoints"])
    else:
        for group in spec["groups"]:
            assert group["name"] and all(
                ("alert" in r) != ("record" in r) and r["expr"] for r in group["rules"]
            )


@pytest.mark.parametrize("which", ["default", "custom"])
def test_restricted_pod_security_everywhere(which: str, request: pytest.FixtureRequest) -> None:
    for doc in request.getfixturevalue(f"{which}_docs"):
        for pod in _pod_specs(doc):
            assert pod["automountServiceAccountToken"] is False
            assert pod["securityContext"]["runAsNonRoot"] is True
            assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
            for c in pod["containers"]:
                sc = c["securityContext"]
                assert sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"]
                assert sc["capabilities"]["drop"] == ["ALL"]
                assert any(m["mountPath"] == "/tmp" for m in c["volumeMounts"])


def test_rbac_is_least_privilege(default_docs: list[dict[str, Any]]) -> None:
    roles = [d for d in default_docs if d["kind"] == "ClusterRole"]
    for role in roles:
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"]
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])
    secrets = [r for role in roles for r in role["rules"] if "secrets" in r["resources"]]
    assert secrets == [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]}]  # never read


def test_plain_manifests_are_fresh() -> None:
    committed = (REPO / "deploy" / "k8s" / "asyncdapo.yaml").read_text()
    assert committed == chart.plain_manifests(), "run `make deploy-manifests`"
    docs = [d for d in yaml.safe_load_all(committed) if d]
    assert docs[0]["kind"] == "Namespace" and docs[1]["kind"] == "CustomResourceDefinition"


def _run_docs() -> list[dict[str, Any]]:
    out = []
    for path in sorted((REPO / "deploy" / "k8s" / "examples").glob("*.yaml")):
        tr = yaml.safe_load(path.read_text())
        spec = parse_spec(tr["spec"], tr["metadata"]["name"])
        ref = RunRef(tr["metadata"]["name"], "ml", "00000000-0000-0000-0000-000000000001")
        for lifecycle in (Lifecycle.PREPARING, Lifecycle.RUNNING) if spec.prepare else (Lifecycle.RUNNING,):
            out += desired_state(spec, ref, OperatorDefaults(kuberay=True), lifecycle)
    return out


def test_checkov_finds_nothing_unjustified(tmp_path: Path, default_docs: list[dict[str, Any]]) -> None:
    """One checkov run over the chart (default and custom values) and the operator's manifests."""
    checkov = REPO / ".venv" / "bin" / "checkov"
    if not checkov.exists():
        pytest.fail("checkov is not installed in .venv: run `make install`")
    docs = default_docs + chart.render(NON_DEFAULT, release="custom") + _run_docs()
    names = set()
    for i, doc in enumerate(docs):
        # One object per file: checkov 3.0 silently skips a multi-document file it cannot fully map.
        name = f"{i:03d}-{doc['kind']}-{doc['metadata']['name']}.yaml"
        names.add(name)
        (tmp_path / name).write_text(yaml.safe_dump(doc, sort_keys=False))
    proc = subprocess.run(
        [str(checkov), "-d", str(tmp_path), "--framework", "kubernetes", "--skip-download", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = json.loads(proc.stdout)
    results = report["results"]
    failed = [f"{f['check_id']} {f['resource']}" for f in results["failed_checks"]]
    assert failed == [], "\n".join(failed)
    assert report["summary"]["parsing_errors"] == 0
    scanned = {c["file_path"].lstrip("/") for c in results["passed_checks"]}
    workloads = {n for n in names if re.search(r"-(Deployment|StatefulSet|Job)-", n)}
    assert workloads <= scanned  # every workload was really scanned
    for skipped in results["skipped_checks"]:
        # 43/15: release tags; 35: ASYNCDAPO_REDIS_PASSWORD is an env var by contract; 8/9/38: the
        # one-shot `helm test` pods (no probes; the CRD check reads the API)
        assert skipped["check_id"] in (
            "CKV_K8S_43",
            "CKV_K8S_15",
            "CKV_K8S_35",
            "CKV_K8S_8",
            "CKV_K8S_9",
            "CKV_K8S_38",
        )
        assert len(skipped["check_result"]["suppress_comment"]) > 40  # a reason, not a bare id


def test_dockerfiles_run_as_non_root_with_the_asyncdapo_entrypoint() -> None:
    dockerfiles = sorted((REPO / "deploy" / "docker").glob("Dockerfile.*"))
    assert {p.name for p in dockerfiles} >= {"Dockerfile.cpu", "Dockerfile.gpu"}
    for path in dockerfiles:
        if path.suffix == ".dockerignore":
            continue
        lines = [ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
        stages = [ln for ln in lines if ln.startswith("FROM ")]
        assert stages and all(re.match(r"FROM \S+:\S+", s) for s in stages), "pin base image tags"
        final = lines[lines.index(stages[-1]) :]
        users = [ln for ln in final if ln.startswith("USER ")]
        assert users and users[-1] not in ("USER root", "USER 0"), path.name
        assert re.match(r"USER \d+", users[-1]), "numeric USER so runAsNonRoot can verify it"
        assert 'ENTRYPOINT ["asyncdapo"]' in final, path.name
        assert not [ln for ln in lines if ln.startswith("ADD ")], "COPY, not ADD"
    checkov = REPO / ".venv" / "bin" / "checkov"
    if checkov.exists():
        proc = subprocess.run(
            [
                str(checkov),
                "-d",
                str(REPO / "deploy" / "docker"),
                "--framework=dockerfile",
                "--skip-download",
                "-o=json",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        report = json.loads(proc.stdout)
        assert report["summary"]["failed"] == 0, [f["check_id"] for f in report["results"]["failed_checks"]]
        assert {s["check_id"] for s in report["results"]["skipped_checks"]} <= {"CKV_DOCKER_2"}


# --- cluster-admin features -------------------------------------------------------

ADMIN: dict[str, Any] = {
    "global": {
        "imageRegistry": "mirror.example/",
        "imagePullSecrets": ["mirror-cred"],
        "unrelated": {"x": 1},
    },
    "fullnameOverride": "ad",
    "podLabels": {"team": "ml-platform"},
    "podAnnotations": {"cost-center": "42"},
    "priorityClassName": "platform-high",
    "serviceAccount": {"annotations": {"iam.gke.io/gcp-service-account": "op@p.iam.gserviceaccount.com"}},
    "operator": {
        "watchNamespaces": ["ml"],
        "podAnnotations": {"cost-center": "7"},
        "extraEnv": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}],
        "extraVolumes": [{"name": "ca", "configMap": {"name": "corp-ca"}}],
        "extraVolumeMounts": [{"name": "ca", "mountPath": "/etc/corp-ca", "readOnly": True}],
    },
    "verifier": {
        "priorityClassName": "verifier-low",
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "topology.kubernetes.io/zone",
                "whenUnsatisfiable": "ScheduleAnyway",
            }
        ],
    },
    "redis": {"auth": {"existingSecret": "redis-pw", "existingSecretKey": "pw"}},
    "networkPolicy": {"clientNamespaces": ["ml", "research"]},
}


@pytest.fixture(scope="module")
def admin_docs() -> list[dict[str, Any]]:
    return chart.render(ADMIN)


def test_admin_values_render_valid_objects(admin_docs: list[dict[str, Any]]) -> None:
    assert chart.lint(ADMIN)["errors"] == []
    for doc in admin_docs:
        if doc["kind"] not in THIRD_PARTY:
            kubernetes_validate.validate(doc, K8S_VERSIONS[0], strict=True)
    objs = _by_kind(admin_docs)
    op = objs[("Deployment", "ad-operator")]
    pod = op["spec"]["template"]
    assert pod["metadata"]["labels"]["team"] == "ml-platform"
    assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == "operator"  # ours win
    assert pod["metadata"]["annotations"] == {"cost-center": "7"}  # the component's over the chart's
    assert pod["spec"]["priorityClassName"] == "platform-high"
    c = pod["spec"]["containers"][0]
    assert c["image"] == "mirror.example/ghcr.io/asyncdapo/asyncdapo-control-plane:0.1.0"
    assert {"name": "HTTPS_PROXY", "value": "http://proxy:3128"} in c["env"]
    assert {"name": "ca", "mountPath": "/etc/corp-ca", "readOnly": True} in c["volumeMounts"]
    assert {"name": "ca", "configMap": {"name": "corp-ca"}} in pod["spec"]["volumes"]
    assert pod["spec"]["imagePullSecrets"] == [{"name": "mirror-cred"}]
    env = {e["name"]: e for e in c["env"]}
    assert env["ASYNCDAPO_OPERATOR_CPU_IMAGE"]["value"].startswith("mirror.example/")
    assert env["ASYNCDAPO_OPERATOR_REDIS_PASSWORD"]["valueFrom"] == {
        "secretKeyRef": {"name": "redis-pw", "key": "pw"}
    }
    sa = objs[("ServiceAccount", "ad-operator")]
    assert sa["metadata"]["annotations"] == ADMIN["serviceAccount"]["annotations"]
    verifier = objs[("Deployment", "ad-verifier")]["spec"]["template"]["spec"]
    assert verifier["priorityClassName"] == "verifier-low"
    (spread,) = verifier["topologySpreadConstraints"]
    assert spread["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == "verifier"
    assert ("Secret", "ad-redis-auth") not in objs  # an existing Secret: nothing generated


def test_values_schema_accepts_a_parent_charts_global_and_rejects_typos() -> None:
    chart.render({"global": {"storageClass": "fast", "anything": [1, 2]}})  # a parent's globals pass
    for bad, where in (
        ({"podAnotations": {}}, "podAnotations"),
        (
            {"verifier": {"topologySpreadConstraints": [{"maxSkew": 0}]}},
            "/verifier/topologySpreadConstraints/0",
        ),
        ({"serviceAccount": {"create": True, "annotation": {}}}, "annotation"),
        ({"networkPolicy": {"clientNamespaces": ["Not_A_Namespace"]}}, "/networkPolicy/clientNamespaces/0"),
    ):
        with pytest.raises(helm.HelmValuesError, match=re.escape(where)):
            chart.render(bad)


def test_tenants_get_trainingruns_through_the_aggregated_roles(default_docs: list[dict[str, Any]]) -> None:
    roles = {d["metadata"]["name"]: d for d in default_docs if d["kind"] == "ClusterRole"}
    edit, view = roles["asyncdapo-edit"], roles["asyncdapo-view"]
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    (rule,) = edit["rules"]
    assert rule["resources"] == ["trainingruns"] and {"create", "delete", "patch"} <= set(rule["verbs"])
    assert all("trainingruns/status" not in r["resources"] for r in edit["rules"])  # the operator's
    (rule,) = view["rules"]
    assert set(rule["verbs"]) == {"get", "list", "watch"}
    off = _by_kind(chart.render({"rbac": {"aggregateToDefaultRoles": False}}))
    assert ("ClusterRole", "asyncdapo-edit") not in off


def test_redis_requires_a_password_and_admits_named_namespaces_only(
    default_docs: list[dict[str, Any]], admin_docs: list[dict[str, Any]]
) -> None:
    objs = _by_kind(default_docs)
    secret = objs[("Secret", "asyncdapo-redis-auth")]
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert len(secret["data"]["password"]) >= 40
    pod = objs[("StatefulSet", "asyncdapo-redis")]["spec"]["template"]["spec"]
    (redis,) = pod["containers"]
    assert "--protected-mode" not in redis["args"]
    # the password from the Secret as a file, through a memory-backed config file: never in a
    # command line or an env value (tests/integration/test_redis_auth_file.py runs the script)
    assert "requirepass" not in json.dumps(redis) and "env" not in redis
    assert redis["args"][0] == "/run/redis/auth.conf"
    (init,) = pod["initContainers"]
    assert init["command"][-2:] == ["/run/secrets/redis/password", "/run/redis/auth.conf"]
    assert "env" not in init and "ASYNCDAPO_REDIS_PASSWORD" not in json.dumps(pod)
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["redis-password"]["secret"] == {
        "secretName": "asyncdapo-redis-auth",
        "items": [{"key": "password", "path": "password"}],
        "defaultMode": 0o440,
    }
    assert volumes["redis-auth"]["emptyDir"]["medium"] == "Memory"
    assert {"name": "redis-auth", "mountPath": "/run/redis", "readOnly": True} in redis["volumeMounts"]
    for docs, names in ((default_docs, ["asyncdapo"]), (admin_docs, ["ml", "research"])):
        pols = _by_kind(docs)
        full = "ad" if docs is admin_docs else "asyncdapo"
        for comp in ("redis", "verifier"):
            for rule in pols[("NetworkPolicy", f"{full}-{comp}")]["spec"]["ingress"]:
                for peer in rule["from"]:
                    ns = peer.get("namespaceSelector")
                    assert ns != {}, "no 'any namespace' peer"
                    if ns and "matchExpressions" in ns:
                        assert ns["matchExpressions"] == [{"key": "kubernetes.io/metadata.name",
                                                           "operator": "In", "values": names}]  # fmt: skip
    # default client namespaces: the release namespace and the watched ones
    watched = _by_kind(chart.render({"operator": {"watchNamespaces": ["ml"]}}))
    (rule,) = watched[("NetworkPolicy", "asyncdapo-redis")]["spec"]["ingress"]
    assert rule["from"][0]["namespaceSelector"]["matchExpressions"][0]["values"] == ["asyncdapo", "ml"]


def _redis_args(values: dict[str, Any]) -> list[str]:
    (sts,) = [d for d in chart.render(values) if d["kind"] == "StatefulSet"]
    args: list[str] = sts["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


def test_redis_maxmemory_from_its_memory_limit_or_given_with_noeviction() -> None:
    def maxmemory(values: dict[str, Any]) -> str:
        args = _redis_args({"redis": values})
        assert args[args.index("--maxmemory-policy") + 1] == "noeviction"
        return args[args.index("--maxmemory") + 1]

    assert maxmemory({}) == str(6 * 2**30)  # 75 % of the default 8Gi limit
    for limit, percent, expected in (
        ("1.5Gi", 75, int(1.5 * 2**30 * 0.75)),
        ("512Mi", 50, 256 * 2**20),
        ("2G", 75, 1_500_000_000),
        ("800k", 100, 800_000),
        (1073741824, 75, 805306368),  # bytes, as a YAML number
    ):
        assert maxmemory({"resources": {"limits": {"memory": limit}}, "maxmemoryPercent": percent}) == str(
            expected
        )
    assert maxmemory({"maxmemory": "6gb"}) == "6gb"  # explicit: the limit is not consulted
    assert maxmemory({"maxmemory": "2gb", "resources": {"limits": {"memory": None}}}) == "2gb"
    with pytest.raises(
        helm.HelmRenderError, match=r"redis\.resources\.limits\.memory .* or redis\.maxmemory"
    ):
        chart.render({"redis": {"resources": {"limits": {"memory": None}}}})
    with pytest.raises(helm.HelmRenderError, match=r'"1e9".*set redis\.maxmemory'):
        chart.render({"redis": {"resources": {"limits": {"memory": "1e9"}}}})
    for bad in ({"maxmemory": "6 GB"}, {"maxmemoryPercent": 0}, {"maxmemoryPercent": 101}):
        with pytest.raises(helm.HelmValuesError):
            chart.render({"redis": bad})


def test_helm_test_hooks(default_docs: list[dict[str, Any]]) -> None:
    hooks = [d for d in default_docs if chart.is_hook(d)]
    pods = {d["metadata"]["name"]: d for d in hooks if d["kind"] == "Pod"}
    assert set(pods) == {"asyncdapo-test-operator", "asyncdapo-test-verifier", "asyncdapo-test-crd"}
    args = {n: p["spec"]["containers"][0]["args"] for n, p in pods.items()}
    assert args["asyncdapo-test-operator"][:3] == [
        "operator",
        "check",
        "--http=http://asyncdapo-operator.asyncdapo.svc:8080/healthz",
    ]
    assert args["asyncdapo-test-verifier"][2] == "--http=http://asyncdapo-verifier.asyncdapo.svc:8080/readyz"
    assert args["asyncdapo-test-crd"][2] == "--crd-established"
    for d in hooks:
        assert d["metadata"]["annotations"]["helm.sh/hook"] == "test"
    role = next(d for d in hooks if d["kind"] == "ClusterRole")
    assert role["rules"] == [{"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
                              "resourceNames": ["trainingruns.asyncdapo.io"], "verbs": ["get"]}]  # fmt: skip
    assert all(
        p["spec"]["automountServiceAccountToken"] is (n == "asyncdapo-test-crd") for n, p in pods.items()
    )
    # the operator's Service exposes /healthz for the check, and its NetworkPolicy admits the test pod
    svc = _by_kind(default_docs)[("Service", "asyncdapo-operator")]
    assert {"name": "health", "port": 8080, "targetPort": "health", "protocol": "TCP"} in svc["spec"]["ports"]
    plain = [d for d in yaml.safe_load_all((REPO / "deploy" / "k8s" / "asyncdapo.yaml").read_text()) if d]
    assert not [d for d in plain if chart.is_hook(d)]  # `kubectl apply` users get no test pods
    assert not [d for d in chart.render({"tests": {"enabled": False}}) if chart.is_hook(d)]


def test_control_plane_image_runs_operator_and_verifier(default_docs: list[dict[str, Any]]) -> None:
    objs = _by_kind(default_docs)
    for name in ("asyncdapo-operator", "asyncdapo-verifier"):
        c = objs[("Deployment", name)]["spec"]["template"]["spec"]["containers"][0]
        assert c["image"] == "ghcr.io/asyncdapo/asyncdapo-control-plane:0.1.0", name
    op = objs[("Deployment", "asyncdapo-operator")]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in op["env"]}
    assert env["ASYNCDAPO_OPERATOR_CONTROL_PLANE_IMAGE"] == "ghcr.io/asyncdapo/asyncdapo-control-plane:0.1.0"


def test_notes_document_the_monitoring_selector_labels() -> None:
    on = {"monitoring": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}}}
    text = chart.notes(on)
    assert "WARNING: a Prometheus selects ServiceMonitors by label" in text
    assert "monitoring.prometheusRule.labels" in text and "helm test asyncdapo -n asyncdapo" in text
    labelled = {"monitoring": {"serviceMonitor": {"enabled": True, "labels": {"release": "kps"}},
                               "prometheusRule": {"enabled": True, "labels": {"release": "kps"}}}}  # fmt: skip
    text = chart.notes(labelled)
    assert "WARNING" not in text and '{"release":"kps"}' in text
    assert "deploy/k8s/examples/tiny-math-cpu.yaml\n" not in text  # no repository-relative path to apply
    assert "list the namespaces" in chart.notes()  # watch-all operator, default Redis: say who gets in
    readme = (REPO / "deploy" / "README.md").read_text()
    assert "monitoring.serviceMonitor.labels" in readme and "release:" in readme


def test_name_override_keeps_the_selectors_runs_rely_on() -> None:
    objs = _by_kind(chart.render({"nameOverride": "adp"}))
    op = objs[("Deployment", "asyncdapo-adp-operator")]
    labels = op["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/name"] == "adp" and labels["app.kubernetes.io/part-of"] == "asyncdapo"
    assert op["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] == "adp"
    assert ("StatefulSet", "asyncdapo-adp-redis") in objs and ("Secret", "asyncdapo-adp-redis-auth") in objs
