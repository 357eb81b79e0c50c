"""bench_simulator's paired validation: each validated run against its fold's simulator replaying
that run's own generations (the scheduler's `--response-log`, `asyncdapo.tools.simulate.run_replay`).

Why: the main tables compare the median of three real runs — three draws of which responses
happen to be long — with the simulator's mean over 16 realisations of a pool of generations.
On the long-tail bench one run's pdsr/sync ratio scatters by sd 0.17 from that draw alone, more
than the 0.05 the goal asks of the ratio; pairing each run with a simulation of the same draw
takes that noise out of the comparison, and leaves the engine, host and control-plane models.
The pool (the bench's groups trace, seed 0) supplies only what the log cannot: the natural length
of a response the run aborted, and attempts the simulator makes that the run did not.

Figures per config: the median over the validated runs of the measured rollout s/step and of the
simulated one (each run its own simulation), their relative error, the ratio to sync on both
sides (medians), and the per-run pairs; tokens generated per version the same way (the replay's
own check: the simulated volume should follow the run's).

Sensitivity: each paired simulation again with the engines' step costs, then the trainer's time,
scaled by 1 -+ SENS (`scaled_profile`); the elasticity is the relative change of the simulated
rollout s/step per relative change of that cost (median over the runs). It says how much of a
config's error one cost's error buys: s = 0 modes follow the engine cost about one for one, while
s = 1's rollout wait, the small difference of a generation time and a training time, moves by
several times the cost's error and with either sign from run to run (which groups finish before
the publish changes) — so a 10 % goal on it asks for costs right to a few per cent.
"""

from __future__ import annotations

import argparse
import statistics
from typing import TYPE_CHECKING, Any

from simulator_real_runs import Run

from asyncdapo.tools.simulate.profile import ClusterProfile
from asyncdapo.tools.simulate.replay import load_replay
from asyncdapo.tools.simulate.run_replay import RunReplay, load_run_replay

if TYPE_CHECKING:
    from simulator_host_fit import Fold

SENS = 0.03  # the relative step of the sensitivity's central difference


# the columns every per-config table of a validation prints first (this one and the speed-matched)
TABLE_HEAD = f"{'':22s} {'measured':>9s} {'simulated':>9s} {'rel err':>8s} {'ratio meas':>10s} {'ratio sim':>9s} {'abs err':>8s}"


def against_sync(
    med: dict[str, dict[str, float]], m: str, key: str = "simulated"
) -> tuple[float, float, float]:
    """Config `m`'s medians: `key`'s relative error against "measured", and the measured and `key`'s
    ratios to sync's."""
    x, s = med[m], med["sync"]
    return x[key] / x["measured"] - 1, x["measured"] / s["measured"], x[key] / s[key]


def table_row(med: dict[str, dict[str, float]], m: str) -> str:
    """TABLE_HEAD's columns for config `m`."""
    x = med[m]
    rel, rm, rs = against_sync(med, m)
    return f"{m:22s} {x['measured']:9.4g} {x['simulated']:9.4g} {rel:+8.1%} {rm:10.3f} {rs:9.3f} {abs(rs - rm):8.3f}"


def scaled_profile(prof: ClusterProfile, engine: float = 1.0, trainer: float = 1.0) -> ClusterProfile:
    """`prof` with every engine step cost (base, per sequence, per KV token, per prefill token)
    times `engine` and the trainer's step time (base and per token) times `trainer`."""
    e, t = prof.engine, prof.trainer
    e = e.model_copy(
        update={
            "base_s": e.base_s * engine,
            "per_seq_s": e.per_seq_s * engine,
            "seq_slopes": tuple((k, x * engine) for k, x in e.seq_slopes),
            "per_kv_token_s": e.per_kv_token_s * engine,
            "prefill_per_token_s": e.prefill_per_token_s * engine,
        }
    )
    t = t.model_copy(update={"base_s": t.base_s * trainer, "per_token_s": t.per_token_s * trainer})
    return prof.model_copy(update={"engine": e, "trainer": t})


