"""What `appendfsync always` costs the scheduler (`make bench-redis-fsync`).

The run's Redis keeps its AOF with `appendfsync always` (local stack and Helm chart): a write is on
disk before Redis replies, so a Redis crash (SIGKILL, node loss) never rolls back anything a
scheduler or trainer already acted on. The alternative, `everysec`, may lose the last second of
acknowledged writes. This benchmark measures the price on the scheduler's own write path: the real
Lua scripts (`asyncdapo.services.scheduler.lua`) through the real client classes (`PromptQueue`,
`GroupStore`) against a real redis-server, in the mix one prompt attempt costs:

    CLAIM of 8 prompts → RECORD of n = 8 scored responses per prompt (batches of 32) → FINISH of the
    8 outcomes (half valid: each XADDs a ~4 KB group, half filtered)

with C concurrent client loops (the scheduler's admission, scoring and finisher tasks overlap).
Modes `everysec` (the baseline) and `always` run interleaved, 3 runs each, each on a fresh Redis
in a fresh directory; per mode the median and spread of completions/s (responses recorded per
second), FINISH latency p50/p99 and the AOF bytes written. The load average is printed.

Last line: `RESULT always_completions_per_s=… everysec_completions_per_s=… ratio=…
finish_p99_ms_always=… finish_p99_ms_everysec=…`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

import redis.asyncio as aioredis

from asyncdapo.contracts.prompts import PromptRecord, queue_prompts
from asyncdapo.contracts.redis_keys import RunKeys
from asyncdapo.services.scheduler.group_records import ResponseScore
from asyncdapo.services.scheduler.group_state import GroupStore, RoundTrips, ScriptRunner
from asyncdapo.services.scheduler.outcome_records import Outcome
from asyncdapo.services.scheduler.queue import PromptQueue
from asyncdapo.tools.local.redis_server import RedisServer

N = 8  # responses per prompt
CLAIM = 8  # prompts per claim
GROUP_BYTES = 4096


async def _loop(q: PromptQueue, store: GroupStore, stop: float, lat: list[float]) -> int:
    done = 0
    group = os.urandom(GROUP_BYTES)
    while time.perf_counter() < stop:
        claims = (await q.claim(CLAIM, N)).claims
        if not claims:
            break
        scores = [
            ResponseScore(c.pid, c.attempt, i, float(i % 2), float(i % 2), 0, 0, 100)
            for c in claims
            for i in range(N)
        ]
        for i in range(0, len(scores), 32):
            await store.record(scores[i : i + 32])
        calls = [
            store.finish_call(c.pid, c.attempt, Outcome.VALID, bound=1 << 40, group=group)
            if j % 2 == 0
            else store.finish_call(c.pid, c.attempt, Outcome.FILTERED)
            for j, c in enumerate(claims)
        ]
        t0 = time.perf_counter()
        await store.finish_many(calls)
        lat.append(time.perf_counter() - t0)
        done += len(scores)
    return done


async def run_once(fsync: str, seconds: float, concurrency: int, prompts: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="bench-fsync-") as tmp:
        server = RedisServer(Path(tmp), appendfsync=fsync).start()
        try:
            keys = RunKeys("bench")
            r = aioredis.from_url(server.url)
            pipe = r.pipeline()
            queue_prompts(
                pipe, keys, [PromptRecord(f"e0-{i}", [1, 2, 3], "q", "1", "b", 0, i) for i in range(prompts)]
            )
            await pipe.execute()
            rtt = RoundTrips()
            scripts = ScriptRunner(r, rtt)
            store = GroupStore(scripts, keys, train_batch_size=1 << 20, max_staleness=0)
            q = PromptQueue(r, keys, scripts, store, rtt, owner="bench")
            await q.take_over()
            before = await r.info("persistence")
            lat: list[float] = []
            t0 = time.perf_counter()
            stop = t0 + seconds
            counts = await asyncio.gather(*(_loop(q, store, stop, lat) for _ in range(concurrency)))
            dt = time.perf_counter() - t0
            after = await r.info("persistence")
            await r.aclose()
        finally:
            server.stop()
    done = sum(counts)
    lat.sort()
    return {
        "completions_per_s": done / dt,
        "finish_p50_ms": 1000 * lat[len(lat) // 2],
        "finish_p99_ms": 1000 * lat[min(len(lat) - 1, int(len(lat) * 0.99))],
        "aof_bytes": float(after.get("aof_current_size", 0) - before.get("aof_current_size", 0)),
        "completions": float(done),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=200_000)
    args = ap.parse_args()
    results: dict[str, list[dict[str, float]]] = {"everysec": [], "always": []}
    order = []
    for i in range(args.runs):  # interleaved ABBA…
        order += ["everysec", "always"] if i % 2 == 0 else ["always", "everysec"]
    for mode in order:
        res = asyncio.run(run_once(mode, args.seconds, args.concurrency, args.prompts))
        results[mode].append(res)
        print(
            f"{mode:9s} {res['completions_per_s']:9.0f} completions/s  FINISH p50 {res['finish_p50_ms']:.2f} ms "
            f"p99 {res['finish_p99_ms']:.2f} ms  AOF +{res['aof_bytes'] / 1e6:.1f} MB",
            flush=True,
        )
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    med: dict[str, dict[str, float]] = {}
    for mode, rs in results.items():
        vals = [r["completions_per_s"] for r in rs]
        med[mode] = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        print(
            f"{mode:9s} median {med[mode]['completions_per_s']:.0f}/s (spread {min(vals):.0f}–{max(vals):.0f}), "
            f"FINISH p99 {med[mode]['finish_p99_ms']:.2f} ms, "
            f"{1e6 / med[mode]['completions_per_s']:.1f} µs per completion"
        )
    ratio = med["always"]["completions_per_s"] / med["everysec"]["completions_per_s"]
    print(
        f"RESULT always_completions_per_s={med['always']['completions_per_s']:.0f} "
        f"everysec_completions_per_s={med['everysec']['completions_per_s']:.0f} ratio={ratio:.3f} "
        f"finish_p99_ms_always={med['always']['finish_p99_ms']:.2f} "
        f"finish_p99_ms_everysec={med['everysec']['finish_p99_ms']:.2f}"
    )


if __name__ == "__main__":
    main()
