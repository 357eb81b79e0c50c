"""Generated deployment artefacts are fresh, and every metric they read is in the metrics contract."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import yaml

from asyncdapo.cli import main
from asyncdapo.operator import progress
from asyncdapo.operator.crd import crd_yaml
from asyncdapo.operator.dashboards import DASHBOARDS, all_queries, render_all

REPO = Path(__file__).resolve().parents[2]
METRICS_MD = (REPO / "deploy" / "METRICS.md").read_text()


def test_dashboards_are_fresh() -> None:
    committed = {p.name: p.read_text() for p in (REPO / "deploy" / "dashboards").glob("*.json")}
    assert committed == render_all(), "run `make deploy-manifests`"
    for text in committed.values():
        board = json.loads(text)
        assert board["uid"].startswith("asyncdapo-") and board["panels"]
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids))
        for panel in board["panels"]:
            assert panel["targets"] and all(t["expr"] for t in panel["targets"])


def test_dashboards_cover_the_requested_panels() -> None:
    titles = {d.uid: " | ".join(p.title.lower() for p in d.panels) for d in DASHBOARDS}
    for word in (
        "tokens/s",
        "in-flight",
        "queue depth",
        "early stops",
        "aborted tokens",
        "valid-group",
        "outcomes",
    ):
        assert word in titles["asyncdapo-rollout"], word
    for word in ("items/s", "latency", "timeout", "restarts"):
        assert word in titles["asyncdapo-verifier"], word
    for word in ("step-time", "reward", "accuracy", "response length", "staleness", "kl", "clip"):
        assert word in titles["asyncdapo-trainer"], word
    for word in ("kv-cache", "running", "waiting"):
        assert word in titles["asyncdapo-gateways"], word


def _metric_names(promql: str) -> set[str]:
    names = set(re.findall(r"\basyncdapo_[a-z_]+", promql))
    return {re.sub(r"_(bucket|sum|count)$", "", n) for n in names}


def _documented(name: str) -> bool:
    service, _, rest = name.removeprefix("asyncdapo_").partition("_")
    section = METRICS_MD.split(f"— `asyncdapo_{service}_`")
    if len(section) < 2:
        return False
    body = section[1].split("\n## ")[0]
    return f"`{rest}`" in body or re.search(rf"`{re.escape(rest)}`", body) is not None


def test_every_metric_read_is_in_the_contract() -> None:
    alerts = yaml.safe_load((REPO / "deploy" / "alerts" / "asyncdapo.rules.yaml").read_text())
    exprs = [q[2] for q in all_queries()] + [r["expr"] for g in alerts["groups"] for r in g["rules"]]
    used = set().union(*(_metric_names(e) for e in exprs))
    used |= {
        progress.STEP,
        progress.POLICY_VERSION,
        progress.REWARD,
        progress.ACCURACY,
        progress.CHECKPOINT_INFO,
    }
    missing = sorted(n for n in used if not _documented(n))
    assert missing == [], f"not in deploy/METRICS.md: {missing}"
    assert len(used) > 30


def test_cli_prints_the_crd(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["operator", "crd"]) == 0
    assert capsys.readouterr().out == crd_yaml()


def test_cli_renders_a_trainingrun(capsys: pytest.CaptureFixture[str]) -> None:
    example = REPO / "deploy" / "k8s" / "examples" / "tiny-math-cpu.yaml"
    assert (
        main(["operator", "render", str(example), "--namespace", "ml", "--redis-url", "redis://r:6379/0"])
        == 0
    )
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert {d["kind"] for d in docs} >= {"ConfigMap", "StatefulSet", "Deployment", "Job", "NetworkPolicy"}
    assert all(d["metadata"]["namespace"] == "ml" for d in docs)


def test_cli_render_reports_bad_specs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = yaml.safe_load((REPO / "deploy" / "k8s" / "examples" / "tiny-math-cpu.yaml").read_text())
    bad["spec"]["gateway"]["gpusPerPod"] = -1
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    assert main(["operator", "render", str(path)]) == 1
    assert "gateway.gpusPerPod" in capsys.readouterr().err


@pytest.mark.parametrize("example", ["tiny-math-cpu.yaml", "qwen3-8b-dapo-gpu.yaml"])
def test_render_of_each_example_matches_its_golden_file(
    example: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`asyncdapo operator render` of the examples (deploy/k8s/examples/rendered): a change to what
    the operator creates shows up in review as a diff of these files (`make deploy-manifests`)."""
    from asyncdapo.operator.cli import example_render_argv

    path = f"deploy/k8s/examples/{example}"
    golden = (REPO / "deploy" / "k8s" / "examples" / "rendered" / example).read_text()
    cwd = os.getcwd()
    os.chdir(REPO)  # the header names the file as the make target does
    try:
        assert main(example_render_argv(path)) == 0
    finally:
        os.chdir(cwd)
    body = "".join(ln for ln in golden.splitlines(keepends=True) if not ln.startswith("#"))
    assert capsys.readouterr().out == body, "run `make deploy-manifests`"
    assert f"`asyncdapo {' '.join(example_render_argv(path))}`" in golden
    docs = list(yaml.safe_load_all(body))
    kinds = {d["kind"] for d in docs}
    assert {
        "ConfigMap",
        "StatefulSet",
        "Deployment",
        "Service",
        "NetworkPolicy",
        "PodDisruptionBudget",
    } <= kinds
    assert ("RayJob" in kinds) == (example == "qwen3-8b-dapo-gpu.yaml")
