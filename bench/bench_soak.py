"""Redis memory over a long run (`make bench-soak`): does anything grow with the run's length?

The whole loop as real processes (`asyncdapo.tools.faults.FaultStack`, no fault injected): redis-server
with the run's settings (AOF, `appendfsync always`), the real verifier, scheduler and trainer (the
tiny model), and two SIMULATOR gateways in answer-key mode, so the real verifier gives groups real
variance. It trains `--versions` policy versions (default 400) while an invariant checker polls
Redis every 2 s: `used_memory`, the AOF's size and the groups stream's length, next to the
trainer's newest version — and every durability invariant (one outcome per attempt, each group
trained once, …) at the same time.

What should be flat: per-prompt state is compacted at its final outcome (its data deleted, the rest
expiring after 60 s), the groups stream is trimmed once a durable checkpoint covers its entries,
the CLAIM replies kept for retries expire after 60 s, and the outcomes audit stream is capped.
The first half of the run fills those windows (the warm-up, printed as the baseline); the slope is
measured over the second half. The AOF is bounded by Redis' own rewrite
(`auto-aof-rewrite-min-size`, 8 MB on the local Redis): its size is printed over time.

Last line: `RESULT versions=… redis_mem_slope_bytes_per_version=… warmup_slope_bytes_per_version=…
aof_bytes=… aof_bytes_max=… stream_len_max=… violations=…`.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from asyncdapo.tools.faults.assets import build_fault_assets
from asyncdapo.tools.faults.invariants import CheckerThread, InvariantChecker, MemorySample
from asyncdapo.tools.faults.procs import FaultStack, FaultStackOptions


def slope(xs: list[float], ys: list[float]) -> float:
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0


def halves(samples: list[MemorySample], versions: int) -> tuple[list[MemorySample], list[MemorySample]]:
    first = [s for s in samples if 0 < s.version <= versions // 2]
    second = [s for s in samples if s.version > versions // 2]
    return first, second


def key_breakdown(url: str, run: str) -> dict[str, tuple[int, int]]:
    """What the run's keys hold at the end: pattern -> (keys, bytes by MEMORY USAGE)."""
    import re

    import redis

    r = redis.Redis.from_url(url)
    prefix = f"asyncdapo:{{{run}}}:"
    out: dict[str, tuple[int, int]] = {}
    for key in r.scan_iter(match=prefix.replace("{", "\\{").replace("}", "\\}") + "*", count=1000):
        name = key.decode()[len(prefix) :]
        pattern = re.sub(r"^prompt:[^:]+", "prompt:{id}", name)
        pattern = re.sub(r"^(claim|countseq):.*", r"\1:{token}", pattern)
        n, b = out.get(pattern, (0, 0))
        out[pattern] = (n + 1, b + int(r.memory_usage(key) or 0))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--versions", type=int, default=400)
    # B = 16: ~25 outcomes a version, so the capped audit stream (4,096 entries) is full before the
    # second half, where the slope is measured
    ap.add_argument("--batch", type=int, default=16, help="train_batch_size B (groups per version)")
    ap.add_argument("--timeout-s", type=float, default=3600)
    ap.add_argument("--dir", help="work directory (default: a temporary one)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-soak-") as tmp:
        root = Path(args.dir or tmp)
        assets = build_fault_assets(
            root / "assets",
            run="soak",
            total_steps=args.versions + 1000,
            overrides={
                "data": {"train_batch_size": args.batch, "prompt_queue_watermark": 4 * args.batch},
                "rollout": {"max_concurrent_prompts": 2 * args.batch},
                "trainer": {"ppo_mini_batch_size": args.batch, "micro_batch_size": 4 * args.batch},
            },
        )
        stack = FaultStack(
            FaultStackOptions(run_dir=root / "stack", config=assets.config, answer_key=assets.answer_key)
        )
        t0 = time.monotonic()
        try:
            stack.start()
            checker = InvariantChecker(stack.redis_url, stack.run, stack.trainer_dir)
            watch = CheckerThread(checker, interval_s=2.0).start()
            last_print = 0
            mid_breakdown: dict[str, tuple[int, int]] = {}
            while stack.trained_steps() < args.versions:
                if not mid_breakdown and stack.trained_steps() >= args.versions // 2:
                    mid_breakdown = key_breakdown(stack.redis_url, stack.run)
                if time.monotonic() - t0 > args.timeout_s:
                    raise SystemExit(f"timeout: {stack.trained_steps()} versions in {args.timeout_s:.0f} s")
                time.sleep(2.0)
                if checker.memory and checker.memory[-1].version >= last_print + 50:
                    m = checker.memory[-1]
                    last_print = m.version
                    print(
                        f"v{m.version:4d}  used_memory {m.used_memory / 1e6:7.2f} MB  AOF {m.aof_bytes / 1e6:6.2f} MB"
                        f"  groups stream {m.stream_len:4d}  ({time.monotonic() - t0:.0f} s)",
                        flush=True,
                    )
            watch.stop()
            checker.poll()
            breakdown = key_breakdown(stack.redis_url, stack.run)
        finally:
            strays = stack.stop()
        wall = time.monotonic() - t0
    first, second = halves(checker.memory, args.versions)
    warm = slope([float(s.version) for s in first], [float(s.used_memory) for s in first])
    steady = slope([float(s.version) for s in second], [float(s.used_memory) for s in second])
    aof_steady = slope([float(s.version) for s in second], [float(s.aof_bytes) for s in second])
    last = checker.memory[-1]
    aof_max = max(s.aof_bytes for s in checker.memory)
    stream_max = max(s.stream_len for s in checker.memory)
    print(checker.report())
    print("the run's keys at half-time and at the end (pattern: count, bytes by MEMORY USAGE):")
    for pattern, (n, b) in sorted(breakdown.items(), key=lambda kv: -kv[1][1]):
        n0, b0 = mid_breakdown.get(pattern, (0, 0))
        print(f"  {pattern:28s} {n0:6d} {b0 / 1e3:9.1f} kB  ->  {n:6d} {b / 1e3:9.1f} kB")
    total0 = sum(b for _, b in mid_breakdown.values())
    total1 = sum(b for _, b in breakdown.values())
    print(f"  {'all keys':28s} {total0 / 1e3:16.1f} kB  ->  {total1 / 1e3:16.1f} kB")
    print(
        f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {wall:.0f} s for {last.version} versions"
    )
    print(f"warm-up (versions 1-{args.versions // 2}): used_memory {warm:+.0f} B/version (baseline)")
    print(
        f"steady  (versions {args.versions // 2 + 1}-{last.version}): used_memory {steady:+.0f} B/version, AOF {aof_steady:+.0f} B/version"
    )
    print(
        f"AOF now {last.aof_bytes / 1e6:.2f} MB, at most {aof_max / 1e6:.2f} MB; groups stream at most {stream_max} entries"
    )
    if strays:
        print(f"WARNING: processes outlived the stack: {strays}")
    print(
        f"RESULT versions={last.version} redis_mem_slope_bytes_per_version={steady:.0f} "
        f"warmup_slope_bytes_per_version={warm:.0f} aof_bytes={last.aof_bytes} aof_bytes_max={aof_max} "
        f"stream_len_max={stream_max} keys_bytes_half={total0} keys_bytes_end={total1} "
        f"violations={len(checker.violations)}"
    )


if __name__ == "__main__":
    main()
