"""Verifier throughput and latency against raw math-verify on the same items (`make bench-verifier`).

1. raw: math-verify's defaults (`parse` gold and response with LaTeX + expression extraction,
   `verify`) in this one process, sequentially: raw_items_per_s.
2. saturation: the service (`asyncdapo verifier`, W workers, child process) fed with requests of
   `--batch` items by enough concurrent senders to keep every worker busy: items_per_s.
   ratio_per_core = items_per_s / (W * raw_items_per_s). Goal: >= 0.9.
3. half load: the saturation rate for requests of `--request-items` items is measured the same way
   (small requests cost more HTTP and pool work per item, so their capacity is lower), then
   open-loop Poisson arrivals of such requests at half that rate; latency from the scheduled send
   time to the answer. Goal: p99 <= 50 ms. (Half of the large-request rate would overload the
   service: the queue, not the service, would then set the latency.)

Items: the 5,276 GSM8K model solutions (whole solution as the response) when ../shared/data exists,
else generated arithmetic items. The machine's other load counts against both sides alike only if it
is steady: run it on a quiet machine for figures to quote. Two diagnostics separate the service's
own overhead from the machine: `vs_raw_parallel` (service vs W raw processes running at once, i.e.
what the cores deliver together) and `cpu_ratio` (raw CPU time per item / service CPU time per item,
workers + service process).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"


def load_items(n: int, seed: int) -> tuple[list[tuple[str, str]], str]:
    """`n` (ground_truth, response) pairs and where they come from."""
    tests = SHARED / "gsm8k" / "test.jsonl"
    solutions = SHARED / "gsm8k" / "example_model_solutions.jsonl"
    pairs: list[tuple[str, str]] = []
    if tests.exists() and solutions.exists():
        rows = [json.loads(line) for line in solutions.read_text().splitlines()]
        golds = [
            json.loads(line)["answer"].rsplit("####", 1)[1].strip() for line in tests.read_text().splitlines()
        ]
        for row, gold in zip(rows, golds, strict=True):
            pairs += [
                (gold, v["solution"]) for k, v in row.items() if isinstance(v, dict) and "solution" in v
            ]
        source = "GSM8K model solutions"
    else:
        rng = random.Random(seed)
        for _ in range(n):
            a, b, c = rng.randint(2, 999), rng.randint(2, 99), rng.randint(1, 50)
            answer = a * b - c if rng.random() < 0.7 else a * b + c
            pairs.append(
                (str(a * b - c), f"First {a} * {b} = {a * b}.\nThen {a * b} - {c} = {answer}.\nA: {answer}")
            )
        source = "generated arithmetic"
    random.Random(seed).shuffle(pairs)
    return pairs[:n], source


def tree_cpu_s(root: int) -> tuple[float, float]:
    """CPU seconds (user + system) used so far by process `root` and by all its descendants."""
    tick = os.sysconf("SC_CLK_TCK")
    parent, cpu = {}, {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(entry.name)] = int(fields[1])
        cpu[int(entry.name)] = (int(fields[11]) + int(fields[12])) / tick
    descendants, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, ppid in parent.items() if ppid in frontier} - descendants
        descendants |= frontier
    return cpu.get(root, 0.0), sum(cpu[pid] for pid in descendants)


def bench_raw(pairs: list[tuple[str, str]]) -> tuple[float, float, list[float]]:
    """items/s, CPU seconds per item, per-item seconds."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    config = [LatexExtractionConfig(), ExprExtractionConfig()]
    for gold, response in pairs[:20]:  # warm-up: regex compilation, ANTLR parser
        verify(parse(gold, extraction_config=config), parse(response, extraction_config=config))
    times = []
    t0, c0 = time.perf_counter(), time.process_time()
    for gold, response in pairs:
        t = time.perf_counter()
        verify(parse(gold, extraction_config=config), parse(response, extraction_config=config))
        times.append(time.perf_counter() - t)
    return len(pairs) / (time.perf_counter() - t0), (time.process_time() - c0) / len(pairs), times


def _raw_share(pairs: list[tuple[str, str]], barrier: Any, out: Any) -> None:
    bench_raw(pairs[:20])  # imports and warm-up before the common start
    barrier.wait()
    t0 = time.perf_counter()
    bench_raw(pairs)
    out.put((len(pairs), time.perf_counter() - t0))


