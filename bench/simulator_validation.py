"""bench_simulator's comparison: the simulator run on each fold's fitted profile and workload over
the same steps as the real runs, each figure's validation table (measured on the validated reps
against simulated, the ratios to sync, the real stack's own spread), the load-matched re-run,
summary.json and the `RESULT` line.

A fold is a calibration (runs of some reps) and the reps it validates, never a rep it was fitted
on: cross-fitted (default), fold v calibrates on every rep but v and validates v; `--cal-rep N`,
one fold: rep N calibrates, the others are validated.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from typing import Any

# bench/ is on sys.path: the script is run as `python bench/bench_simulator.py`
from simulator_host_fit import Fold, WorkloadInput
from simulator_paired import paired_validation
from simulator_real_runs import POOLS, Run, real_config
from simulator_speed_matched import speed_matched_validation

from asyncdapo.contracts.config import RunConfig
from asyncdapo.tools.simulate.driver import Simulation
from asyncdapo.tools.simulate.modes import mode_config
from asyncdapo.tools.simulate.presets import load_workload
from asyncdapo.tools.simulate.profile import ClusterProfile

# ------------------------------------------------------------------------- simulated side
NOT_WORKLOAD = ("target_mean_length", "fitted_on_responses")
LOAD_SEEDS = 5


# a preset's fitted parameters, or the replays of a recorded trace (one per realisation)


# a relative sd below this is no spread: the figure does not depend on the draw (s = 1's rollout wait
# can be the weight fan-out alone), and an error in its units would be a division by rounding noise
NO_DRAW_SPREAD = 1e-6


def describe(workload: WorkloadInput) -> dict[str, Any]:
    if isinstance(workload, list):
        return {"replay": workload[0].spec.source, "realisations": len(workload)}
    return dict(workload)


def simulate(
    mode: str, cluster: ClusterProfile, workload: WorkloadInput, args: argparse.Namespace
) -> list[tuple[float, ...]]:
    """Per seed (a replay: per realisation; the simulator draws nothing else at random, so more
    seeds would repeat them), over the same steps as a real run: (mean rollout s/step, mean step
    period s, tokens generated per version (aborted included), completions per version, their mean
    length, aborted tokens per version)."""
    cfg = mode_config(RunConfig.model_validate(real_config("async", args.bench, args.steps)), mode)
    if mode in POOLS:  # the real runs' pools: one gateway each
        cluster = cluster.model_copy(update={"heavy_fraction": POOLS[mode].count("heavy") / len(POOLS[mode])})
    if isinstance(workload, list):
        wls: list[Any] = workload
    else:
        over = {k: v for k, v in workload.items() if k not in NOT_WORKLOAD}
        wls = [load_workload(args.workload, seed, **over) for seed in range(args.sim_seeds)]
    out: list[tuple[float, ...]] = []
    for wl in wls:
        res = Simulation(cfg, cluster, wl, args.steps).simulate()
        # StepRecord i is the step that trained version i's rollout: index i <-> the real version i
        steps = res.steps[args.warmup : args.steps]
        pub = [s.t_published for s in res.steps]
        periods = [pub[i] - pub[i - 1] for i in range(args.warmup, len(pub))]
        v = len(res.steps)
        c = res.counts
        out.append(
            (
                statistics.fmean(s.t_data - s.t_free + s.sync_s for s in steps),
                statistics.fmean(periods),
                (c.completed_tokens + res.aborted_tokens) / v,
                c.completed / v,
                c.completed_tokens / max(c.completed, 1),
                res.aborted_tokens / v,
            )
        )
    return out


def workload_noise(
    sim_runs: list[dict[str, list[tuple[float, ...]]]], configs: list[str]
) -> dict[str, float]:
    """Per config, how far one run's rollout ratio to sync scatters from the workload draw alone:
    the standard deviation, over the simulator's realisations (config and sync on the same one), of
    their ratio; the median over folds. A real run is one draw: its ratio carries this noise."""
    out = {}
    for m in configs:
        if m == "sync":
            continue
        sds = []
        for sr in sim_runs:
            ratios = [x[0] / s[0] for x, s in zip(sr[m], sr["sync"], strict=True) if s[0] > 0]
            sds.append(statistics.stdev(ratios) if len(ratios) > 1 else float("nan"))
        out[m] = statistics.median(sds)
    return out


MEDIAN_DRAWS = 4000


def median_of_runs(per_run: list[list[float]]) -> tuple[float, float]:
    """The simulated side of "the median of the validated runs": one simulated run drawn per
    validated run from its fold's realisations (`per_run`: those realisations' values, one list per
    validated run), the median of the draws; (its expected value, its standard deviation), over
    MEDIAN_DRAWS draws with a fixed seed.

    Why not the mean over the realisations: where the runs' distribution is skewed — sync's second
    barrier batch in a draw with too few valid groups, s = 1's wait, a small difference of two large
    times — a median of three runs sits below the mean (long-tail, third run: s = 1's realisations
    0.7-3.6 s/step around means of 1.16-1.62 per fold); nor the realisations' median, below which a
    median of three rarely falls. The standard deviation is the draw's own noise on the measured
    median: the real runs scatter more (the machine's speed drifts from run to run), so an error
    within about twice it is not one these runs can show."""
    rng = random.Random(0)
    meds = [statistics.median(rng.choice(xs) for xs in per_run) for _ in range(MEDIAN_DRAWS)]
    return statistics.fmean(meds), statistics.stdev(meds)


FIGURES: list[tuple[str, Any]] = [
    ("rollout s/step", lambda r: r.rollout_s),
    ("step period s", lambda r: r.period_s),
    ("tokens/version", lambda r: r.tokens_per_version),
    ("completions/version", lambda r: r.per_version["completions"]),
    ("completed mean length", lambda r: r.per_version["completed_mean"]),
    ("aborted tokens/version", lambda r: r.per_version["aborted_tokens"]),
]


def report(args: argparse.Namespace, runs: dict[tuple[int, str], Run], folds: list[Fold], t0: float) -> None:
    """Validation of every fold on the reps it did not calibrate on: the tables, summary.json, the
    RESULT line."""
    validated = sorted(r for f in folds for r in f.val_reps)
    sim_runs = [
        {m: simulate(m, f.calibration.profile, f.workload, args) for m in args.configs} for f in folds
    ]
    ratio_sd = workload_noise(sim_runs, args.configs)
    draw_sd: dict[str, float] = {}
    rel: dict[str, float] = {}
    rat: dict[str, float] = {}
    spread: dict[str, float] = {}
    summary: dict[str, Any] = {
        "folds": [
            {"cal_reps": f.cal_reps, "val_reps": f.val_reps, "calibration": f.calibration.profile.model_dump(),
             "workload": describe(f.workload), "host_calibration": f.calibration.per_run}
            for f in folds
        ],
        "figures": {},
    }  # fmt: skip
    how = (
        "cross-fitted: rep v against the simulator calibrated on the other reps"
        if len(folds) > 1
        else f"reps {','.join(map(str, validated))} against the simulator calibrated on rep {folds[0].cal_reps[0]}"
    )
    first = folds[0].workload
    if isinstance(first, list):
        wl_s = f"{len(first)} realisations each, workload {first[0].spec.source}"
    else:
        rates = ", ".join(f"{f.workload['valid_rate']:.2f}" for f in folds if isinstance(f.workload, dict))
        wl_s = f"{args.sim_seeds} seeds each, workload {args.workload} fitted, at valid_rate {rates}"
    print(f"\nvalidation ({how}; measured: median of the validated runs; simulated: the same median of one "
          f"simulated run per validated run, drawn from its fold's {wl_s} (its expected value; the per-fold "
          f"column: their mean); ratio = config / sync; real spread = (max - min) / median of every rep):")  # fmt: skip
    for k, (name, get) in enumerate(FIGURES):
        meas = {m: statistics.median(get(runs[(rep, m)]) for rep in validated) for m in args.configs}
        per_fold = {m: [statistics.fmean(x[k] for x in sr[m]) for sr in sim_runs] for m in args.configs}
        # the same statistic as the measured side: the median of one run per validated run
        drawn = {
            m: median_of_runs([[x[k] for x in sr[m]] for f, sr in zip(folds, sim_runs, strict=True) for _ in f.val_reps])
            for m in args.configs
        }  # fmt: skip
        sim = {m: drawn[m][0] for m in args.configs}
        if k == 0:
            mean_sim = {m: statistics.median(per_fold[m]) for m in args.configs}
            draw_sd = {m: drawn[m][1] / drawn[m][0] for m in args.configs}
        print(f"\n{name:22s} {'measured':>9s} {'(runs)':>20s} {'simulated':>9s} {'(folds)':>20s} {'rel err':>8s} "
              f"{'ratio meas':>10s} {'ratio sim':>9s} {'abs err':>8s} {'real spread':>11s}")  # fmt: skip
        for m in args.configs:
            err = sim[m] / meas[m] - 1 if meas[m] else float("nan")
            rm = meas[m] / meas["sync"] if meas["sync"] else float("nan")
            rs = sim[m] / sim["sync"] if sim["sync"] else float("nan")
            every = [get(runs[(rep, m)]) for rep in range(1, args.reps + 1)]
            spr = (max(every) - min(every)) / statistics.median(every) if statistics.median(every) else 0.0
            if k == 0:
                rel[m] = err
                spread[m] = spr
                if m != "sync":
                    rat[m] = abs(rs - rm)
            runs_s = " ".join(f"{get(runs[(rep, m)]):.3g}" for rep in validated)
            folds_s = " ".join(f"{x:.3g}" for x in per_fold[m])
            print(f"{m:22s} {meas[m]:9.4g} {runs_s:>20s} {sim[m]:9.4g} {folds_s:>20s} {err:+8.1%} {rm:10.3f} "
                  f"{rs:9.3f} {abs(rs - rm):8.3f} {spr:11.1%}")  # fmt: skip
        summary["figures"][name] = {"measured": meas, "simulated": sim, "simulated_per_fold": per_fold}
        if k == 0:
            shown = ", ".join(f"{m} {x:.3f}" for m, x in ratio_sd.items())
            print(f"{'':22s} ratio to sync of one run, its spread from the workload draw alone (sd over the "
                  f"simulator's realisations, paired): {shown}")  # fmt: skip
            shown = ", ".join(f"{m} {mean_sim[m] / meas[m] - 1:+.1%}" for m in args.configs)
            print(f"{'':22s} the simulated side as the median over folds of the mean over the realisations "
                  f"(the figure before 2026-11-26): {shown}")  # fmt: skip
            shown = ", ".join(
                f"{m} {x:.1%} (error {rel[m] / x:+.1f} sd)"
                if x > NO_DRAW_SPREAD
                else f"{m} {x:.1%} (no draw spread)"
                for m, x in draw_sd.items()
            )
            print(f"{'':22s} the median of {len(validated)} runs, its spread from the workload draw alone "
                  f"(sd, relative; median_of_runs): {shown}")  # fmt: skip
    paired = paired_validation(args, runs, folds, simulate) if isinstance(folds[0].workload, list) else {}
    matched = speed_matched_validation(args, runs, folds, simulate) if paired else {}
    load_matched: dict[str, Any] = {}
    if all(f.calibration.profile.host is not None for f in folds):
        # the same model and calibration, one input replaced: the background load (other users'
        # CPU, an input from outside the stack) each validated run met
        print(f"\nrollout s/step, load-matched (per validated run: its fold's simulator with that run's measured "
              f"background load; {LOAD_SEEDS} seeds each):")  # fmt: skip
        print(f"{'':22s} {'measured':>9s} {'simulated':>9s} {'rel err':>8s} {'ratio meas':>10s} {'ratio sim':>9s} "
              f"{'abs err':>8s}   per run: background, measured / simulated")  # fmt: skip
        per: dict[str, list[tuple[float, float, float]]] = {}
        one = argparse.Namespace(**{**vars(args), "sim_seeds": LOAD_SEEDS})
        for f in folds:
            prof = f.calibration.profile
            for m in args.configs:
                for rep in f.val_reps:
                    r = runs[(rep, m)]
                    host = f.calibration.host_for(r)
                    bgc = host.background_threads or host.background_cores
                    lm_sims = simulate(m, prof.model_copy(update={"host": host}), f.workload, one)
                    per.setdefault(m, []).append((bgc, r.rollout_s, statistics.fmean(x[0] for x in lm_sims)))
        lm_meas = {m: statistics.median(x[1] for x in per[m]) for m in args.configs}
        lm_sim = {m: statistics.median(x[2] for x in per[m]) for m in args.configs}
        lm_rel, lm_rat = {}, {}
        for m in args.configs:
            lm_rel[m] = lm_sim[m] / lm_meas[m] - 1
            rm, rs = lm_meas[m] / lm_meas["sync"], lm_sim[m] / lm_sim["sync"]
            if m != "sync":
                lm_rat[m] = abs(rs - rm)
            runs_s = "  ".join(f"{b:.2f}: {x:.3g} / {y:.3g}" for b, x, y in per[m])
            print(f"{m:22s} {lm_meas[m]:9.4g} {lm_sim[m]:9.4g} {lm_rel[m]:+8.1%} {rm:10.3f} {rs:9.3f} {abs(rs - rm):8.3f}   {runs_s}")  # fmt: skip
        load_matched = {"per_run": per, "rel_err": lm_rel, "ratio_abs_err": lm_rat}
    summary.update(
        rel_err=rel,
        ratio_abs_err=rat,
        real_spread=spread,
        ratio_sd_one_run=ratio_sd,
        median_draw_sd=draw_sd,
        sim_runs=sim_runs,
        load_matched=load_matched,
        paired=paired,
        speed_matched=matched,
    )
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    max_rel = max(abs(x) for x in rel.values())
    max_rat = max(rat.values(), default=0.0)
    s0 = [m for m in args.configs if m != "fully-async"]
    cal = "cross" if len(folds) > 1 else str(folds[0].cal_reps[0])
    print(
        f"RESULT configs={','.join(args.configs)} max_rel_err={max_rel:.3f} ratio_abs_err={max_rat:.3f} "
        f"max_rel_err_s0={max(abs(rel[m]) for m in s0):.3f} real_spread_max={max(spread.values()):.3f} "
        f"goal_met={int(max_rel <= 0.10 and max_rat <= 0.05)} ratio_sd_one_run_max={max(ratio_sd.values(), default=0.0):.3f} "
        f"median_draw_sd_max={max(draw_sd.values()):.3f} max_err_in_draw_sds={max((abs(rel[m]) / draw_sd[m] for m in args.configs if draw_sd[m] > NO_DRAW_SPREAD), default=0.0):.1f} "
        f"bench={args.bench.name} calibration={cal} reps={args.reps} "
        + (
            f"load_matched_max_rel_err={max(abs(x) for x in load_matched['rel_err'].values()):.3f} "
            f"load_matched_ratio_abs_err={max(load_matched['ratio_abs_err'].values(), default=0.0):.3f} "
            if load_matched
            else ""
        )
        + (
            f"paired_max_rel_err={max(abs(x) for x in paired['rel_err'].values()):.3f} "
            f"paired_ratio_abs_err={max(paired['ratio_abs_err'].values(), default=0.0):.3f} "
            f"paired_tokens_max_rel_err={max(abs(x) for x in paired['tokens_rel_err'].values()):.3f} "
            if paired
            else ""
        )
        + (
            f"speed_matched_max_rel_err={max(abs(x) for x in matched['rel_err'].values()):.3f} "
            f"speed_matched_ratio_abs_err={max(matched['ratio_abs_err'].values(), default=0.0):.3f} "
            f"speed_own_max_rel_err={max(abs(x) for x in matched['own_rel_err'].values()):.3f} "
            f"speed_own_ratio_abs_err={max(matched['own_ratio_abs_err'].values(), default=0.0):.3f} "
            f"engine_speed_range={matched['engine_factor_range'][0]:.2f}-{matched['engine_factor_range'][1]:.2f} "
            if matched
            else ""
        )
        + f"contention={int(not args.no_contention)} background={args.background} "
        + (
            f"workload={args.workload} "
            if isinstance(first, list)
            else f"workload={args.workload} fitted_lengths={int(not args.preset_lengths)} "
        )
        + f"wall_s={time.monotonic() - t0:.0f}",
        flush=True,
    )
