"""`LoadProbe`'s step log: one JSON line per engine step from vLLM's SchedulerStats (pure: the
stats are stand-ins with vLLM's field names; the real engine's log is checked in
tests/integration/scheduler/test_vllm_engine_processes.py)."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace

from asyncdapo.services.gateway.vllm_stats import LoadProbe


def _stats(running: int, decode: int, prefill_reqs: int = 0, prefill_tokens: int = 0, dummy: bool = False):
    return SimpleNamespace(
        num_running_reqs=running,
        num_waiting_reqs=1,
        kv_cache_usage=0.25,
        prefix_cache_stats=SimpleNamespace(queries=prefill_tokens, hits=0),
        iteration_details=SimpleNamespace(
            is_dummy=dummy,
            num_generation_tokens=decode,
            num_ctx_requests=prefill_reqs,
            num_ctx_tokens=prefill_tokens,
        ),
    )


def test_one_line_per_real_step_with_the_engine_state_after_it() -> None:
    log = io.StringIO()
    probe = LoadProbe(log)
    probe.record(_stats(running=2, decode=0, prefill_reqs=2, prefill_tokens=9))
    probe.record(_stats(running=2, decode=2, dummy=True))  # a dummy step (data parallel padding)
    probe.record(None)  # an iteration without scheduler stats
    probe.record(_stats(running=1, decode=2))
    lines = [json.loads(x) for x in log.getvalue().splitlines()]
    assert [(x["running"], x["waiting"], x["kv"], x["decode"], x["prefill_reqs"], x["prefill_tokens"]) for x in lines] == [
        (2, 1, 0.25, 0, 2, 9),
        (1, 1, 0.25, 2, 0, 0),
    ]  # fmt: skip
    assert lines[0]["t"] <= lines[1]["t"]
    # the log counts what the probe counts: every sampled token once
    assert sum(x["decode"] + x["prefill_reqs"] for x in lines) == probe.generated_tokens == 4
    assert "block" not in lines[0]  # the engine's KV block size, once the gateway knows it
    probe.block_tokens = 128
    probe.record(_stats(running=1, decode=1))
    assert json.loads(log.getvalue().splitlines()[-1])["block"] == 128


def test_no_log_without_a_file() -> None:
    probe = LoadProbe()
    probe.record(_stats(running=1, decode=1))
    assert probe.step_log is None and probe.generated_tokens == 1
