"""Every alert rule through promtool and a real Prometheus; every dashboard query through the same
Prometheus (started on 127.0.0.1), against a contract exporter.

The contract exporter is a stand-in, labelled as such: it exports the metric names and labels of
deploy/METRICS.md with moving values, as the services are specified to. It proves the queries are
valid PromQL and that the core panels are non-empty for metrics shaped as documented. The
local-stack test (real scheduler, gateways, verifier, trainer) replaces it once those services land.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from asyncdapo.local.ports import free_port, wait_until
from asyncdapo.operator.dashboards import all_queries

REPO = Path(__file__).resolve().parents[2]
ALERTS = REPO / "deploy" / "alerts" / "asyncdapo.rules.yaml"
ALERT_TESTS = REPO / "deploy" / "alerts" / "asyncdapo.rules.test.yaml"

pytestmark = pytest.mark.skipif(
    not (shutil.which("prometheus") and shutil.which("promtool")),
    reason="prometheus/promtool not installed (`make prometheus`)",
)


def _grafana_to_promql(expr: str) -> str:
    return expr.replace("$__rate_interval", "1m").replace("$run", ".*")


def test_promtool_checks_and_unit_tests_the_alert_rules() -> None:
    check = subprocess.run(
        ["promtool", "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS" in check.stdout
    unit = subprocess.run(
        ["promtool", "test", "rules", ALERT_TESTS.name],
        cwd=ALERTS.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert unit.returncode == 0, unit.stdout + unit.stderr


class ContractExporter:
    """Stand-in for the services' /metrics (see module docstring): names and labels of METRICS.md."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.port = free_port()
        s = "asyncdapo_scheduler_"
        self.outcomes = Counter(s + "outcomes", "", ["outcome"], registry=r)
        self.tokens = Counter(s + "generated_tokens", "", registry=r)
        self.early = Counter(s + "early_stops", "", registry=r)
        self.aborted_req = Counter(s + "aborted_requests", "", registry=r)
        self.aborted_tok = Counter(s + "aborted_tokens", "", registry=r)
        Gauge(s + "in_flight_requests", "", ["gateway"], registry=r).labels("gw-0:50051").set(12)
        Gauge(s + "in_flight_prompts", "", registry=r).set(4)
        Gauge(s + "queue_depth", "", registry=r).set(64)
        Gauge(s + "policy_version", "", registry=r).set(3)
        Gauge(s + "gateways", "", ["state"], registry=r).labels("up").set(1)
        g = "asyncdapo_gateway_"
        Gauge(g + "kv_cache_usage_ratio", "", registry=r).set(0.4)
        Gauge(g + "running_requests", "", registry=r).set(10)
        Gauge(g + "waiting_requests", "", registry=r).set(2)
        Gauge(g + "policy_version", "", registry=r).set(3)
        self.gw_tokens = Counter(g + "generated_tokens", "", registry=r)
        self.gw_load = Histogram(g + "weight_load_seconds", "", registry=r)
        v = "asyncdapo_verifier_"
        self.items = Counter(v + "items", "", ["status"], registry=r)
        self.latency = Histogram(v + "request_seconds", "", registry=r)
        self.restarts = Counter(v + "worker_restarts", "", registry=r)
        t = "asyncdapo_trainer_"
        for name, value in (("step", 5), ("policy_version", 5), ("reward_mean", 0.4), ("accuracy_mean", 0.5),
                            ("response_length_mean", 21), ("response_clip_ratio", 0.1), ("staleness_mean", 0.2),
                            ("staleness_max", 1), ("kl", 0.001), ("entropy", 1.2),
                            ("last_step_timestamp_seconds", time.time())):  # fmt: skip
            Gauge(t + name, "", registry=r).set(value)
        clip = Gauge(t + "clip_fraction", "", ["kind"], registry=r)
        for kind in ("low", "high", "dual"):
            clip.labels(kind).set(0.01)
        Gauge(t + "checkpoint_info", "", ["path"], registry=r).labels("checkpoints/step-5").set(5)
        self.phase = Counter(t + "phase_seconds", "", ["phase"], registry=r)
        self.stale = Counter(t + "stale_groups_dropped", "", registry=r)
        self._stop = threading.Event()

    def tick(self) -> None:
        self.outcomes.labels("valid").inc(2)
        self.outcomes.labels("filtered").inc(5)
        self.tokens.inc(500)
        self.gw_tokens.inc(500)
        self.early.inc()
        self.aborted_req.inc(3)
        self.aborted_tok.inc(40)
        self.items.labels("ok").inc(30)
        self.items.labels("timeout").inc(1)
        self.latency.observe(0.05)
        self.gw_load.observe(1.5)
        for phase, seconds in (("wait_groups", 0.1), ("old_logprob", 0.02), ("update", 0.06)):
            self.phase.labels(phase).inc(seconds)

    def run(self) -> None:
        while not self._stop.wait(0.2):
            self.tick()

    def __enter__(self) -> ContractExporter:
        self.server, self.thread = start_http_server(self.port, addr="127.0.0.1", registry=self.registry)
        self.ticker = threading.Thread(target=self.run, daemon=True)
        self.ticker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.ticker.join(timeout=5)
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    work = tmp_path_factory.mktemp("prometheus")
    with ContractExporter() as exporter:
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(ALERTS)],
            "scrape_configs": [
                {
                    "job_name": "asyncdapo-contract",
                    "static_configs": [
                        {"targets": [f"127.0.0.1:{exporter.port}"], "labels": {"run": "contract-run"}}
                    ],
                }
            ],
        }
        (work / "prometheus.yml").write_text(yaml.safe_dump(config))
        port = free_port()
        proc = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={work / 'prometheus.yml'}",
                f"--storage.tsdb.path={work / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=(work / "prometheus.log").open("w"),
        )
        url = f"http://127.0.0.1:{port}"
        try:
            wait_until(lambda: httpx.get(f"{url}/-/ready", timeout=1).status_code == 200, 30, "prometheus")

            def scraped_twice() -> bool:
                result = _query(url, "count_over_time(asyncdapo_scheduler_generated_tokens_total[1m])")
                return bool(result) and float(result[0]["value"][1]) >= 3

            wait_until(scraped_twice, 30, "three scrapes of the contract exporter", interval_s=0.5)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def _query(url: str, promql: str) -> list[dict[str, Any]]:
    body = httpx.get(f"{url}/api/v1/query", params={"query": promql}, timeout=10).json()
    assert body["status"] == "success", f"{promql}: {body.get('error')}"
    return body["data"]["result"]


