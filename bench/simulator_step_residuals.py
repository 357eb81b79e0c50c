"""How far the calibrated engine-step model misses each real run's own steps: one
`asyncdapo simulate calibrate` fit (with the contention model, as bench_simulator calibrates) over
every run under OUT, then per run the model's total step time against the measured one, and per
config by running sequences. bench_simulator's folds are fitted on other runs than they validate;
this shows the scatter between runs that such a fit cannot follow (a machine whose speed drifts
from run to run, or a config the model prices wrong every time).

    .venv/bin/python bench/simulator_step_residuals.py OUT [--bench demo|longtail-v0.3] [--reps N]

Last line: `RESULT runs=… run_err_min=… run_err_max=… config_err_sd=…` (config_err_sd: the
standard deviation of the per-run errors within a config, the median over configs).
"""

from __future__ import annotations

import argparse
import functools
import statistics
from pathlib import Path

import numpy as np

# bench/ is on sys.path: the script is run as `python bench/simulator_step_residuals.py`
from simulator_host_fit import KV_CAPACITY, fit_host, stretch_of
from simulator_real_runs import BENCHES, CONFIGS, Run

from asyncdapo.tools.simulate.calibrate import design, fit_steps, read_steps, seq_columns, seq_knots

BUCKETS = [(1, 8), (9, 32), (33, 64), (65, 96), (97, 10**6)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="a bench_simulator --out directory (rep1/, rep2/, …)")
    ap.add_argument("--bench", choices=sorted(BENCHES), default="demo")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args()
    bench = BENCHES[args.bench]
    reps = range(1, args.reps + 1)
    runs = {(rep, m): Run(args.out / f"rep{rep}" / m, args.warmup) for rep in reps for m in CONFIGS}
    host, _, scale = fit_host(list(runs.values()), 2, 0.5, "cores")
    stretch = stretch_of(list(runs.values()), host, scale)
    data = {}
    for key, r in runs.items():
        parts = [design(read_steps(p), KV_CAPACITY, functools.partial(stretch, p)) for p in r.step_logs]
        data[key] = (np.vstack([x for x, _, _ in parts]), np.concatenate([y for _, y, _ in parts]))
    knots = seq_knots(bench.max_concurrency)
    fit = fit_steps(
        np.vstack([x for x, _ in data.values()]), np.concatenate([y for _, y in data.values()]), 0, knots
    )
    c = fit.coef
    coef = np.array(
        [
            c["base_s"],
            c["per_seq_s"],
            *(s for _, s in fit.seq_slopes),
            c["per_kv_token_s"],
            c["prefill_per_token_s"],
        ]
    )

    def predicted(X: np.ndarray) -> np.ndarray:
        return np.column_stack([X[:, :1], seq_columns(X[:, 1], knots), X[:, 2:]]) @ coef

    print(f"one fit over {len(runs)} runs: {fit.summary()}")
    print("model / measured total step time - 1, per run (and per bucket of running sequences, every rep):")
    errs: dict[str, list[float]] = {}
    for m in CONFIGS:
        errs[m] = [float(predicted(data[(rep, m)][0]).sum() / data[(rep, m)][1].sum() - 1) for rep in reps]
        X = np.vstack([data[(rep, m)][0] for rep in reps])
        y = np.concatenate([data[(rep, m)][1] for rep in reps])
        P = predicted(X)
        cells = []
        for lo, hi in BUCKETS:
            sel = (X[:, 1] >= lo) & (X[:, 1] <= hi)
            if sel.sum() >= 50:
                cells.append(f"{lo}-{hi}: {P[sel].sum() / y[sel].sum() - 1:+.1%}")
        per_run = "  ".join(f"{e:+.1%}" for e in errs[m])
        print(f"  {m:12s} {per_run}   |  {'  '.join(cells)}")
    every = [e for v in errs.values() for e in v]
    sd = statistics.median(statistics.stdev(v) for v in errs.values())
    print(
        f"RESULT runs={len(runs)} run_err_min={min(every):+.3f} run_err_max={max(every):+.3f} "
        f"config_err_sd={sd:.3f} bench={args.bench}"
    )


if __name__ == "__main__":
    main()
