"""The operator's cluster-wide pod settings: flag parsing (refused with a message naming the flag)
and what they change in a run's desired state (nothing, with the defaults)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from asyncdapo.contracts.errors import AsyncdapoError
from asyncdapo.services.operator.desired import Lifecycle, OperatorDefaults, RunRef, desired_state
from asyncdapo.services.operator.pod_settings import (
    parse_pull_secrets,
    parse_security_context,
    parse_selector,
)
from asyncdapo.services.operator.spec import parse_spec

REPO = Path(__file__).resolve().parents[2]


def test_selector_flag_parses_pairs_and_refuses_malformed_ones() -> None:
    assert parse_selector("team=obs, kubernetes.io/metadata.name=monitoring") == (
        ("kubernetes.io/metadata.name", "monitoring"),
        ("team", "obs"),
    )
    for bad in ("", "team", "team=a b", "Bad Key=x", "a=b,,c=d"):
        with pytest.raises(AsyncdapoError, match="--monitoring-namespace-selector"):
            parse_selector(bad)


def test_security_context_flag_is_a_json_object_and_drops_nulls() -> None:
    assert parse_security_context("", "--pod-security-context") is None
    assert parse_security_context('{"runAsNonRoot": true, "runAsUser": null}', "--x") == {
        "runAsNonRoot": True
    }
    for bad in ("[1]", "{runAsNonRoot: true}"):
        with pytest.raises(AsyncdapoError, match="--pod-security-context"):
            parse_security_context(bad, "--pod-security-context")


def test_pull_secrets_flag() -> None:
    assert parse_pull_secrets(None) == () and parse_pull_secrets("a, b-c") == ("a", "b-c")
    with pytest.raises(AsyncdapoError, match="--pull-secrets"):
        parse_pull_secrets("Regcred")


def _objs(defaults: OperatorDefaults, example: str = "tiny-math-cpu.yaml") -> list[dict]:
    tr = yaml.safe_load((REPO / "deploy" / "k8s" / "examples" / example).read_text())
    spec = parse_spec(tr["spec"], tr["metadata"]["name"])
    ref = RunRef(tr["metadata"]["name"], "ml", "00000000-0000-0000-0000-000000000001")
    return desired_state(spec, ref, defaults, Lifecycle.RUNNING)


def _pod_specs(objs: list[dict]) -> list[dict]:
    out = []
    for o in objs:
        tpl = o.get("spec", {}).get("template")
        if isinstance(tpl, dict):
            out.append(tpl["spec"])
    return out


def test_operator_settings_reach_every_run_pod_and_defaults_change_nothing() -> None:
    base = _objs(OperatorDefaults())
    assert base == _objs(OperatorDefaults(pod_security_context=None, pull_secrets=()))
    pod_sc = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    c_sc = {"runAsNonRoot": True, "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    objs = _objs(
        OperatorDefaults(
            pod_security_context=pod_sc,
            container_security_context=c_sc,
            pull_secrets=("regcred",),
            monitoring_namespace_selector=(("team", "obs"),),
        )
    )
    pods = _pod_specs(objs)
    assert len(pods) >= 3
    for pod in pods:
        assert pod["securityContext"] == pod_sc and pod["imagePullSecrets"] == [{"name": "regcred"}]
        assert all(c["securityContext"] == c_sc for c in pod["containers"])
    policies = [o for o in objs if o["kind"] == "NetworkPolicy"]
    peers = [p for pol in policies for rule in pol["spec"]["ingress"] for p in rule.get("from", [])]
    monitoring = [p for p in peers if p.get("namespaceSelector", {}).get("matchLabels")]
    assert monitoring and all(p["namespaceSelector"] == {"matchLabels": {"team": "obs"}} for p in monitoring)