def paired_validation(
    args: argparse.Namespace, runs: dict[tuple[int, str], Run], folds: list[Fold], simulate: Any
) -> dict[str, Any]:
    """The table (printed) and its figures; {} when a validated run has no response log (runs
    recorded before the scheduler wrote one)."""
    val = [(f, rep) for f in folds for rep in f.val_reps]
    missing = [p for _, rep in val for m in args.configs if not (p := runs[(rep, m)].response_log).is_file()]
    if missing:
        print(f"\npaired validation: skipped, {len(missing)} run(s) have no response log (e.g. {missing[0]})")
        return {}
    cap = args.bench.max_response_length
    pool = load_replay(args.bench.trace, cap, 0)
    per: dict[str, list[dict[str, float]]] = {}
    unresolved = from_log = from_pool = 0
    for f, rep in val:
        for m in args.configs:
            run = runs[(rep, m)]
            wl: RunReplay = load_run_replay(run.response_log, cap, pool)
            prof = f.calibration.profile
            (sim,) = simulate(m, prof, [wl], args)
            moved: dict[str, list[float]] = {}
            for which in ("engine", "trainer"):
                for d in (SENS, -SENS):
                    again = load_run_replay(run.response_log, cap, pool)  # a replay is read once
                    (y,) = simulate(m, scaled_profile(prof, **{which: 1 + d}), [again], args)
                    moved.setdefault(which, []).append(y[0])
            unresolved += wl.unresolved
            from_log += wl.from_log
            from_pool += wl.from_pool
            per.setdefault(m, []).append(
                {"rep": rep, "measured": run.rollout_s, "simulated": sim[0],
                 "tokens_measured": run.tokens_per_version, "tokens_simulated": sim[2],
                 **{f"elasticity_{k}": (hi - lo) / (2 * SENS) / sim[0] for k, (hi, lo) in moved.items()}}
            )  # fmt: skip
    med = {
        m: {k: statistics.median(x[k] for x in xs) for k in ("measured", "simulated", "tokens_measured", "tokens_simulated")}
        for m, xs in per.items()
    }  # fmt: skip
    print(
        "\nrollout s/step, paired (each validated run against its fold's simulator replaying that run's own "
        "generations, its --response-log; medians over the runs):"
    )
    print(f"{TABLE_HEAD} {'tokens/v err':>12s}   per run: measured / simulated")
    rel: dict[str, float] = {}
    rat: dict[str, float] = {}
    tok: dict[str, float] = {}
    for m in args.configs:
        rel[m], rm, rs = against_sync(med, m)
        tok[m] = med[m]["tokens_simulated"] / med[m]["tokens_measured"] - 1
        if m != "sync":
            rat[m] = abs(rs - rm)
        pairs = "  ".join(f"{y['measured']:.3g} / {y['simulated']:.3g}" for y in per[m])
        print(f"{table_row(med, m)} {tok[m]:+12.1%}   {pairs}")
    print(f"{'':22s} attempts replayed from the runs' logs: {from_log}; from the pool (attempts the runs never made): {from_pool}")  # fmt: skip
    if unresolved:
        print(f"{'':22s} ({unresolved} aborted responses outlasted every pool answer of their problem: replayed one token longer than they had)")  # fmt: skip
    print(f"{'':22s} sensitivity (each paired run again with one cost scaled by 1 -+ {SENS:.0%}; median and range "
          f"over the runs): % rollout s/step per % of engine step cost | per % of trainer time")  # fmt: skip
    elasticity: dict[str, dict[str, float]] = {}
    for m in args.configs:
        ee = [y["elasticity_engine"] for y in per[m]]
        et = [y["elasticity_trainer"] for y in per[m]]
        elasticity[m] = {"engine": statistics.median(ee), "trainer": statistics.median(et)}
        print(f"{m:22s} {elasticity[m]['engine']:+6.2f} ({min(ee):+.2f} .. {max(ee):+.2f}) | "
              f"{elasticity[m]['trainer']:+6.2f} ({min(et):+.2f} .. {max(et):+.2f})")  # fmt: skip
    return {
        "elasticity": elasticity,
        "per_run": per,
        "rel_err": rel,
        "ratio_abs_err": rat,
        "tokens_rel_err": tok,
        "unresolved": unresolved,
    }
