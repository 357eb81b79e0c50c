"""When each config's versions start on the real engines: per config, the delay from a version's
announcement to the first engine step (any gateway) that decodes or prefills, and how many requests
the engines prefill in the window after that step — the size of the version's first admission
round. It showed (2026-11-27: sync 155 ms with 192 requests, async 97 ms with 120 on the demo
bench) that the start depends on the burst, which the simulator has modelled since
(`ClusterProfile.dispatch_per_request_s`; `fit_dispatch` fits it per gateway from the same scan,
`simulator_host_fit.first_round`).

    .venv/bin/python bench/simulator_version_start.py OUT [--reps N] [--window-s 0.3]

Last line: `RESULT <config>_start_ms=… <config>_prefilled=… …` (medians over the measured
versions of every rep). fully-async is left out: its next version's requests were dispatched long
before the announcement.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

# bench/ is on sys.path: the script is run as `python bench/simulator_version_start.py`
from simulator_host_fit import first_round, working_steps
from simulator_real_runs import CONFIGS, Run


def version_starts(run: Run, window_s: float) -> list[tuple[float, int]]:
    """(seconds from the announcement to the first working step, requests prefilled from that step
    to `window_s` after it) per measured version of `run`."""
    lines, times = working_steps(run.step_logs)  # every gateway's: the version's first step anywhere
    out = []
    for v in run.versions():
        start = first_round(lines, times, run.announced[v], window_s)
        if start is not None:
            out.append((start[0]["t"] - run.announced[v], start[1]))
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
