"""Engine statistics from vLLM at the lowest frontend cost.

vLLM's statistics have two halves. The engine core sends `SchedulerStats` with every step
(running, waiting, KV-cache usage, prefix-cache lookups and, with
`enable_logging_iteration_details`, the tokens scheduled in the step): cheap, and all the load a
scheduler needs. The frontend builds `IterationStats` per request per step (latencies) and vLLM's
Prometheus logger observes histograms per token: on the tiny CPU model these cost about half of
the frontend's CPU time. The gateway keeps the first half (`LoadProbe`) and, unless `vllm:*`
metrics are asked for, drops the second (`quiet_prometheus_logger`, and `AsyncLLM.log_stats =
False` before its output handler starts, see `vllm_engine.py`).

The same `SchedulerStats`, written one line per step with the time they reached the frontend,
are the step log (`--step-log`): a timeline of the engine. A gap between steps while requests
are running, many times the steps around it and not a large prefill, is an engine that was not
scheduled on its CPU (how engine cores floating between CPUs
showed up); the step interval against `running` is the decode cost per batch size.
"""

from __future__ import annotations

import json
import time
from typing import Any, TextIO


class LoadProbe:
    """Latest scheduler stats and running totals, fed by a vLLM stat logger (`stat_logger()`)."""

    def __init__(self, step_log: TextIO | None = None) -> None:
        self.step_log = step_log  # one JSON line per engine step (see the module docstring)
        self.running = 0
        self.waiting = 0
        self.kv_cache_usage = 0.0
        self.generated_tokens = 0  # tokens sampled (decode steps + completed prefills)
        self.prompt_tokens = 0  # prompt tokens computed (recompute after a reload included)
        self.prefix_queries = 0
        self.prefix_hits = 0
        # vLLM's KV block size (tokens): `kv` counts whole blocks, so the log carries it for the
        # simulator's calibration (asyncdapo.tools.simulate.calibrate); set once the engine config is made
        self.block_tokens: int | None = None

    def record(self, scheduler_stats: Any) -> None:
        if scheduler_stats is None:
            return
        self.running = scheduler_stats.num_running_reqs
        self.waiting = scheduler_stats.num_waiting_reqs
        self.kv_cache_usage = scheduler_stats.kv_cache_usage
        self.prefix_queries += scheduler_stats.prefix_cache_stats.queries
        self.prefix_hits += scheduler_stats.prefix_cache_stats.hits
        details = scheduler_stats.iteration_details
        if details is not None and not details.is_dummy:
            # A request whose prefill completes in this step samples its first token too (exact
            # without chunked prefill; a live figure, the responses carry the exact counts).
            self.generated_tokens += details.num_generation_tokens + details.num_ctx_requests
            self.prompt_tokens += details.num_ctx_tokens
            if self.step_log is not None:
                self._log_step(self.step_log, details)

    def close_step_log(self) -> None:
        """Close the step log; steps recorded afterwards (during engine shutdown) are not logged."""
        log, self.step_log = self.step_log, None
        if log is not None:
            log.close()

    def _log_step(self, log: TextIO, details: Any) -> None:
        """t: unix time the stats reached the frontend; running / waiting / kv: the engine after the
        step; decode: tokens sampled by requests past their prefill; prefill_reqs / prefill_tokens:
        requests whose prompt was computed in the step (each also sampled its first token) and the
        prompt tokens computed; block: tokens per KV-cache block (`kv` counts allocated blocks: a
        request of c tokens holds ceil(c / block) of them). Summed over the log, decode +
        prefill_reqs is every token sampled."""
        line = {
            "t": round(time.time(), 4),
            "running": self.running,
            "waiting": self.waiting,
            "kv": round(self.kv_cache_usage, 4),
            "decode": details.num_generation_tokens,
            "prefill_reqs": details.num_ctx_requests,
            "prefill_tokens": details.num_ctx_tokens,
        }
        if self.block_tokens is not None:
            line["block"] = self.block_tokens
        log.write(json.dumps(line, separators=(",", ":")) + "\n")

    def stat_logger(self) -> Any:
        """A per-engine vLLM stat logger factory that feeds this probe."""
        from vllm.v1.metrics.loggers import StatLoggerBase

        probe = self

        class _ProbeLogger(StatLoggerBase):
            def __init__(self, vllm_config: Any = None, engine_index: int = 0) -> None:
                pass

            def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0):
                probe.record(scheduler_stats)

            def log_engine_initialized(self) -> None:
                pass

        return _ProbeLogger


def quiet_prometheus_logger() -> Any:
    """A stand-in for vLLM's Prometheus stat logger, which vLLM installs unless one is given."""
    from vllm.v1.metrics.loggers import PrometheusStatLogger

    class _QuietPrometheus(PrometheusStatLogger):
        def __init__(self, vllm_config: Any = None, engine_indexes: list[int] | None = None) -> None:
            self.engine_indexes = engine_indexes or [0]

        def record(self, *args: Any, **kwargs: Any) -> None:
            pass

        def record_admission_rejection(self, reason: str) -> None:
            pass

        def record_sleep_state(self, sleep: int = 0, level: int = 0) -> None:
            pass

        def log_engine_initialized(self) -> None:
            pass

        def log(self) -> None:
            pass

    return _QuietPrometheus
