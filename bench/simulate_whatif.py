"""SIMULATOR what-if grid behind docs/simulator.md: rollout modes x valid rates x GPU profiles, and
admission margins, on the same workload and seed, each against sync in the same grid.

Usage: python bench/simulate_whatif.py [--engines 64] [--batch 128] [--versions 12] [--out runs/simulate/whatif.json]
       python bench/simulate_whatif.py --published verl-fully-async-7b-128 --batch 512 --versions 8

With --published, the grid runs on a setup held to a published result (docs/simulator.md, "Held to
published results"): sync on its colocated GPUs, the async modes on the same GPUs split; each mode's
efficiency is against its own cluster's ideal.

Summary figures leave out the first quarter of the versions (the pipeline filling: `report.warmup_steps`).

Prints one markdown row per (profile, valid rate, mode): step s, speed-up vs sync, efficiency vs the
unbiased ideal, trained-length bias vs sync, aborted share of generated tokens, attempts per trained
prompt, engine idle fraction, max staleness; then `RESULT` with the CPU time of the whole grid.
Everything here is simulated (the scheduler's own core on modelled engines): no figure is measured on
a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from asyncdapo.contracts.config import RunConfig
from asyncdapo.tools.simulate.comparison import compare, ideal, mode_report
from asyncdapo.tools.simulate.driver import Simulation
from asyncdapo.tools.simulate.modes import mode_config
from asyncdapo.tools.simulate.presets import load_workload
from asyncdapo.tools.simulate.profile import ClusterProfile, load_cluster
from asyncdapo.tools.simulate.published import PUBLISHED
from asyncdapo.tools.simulate.workload import Workload, WorkloadSpec

MODES = ["sync", "async", "async-fifo", "fully-async", "fully-async-s2", "pdsr"]
MARGINS = ["async+m1.0", "async", "async+m1.5", "async+m2.0", "async+greedy"]


def base_cfg(batch: int, cap: int) -> RunConfig:
    return RunConfig.model_validate(
        {
            "name": "whatif",
            "data": {"train_batch_size": batch, "max_response_length": cap, "max_prompt_length": 1024},
            "rollout": {"n": 16, "max_concurrent_prompts": 3 * batch},
            "reward": {"overlong_buffer": {"len": cap // 4}},
            "trainer": {"ppo_mini_batch_size": batch // 4},
        }
    )


def published_setup(name: str, batch: int) -> tuple[RunConfig, ClusterProfile, ClusterProfile, WorkloadSpec]:
    """A published setup (asyncdapo.tools.simulate.published) as a what-if base: its run with DAPO's
    dynamic sampling on and verl's generation batch of 3·B for sync; sync on the colocated GPUs,
    every async mode on the same GPUs split, with asyncdapo's own trainer (a version's batch at once)."""
    res = PUBLISHED[name]
    run = json.loads(json.dumps(res.run))
    run["data"]["train_batch_size"] = batch
    run["trainer"]["ppo_mini_batch_size"] = max(1, batch // 4)
    run["rollout"]["max_concurrent_prompts"] = 3 * batch
    run["reward"]["filter_groups"] = True
    asyn = res.asynchronous.cluster
    asyn = asyn.model_copy(update={"trainer": asyn.trainer.model_copy(update={"stream_chunks": 1})})
    return RunConfig.model_validate(run), res.sync.cluster, asyn, res.workload


def grid(profile: str, rate: float, modes: list[str], a: argparse.Namespace) -> list[dict[str, object]]:
    if a.published:
        cfg0, sync_cluster, cluster, spec = published_setup(a.published, a.batch)
        wl = Workload(WorkloadSpec.model_validate(spec.model_dump() | {"valid_rate": rate}), a.seed)
    else:
        cfg0 = base_cfg(a.batch, a.cap)
        cluster = sync_cluster = load_cluster(profile, a.engines)
        wl = load_workload(a.workload, a.seed, valid_rate=rate)
    reps = []
    for m in modes:
        cfg = mode_config(cfg0, m)
        cl = sync_cluster if m == "sync" else cluster
        c0 = time.process_time()
        res = Simulation(cfg, cl, wl, a.versions).simulate()
        reps.append(mode_report(m, cfg, res, ideal(cfg0, cl, wl), time.process_time() - c0))
    compare(reps)
    rows = []
    for r in reps:
        rows.append(
            {
                "profile": profile,
                "valid_rate": rate,
                "mode": r.mode,
                "step_s": round(r.step_s, 1),
                "speedup_vs_sync": round(r.speedup_vs_sync or 0, 2),
                "efficiency": round(r.efficiency, 2),
                "bias_vs_sync": round(r.length_bias_vs_sync or 0, 3),
                "speedup_length_matched": round(r.speedup_length_matched or 0, 2),
                "aborted_share": round(r.tokens_aborted / max(r.tokens_generated, 1), 3),
                "attempts": round(r.attempts_per_trained_prompt, 2),
                "idle": round(r.engine_idle_fraction, 2),
                "max_staleness": max(r.staleness),
                "cpu_s": round(r.sim_cpu_s, 1),
            }
        )
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--engines", type=int, default=64)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--cap", type=int, default=16384)
    p.add_argument("--versions", type=int, default=12)
    p.add_argument("--workload", default="rollpacker-14b")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rates", default="0.2,0.35,0.5,0.7", help="valid rates, on the first profile")
    p.add_argument("--rates2", default="0.2,0.5", help="valid rates on the other profiles")
    p.add_argument("--profiles", default="h100-7b,h100-32b")
    p.add_argument(
        "--published",
        default="",
        help="a published setup (asyncdapo.tools.simulate.published) instead of --profiles/--workload: "
        "its clusters (sync colocated, async modes disaggregated) and workload, dynamic sampling on",
    )
    p.add_argument("--out", default="runs/simulate/whatif.json")
    a = p.parse_args()
    t0, c0 = time.perf_counter(), time.process_time()
    rows: list[dict[str, object]] = []
    cols = ["profile", "valid_rate", "mode", "step_s", "speedup_vs_sync", "speedup_length_matched", "efficiency",
            "bias_vs_sync", "aborted_share", "attempts", "idle", "max_staleness"]  # fmt: skip
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    profiles = [a.published] if a.published else a.profiles.split(",")
    jobs = [(profiles[0], float(r), MODES) for r in a.rates.split(",")]
    if not a.published:
        jobs += [(pr, float(r), MODES) for pr in profiles[1:] for r in a.rates2.split(",")]
        jobs.append((profiles[0], 0.5, ["sync", *MARGINS]))
    for profile, rate, modes in jobs:
        for row in grid(profile, rate, modes, a):
            if modes is not MODES and row["mode"] == "sync":
                continue
            rows.append(row)
            print("| " + " | ".join(str(row[c]) for c in cols) + " |", flush=True)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(a), "rows": rows}, indent=1) + "\n")
    print(
        f"RESULT rows={len(rows)} setup={a.published or a.profiles} "
        f"engines={'per-setup' if a.published else a.engines} batch={a.batch} versions={a.versions} "
        f"cpu_s={time.process_time() - c0:.1f} wall_s={time.perf_counter() - t0:.1f} loadavg={os.getloadavg()[0]:.2f}"
    )


if __name__ == "__main__":
    main()
