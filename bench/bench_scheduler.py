"""Scheduler benchmark (`make bench-scheduler`): the real scheduler (`Rollout`: dispatch, Lua group
state on a real redis-server, commit ledger, early stop, abort fan-out, weight fan-out) against 8 and
64 gateways running the gateway's token-timing SIMULATOR, served from one child process so the
scheduler process has its own core (`--sim-processes N` spreads them; on 2 cores, 4 processes took
the scheduler's core away: 3,550 completions/s and 148 µs of scheduler CPU each, against 5,558 and
103 µs with one).

First, the cost at scale (scheduler_scale.py): scheduler CPU and Redis round trips per completion
with 64 and 512 gateways on the production scoring path, against the exact-scan baseline. The
SIMULATOR fleet and the helpers both phases share are in scheduler_fleet.py.

Then, per gateway count:
1. throughput: async mode with a bound far away (no early stop), a fixed total concurrency;
   completions/s, Redis round trips per completion, and the scheduler's CPU time per completion
   (its projected rate on one dedicated core); then added dispatch latency p50/p99 (request
   dispatchable → handed to its gateway's GenerateStream) at about half that rate — at
   saturation every queue grows, so the saturated p99 is printed too but is a throughput figure,
   not a latency one.
2. early stop (s = 0, several policy versions, PublishWeights between them), order `any` and
   `fifo`: abort fan-out p50/p99, seconds per version, and the length bias of early stop — mean
   response length of the groups committed for training vs. every completed response vs. the
   simulator's natural length distribution.
3. the same workload in `sync` mode (verl's DAPO loop): seconds per version, and the async/sync
   speed-up — the baseline measured in the same run.

Scoring uses `BenchScorer`, a BENCHMARK STAND-IN for the verifier (labelled): math-verify cannot
score 10^4 responses/s on this machine and the simulator's tokens are random numbers anyway. It
gives each prompt a difficulty (40 % never solved, 10 % always, the rest a uniform solve rate) so
a realistic share of groups is filtered.

The last line is `RESULT completions_per_s=… p99_dispatch_ms=… abort_fanout_p99_ms=…
redis_rtt_per_completion=…` for 64 gateways. Goals: >= 10,000/s, <= 2 ms, <= 50 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import tempfile
import time
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# bench/ is on sys.path: the script is run as `python bench/bench_scheduler.py`
from scheduler_fleet import MAX_TOKENS, SimFleet, bench_cfg, close_rollout
from scheduler_scale import scale_phase

REPO = Path(__file__).resolve().parents[1]

# Throughput phase: short responses keep the simulator's per-token Python work small, so the
# scheduler (not the simulator) is what gets measured.
THROUGHPUT_SIM = {"base_step_s": 0.025, "per_seq_step_s": 0.0, "length_dist": "uniform", "length_mean": 4.0,
                  "length_sigma": 0.5, "prefill_s_per_token": 0.0, "reload_s": 0.01}  # fmt: skip
# Early-stop phases: a long-tailed length distribution, so that early stop has something to bias.
EARLY_STOP_SIM = {"base_step_s": 0.02, "per_seq_step_s": 0.0, "length_dist": "lognormal", "length_mean": 24.0,
                  "length_sigma": 0.9, "prefill_s_per_token": 0.0, "reload_s": 0.01}  # fmt: skip


# --------------------------------------------------------------------------- scoring stand-in
class BenchScorer:
    """BENCHMARK STAND-IN for the verifier (see module docstring): deterministic, in-process."""

    async def score(self, items: Sequence[tuple[str, Sequence[int], str]]) -> list[Any]:
        from asyncdapo.services.scheduler.score_batcher import ItemScore

        out = []
        for item_id, _, _ in items:
            pid, _, idx, _ = item_id.split(":")
            h = zlib.crc32(pid.encode()) / 2**32
            rate = 0.0 if h < 0.4 else 1.0 if h < 0.5 else (h - 0.5) * 2
            acc = float(zlib.crc32(f"{pid}/{idx}".encode()) / 2**32 < rate)
            out.append(ItemScore("ok", acc, acc, ""))
        return out


# --------------------------------------------------------------------------- one workload
def _queue(redis_url: str, run: str, count: int) -> None:
    from asyncdapo.contracts.prompts import PromptRecord, queue_prompts
    from asyncdapo.contracts.redis_keys import RunKeys
    from asyncdapo.runtime.redis_conn import sync_client

    r = sync_client(redis_url)
    r.flushall()
    for start in range(0, count, 5000):
        pipe = r.pipeline(transaction=False)
        recs = [
            PromptRecord(f"p{i}", [1, 2, 3, 4, 5, 6, 7, 8], "", "x", "bench", 0, i)
            for i in range(start, min(count, start + 5000))
        ]
        queue_prompts(pipe, RunKeys(run), recs)
        pipe.execute()


async def _open(cfg: Any, redis_url: str, addresses: list[str]) -> Any:
    from asyncdapo.runtime.redis_conn import async_client
    from asyncdapo.services.scheduler.gateway_pool import GatewayPool, GatewaySpec
    from asyncdapo.services.scheduler.rollout import Rollout

    pool = GatewayPool(GatewaySpec(static=tuple(addresses)), watch_interval_ms=200)
    ro = Rollout(cfg, async_client(redis_url), pool, BenchScorer(), queue_poll_s=0.005, claim_chunk=16)
    await pool.start()
    await pool.wait_up(len(addresses), 30)
    await ro.open()
    return ro


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def throughput(
    redis_url: str, addresses: list[str], concurrency: int, seconds: float
) -> dict[str, float]:
    n = 8
    cfg = bench_cfg("bench-tp", train_batch_size=256, max_staleness=64, max_concurrent_prompts=concurrency // n,
               max_concurrent_per_gateway=1 << 16, admission={"policy": "greedy"})  # fmt: skip
    _queue(redis_url, cfg.name, 150_000)
    ro = await _open(cfg, redis_url, addresses)
    try:
        ro.start_run()
        await asyncio.sleep(min(3.0, seconds / 3))  # warm-up: fill every slot
        c0, r0, t0, cpu0 = ro.lengths.completed, ro.rtt.count, time.perf_counter(), time.process_time()
        d0 = len(ro.dispatcher.dispatch_s)
        await asyncio.sleep(seconds)
        c1, r1, t1, cpu1 = ro.lengths.completed, ro.rtt.count, time.perf_counter(), time.process_time()
        lat = ro.dispatcher.dispatch_s[d0:]
    finally:
        await close_rollout(ro)
    done = max(c1 - c0, 1)
    return {
        "completions_per_s": done / (t1 - t0),
        "dispatch_p50_ms": _pct(lat, 0.5) * 1e3,
        "dispatch_p99_ms": _pct(lat, 0.99) * 1e3,
        "redis_rtt_per_completion": (r1 - r0) / done,
        "cpu_us_per_completion": (cpu1 - cpu0) / done * 1e6,
    }


async def versions(
    redis_url: str, addresses: list[str], mode: str, order: str, prompts_in_flight: int, count: int, tmp: Path
) -> dict[str, float]:
    """`count` policy versions of B valid groups each, with PublishWeights between them."""
    from asyncdapo.services.scheduler.rollout import Phase

    extra: dict[str, Any] = {"mode": mode, "max_concurrent_prompts": prompts_in_flight}
    if mode == "async":
        extra["early_stop_order"] = order
        extra["admission"] = {"policy": "greedy"}
    cfg = bench_cfg(f"bench-{mode}-{order}", train_batch_size=16, **extra)
    _queue(redis_url, cfg.name, 40_000)
    snap = tmp / "weights"
    if not snap.exists():
        import numpy as np
        from safetensors.numpy import save_file

        snap.mkdir()
        save_file({"w": np.zeros(2, dtype=np.float32)}, str(snap / "model.safetensors"))
    ro = await _open(cfg, redis_url, addresses)
    per_version: list[float] = []
    try:
        ro.start_run()
        c0, t0 = ro.lengths.completed, time.perf_counter()
        for v in range(count):
            tv = time.perf_counter()
            deadline = tv + 120
            while ro.phase != Phase.BOUND:
                if time.perf_counter() > deadline:
                    raise TimeoutError(f"{mode}/{order}: version {v} did not reach its bound")
                await asyncio.sleep(0.002)
            per_version.append(time.perf_counter() - tv)
            if v + 1 < count:
                await ro.publish_weights(v + 1, str(snap))
        elapsed = time.perf_counter() - t0
        completions = ro.lengths.completed - c0
        lengths = ro.lengths
        fanout = list(ro.dispatcher.abort_fanout_s)
        aborted = ro.dispatcher.aborted_requests
    finally:
        await close_rollout(ro)
    return {
        "s_per_version": statistics.mean(per_version),
        "completions_per_s": completions / elapsed,
        "abort_fanout_p50_ms": _pct(fanout, 0.5) * 1e3,
        "abort_fanout_p99_ms": _pct(fanout, 0.99) * 1e3,
        "fanouts": len(fanout),
        "aborted_requests": aborted,
        "trained_mean_len": lengths.committed_mean,
        "completed_mean_len": lengths.completed_mean,
    }


def natural_mean_length(timing: dict[str, float]) -> float:
    from asyncdapo.services.gateway.sim_engine import SimTiming

    t = SimTiming(**timing)
    rng = random.Random(0)
    return statistics.mean(min(t.natural_length(rng), MAX_TOKENS) for _ in range(200_000))


# --------------------------------------------------------------------------- main
async def bench(
    gateway_counts: list[int], seconds: float, nversions: int, sim_processes: int, runs: int
) -> None:
    from asyncdapo.tools.local.redis_server import RedisServer

    results: dict[int, dict[str, Any]] = {}
    with (
        tempfile.TemporaryDirectory() as tmpdir,
        RedisServer(Path(tmpdir) / "redis", appendonly=False) as redis,
    ):
        tmp = Path(tmpdir)
        print("=== cost per completion at scale: 256-token responses, production scoring path ===")
        scale = await scale_phase(redis.url, runs, max(seconds, 10.0), sim_processes)
        natural = natural_mean_length(EARLY_STOP_SIM)
        for g in gateway_counts:
            res: dict[str, Any] = {}
            total = 4096
            fleet = SimFleet(g, max(1, total // g), THROUGHPUT_SIM, sim_processes)
            try:
                res["tp"] = await throughput(redis.url, fleet.addresses, total, seconds)
                # added latency at about half the saturated rate (a simulated response takes ~0.1 s)
                half = max(8, int(res["tp"]["completions_per_s"] * 0.05) // 8 * 8)
                res["half"] = await throughput(redis.url, fleet.addresses, half, seconds / 2)
                res["half"]["concurrency"] = half
            finally:
                fleet.close()
            fleet = SimFleet(g, max(1, 512 // g), EARLY_STOP_SIM, sim_processes)
            try:
                res["any"] = await versions(redis.url, fleet.addresses, "async", "any", 64, nversions, tmp)
                res["fifo"] = await versions(redis.url, fleet.addresses, "async", "fifo", 64, nversions, tmp)
                res["sync"] = await versions(redis.url, fleet.addresses, "sync", "any", 64, nversions, tmp)
            finally:
                fleet.close()
            results[g] = res
            _report(g, res, natural)
    big = max(gateway_counts)
    r = results[big]
    print(
        f"RESULT cpu_us_per_completion_64={scale['64']['cpu_us']:.0f} "
        f"cpu_us_per_completion_512={scale['512']['cpu_us']:.0f} "
        f"marginal_us_per_completion_64={scale['64']['marginal_us']:.0f} "
        f"marginal_us_per_completion_512={scale['512']['marginal_us']:.0f} "
        f"marginal_us_per_completion_512_exact_scan={scale['512-exact']['marginal_us']:.0f} "
        f"idle_core_fraction_512={scale['512']['idle_cpu']:.3f} "
        f"redis_rtt_per_completion={scale['512']['rtt']:.3f} "
        f"abort_fanout_p99_ms_{big}={r['any']['abort_fanout_p99_ms']:.2f} "
        f"completions_per_s_standin_{big}={r['tp']['completions_per_s']:.0f} "
        f"p99_dispatch_ms={r['half']['dispatch_p99_ms']:.3f} "
        f"async_vs_sync_speedup={r['sync']['s_per_version'] / r['any']['s_per_version']:.2f} "
        f"length_bias_any={r['any']['trained_mean_len'] / natural:.3f} "
        f"length_bias_fifo={r['fifo']['trained_mean_len'] / natural:.3f} "
        f"gateways={big}"
    )


def _report(g: int, res: dict[str, Any], natural: float) -> None:
    tp = res["tp"]
    print(f"\n=== {g} simulated gateways ===")
    print(
        f"throughput   {tp['completions_per_s']:8.0f} completions/s  (goal >= 10,000: {tp['completions_per_s'] / 1e4:.2f}x)"
        f"   scheduler CPU {tp['cpu_us_per_completion']:.0f} us/completion"
        f" -> {1e6 / tp['cpu_us_per_completion']:.0f}/s on one dedicated core"
    )
    half = res["half"]
    print(
        f"dispatch     saturated: p50 {tp['dispatch_p50_ms']:.3f} ms p99 {tp['dispatch_p99_ms']:.3f} ms;"
        f" at ~half load ({half['concurrency']} in flight, {half['completions_per_s']:.0f}/s):"
        f" p50 {half['dispatch_p50_ms']:.3f} ms p99 {half['dispatch_p99_ms']:.3f} ms (goal <= 2 ms)"
    )
    print(f"redis        {tp['redis_rtt_per_completion']:.3f} round trips per completion")
    for key in ("any", "fifo", "sync"):
        r = res[key]
        label = f"async/{key}" if key != "sync" else "sync (verl)"
        print(
            f"{label:12} {r['s_per_version']:6.2f} s/version  {r['completions_per_s']:6.0f} completions/s"
            f"  abort fan-out p50 {r['abort_fanout_p50_ms']:.1f} ms p99 {r['abort_fanout_p99_ms']:.1f} ms"
            f" ({r['fanouts']} fan-outs, {r['aborted_requests']} aborted)"
            f"  mean length: trained {r['trained_mean_len']:.1f} / completed {r['completed_mean_len']:.1f}"
            f" / natural {natural:.1f}"
        )
    print(
        f"async (any) vs sync: {res['sync']['s_per_version'] / res['any']['s_per_version']:.2f}x faster per version;"
        f" length bias (trained/natural): any {res['any']['trained_mean_len'] / natural:.3f},"
        f" fifo {res['fifo']['trained_mean_len'] / natural:.3f}, sync {res['sync']['trained_mean_len'] / natural:.3f}"
        f" (trained/completed: any {res['any']['trained_mean_len'] / res['any']['completed_mean_len']:.3f},"
        f" fifo {res['fifo']['trained_mean_len'] / res['fifo']['completed_mean_len']:.3f},"
        f" sync {res['sync']['trained_mean_len'] / res['sync']['completed_mean_len']:.3f})",
        flush=True,
    )


def main() -> None:
    # grpc's core logs one INFO line per connection when the simulators shut down (GOAWAY)
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gateways", default="64,512", help="gateway counts (the last is reported in RESULT)")
    ap.add_argument("--runs", type=int, default=3, help="interleaved runs of the cost-at-scale modes")
    ap.add_argument("--seconds", type=float, default=8.0, help="throughput measurement window")
    ap.add_argument("--versions", type=int, default=6, help="policy versions per early-stop workload")
    ap.add_argument(
        "--sim-processes",
        type=int,
        default=1,
        help="processes serving the simulated gateways (2 cores: 1 is best)",
    )
    args = ap.parse_args()
    import logging

    logging.basicConfig(level=logging.ERROR)
    asyncio.run(
        bench(
            [int(x) for x in args.gateways.split(",")],
            args.seconds,
            args.versions,
            args.sim_processes,
            args.runs,
        )
    )


if __name__ == "__main__":
    main()
