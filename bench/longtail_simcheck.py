"""bench-longtail's simulator check: the same configs through `asyncdapo simulate` (the SIMULATOR,
a model) with a profile fitted from the runs' own step logs. Split out of bench/bench_longtail.py."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

# bench/ is on sys.path: the script is run as `python bench/bench_longtail.py`
from longtail_report import med
from longtail_runs import (
    DATA,
    MAX_RESPONSE_LENGTH,
    MODES,
    PASS_N,
    SYNC_MODES,
    B,
    N,
    Run,
    bench_config,
    run_tag,
)

from asyncdapo.contracts.config import RunConfig

# ---------------------------------------------------------------------------------- the simulator

KV_CAPACITY = 1 << 20  # the stack's 1 GiB KV cache at 1,024 B per token of the tiny model (bench_simulator)
SIM_MODES = {"sync-3B": "sync", "sync-2B": "sync", "sync-1.5B": "sync", "any": "async", "fifo": "async-fifo",
             "s1": "fully-async", "s2": "fully-async-s2", "pdsr": "pdsr"}  # fmt: skip


def _slice_step_log(src: Path, windows: list[tuple[float, float]], dst: Path) -> int:
    lines = []
    for line in src.read_text().splitlines():
        try:
            t = float(json.loads(line)["t"])
        except (ValueError, KeyError, TypeError):
            continue
        if any(a <= t <= b for a, b in windows):
            lines.append(line)
    dst.write_text("".join(x + "\n" for x in lines))
    return len(lines)


def _trainer_fit(cal: list[Run]) -> dict[str, float]:
    """The trainer's compute per step = base + per token x trained tokens (prompt + response), by
    non-negative least squares over the calibration runs' measured steps (s = 0 runs: the engines
    idle while it trains; at s >= 1 they share the cores, which this profile does not model)."""
    from asyncdapo.tools.simulate.calibrate import nnls

    rows = [(r.mean("timing/compute_s"), B * N * (r.mean("response_length/mean") + r.mean("prompt_length/mean")))
            for r in cal if r.mean("timing/compute_s") == r.mean("timing/compute_s")]  # fmt: skip
    if len(rows) < 3:
        return {"base_s": med([y for y, _ in rows]) if rows else 0.0, "per_token_s": 0.0}
    coef = nnls(np.asarray([[1.0, x] for _, x in rows]), np.asarray([y for y, _ in rows]))
    return {"base_s": float(coef[0]), "per_token_s": float(coef[1])}


def simulator_check_safe(*args: Any) -> dict[str, float]:
    """`simulator_check`, whose failure is printed and does not cost the run its RESULT line
    (`--report-only` redoes the check on the saved runs and step logs)."""
    try:
        return simulator_check(*args)
    except Exception as err:  # a bench report: print it, keep the measured figures
        print(f"simulator check failed: {type(err).__name__}: {err}", flush=True)
        return {}


def simulator_check(rate: float, runs: dict[str, list[Run]], out: Path, logs: Path, steps: int, warmup: int,
                    lr: float) -> dict[str, float]:  # fmt: skip
    """The same configs through `asyncdapo simulate` (the SIMULATOR, a model): an engine profile fitted
    by `asyncdapo simulate calibrate` from the gateways' step logs of the first rep's s = 0 runs
    (the engines alone on the cores: at s >= 1 the trainer computes beside them, which this check's
    profile does not model), the weight fan-out and verifier latency of those runs, the trainer's
    compute fitted as base + per trained token (`_trainer_fit`); the workload replayed from real
    generations of the same warm start on each row's problem (the seed-1 measurement of
    `ensure_assets`: row k replays its problem, a requeued attempt the same problem's next 8
    responses), averaged over its PASS_N / N recorded realisations; the `tiny-longtail` preset at the
    runs' sync valid ratio when absent; each mode's own RunConfig, simulated for the same steps.
    Prints measured vs simulated; agreement is not required (reported)."""
    from asyncdapo.tools.simulate.comparison import ideal, mode_report
    from asyncdapo.tools.simulate.driver import Simulation, check_supported
    from asyncdapo.tools.simulate.presets import load_workload
    from asyncdapo.tools.simulate.profile import ClusterProfile, VerifierProfile
    from asyncdapo.tools.simulate.replay import load_replay

    cal = [r for m in runs if m not in ("s1", "s2") for r in runs[m] if r.rep == 0 and r.window[1] > 0]
    sim_dir = out / "simulate"
    sim_dir.mkdir(parents=True, exist_ok=True)
    src = sorted(logs.glob("gateway-*.steps.jsonl"))
    if not cal or not src:
        print(
            f"simulator check: skipped (rep-1 runs with time windows: {len(cal)}, step logs under {logs}: {len(src)})"
        )
        return {}
    cal_logs = []
    for p in src:
        dst = sim_dir / p.name.replace(".steps", ".rep1.steps")
        if _slice_step_log(p, [r.window for r in cal], dst):
            cal_logs.append(dst)
    profile_path = sim_dir / "cpu-fitted.json"
    fit = subprocess.run([sys.executable, "-m", "asyncdapo.cli", "simulate", "calibrate", "--step-log",
                          *map(str, cal_logs), "--kv-capacity-tokens", str(KV_CAPACITY), "--max-num-seqs", "96",
                          "-o", str(profile_path)], capture_output=True, text=True)  # fmt: skip
    said = " ".join(x for x in fit.stdout.splitlines() if x.strip() and not x.startswith("RESULT"))
    print(f"simulate calibrate (rep-1 step logs, {len(cal_logs)} gateways): {said[-600:]}")
    if fit.returncode != 0:
        print(f"simulator check: calibrate failed: {fit.stderr.strip()[-800:]}")
        return {}
    prof = ClusterProfile.model_validate(json.loads(profile_path.read_text()))
    lat = "asyncdapo_scheduler_verifier_latency_seconds"
    call_s = med(
        [r.prom.get(lat + "_sum", 0.0) / r.prom[lat + "_count"] for r in cal if r.prom.get(lat + "_count")]
    )
    prof = prof.model_copy(update={
        "name": "cpu-fitted-longtail", "engines": 2, "heavy_fraction": 0.5,
        "engine": prof.engine.model_copy(update={"reload_s": med([r.fanout_s for r in cal]), "pause_s": 0.0}),
        "trainer": prof.trainer.model_copy(update={**_trainer_fit(cal), "per_sequence_s": 0.0, "publish_s": 0.0}),
        "verifier": VerifierProfile(workers=1, per_item_s=0.0, call_s=call_s if call_s == call_s else 0.005),
    })  # fmt: skip
    (sim_dir / "cluster.json").write_text(prof.model_dump_json(indent=1))
    trace = DATA.parent / "stats" / f"replay-train-v{rate:g}.jsonl"
    sync_runs = [r for m in SYNC_MODES for r in runs.get(m, [])]
    if trace.exists():
        wls: list[Any] = [load_replay(trace, MAX_RESPONSE_LENGTH, s) for s in range(PASS_N // N)]
        wl_name = (f"replay of {trace} (real generations of each row's problem, seed 1, {PASS_N} per problem; "
                   f"the mean of its {len(wls)} realisations)")  # fmt: skip
    else:
        over = {}
        if sync_runs:
            o = [r.outcomes for r in sync_runs]
            v = sum(x.get("valid", 0) + x.get("dropped:surplus", 0) for x in o)
            over["valid_rate"] = v / max(v + sum(x.get("filtered", 0) for x in o), 1)
        wls = [load_workload("tiny-longtail", s, **over) for s in range(PASS_N // N)]
        wl_name = f"tiny-longtail preset {over}, {len(wls)} seeds"
    print(f"simulator check, valid rate {rate:g}: cluster {prof.engine.model_dump(include={'base_s', 'per_seq_s', 'per_kv_token_s', 'prefill_per_token_s', 'reload_s'})}, "
          f"trainer {prof.trainer.base_s:.2f} s/step + {prof.trainer.per_token_s * 1e6:.1f} us per trained token, verifier call {prof.verifier.call_s:.3f} s; workload {wl_name}")  # fmt: skip
    sim: dict[str, tuple[float, float]] = {}  # mode -> (e2e s/step, tokens generated + aborted per step)
    for mode in (m for m in MODES if runs.get(m)):
        cfg = RunConfig.model_validate(bench_config(f"sim-{run_tag(mode, 0).lower()}", mode,
                                                    DATA / f"train-v{rate:g}.parquet", steps, lr))  # fmt: skip
        check_supported(cfg)
        got = []
        for wl in wls:
            c0 = time.process_time()
            res = Simulation(cfg, prof, wl, steps).simulate()
            rep = mode_report(
                SIM_MODES[mode], cfg, res, ideal(cfg, prof, wl), time.process_time() - c0, warmup=warmup
            )
            got.append(
                (rep.step_s, (res.counts.completed_tokens + res.aborted_tokens) / max(len(res.steps), 1))
            )
        sim[mode] = (statistics.fmean(x for x, _ in got), statistics.fmean(y for _, y in got))
    best_sync = min(
        (m for m in SYNC_MODES if m in sim), key=lambda m: med([r.step_s for r in runs[m]]), default=None
    )
    print(f"{'mode':10s} {'e2e s/step real':>16s} {'simulated':>10s} {'error':>7s} {'ratio to sync real':>19s} "
          f"{'simulated':>10s} {'tokens/step real':>17s} {'simulated':>10s}")  # fmt: skip
    errs, ratio_errs = {}, {}
    for mode, (step_s, tok_sim) in sim.items():
        real = med([r.step_s for r in runs[mode]])
        tok_real = med(
            [
                r.per_step("rollout/generated_tokens") + r.per_step("rollout/aborted_tokens")
                for r in runs[mode]
            ]
        )
        errs[mode] = step_s / real - 1
        r_real = real / med([r.step_s for r in runs[best_sync]]) if best_sync else float("nan")
        r_sim = step_s / sim[best_sync][0] if best_sync else float("nan")
        ratio_errs[mode] = r_sim - r_real
        print(f"{mode:10s} {real:16.2f} {step_s:10.2f} {errs[mode]:+7.1%} {r_real:19.3f} {r_sim:10.3f} "
              f"{tok_real:17.0f} {tok_sim:10.0f}")  # fmt: skip
    pd = runs.get("pdsr", [])
    if pd and all(r.pools for r in pd):
        # engine time of the heavy pool's recompute, priced with the fitted profile over the pdsr runs' steps
        e = prof.engine
        logs_pd = [(p, [r.window for r in pd]) for p in src]
        busy = 0.0
        for p, wins in logs_pd:
            for line in p.read_text().splitlines():
                d = json.loads(line)
                if any(a <= d["t"] <= b for a, b in wins):
                    busy += e.step_s(
                        d["decode"] + d["prefill_reqs"], d["kv"] * e.kv_capacity_tokens, d["prefill_tokens"]
                    )
        recompute = sum(r.pools["heavy"]["prefill"] - r.pools["heavy"]["prefix_hits"] for r in pd)
        share = e.prefill_per_token_s * recompute / busy if busy else float("nan")
        print(f"pdsr recompute priced by the fitted profile: {recompute:.0f} prefill tokens on heavy x "
              f"{e.prefill_per_token_s * 1e6:.1f} us = {e.prefill_per_token_s * recompute:.1f} s of "
              f"{busy:.1f} modelled engine-busy s over the pdsr runs: {share:.1%} of the engines' time "
              "(the figure to read against the seed's < 10 % compute lost)")  # fmt: skip
    fields = {"sim_max_abs_err": max((abs(x) for x in errs.values()), default=float("nan")),
              "sim_ratio_max_abs_err": max((abs(x) for x in ratio_errs.values()), default=float("nan"))}  # fmt: skip
    (sim_dir / "check.json").write_text(json.dumps({"errors": errs, "ratio_errors": ratio_errs,
                                                    "workload": wl_name, **fields}, indent=1))  # fmt: skip
    return fields
