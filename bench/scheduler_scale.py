"""The cost-at-scale phase of `make bench-scheduler` (bench_scheduler.py runs it first).

The real scheduler (`Rollout`) against 64 and 512 SIMULATOR gateways in answer-key mode: 256-token
responses ending in a boxed answer, scored through the production path (detokenization, the real
verifier over HTTP, group serialization, XADD). Per mode: the scheduler's CPU time per completion,
its marginal part (the idle fleet's fixed cost — load reports, housekeeping — set apart), the idle
cost itself and Redis round trips per completion. The baseline, measured in the same run, is 512
gateways with every eligible gateway scored per prompt (the pre-index dispatcher); the modes run
interleaved, `runs` times each, and the medians with their spread are reported.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# bench/ is on sys.path: the script is run as `python bench/bench_scheduler.py`
from scheduler_fleet import SimFleet, bench_cfg, close_rollout

SCALE_SIM = {"base_step_s": 0.01, "per_seq_step_s": 0.0, "length_dist": "fixed", "length_mean": 256.0,
             "length_sigma": 0.0, "prefill_s_per_token": 0.0, "reload_s": 0.01}  # fmt: skip
SCALE_TOKENS = 256


class ScaleAssets:
    """The tiny model's tokenizer, prompts with real ground truths and their answer key, and a
    real verifier process."""

    def __init__(self, tmp: Path, prompts: int) -> None:
        from asyncdapo.services.gateway.sim_answers import prompt_key, write_answer_key
        from asyncdapo.tools.local.ports import free_port, wait_until
        from asyncdapo.tools.local.stack import http_ready
        from asyncdapo.tools.tiny_model import build_tiny_model

        self.model = build_tiny_model(tmp / "model", seed=0)
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(Path(self.model) / "tokenizer.json"))
        rng = random.Random(0)
        self.prompts: list[tuple[list[int], str]] = []
        answers = {}
        for _ in range(prompts):
            a, b = rng.randint(0, 99), rng.randint(0, 99)
            ids = tok.encode(f"What is {a} + {b}?").ids
            self.prompts.append((ids, str(a + b)))
            answers[prompt_key(ids)] = str(a + b)
        key = write_answer_key(answers, tmp / "answers.json")
        self.answers = json.dumps({"key": str(key), "model": str(self.model)})
        port = free_port()
        self.verifier_url = f"http://127.0.0.1:{port}"
        self.verifier = subprocess.Popen(
            [sys.executable, "-m", "asyncdapo.cli", "verifier", "--host", "127.0.0.1", "--port", str(port),
             "--workers", "1", "--log-level", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            wait_until(lambda: http_ready(f"{self.verifier_url}/readyz"), 120, "the verifier")
        except BaseException:
            self.close()
            raise

    def queue(self, redis_url: str, run: str, count: int) -> None:
        from asyncdapo.contracts.prompts import PromptRecord, queue_prompts
        from asyncdapo.contracts.redis_keys import RunKeys
        from asyncdapo.runtime.redis_conn import sync_client

        r = sync_client(redis_url)
        r.flushall()
        for start in range(0, count, 5000):
            pipe = r.pipeline(transaction=False)
            recs = []
            for i in range(start, min(count, start + 5000)):
                ids, gt = self.prompts[i % len(self.prompts)]
                recs.append(PromptRecord(f"p{i}", ids, "", gt, "bench", 0, i))
            queue_prompts(pipe, RunKeys(run), recs)
            pipe.execute()

    def close(self) -> None:
        self.verifier.terminate()
        try:
            self.verifier.wait(20)
        except subprocess.TimeoutExpired:
            self.verifier.kill()


async def scale_cost(
    redis_url: str, assets: ScaleAssets, addresses: list[str], concurrency: int, seconds: float, exact: bool
) -> dict[str, float]:
    """Scheduler CPU and Redis round trips per completion on the production scoring path. `exact`
    scores every eligible gateway for each prompt (the pre-index dispatcher: the baseline)."""
    from asyncdapo.runtime.redis_conn import async_client
    from asyncdapo.services.scheduler.gateway_pool import GatewayPool, GatewaySpec
    from asyncdapo.services.scheduler.metrics import SchedulerMetrics
    from asyncdapo.services.scheduler.rollout import Rollout
    from asyncdapo.services.scheduler.score_batcher import Detokenizer, VerifierScorer

    n = 8
    cfg = bench_cfg("bench-scale", train_batch_size=256, max_staleness=64, max_concurrent_prompts=concurrency // n,
               max_concurrent_per_gateway=1 << 16, admission={"policy": "greedy"})  # fmt: skip
    cfg = cfg.model_copy(update={"data": cfg.data.model_copy(update={"max_response_length": SCALE_TOKENS})})
    assets.queue(redis_url, cfg.name, 200_000)
    metrics = SchedulerMetrics()
    scorer = VerifierScorer(assets.verifier_url, Detokenizer(assets.model), cfg.reward, metrics)
    # production settings: the default load-report interval, admission poll and claim chunk
    pool = GatewayPool(GatewaySpec(static=tuple(addresses)))
    ro = Rollout(cfg, async_client(redis_url), pool, scorer, metrics)
    if exact:
        ro.dispatcher.index.exact_limit = 1 << 30
    await pool.start()
    await pool.wait_up(len(addresses), 60)
    await ro.open()
    try:
        # idle: every gateway up and reporting its load, nothing admitted — the fixed cost
        await asyncio.sleep(3.0)  # connections and first reports settled
        i0, icpu0 = time.perf_counter(), time.process_time()
        await asyncio.sleep(5.0)
        idle_cpu_per_s = (time.process_time() - icpu0) / (time.perf_counter() - i0)
        ro.start_run()
        await asyncio.sleep(8.0)  # warm-up: every slot filled, responses completing
        c0, r0, t0, cpu0 = ro.lengths.completed, ro.rtt.count, time.perf_counter(), time.process_time()
        await asyncio.sleep(seconds)
        c1, r1, t1, cpu1 = ro.lengths.completed, ro.rtt.count, time.perf_counter(), time.process_time()
        waiting = metrics.registry.get_sample_value("asyncdapo_scheduler_verifier_waiting_items") or 0
    finally:
        await close_rollout(ro)
        await scorer.aclose()
    done = max(c1 - c0, 1)
    cpu = cpu1 - cpu0
    return {
        "completions_per_s": done / (t1 - t0),
        "cpu_us_per_completion": cpu / done * 1e6,
        # what a completion adds, the idle cost of the fleet (load reports, housekeeping) set apart
        "marginal_us_per_completion": max(cpu - idle_cpu_per_s * (t1 - t0), 0.0) / done * 1e6,
        "idle_cpu_per_s": idle_cpu_per_s,
        "redis_rtt_per_completion": (r1 - r0) / done,
        "verifier_waiting_items": waiting,
        "completions": float(done),
    }


async def scale_phase(
    redis_url: str, runs: int, seconds: float, sim_processes: int
) -> dict[str, dict[str, Any]]:
    """64 and 512 gateways (index), and 512 with every gateway scored (the baseline), interleaved."""
    modes = [("64", 64, False), ("512", 512, False), ("512-exact", 512, True)]
    out: dict[str, list[dict[str, float]]] = {m: [] for m, _, _ in modes}
    with tempfile.TemporaryDirectory() as tmpdir:
        assets = ScaleAssets(Path(tmpdir), 2000)
        fleets = {g: SimFleet(g, 2048 // g, SCALE_SIM, sim_processes, assets.answers) for g in (64, 512)}
        try:
            for rep in range(runs):
                order = modes if rep % 2 == 0 else list(reversed(modes))
                for name, g, exact in order:
                    res = await scale_cost(redis_url, assets, fleets[g].addresses, 512, seconds, exact)
                    out[name].append(res)
                    print(
                        f"  run {rep + 1} {name:10s} {res['completions_per_s']:6.0f} completions/s"
                        f"  scheduler CPU {res['cpu_us_per_completion']:6.0f} us/completion,"
                        f" {res['marginal_us_per_completion']:5.0f} us marginal,"
                        f" idle {res['idle_cpu_per_s'] * 100:4.1f} % of a core"
                        f"  {res['redis_rtt_per_completion']:.3f} Redis round trips/completion"
                        f"  (verifier waiting items {res['verifier_waiting_items']:.0f})",
                        flush=True,
                    )
        finally:
            for fleet in fleets.values():
                fleet.close()
            assets.close()
    summary: dict[str, dict[str, Any]] = {}
    for name, rs in out.items():
        cpu = [r["cpu_us_per_completion"] for r in rs]
        marg = [r["marginal_us_per_completion"] for r in rs]
        summary[name] = {
            "cpu_us": statistics.median(cpu),
            "cpu_spread": (min(cpu), max(cpu)),
            "marginal_us": statistics.median(marg),
            "marginal_spread": (min(marg), max(marg)),
            "idle_cpu": statistics.median(r["idle_cpu_per_s"] for r in rs),
            "rtt": statistics.median(r["redis_rtt_per_completion"] for r in rs),
            "rate": statistics.median(r["completions_per_s"] for r in rs),
        }
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for name, sm in summary.items():
        lo, hi = sm["cpu_spread"]
        mlo, mhi = sm["marginal_spread"]
        print(
            f"{name:10s} scheduler CPU median {sm['cpu_us']:.0f} us/completion (spread {lo:.0f}-{hi:.0f}), "
            f"marginal {sm['marginal_us']:.0f} us (spread {mlo:.0f}-{mhi:.0f}), idle "
            f"{sm['idle_cpu'] * 100:.1f} % of a core, {sm['rtt']:.3f} round trips/completion, {sm['rate']:.0f} completions/s"
        )
    return summary