QUERIES = all_queries()


@pytest.mark.parametrize(("uid", "title", "expr", "core"), QUERIES, ids=[f"{q[0]}:{q[1]}" for q in QUERIES])
def test_dashboard_query_runs(prometheus: str, uid: str, title: str, expr: str, core: bool) -> None:
    result = _query(prometheus, _grafana_to_promql(expr))
    if core:
        assert result, f"core panel {uid} / {title} is empty: {expr}"
        assert all(r["value"][1] not in ("NaN", "+Inf", "-Inf") for r in result), result


def test_every_dashboard_has_core_panels() -> None:
    core_boards = {uid for uid, _, _, core in QUERIES if core}
    assert core_boards == {
        "asyncdapo-rollout",
        "asyncdapo-verifier",
        "asyncdapo-trainer",
        "asyncdapo-gateways",
    }


def test_prometheus_loads_and_evaluates_every_alert_rule(prometheus: str) -> None:
    source = yaml.safe_load(ALERTS.read_text())
    expected = {r["alert"] for g in source["groups"] for r in g["rules"]}

    def evaluated() -> bool:
        groups = httpx.get(f"{prometheus}/api/v1/rules", timeout=5).json()["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        return {r["name"] for r in rules} == expected and all(r.get("lastEvaluation", "").startswith("2") and
                                                               r["health"] == "ok" for r in rules)  # fmt: skip

    wait_until(evaluated, 20, "every alert rule evaluated", interval_s=0.5)
    for group in source["groups"]:
        for rule in group["rules"]:
            _query(prometheus, rule["expr"])
    # The healthy contract values fire nothing but the informational ones that match them.
    alerts = httpx.get(f"{prometheus}/api/v1/alerts", timeout=5).json()["data"]["alerts"]
    assert not [a for a in alerts if a["labels"]["severity"] == "critical"], alerts
