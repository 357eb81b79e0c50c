"""bench_simulator's speed-matched validation: each validated run against its fold's simulator
replaying that run's own generations (as the paired table does), with that run's own background
load (as the load-matched table does) and with the machine's speed when the run ran: one factor on
every engine step cost and one on the trainer's time, measured on the same rep's other configs
(run just before and after it, interleaved), never on the run itself.

Why: this VM's speed for identical work drifts by more than the goal between runs of one bench
(2026-11-25: one draw 6.13 s/step, an hour later 4.38; `simulator_step_residuals.py`: one
engine fit misses single runs' own steps by -15 … +20 %), and a fold's calibration comes from the
other reps' runs, an hour away: a cross-fitted simulator is off by the machine's drift before its
model is. The factors measure the machine, not the scheduler: a run's engine factor is its step
intervals against the fold's step-cost model at the batch each step actually had (the intervals,
gaps and contention stretch of the calibration's fit), its trainer factor its trainer steps against
the fold's trainer model for the tokens each trained (s = 1 runs: with the engines that stepped
beside it; their trainer factor is not used for others, as it holds the overlap the simulator has
to predict). Neither reads when groups finished, how many attempts a version took or how long
anything waited. The run's own factors give a second column: what speed matching could do at best.

It restates the simulator's validation (`make bench-simulator`, which compares with a simulator
calibrated on other runs, whenever they ran) for a machine whose speed drifts; it says how much of
that validation's miss is the machine's drift and how much the model's.
"""

from __future__ import annotations

import argparse
import functools
import statistics
from typing import TYPE_CHECKING, Any

import numpy as np
from simulator_host_fit import CONTROL, KV_CAPACITY, _busy_spans, stretch_of
from simulator_paired import TABLE_HEAD, against_sync, scaled_profile, table_row
from simulator_real_runs import Run, cpu_delta

from asyncdapo.tools.simulate.calibrate import design, read_steps
from asyncdapo.tools.simulate.profile import ClusterProfile
from asyncdapo.tools.simulate.replay import load_replay
from asyncdapo.tools.simulate.run_replay import load_run_replay

if TYPE_CHECKING:
    from simulator_host_fit import Fold


def engine_factor(r: Run, fold: Fold) -> float:
    """The run's engine step intervals over the fold's model of them: sum of measured over sum of
    modelled, on the intervals the calibration fits (gaps out; each divided by the contention
    stretch the run's own CPU samples give, with its own background load)."""
    cal = fold.calibration
    prof = cal.profile
    e = prof.engine
    stretch = stretch_of([r], prof.host, cal.threads_scale) if prof.host is not None else None
    measured = modelled = 0.0
    for p in r.step_logs:
        X, y, _ = design(read_steps(p), KV_CAPACITY, functools.partial(stretch, p) if stretch else None)
        if not len(y):
            continue
        seqs = X[:, 1]
        per_seq = np.array([e.seq_s(int(s)) for s in seqs])
        # X's KV column is the log's, counted in whole blocks: the fitted per-KV-token cost applies
        # to it as is (the simulator adds the blocks' mean rounding to bare contexts instead)
        pred = e.base_s + per_seq + e.per_kv_token_s * X[:, 2] + e.prefill_per_token_s * X[:, 3]
        measured += float(y.sum())
        modelled += float(pred.sum())
    return measured / modelled if modelled > 0 else 1.0


def trainer_factor(r: Run, fold: Fold) -> float:
    """The run's trainer steps over the fold's model of them (`TrainerProfile.step_s` of the tokens
    each trained, stretched by the contention model: at idle engines for s = 0, interval by interval
    at the engines stepping beside it for s = 1, as `fit_trainer` and `fit_trainer_interference`)."""
    cal = fold.calibration
    prof = cal.profile
    tr = prof.trainer
    host = cal.host_for(r) if prof.host is not None else None
    measured = modelled = 0.0
    s1 = r.dir.name == "fully-async"
    floating = 0.0
    if host is not None:
        floating = host.trainer_cores + host.background_cores
        w = r.window()
        if s1 and w is not None:  # the control plane's mean CPU rate floats beside it too
            floating += cpu_delta(w[0], w[1], CONTROL) / max(w[1]["t"] - w[0]["t"], 1e-9)
    for start, tok, t in r.trainer_steps:
        if t <= 0:
            continue
        u = tr.step_s(int(tok), 0)
        if host is None:
            pred = u
        elif not s1:
            pred = u * host.trainer_stretch(floating, 0)
        else:
            busy = _busy_spans(r, start, start + t)
            total = sum(x for x, _ in busy)
            if total <= 0:
                continue
            pred = u * sum(x / total * host.trainer_stretch(floating, b) for x, b in busy)
        measured += t
        modelled += pred
    return measured / modelled if modelled > 0 else 1.0