def bench_raw_parallel(pairs: list[tuple[str, str]], processes: int) -> float:
    """`processes` raw math-verify processes at once on disjoint shares: what the cores can give."""
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(processes), ctx.Queue()
    procs = [
        ctx.Process(target=_raw_share, args=(pairs[k::processes], barrier, out)) for k in range(processes)
    ]
    for proc in procs:
        proc.start()
    results = [out.get(timeout=600) for _ in procs]
    for proc in procs:
        proc.join()
    return sum(n for n, _ in results) / max(t for _, t in results)


def _bodies(pairs: list[tuple[str, str]], size: int, tag: str) -> list[bytes]:
    out = []
    for i in range(0, len(pairs), size):
        items = [
            {"id": f"{tag}{i + k}", "response": r, "ground_truth": g}
            for k, (g, r) in enumerate(pairs[i : i + size])
        ]
        out.append(json.dumps({"items": items}).encode())
    return out


async def _post(http: httpx.AsyncClient, body: bytes) -> None:
    response = await http.post("/v1/score", content=body, headers={"content-type": "application/json"})
    response.raise_for_status()
    if '"timeout"' in response.text or '"error"' in response.text:
        bad = [r for r in response.json()["results"] if r["status"] != "ok"]
        if bad:
            print(f"  note: {len(bad)} item(s) not ok, e.g. {bad[0]}", file=sys.stderr)


async def bench_saturation(url: str, pairs: list[tuple[str, str]], batch: int, senders: int) -> float:
    bodies = _bodies(pairs, batch, "s")
    queue: asyncio.Queue[bytes] = asyncio.Queue()
    async with httpx.AsyncClient(base_url=url, timeout=300) as http:
        for body in _bodies(pairs[: batch * senders], batch, "w"):  # warm the HTTP path
            await _post(http, body)
        for body in bodies:
            queue.put_nowait(body)

        async def sender() -> None:
            while not queue.empty():
                await _post(http, queue.get_nowait())

        t0 = time.perf_counter()
        await asyncio.gather(*(sender() for _ in range(senders)))
        return len(pairs) / (time.perf_counter() - t0)


async def bench_latency(
    url: str,
    pairs: list[tuple[str, str]],
    items_per_s: float,
    request_items: int,
    duration_s: float,
    seed: int,
) -> list[float]:
    rate = items_per_s / request_items  # requests per second
    rng = random.Random(seed)
    arrivals, t = [], 0.0
    while t < duration_s:
        t += rng.expovariate(rate)
        arrivals.append(t)
    bodies = _bodies(pairs, request_items, "l")
    latencies: list[float] = []
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as http:
        for body in bodies[:20]:
            await _post(http, body)
        start = time.perf_counter() + 0.05

        async def one(k: int, at: float) -> None:
            await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
            await _post(http, bodies[k % len(bodies)])
            latencies.append(time.perf_counter() - (start + at))  # open loop: from the scheduled time

        await asyncio.gather(*(one(k, at) for k, at in enumerate(arrivals)))
    return latencies


