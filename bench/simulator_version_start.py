"""When each config's versions start on the real engines: per config, the delay from a version's
announcement to the first engine step (any gateway) that decodes or prefills, and how many requests
the engines prefill in the window after that step — the size of the version's first admission
round. The simulator charges every dispatch one fitted constant (`ClusterProfile.dispatch_s`,
`fit_dispatch`: the median over all s = 0 configs); this shows whether the start depends on the
config (session 17: sync 155 ms with 192 requests, async 97 ms with 120 on the demo bench).

    .venv/bin/python bench/simulator_version_start.py OUT [--reps N] [--window-s 0.3]

Last line: `RESULT <config>_start_ms=… <config>_prefilled=… …` (medians over the measured
versions of every rep). fully-async is left out: its next version's requests were dispatched long
before the announcement.
"""

from __future__ import annotations

import argparse
import bisect
import statistics
from pathlib import Path

# bench/ is on sys.path: the script is run as `python bench/simulator_version_start.py`
from simulator_real_runs import CONFIGS, Run

from asyncdapo.simulate.calibrate import read_steps


def version_starts(run: Run, window_s: float) -> list[tuple[float, int]]:
    """(seconds from the announcement to the first working step, requests prefilled from that step
    to `window_s` after it) per measured version of `run`."""
    lines = sorted(
        (x for p in run.step_logs for x in read_steps(p) if x["decode"] or x["prefill_reqs"]),
        key=lambda x: x["t"],
    )
    times = [x["t"] for x in lines]
    out = []
    for v in run.versions():
        i = bisect.bisect_right(times, run.announced[v])
        if i == len(lines):
            continue
        t0 = times[i]
        j = bisect.bisect_right(times, t0 + window_s)
        out.append((t0 - run.announced[v], sum(int(x["prefill_reqs"]) for x in lines[i:j])))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="a bench_simulator --out directory (rep1/, rep2/, …)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--window-s", type=float, default=0.3, help="after the first step, for the prefill count")
    args = ap.parse_args()
    result = []
    print(f"{'config':<12} {'versions':>8} {'start ms':>9} {'(p25-p75)':>12} {'prefilled':>9}")
    for m in CONFIGS:
        if m == "fully-async":
            continue
        starts = [
            s
            for rep in range(1, args.reps + 1)
            if (args.out / f"rep{rep}" / m).is_dir()
            for s in version_starts(Run(args.out / f"rep{rep}" / m, args.warmup), args.window_s)
        ]
        if not starts:
            print(f"{m:<12} no measured versions")
            continue
        ms = [1e3 * d for d, _ in starts]
        q = statistics.quantiles(ms, n=4) if len(ms) > 1 else [ms[0]] * 3
        pre = statistics.median(n for _, n in starts)
        print(f"{m:<12} {len(starts):>8} {statistics.median(ms):>9.0f} {q[0]:>5.0f}-{q[2]:<6.0f} {pre:>9.0f}")
        key = m.replace("-", "_")
        result += [f"{key}_start_ms={statistics.median(ms):.0f}", f"{key}_prefilled={pre:.0f}"]
    print("RESULT " + " ".join(result))


if __name__ == "__main__":
    main()
