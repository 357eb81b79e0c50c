"""Generated deployment artefacts are fresh, and every metric they read is in the metrics contract."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import yaml

from asyncdapo.cli import main
from asyncdapo.services.operator import service_progress as progress
from asyncdapo.services.operator.crd import crd_yaml
from asyncdapo.services.operator.dashboards import DASHBOARDS, all_queries, render_all

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
    # the annotations name metrics too (an operator follows them): they must exist as well
    exprs += [v for g in alerts["groups"] for r in g["rules"] for v in r.get("annotations", {}).values()]
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


@pytest.mark.parametrize(
    "example", ["tiny-math-cpu.yaml", "qwen3-8b-dapo-gpu.yaml", "tiny-math-pdsr-cpu.yaml"]
)
def test_render_of_each_example_matches_its_golden_file(
    example: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`asyncdapo operator render` of the examples (deploy/k8s/examples/rendered): a change to what
    the operator creates shows up in review as a diff of these files (`make deploy-manifests`)."""
    from asyncdapo.services.operator.cli import example_render_argv

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


def _alert_rules() -> list[dict]:
    alerts = yaml.safe_load((REPO / "deploy" / "alerts" / "asyncdapo.rules.yaml").read_text())
    return [r for g in alerts["groups"] for r in g["rules"] if "alert" in r]


def test_every_alert_has_a_promtool_test_that_fires_it() -> None:
    tests = yaml.safe_load((REPO / "deploy" / "alerts" / "asyncdapo.rules.test.yaml").read_text())
    cases = [c for t in tests["tests"] for c in t.get("alert_rule_test", [])]
    fired = {c["alertname"] for c in cases if c.get("exp_alerts")}
    names = {r["alert"] for r in _alert_rules()}
    assert len(names) >= 14
    assert names - fired == set(), "alerts without a promtool test that fires them"
    quiet = {c["alertname"] for c in cases if not c.get("exp_alerts")}
    assert len(quiet) >= 8  # and most have a case where they must stay quiet


def test_alerts_and_dashboards_separate_namespaces_and_runs() -> None:
    for rule in _alert_rules():
        expr = rule["expr"]
        if re.search(r"asyncdapo_(scheduler|trainer|gateway)_", expr):
            assert "by (namespace, run" in expr, rule["alert"]
    for uid, title, expr, _ in all_queries():
        for selector in re.findall(r"asyncdapo_[a-z_]+(\{[^}]*\})?", expr):
            assert 'namespace=~"$namespace"' in selector, (uid, title, expr)
        if uid != "asyncdapo-verifier":
            assert 'run=~"$run"' in expr, (uid, title)
    for path in (REPO / "deploy" / "dashboards").glob("*.json"):
        board = json.loads(path.read_text())
        variables = {v["name"]: v for v in board["templating"]["list"]}
        assert "namespace" in variables, path.name
        if board["uid"] != "asyncdapo-verifier":
            assert 'namespace=~"$namespace"' in variables["run"]["query"]["query"], path.name


def test_renamed_metrics_are_read_by_their_new_names_only() -> None:
    changelog = METRICS_MD.split("## Changelog")[1]
    old = re.findall(r"^\| `(asyncdapo_[a-z_]+)`", changelog, re.M)
    assert len(old) >= 8
    readers = [q[2] for q in all_queries()] + [json.dumps(r) for r in _alert_rules()]
    readers += [
        progress.STEP,
        progress.POLICY_VERSION,
        progress.REWARD,
        progress.ACCURACY,
        progress.CHECKPOINT_INFO,
    ]
    for name in old:
        pattern = re.compile(rf"\b{name}(?![a-z_])")
        assert not any(pattern.search(r) for r in readers), name


# Label names of every metric, and why each is bounded.
BOUNDED_LABELS = {
    "outcome": "PromptOutcome enum", "reason": "enums of reasons", "gateway": "gateway addresses of the run",
    "code": "gRPC / HTTP status codes", "kind": "verifier error kinds", "why": "redispatch causes",
    "action": "long-tail actions", "finish_reason": "Finish enum", "cause": "AbortCause enum",
    "status": "ItemStatus enum", "staleness": "0..ceil(max_staleness) (<= 64)",
    "path": "checkpoint_info keeps one series", "trigger": "kopf triggers", "result": "ok | error",
    "namespace": "operator: watched namespaces", "run": "operator: runs", "phase": "Phase enum",
}  # fmt: skip


def test_no_unbounded_labels() -> None:
    from prometheus_client import CollectorRegistry

    from asyncdapo.services.gateway.metrics import GatewayMetrics
    from asyncdapo.services.operator import handlers
    from asyncdapo.services.scheduler.metrics import SchedulerMetrics
    from asyncdapo.services.trainer.metrics import MetricsSink
    from asyncdapo.services.verifier.metrics import VerifierMetrics

    registries = [SchedulerMetrics().registry, GatewayMetrics(CollectorRegistry()).registry,
                  VerifierMetrics().registry]  # fmt: skip
    collectors = [handlers.RECONCILES, handlers.RECONCILE_SECONDS, handlers.RUN_PHASE, handlers.RUN_STEP]
    labels: dict[str, set[str]] = {}
    for reg in registries:
        for c in list(reg._collector_to_names):
            labels[str(reg._collector_to_names[c])] = set(getattr(c, "_labelnames", ()))
    for c in collectors:
        labels[c._name] = set(c._labelnames)
    import tempfile
    from pathlib import Path as P

    with tempfile.TemporaryDirectory() as d:
        sink = MetricsSink(P(d) / "m.jsonl")
        for c in list(sink.registry._collector_to_names):
            labels[str(sink.registry._collector_to_names[c])] = set(getattr(c, "_labelnames", ()))
    used = set().union(*labels.values())
    assert used - set(BOUNDED_LABELS) == set(), {k: v for k, v in labels.items() if v - set(BOUNDED_LABELS)}
    assert "version" not in used


def test_checkpoint_info_fills_the_status(tmp_path: Path) -> None:
    """The trainer exports the newest checkpoint; the operator's progress reader (over HTTP, as in
    the cluster) turns it into status.lastCheckpoint."""
    from datetime import UTC, datetime

    from asyncdapo.services.operator.resource_status import TrainingRunStatus
    from asyncdapo.services.operator.service_progress import read_trainer_metrics
    from asyncdapo.services.operator.status_machine import Observation, next_status
    from asyncdapo.services.trainer.metrics import MetricsSink
    from asyncdapo.tools.local.ports import free_port

    port = free_port()
    sink = MetricsSink(tmp_path / "metrics.jsonl", port=port)
    try:
        sink.write({"step": 3, "version": 3, "reward/mean": 0.25, "timing/wait_s": 0.5})
        sink.checkpoint(tmp_path / "checkpoints" / "step-00000002", 2)
        sink.checkpoint(tmp_path / "checkpoints" / "step-00000003", 3)
        import httpx

        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        assert text.count("asyncdapo_trainer_checkpoint_info{") == 1  # one series: bounded
        assert "asyncdapo_trainer_timing_wait_seconds 0.5" in text
        progress = read_trainer_metrics([f"127.0.0.1:{port}"], timeout_s=5)
    finally:
        sink.close()
    assert progress.last_checkpoint == str(tmp_path / "checkpoints" / "step-00000003") and progress.step == 3
    status = next_status(TrainingRunStatus(), Observation(1, None, progress=progress), datetime.now(UTC))
    assert status.last_checkpoint == progress.last_checkpoint