def _metric(url: str, name: str) -> float:
    """One sample of the service's /metrics (the whole run, all phases)."""
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(f"{name} not in the service's /metrics")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def main() -> int:
    cores = len(os.sched_getaffinity(0))
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=cores, help=f"service workers (default: cores = {cores})")
    p.add_argument("--items", type=int, default=3000, help="items in the fixed set")
    p.add_argument("--batch", type=int, default=128, help="items per request at saturation")
    p.add_argument("--request-items", type=int, default=4, help="items per request at half load")
    p.add_argument("--duration-s", type=float, default=8.0, help="length of the half-load phase")
    p.add_argument("--spare-workers", type=int, default=None, help="service spare workers (default: its own)")
    p.add_argument("--stall-after-s", type=float, default=None, help="service stall line (default: its own)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    from asyncdapo.tools.local.local_server import VerifierServer

    pairs, source = load_items(args.items, args.seed)
    print(
        f"items: {len(pairs)} from {source}; workers: {args.workers}; cores: {cores}; "
        f"load average before: {os.getloadavg()[0]:.2f}"
    )
    # Raw runs before and after the service phases; their mean is the baseline, so a change in the
    # machine's other load during the run weighs on both sides.
    raw_before, raw_cpu, times = bench_raw(pairs)
    print(
        f"raw math-verify, one process: {raw_before:.0f} items/s, {raw_cpu * 1e3:.2f} CPU ms/item "
        f"(item p50 {_pct(times, 50) * 1e3:.2f} ms, p99 {_pct(times, 99) * 1e3:.2f} ms)"
    )

    raw_parallel = bench_raw_parallel(pairs, args.workers)
    print(f"raw math-verify, {args.workers} processes at once: {raw_parallel:.0f} items/s")

    extra = [f"--spare-workers={args.spare_workers}"] if args.spare_workers is not None else []
    extra += [f"--stall-after-s={args.stall_after_s}"] if args.stall_after_s is not None else []
    with VerifierServer(workers=args.workers, timeout_s=5.0, extra_args=extra) as server:
        pid = server.pid
        parent0, workers0 = tree_cpu_s(pid)
        sat = asyncio.run(bench_saturation(server.url, pairs, args.batch, senders=2 * args.workers + 2))
        parent1, workers1 = tree_cpu_s(pid)
        print(f"service at saturation: {sat:.0f} items/s")
        sat_small = asyncio.run(
            bench_saturation(server.url, pairs, args.request_items, senders=4 * args.workers + 2)
        )
        print(f"service at saturation, {args.request_items} items/request: {sat_small:.0f} items/s")
        lat = asyncio.run(
            bench_latency(server.url, pairs, sat_small / 2, args.request_items, args.duration_s, args.seed)
        )
        stalls = _metric(server.url, "asyncdapo_verifier_stalled_items_total")
    raw_after, _, _ = bench_raw(pairs)
    raw = (raw_before + raw_after) / 2
    ratio = sat / (args.workers * raw)
    # CPU per item spent in the service (warm-up batches included: senders * batch extra items),
    # from the large-request saturation phase only.
    scored = len(pairs) + args.batch * (2 * args.workers + 2)
    worker_cpu, parent_cpu = (workers1 - workers0) / scored, (parent1 - parent0) / scored
    p50, p99 = _pct(lat, 50) * 1e3, _pct(lat, 99) * 1e3
    rows = [
        ("raw math-verify items/s (before, after)", f"{raw_before:.0f}, {raw_after:.0f}"),
        ("raw math-verify items/s (mean)", f"{raw:.0f}"),
        (f"service items/s ({args.workers} workers, {args.batch}/request)", f"{sat:.0f}"),
        ("ratio per worker core (goal >= 0.9)", f"{ratio:.3f}"),
        (f"raw math-verify, {args.workers} processes at once, items/s", f"{raw_parallel:.0f}"),
        ("service / raw processes at once", f"{sat / raw_parallel:.3f}"),
        ("CPU ms/item: raw", f"{raw_cpu * 1e3:.3f}"),
        ("CPU ms/item: workers (incl. forkserver)", f"{worker_cpu * 1e3:.3f}"),
        ("CPU ms/item: service process (HTTP, pool)", f"{parent_cpu * 1e3:.3f}"),
        (f"service items/s ({args.request_items}/request)", f"{sat_small:.0f}"),
        (f"half load: {len(lat)} requests of {args.request_items} items", f"{sat_small / 2:.0f} items/s"),
        ("latency p50 ms", f"{p50:.1f}"),
        ("latency p99 ms (goal <= 50)", f"{p99:.1f}"),
        ("latency mean ms", f"{statistics.fmean(lat) * 1e3:.1f}"),
        ("stalled items (a spare took their place)", f"{stalls:.0f}"),
        ("load average after", f"{os.getloadavg()[0]:.2f}"),
    ]
    print()
    for name, value in rows:
        print(f"{name:<48}{value:>14}")
    print(
        f"RESULT items_per_s={sat:.1f} raw_items_per_s={raw:.1f} ratio_per_core={ratio:.3f} "
        f"p99_ms={p99:.1f} p50_ms={p50:.1f} workers={args.workers} "
        f"cpu_ratio={raw_cpu / (worker_cpu + parent_cpu):.3f} vs_raw_parallel={sat / raw_parallel:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
