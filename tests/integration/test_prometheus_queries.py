"""Every alert rule through promtool and a real Prometheus; every dashboard query through the same
Prometheus (started on 127.0.0.1), against a contract exporter.

The contract exporter is a stand-in, labelled as such: it exports the metric names and labels of
deploy/METRICS.md with moving values, as the services are specified to. It proves the queries are
valid PromQL and that the core panels are non-empty for metrics shaped as documented. The
local-stack test (real scheduler, gateways, verifier, trainer) replaces it once those services land.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from asyncdapo.services.operator.dashboards import all_queries
from asyncdapo.tools.local.ports import free_port, wait_until

REPO = Path(__file__).resolve().parents[2]
ALERTS = REPO / "deploy" / "alerts" / "asyncdapo.rules.yaml"
ALERT_TESTS = REPO / "deploy" / "alerts" / "asyncdapo.rules.test.yaml"

pytestmark = pytest.mark.usefixtures("prometheus_installed")


def _grafana_to_promql(expr: str) -> str:
    return expr.replace("$__rate_interval", "1m").replace("$run", ".*").replace("$namespace", ".*")


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
        self.outcomes = Counter(s + "outcomes", "", ["outcome", "reason"], registry=r)
        self.tokens = Counter(s + "generated_tokens", "", registry=r)
        self.completions = Counter(s + "completions", "", registry=r)
        self.early = Counter(s + "early_stops", "", registry=r)
        self.aborted_req = Counter(s + "aborted_requests", "", registry=r)
        self.aborted_tok = Counter(s + "aborted_tokens", "", registry=r)
        self.staleness = Histogram(s + "group_staleness_versions", "", buckets=(0, 1, 2, 4), registry=r)
        self.attempts = Histogram(s + "prompt_attempts", "", ["outcome"], buckets=(1, 2, 4), registry=r)
        self.verifier_latency = Histogram(s + "verifier_latency_seconds", "", registry=r)
        Counter(s + "gateway_errors", "", ["gateway", "code"], registry=r)
        Counter(s + "verifier_errors", "", ["kind"], registry=r)
        Counter(s + "redispatched_requests", "", ["why"], registry=r)
        Gauge(s + "in_flight_requests", "", ["gateway"], registry=r).labels("gw-0:50051").set(12)
        for name, value in (("in_flight_prompts", 4), ("queue_depth", 64), ("dispatch_queue_depth", 3),
                            ("policy_version", 3), ("valid_groups_bound", 32)):  # fmt: skip
            Gauge(s + name, "", registry=r).set(value)
        Counter(s + "valid_groups_produced", "", registry=r).inc(30)
        g = "asyncdapo_gateway_"
        for name, value in (("kv_cache_usage_ratio", 0.4), ("engine_running", 10), ("engine_waiting", 2), ("in_flight", 12),
                            ("paused", 0), ("weight_version", 3)):  # fmt: skip
            Gauge(g + name, "", registry=r).set(value)
        self.gw_tokens = Counter(g + "generated_tokens", "", registry=r)
        self.gw_requests = Counter(g + "requests", "", ["finish_reason"], registry=r)
        self.gw_aborts = Counter(g + "aborts", "", ["cause"], registry=r)
        self.gw_reload = Histogram(g + "reload_seconds", "", registry=r)
        v = "asyncdapo_verifier_"
        self.items = Counter(v + "items", "", ["status"], registry=r)
        self.http = Counter(v + "requests", "", ["code"], registry=r)
        self.latency = Histogram(v + "request_seconds", "", registry=r)
        self.restarts = Counter(v + "worker_restarts", "", ["reason"], registry=r)
        Gauge(v + "workers_ready", "", registry=r).set(2)
        Gauge(v + "queued_items", "", registry=r).set(0)
        t = "asyncdapo_trainer_"
        for name, value in (("step", 5), ("version", 5), ("reward_mean", 0.4), ("acc_mean", 0.5),
                            ("val_accuracy", 0.45), ("response_length_mean", 21), ("response_length_max", 32),
                            ("response_length_clip_ratio", 0.1), ("timing_wait_seconds", 0.4),
                            ("timing_compute_seconds", 1.1), ("timing_checkpoint_seconds", 0.2),
                            ("timing_publish_seconds", 0.3), ("actor_ppo_kl", 0.001), ("rollout_kl", 0.0005),
                            ("actor_pg_clip_ratio", 0.02), ("actor_pg_clip_lower_ratio", 0.001),
                            ("actor_entropy", 1.2), ("actor_grad_norm", 0.8)):  # fmt: skip
            Gauge(t + name, "", registry=r).set(value)
        self.trained = Counter(t + "trained_groups", "", ["staleness"], registry=r)
        self._stop = threading.Event()

    def tick(self) -> None:
        self.outcomes.labels("valid", "").inc(2)
        self.outcomes.labels("filtered", "").inc(5)
        self.outcomes.labels("dropped", "verifier_error").inc(0)
        self.tokens.inc(500)
        self.completions.inc(8)
        self.gw_tokens.inc(500)
        self.gw_requests.labels("stop").inc(7)
        self.gw_aborts.labels("abort_rpc").inc(1)
        self.early.inc()
        self.aborted_req.inc(3)
        self.aborted_tok.inc(40)
        self.staleness.observe(0)
        self.attempts.labels("valid").observe(2)
        self.verifier_latency.observe(0.08)
        self.items.labels("ok").inc(30)
        self.items.labels("timeout").inc(1)
        self.http.labels("200").inc()
        self.latency.observe(0.05)
        self.gw_reload.observe(1.5)
        self.trained.labels("0").inc(2)

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
