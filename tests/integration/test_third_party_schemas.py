"""What asyncdapo generates for other projects' operators, validated against their published CRD
schemas (vendored under tests/data/crds, see its README for source and version): the chart's
ServiceMonitors and PrometheusRule (prometheus-operator) and the trainer RayJob (KubeRay) of the
multi-worker example, in every lifecycle."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import pytest
import required
import yaml
from crd_schema import CRDS, load_crd, validate

from asyncdapo.services.operator.desired import Lifecycle, OperatorDefaults, RunRef, desired_state
from asyncdapo.services.operator.spec import parse_spec

REPO = Path(__file__).resolve().parents[2]
helm = required.module("helm_python")
from asyncdapo.services.operator import chart  # noqa: E402

MONITORING = {
    "monitoring": {
        "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
        "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
    }
}


def test_vendored_crds_match_their_recorded_checksums() -> None:
    import gzip

    rows = re.findall(r"^\| `([^`]+)` \|.*\| ([0-9a-f]{64}) \|$", (CRDS / "README.md").read_text(), re.M)
    assert len(rows) == 3
    for name, digest in rows:
        path = CRDS / name
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        assert hashlib.sha256(raw).hexdigest() == digest, name


@pytest.fixture(scope="module")
def monitoring_docs() -> list[dict[str, Any]]:
    return [d for d in chart.render(MONITORING) if d["apiVersion"] == "monitoring.coreos.com/v1"]


def test_service_monitors_validate_against_prometheus_operator(monitoring_docs: list[dict[str, Any]]) -> None:
    crd = load_crd("monitoring.coreos.com_servicemonitors.yaml")
    monitors = [d for d in monitoring_docs if d["kind"] == "ServiceMonitor"]
    assert len(monitors) == 2
    for sm in monitors:
        errors, cel = validate(crd, sm)
        assert errors == [] and cel.errors == [], (errors, cel.errors)
        assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    # the check is real: a typo'd relabeling field and a wrong action are refused
    bad = yaml.safe_load(yaml.safe_dump(monitors[1]))
    bad["spec"]["endpoints"][0]["relabelings"][0]["sourceLabel"] = ["x"]
    bad["spec"]["endpoints"][0]["relabelings"][0]["action"] = "rewrite"
    errors, _ = validate(crd, bad)
    assert any("sourceLabel" in e for e in errors) and any("rewrite" in e for e in errors), errors


def test_prometheus_rule_validates_against_prometheus_operator(monitoring_docs: list[dict[str, Any]]) -> None:
    crd = load_crd("monitoring.coreos.com_prometheusrules.yaml")
    (rule,) = [d for d in monitoring_docs if d["kind"] == "PrometheusRule"]
    errors, cel = validate(crd, rule)
    assert errors == [] and cel.errors == [], (errors, cel.errors)
    assert sum(len(g["rules"]) for g in rule["spec"]["groups"]) >= 14
    bad = yaml.safe_load(yaml.safe_dump(rule))
    bad["spec"]["groups"][0]["rules"][0]["for"] = "fifteen minutes"
    errors, _ = validate(crd, bad)
    assert any("for" in e for e in errors), errors


@pytest.fixture(scope="module")
def rayjob_crd() -> dict[str, Any]:
    return load_crd("ray.io_rayjobs.yaml.gz")


def _ray_jobs(lifecycle: Lifecycle, **meta: Any) -> list[dict[str, Any]]:
    tr = yaml.safe_load((REPO / "deploy" / "k8s" / "examples" / "qwen3-8b-dapo-gpu.yaml").read_text())
    spec = parse_spec(tr["spec"], tr["metadata"]["name"])
    ref = RunRef.of(
        {**tr["metadata"], "namespace": "ml", "uid": "00000000-0000-0000-0000-0000000000aa", **meta}
    )
    objs = desired_state(spec, ref, OperatorDefaults(kuberay=True), lifecycle)
    return [o for o in objs if o["kind"] == "RayJob"]


@pytest.mark.parametrize("lifecycle", list(Lifecycle))
def test_rayjob_validates_against_kuberay(rayjob_crd: dict[str, Any], lifecycle: Lifecycle) -> None:
    if lifecycle is Lifecycle.PREPARING:
        assert _ray_jobs(lifecycle) == []  # the example has no prepare Job: nothing to check
        return
    (job,) = _ray_jobs(lifecycle)
    errors, cel = validate(rayjob_crd, job)
    assert errors == [], errors
    assert cel.errors == [] and cel.skipped == [], (cel.errors, cel.skipped)


def test_queued_rayjob_validates_too(rayjob_crd: dict[str, Any]) -> None:
    (job,) = _ray_jobs(Lifecycle.RUNNING, labels={"kueue.x-k8s.io/queue-name": "gpu"})
    assert "suspend" not in job["spec"] and job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu"
    errors, cel = validate(rayjob_crd, job)
    assert errors == [] and cel.errors == [], (errors, cel.errors)


def test_kuberay_schema_catches_a_wrong_field(rayjob_crd: dict[str, Any]) -> None:
    (job,) = _ray_jobs(Lifecycle.RUNNING)
    bad = yaml.safe_load(yaml.safe_dump(job))
    bad["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replica"] = 8  # typo
    bad["spec"]["backoffLimit"] = "three"
    bad["spec"]["managedBy"] = "asyncdapo"  # KubeRay's CEL rule allows two managers only
    errors, cel = validate(rayjob_crd, bad)
    assert any("replica" in e for e in errors) and any("three" in e for e in errors), errors
    assert cel.evaluated >= 1 and len(cel.errors) == 1, cel