def speed_matched_validation(
    args: argparse.Namespace, runs: dict[tuple[int, str], Run], folds: list[Fold], simulate: Any
) -> dict[str, Any]:
    """The table (printed) and its figures; {} when a validated run has no response log or the
    calibration has no host model. The main figure takes each run's speed from its rep's other
    configs (run just before and after it, none of it its own); the run's own factors are printed
    beside it as the bound of what speed matching can do."""
    val = [(f, rep) for f in folds for rep in f.val_reps]
    if any(not runs[(rep, m)].response_log.is_file() for _, rep in val for m in args.configs):
        return {}
    if any(f.calibration.profile.host is None for f in folds):
        return {}  # --no-contention: the factors would carry the whole host
    cap = args.bench.max_response_length
    pool = load_replay(args.bench.trace, cap, 0)
    # every run of a validated rep against that rep's fold: the machine's speed when it ran
    speed = {
        (rep, m): (engine_factor(runs[(rep, m)], f), trainer_factor(runs[(rep, m)], f))
        for f, rep in val
        for m in args.configs
    }
    per: dict[str, list[dict[str, float]]] = {}
    for f, rep in val:
        for m in args.configs:
            r = runs[(rep, m)]
            others = [speed[(rep, o)] for o in args.configs if o != m]
            # the trainer's speed from s = 0 neighbours: an s = 1 step's time also holds how long the
            # engines stepped beside it, which is the simulator's to get right
            s0 = [
                x
                for o, x in zip((o for o in args.configs if o != m), others, strict=True)
                if o != "fully-async"
            ]
            near = (statistics.median(x[0] for x in others), statistics.median(x[1] for x in s0 or others))
            row: dict[str, float] = {"rep": rep, "measured": r.rollout_s}
            for key, (ef, tf) in (("simulated", near), ("own", speed[(rep, m)])):
                prof: ClusterProfile = f.calibration.profile
                prof = scaled_profile(prof.model_copy(update={"host": f.calibration.host_for(r)}), ef, tf)
                (sim,) = simulate(m, prof, [load_run_replay(r.response_log, cap, pool)], args)
                row[key] = sim[0]
            row.update(
                engine=near[0], trainer=near[1], engine_own=speed[(rep, m)][0], trainer_own=speed[(rep, m)][1]
            )
            per.setdefault(m, []).append(row)
    keys = ("measured", "simulated", "own")
    med = {m: {k: statistics.median(x[k] for x in xs) for k in keys} for m, xs in per.items()}
    print(
        "\nrollout s/step, speed-matched (paired and load-matched, with the machine's speed when the run ran: "
        "engine and trainer cost factors measured on its rep's other configs against its fold's models; "
        "medians over the runs; 'own': the run's own factors instead):"
    )
    print(
        f"{TABLE_HEAD} {'own err':>8s} {'own ratio':>9s}   per run: engine x, trainer x (own): measured / simulated"
    )
    rel: dict[str, float] = {}
    rat: dict[str, float] = {}
    rel_own: dict[str, float] = {}
    rat_own: dict[str, float] = {}
    for m in args.configs:
        rel[m], rm, rs = against_sync(med, m)
        rel_own[m], _, ro = against_sync(med, m, "own")
        if m != "sync":
            rat[m] = abs(rs - rm)
            rat_own[m] = abs(ro - rm)
        pairs = "  ".join(
            f"{y['engine']:.2f} ({y['engine_own']:.2f}), {y['trainer']:.2f} ({y['trainer_own']:.2f}): "
            f"{y['measured']:.3g} / {y['simulated']:.3g}"
            for y in per[m]
        )
        print(f"{table_row(med, m)} {rel_own[m]:+8.1%} {ro:9.3f}   {pairs}")
    ef = [x[0] for x in speed.values()]
    tf = [x[1] for x in speed.values()]
    print(f"{'':22s} the machine's speed per run against its fold's calibration (cost factors): engine "
          f"x{min(ef):.2f} .. x{max(ef):.2f}, trainer x{min(tf):.2f} .. x{max(tf):.2f}")  # fmt: skip
    return {
        "per_run": per,
        "rel_err": rel,
        "ratio_abs_err": rat,
        "own_rel_err": rel_own,
        "own_ratio_abs_err": rat_own,
        "engine_factor_range": [min(ef), max(ef)],
        "trainer_factor_range": [min(tf), max(tf)],
    }
