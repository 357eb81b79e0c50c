"""The TrainingRun CRD as the chart ships it: a template (so `helm upgrade` upgrades it) rendered from
the one generated file, kept on uninstall, labelled like every object, and left out with
`crds.install: false`; rendered with Helm's own engine (helm-python-sdk)."""

from __future__ import annotations

import re
from typing import Any

import pytest
import required
import yaml

helm = required.module("helm_python")

from asyncdapo.services.operator import chart  # noqa: E402
from asyncdapo.services.operator.crd import CRD_NAME, crd  # noqa: E402


def _crds(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == "CustomResourceDefinition"]


def _others(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] != "CustomResourceDefinition"]


def test_chart_has_no_crds_folder() -> None:
    # Helm installs whatever is in crds/ on first install regardless of values (and never upgrades
    # it), which would defeat both `crds.install: false` and upgrades.
    assert not (chart.CHART_DIR / "crds").exists()
    assert chart.CHART_CRD.is_file()


def test_default_install_renders_the_generated_crd_kept_and_labelled() -> None:
    (rendered,) = _crds(chart.render({"commonLabels": {"team": "ml-platform"}}))
    assert rendered["metadata"]["name"] == CRD_NAME
    assert rendered["spec"] == crd()["spec"]  # the generated schema, CEL rules and defaults intact
    assert rendered["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    labels = rendered["metadata"]["labels"]
    assert labels["team"] == "ml-platform"
    assert labels["app.kubernetes.io/component"] == "crd"
    assert labels["app.kubernetes.io/managed-by"] == "Helm"


def test_the_crd_spec_reaches_the_manifest_byte_for_byte() -> None:
    with helm.Chart.load(str(chart.CHART_DIR)) as c:
        rendered = c.render({}, name=chart.RELEASE, namespace=chart.NAMESPACE, is_install=True)
    (text,) = [t for name, t in rendered.items() if name.endswith("templates/crds.yaml")]
    generated = chart.CHART_CRD.read_text()
    spec = generated[re.search(r"(?m)^spec:$", generated).start() :]  # type: ignore[union-attr]
    assert spec.strip() in text
    assert [d["kind"] for d in yaml.safe_load_all(text) if d] == ["CustomResourceDefinition"]


def test_install_false_renders_no_crd_and_changes_nothing_else() -> None:
    fixed = {"redis": {"auth": {"existingSecret": "redis-pw"}}}  # no generated (random) password
    default = chart.render(fixed)
    off = chart.render({**fixed, "crds": {"install": False}})
    assert len(_crds(default)) == 1
    assert _crds(off) == []
    assert _others(off) == _others(default)
    assert chart.lint({"crds": {"install": False}})["errors"] == []


def test_upgrade_with_other_values_keeps_the_same_crd() -> None:
    installed = chart.render()
    upgraded = chart.render(
        {"commonLabels": {"team": "ml"}, "verifier": {"replicas": 3, "autoscaling": {"enabled": False}}},
        upgrade=True,
    )
    (before,) = _crds(installed)
    (after,) = _crds(upgraded)
    assert after["spec"] == before["spec"] == crd()["spec"]
    assert (
        after["metadata"]["annotations"]
        == before["metadata"]["annotations"]
        == {"helm.sh/resource-policy": "keep"}
    )
    assert after["metadata"]["labels"]["team"] == "ml"  # the values did reach the upgrade
    assert _others(upgraded) != _others(installed)


def test_values_schema_refuses_a_crds_typo() -> None:
    for bad, where in (
        ({"crds": {"instal": True}}, "instal"),
        ({"crds": {"install": "yes"}}, "/crds/install"),
    ):
        with pytest.raises(helm.HelmValuesError, match=re.escape(where)):
            chart.render(bad)
