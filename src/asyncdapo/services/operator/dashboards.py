"""Grafana dashboards (rollout, verifier, trainer, gateways), defined as data and written as JSON to
deploy/dashboards/ (`asyncdapo operator dashboards`); the chart ships them as ConfigMaps labelled
`grafana_dashboard: "1"`. A test keeps the JSON fresh and runs every query through a real Prometheus.

Queries use the metric names of deploy/METRICS.md. `$namespace` and `$run` filter by the
`namespace` and `run` target labels; `$__rate_interval` is Grafana's. Panels marked `core` must be non-empty once a local stack runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Every query is filtered by the dashboard's `namespace` and `run` variables ("All": `.*`, which
# also matches series without the label, e.g. the local stack's, which has no namespace).
NS = 'namespace=~"$namespace"'
RUN = f'{NS},run=~"$run"'
RATE = "[$__rate_interval]"


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""


@dataclass(frozen=True)
class Panel:
    title: str
    queries: tuple[Query, ...]
    unit: str = "short"
    description: str = ""
    stacked: bool = False
    core: bool = False


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    panels: tuple[Panel, ...]
    run_variable_metric: str | None = "asyncdapo_scheduler_outcomes_total"
    tags: tuple[str, ...] = field(default=("asyncdapo",))


def _q(expr: str, legend: str = "") -> Query:
    return Query(expr, legend)


ROLLOUT = Dashboard(
    uid="asyncdapo-rollout",
    title="asyncdapo / rollout",
    panels=(
        Panel(
            "Tokens/s",
            (
                _q(
                    f"sum by (namespace, run) (rate(asyncdapo_scheduler_generated_tokens_total{{{RUN}}}{RATE}))",
                    "{{namespace}} {{run}}",
                ),
            ),
            description="Response tokens received by the scheduler per second.",
            core=True,
        ),
        Panel(
            "In-flight requests per gateway",
            (_q(f"sum by (gateway) (asyncdapo_scheduler_in_flight_requests{{{RUN}}})", "{{gateway}}"),),
            stacked=True,
        ),
        Panel(
            "Prompt queue depth and in-flight prompts",
            (
                _q(
                    f"sum by (namespace, run) (asyncdapo_scheduler_queue_depth{{{RUN}}})",
                    "queued prompts {{namespace}} {{run}}",
                ),
                _q(
                    f"sum by (namespace, run) (asyncdapo_scheduler_in_flight_prompts{{{RUN}}})",
                    "in-flight prompts {{namespace}} {{run}}",
                ),
                _q(
                    f"sum by (namespace, run) (asyncdapo_scheduler_dispatch_queue_depth{{{RUN}}})",
                    "awaiting a slot {{namespace}} {{run}}",
                ),
            ),
            core=True,
        ),
        Panel(
            "Early stops",
            (
                _q(
                    f"sum by (namespace, run) (increase(asyncdapo_scheduler_early_stops_total{{{RUN}}}{RATE}))",
                    "{{namespace}} {{run}}",
                ),
            ),
            description="Early stops (valid-group bound reached, in-flight requests aborted).",
        ),
        Panel(
            "Aborted tokens/s",
            (
                _q(
                    f"sum by (namespace, run) (rate(asyncdapo_scheduler_aborted_tokens_total{{{RUN}}}{RATE}))",
                    "tokens {{namespace}} {{run}}",
                ),
                _q(
                    f"sum by (namespace, run) (rate(asyncdapo_scheduler_aborted_requests_total{{{RUN}}}{RATE}))",
                    "requests {{namespace}} {{run}}",
                ),
            ),
            description="Work thrown away by early stop and weight updates.",
        ),
        Panel(
            "Valid-group ratio",
            (
                _q(
                    # `or 0 * filtered`: a run whose groups are all filtered has no `valid` series yet.
                    f'(sum by (namespace, run) (rate(asyncdapo_scheduler_outcomes_total{{{RUN},outcome="valid"}}{RATE}))'
                    f' or 0 * sum by (namespace, run) (rate(asyncdapo_scheduler_outcomes_total{{{RUN},outcome="filtered"}}'
                    f"{RATE})))"
                    f' / sum by (namespace, run) (rate(asyncdapo_scheduler_outcomes_total{{{RUN},outcome=~"valid|filtered"}}'
                    f"{RATE}))",
                    "{{namespace}} {{run}}",
                ),
            ),
            unit="percentunit",
            description="valid / (valid + filtered): the share of groups with reward variance.",
            core=True,
        ),
        Panel(
            "Outcomes/s",
            (
                _q(
                    f"sum by (outcome, reason) (rate(asyncdapo_scheduler_outcomes_total{{{RUN}}}{RATE}))",
                    "{{outcome}} {{reason}}",
                ),
            ),
            stacked=True,
            core=True,
        ),
        Panel(
            "Attempts per finished prompt",
            (
                _q(
                    f"sum by (namespace, run) (rate(asyncdapo_scheduler_prompt_attempts_sum{{{RUN}}}{RATE})) / "
                    f"sum by (namespace, run) (rate(asyncdapo_scheduler_prompt_attempts_count{{{RUN}}}{RATE}))",
                    "mean {{namespace}} {{run}}",
                ),
                _q(
                    "histogram_quantile(0.99, sum by (le, run) "
                    f"(rate(asyncdapo_scheduler_prompt_attempts_bucket{{{RUN}}}{RATE})))",
                    "p99 {{namespace}} {{run}}",
                ),
            ),
            description="1 + the early stops that aborted and requeued a prompt before its outcome. "
            "Above ~1.5 the rollout keeps cutting the same long prompts: their tokens are generated "
            "again and again (s = 0 and early stop order `any`).",
        ),
        Panel(
            "Valid groups vs bound, policy version",
            (
                _q(
                    f"max by (namespace, run) (asyncdapo_scheduler_valid_groups_produced_total{{{RUN}}})",
                    "produced {{namespace}} {{run}}",
                ),
                _q(
                    f"max by (namespace, run) (asyncdapo_scheduler_valid_groups_bound{{{RUN}}})",
                    "bound ⌊(v+1+s)·B⌋ {{namespace}} {{run}}",
                ),
                _q(
                    f"max by (namespace, run) (asyncdapo_scheduler_policy_version{{{RUN}}})",
                    "version {{namespace}} {{run}}",
                ),
            ),
        ),
        Panel(
            "Group staleness (versions)",
            (
                _q(
                    "histogram_quantile(0.99, sum by (le, run) "
                    f"(rate(asyncdapo_scheduler_group_staleness_versions_bucket{{{RUN}}}{RATE})))",
                    "p99 {{namespace}} {{run}}",
                ),
                _q(
                    "histogram_quantile(0.5, sum by (le, run) "
                    f"(rate(asyncdapo_scheduler_group_staleness_versions_bucket{{{RUN}}}{RATE})))",
                    "p50 {{namespace}} {{run}}",
                ),
            ),
        ),
        Panel(
            "Errors and re-dispatches/s",
            (
                _q(
                    f"sum by (gateway, code) (rate(asyncdapo_scheduler_gateway_errors_total{{{RUN}}}{RATE}))",
                    "gateway {{gateway}} {{code}}",
                ),
                _q(
                    f"sum by (kind) (rate(asyncdapo_scheduler_verifier_errors_total{{{RUN}}}{RATE}))",
                    "verifier {{kind}}",
                ),
                _q(
                    f"sum by (why) (rate(asyncdapo_scheduler_redispatched_requests_total{{{RUN}}}{RATE}))",
                    "re-dispatch {{why}}",
                ),
            ),
        ),
    ),
)

VERIFIER = Dashboard(
    uid="asyncdapo-verifier",
    title="asyncdapo / verifier",
    run_variable_metric=None,  # the shared verifier serves every run
    panels=(
        Panel(
            "Items/s by status",
            (_q(f"sum by (status) (rate(asyncdapo_verifier_items_total{{{NS}}}{RATE}))", "{{status}}"),),
            stacked=True,
            core=True,
        ),
        Panel(
            "Request latency",
            (
                _q(
                    f"histogram_quantile(0.99, sum by (le) (rate(asyncdapo_verifier_request_seconds_bucket{{{NS}}}{RATE})))",
                    "p99",
                ),
                _q(
                    f"histogram_quantile(0.5, sum by (le) (rate(asyncdapo_verifier_request_seconds_bucket{{{NS}}}{RATE})))",
                    "p50",
                ),
                _q(
                    "histogram_quantile(0.99, sum by (le) "
                    f"(rate(asyncdapo_scheduler_verifier_latency_seconds_bucket{{{NS}}}{RATE})))",
                    "p99 seen by schedulers",
                ),
            ),
            unit="s",
            core=True,
        ),
        Panel(
            "Timeout and error ratio",
            (
                _q(
                    f'sum(rate(asyncdapo_verifier_items_total{{{NS},status="timeout"}}{RATE}))'
                    f" / sum(rate(asyncdapo_verifier_items_total{{{NS}}}{RATE}))",
                    "timeout",
                ),
                _q(
                    f'sum(rate(asyncdapo_verifier_items_total{{{NS},status="error"}}{RATE}))'
                    f" / sum(rate(asyncdapo_verifier_items_total{{{NS}}}{RATE}))",
                    "error",
                ),
            ),
            unit="percentunit",
        ),
        Panel(
            "Worker restarts",
            (
                _q(
                    f"sum by (reason) (increase(asyncdapo_verifier_worker_restarts_total{{{NS}}}{RATE}))",
                    "{{reason}}",
                ),
            ),
        ),
        Panel(
            "Workers ready and queued items",
            (
                _q(f"sum(asyncdapo_verifier_workers_ready{{{NS}}})", "workers ready"),
                _q(f"sum(asyncdapo_verifier_queued_items{{{NS}}})", "queued items"),
            ),
        ),
        Panel(
            "HTTP requests/s by code",
            (_q(f"sum by (code) (rate(asyncdapo_verifier_requests_total{{{NS}}}{RATE}))", "{{code}}"),),
            stacked=True,
        ),
    ),
)

TRAINER = Dashboard(
    uid="asyncdapo-trainer",
    title="asyncdapo / trainer",
    panels=(
        Panel(
            "Step-time split",
            tuple(
                _q(
                    f"max by (namespace, run) (asyncdapo_trainer_timing_{part}_seconds{{{RUN}}})",
                    f"{part} {{{{namespace}} {{run}}}}",
                )
                for part in ("wait", "compute", "checkpoint", "publish")
            ),
            unit="s",
            stacked=True,
            description="The last step: waiting for groups, compute (log-probs + update), checkpoint, publish.",
            core=True,
        ),
        Panel(
            "Reward and accuracy",
            (
                _q(
                    f"avg by (namespace, run) (asyncdapo_trainer_reward_mean{{{RUN}}})",
                    "reward {{namespace}} {{run}}",
                ),
                _q(
                    f"avg by (namespace, run) (asyncdapo_trainer_acc_mean{{{RUN}}})",
                    "accuracy {{namespace}} {{run}}",
                ),
                _q(
                    f"avg by (namespace, run) (asyncdapo_trainer_val_accuracy{{{RUN}}})",
                    "validation accuracy {{namespace}} {{run}}",
                ),
            ),
            core=True,
        ),
        Panel(
            "Response length",
            (
                _q(
                    f"avg by (namespace, run) (asyncdapo_trainer_response_length_mean{{{RUN}}})",
                    "mean {{namespace}} {{run}}",
                ),
                _q(
                    f"max by (namespace, run) (asyncdapo_trainer_response_length_max{{{RUN}}})",
                    "max {{namespace}} {{run}}",
                ),
            ),
        ),
        Panel(
            "Clipped responses",
            (
                _q(
                    f"avg by (namespace, run) (asyncdapo_trainer_response_length_clip_ratio{{{RUN}}})",
                    "{{namespace}} {{run}}",
                ),
            ),
            unit="percentunit",
            description="Share of responses cut at max_response_length (overlong shaping applies).",
        ),
        Panel(
            "Staleness of trained groups",
            (
                _q(
                    f"sum by (staleness) (rate(asyncdapo_trainer_trained_groups_total{{{RUN}}}{RATE}))",
                    "t − v = {{staleness}}",
                ),
            ),
            stacked=True,
        ),
        Panel(
            "KL and clip fractions",
            (
                _q(
                    f"avg by (namespace, run) (asyncdapo_trainer_actor_ppo_kl{{{RUN}}})",
                    "ppo kl {{namespace}} {{run}}",
                ),
                _q(
                    f"avg by (namespace, run) (asyncdapo_trainer_rollout_kl{{{RUN}}})",
                    "rollout kl {{namespace}} {{run}}",
                ),
                _q(
                    f"avg by (namespace, run) (asyncdapo_trainer_actor_pg_clip_ratio{{{RUN}}})",
                    "clipfrac {{namespace}} {{run}}",
                ),
                _q(
                    f"avg by (namespace, run) (asyncdapo_trainer_actor_pg_clip_lower_ratio{{{RUN}}})",
                    "clipfrac lower {{namespace}} {{run}}",
                ),
            ),
        ),
        Panel(
            "Step, version, entropy, grad norm",
            (
                _q(
                    f"max by (namespace, run) (asyncdapo_trainer_step{{{RUN}}})", "step {{namespace}} {{run}}"
                ),
                _q(
                    f"max by (namespace, run) (asyncdapo_trainer_version{{{RUN}}})",
                    "version {{namespace}} {{run}}",
                ),
                _q(
                    f"avg by (namespace, run) (asyncdapo_trainer_actor_entropy{{{RUN}}})",
                    "entropy {{namespace}} {{run}}",
                ),
                _q(
                    f"avg by (namespace, run) (asyncdapo_trainer_actor_grad_norm{{{RUN}}})",
                    "grad norm {{namespace}} {{run}}",
                ),
            ),
        ),
    ),
)

GATEWAYS = Dashboard(
    uid="asyncdapo-gateways",
    title="asyncdapo / gateways",
    panels=(
        Panel(
            "KV-cache usage",
            (_q(f"max by (instance) (asyncdapo_gateway_kv_cache_usage_ratio{{{RUN}}})", "{{instance}}"),),
            unit="percentunit",
            core=True,
        ),
        Panel(
            "Running requests",
            (_q(f"sum by (instance) (asyncdapo_gateway_engine_running{{{RUN}}})", "{{instance}}"),),
            stacked=True,
            core=True,
        ),
        Panel(
            "Waiting requests",
            (_q(f"sum by (instance) (asyncdapo_gateway_engine_waiting{{{RUN}}})", "{{instance}}"),),
            stacked=True,
        ),
        Panel(
            "Tokens/s per gateway",
            (
                _q(
                    f"sum by (instance) (rate(asyncdapo_gateway_generated_tokens_total{{{RUN}}}{RATE}))",
                    "{{instance}}",
                ),
            ),
            stacked=True,
        ),
        Panel(
            "Finishes and aborts/s",
            (
                _q(
                    f"sum by (finish_reason) (rate(asyncdapo_gateway_requests_total{{{RUN}}}{RATE}))",
                    "finish {{finish_reason}}",
                ),
                _q(
                    f"sum by (cause) (rate(asyncdapo_gateway_aborts_total{{{RUN}}}{RATE}))", "abort {{cause}}"
                ),
            ),
            stacked=True,
        ),
        Panel(
            "Weight reload p99, version, paused",
            (
                _q(
                    f"histogram_quantile(0.99, sum by (le) (rate(asyncdapo_gateway_reload_seconds_bucket{{{RUN}}}{RATE})))",
                    "reload p99 (s)",
                ),
                _q(f"max by (instance) (asyncdapo_gateway_weight_version{{{RUN}}})", "version {{instance}}"),
                _q(f"max by (instance) (asyncdapo_gateway_paused{{{RUN}}})", "paused {{instance}}"),
            ),
        ),
    ),
)

DASHBOARDS: tuple[Dashboard, ...] = (ROLLOUT, VERIFIER, TRAINER, GATEWAYS)


def _panel_json(panel: Panel, panel_id: int) -> dict[str, Any]:
    x, y = (panel_id - 1) % 2 * 12, (panel_id - 1) // 2 * 8
    return {
        "id": panel_id,
        "type": "timeseries",
        "title": panel.title,
        "description": panel.description,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": 12, "x": x, "y": y},
        "fieldConfig": {
            "defaults": {
                "unit": panel.unit,
                "custom": {"stacking": {"mode": "normal" if panel.stacked else "none"}, "fillOpacity": 10},
            },
            "overrides": [],
        },
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}},
        "targets": [
            {
                "refId": chr(ord("A") + i),
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "expr": q.expr,
                "legendFormat": q.legend,
            }
            for i, q in enumerate(panel.queries)
        ],
    }


def _query_variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "query": {"query": query, "refId": name},
        "definition": query,
        "refresh": 2,
        "includeAll": True,
        "allValue": ".*",
        "multi": True,
        "current": {"text": "All", "value": "$__all"},
        "hide": 0,
    }


def dashboard_json(d: Dashboard) -> dict[str, Any]:
    metric = d.run_variable_metric or "asyncdapo_verifier_items_total"
    variables: list[dict[str, Any]] = [
        {
            "name": "datasource",
            "type": "datasource",
            "query": "prometheus",
            "label": "Data source",
            "hide": 0,
        },
        _query_variable("namespace", "Namespace", f"label_values({metric}, namespace)"),
    ]
    if d.run_variable_metric:
        variables.append(_query_variable("run", "Run", f"label_values({d.run_variable_metric}{{{NS}}}, run)"))
    return {
        "uid": d.uid,
        "title": d.title,
        "tags": list(d.tags),
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": variables},
        "annotations": {"list": []},
        "panels": [_panel_json(p, i + 1) for i, p in enumerate(d.panels)],
    }


def file_name(d: Dashboard) -> str:
    return f"{d.uid.removeprefix('asyncdapo-')}.json"


def render_all() -> dict[str, str]:
    """file name → JSON text of every dashboard."""
    return {
        file_name(d): json.dumps(dashboard_json(d), indent=2, ensure_ascii=False) + "\n" for d in DASHBOARDS
    }


def write_all(out_dir: str | Path) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render_all().items():
        path = out / name
        path.write_text(text)
        written.append(path)
    return written


def all_queries(d: Dashboard | None = None) -> list[tuple[str, str, str, bool]]:
    """(dashboard uid, panel title, expr, core) of every query, for tests and tooling."""
    boards = DASHBOARDS if d is None else (d,)
    return [(b.uid, p.title, q.expr, p.core) for b in boards for p in b.panels for q in p.queries]
