"""What a `FaultStack` runs on: the tiny model, synthetic arithmetic, a run config and the
SIMULATOR answer key of its prompts — built in a directory, no download.

The run config keeps every durability setting at its default (leases, retries, timeouts): fault
tests run at default settings. Only the sizes are small (batch, group size, steps, lengths), so a
run is seconds of CPU per step on the tiny model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from asyncdapo.contracts.overrides import merge_sections


@dataclass(frozen=True)
class FaultAssets:
    root: Path
    model_dir: Path
    config: Path  # RunConfig YAML
    answer_key: Path  # SIMULATOR answer key (asyncdapo.services.gateway.sim_answers)
    run: str


def run_config(run: str, model_dir: Path, data_dir: Path, total_steps: int) -> dict[str, Any]:
    """A small on-policy (s = 0) run: B = 4 groups of n = 4, 16-token responses."""
    return {
        "name": run,
        "model": {"path": str(model_dir)},
        "data": {
            "train_files": [str(data_dir / "train.parquet")],
            "val_files": [str(data_dir / "val.parquet")],
            "train_batch_size": 4,
            "max_prompt_length": 64,
            "max_response_length": 16,
            "prompt_queue_watermark": 32,
        },
        "rollout": {"n": 4, "max_concurrent_prompts": 8, "max_staleness": 0},
        "reward": {"overlong_buffer": {"enable": True, "len": 4, "penalty_factor": 0.5}},
        "trainer": {
            "total_steps": total_steps,
            "ppo_mini_batch_size": 4,
            "micro_batch_size": 16,
            "lr": 1e-4,
            "warmup_steps": 0,
        },
    }


def build_fault_assets(
    root: str | Path,
    model_dir: str | Path | None = None,
    *,
    run: str = "faults",
    total_steps: int = 6,
    n_train: int = 120,
    n_val: int = 8,
    seed: int = 0,
    overrides: dict[str, Any] | None = None,
) -> FaultAssets:
    """Write data, config and answer key under `root` (and the tiny model, unless given)."""
    from asyncdapo.contracts.verl_format import write_examples
    from asyncdapo.services.gateway.sim_answers import build_answer_key, write_answer_key
    from asyncdapo.tools.data.synth import SynthSpec, synth_splits

    root = Path(root).resolve()
    if model_dir is None:
        from asyncdapo.tools.tiny_model import build_tiny_model

        model_dir = build_tiny_model(root / "model", seed=seed)
    model_dir = Path(model_dir).resolve()
    data_dir = root / "data"
    train, val = synth_splits(n_train, n_val, seed=seed, spec=SynthSpec(ops=("+", "-"), max_operand=9))
    write_examples(train, data_dir / "train.parquet")
    write_examples(val, data_dir / "val.parquet")
    cfg = merge_sections(run_config(run, model_dir, data_dir, total_steps), overrides or {})
    config = root / f"{run}.yaml"
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    data = cfg["data"]
    answers = build_answer_key(
        [*data["train_files"], *data.get("val_files", [])],
        model_dir,
        prompt_field=data.get("prompt_key", "prompt"),
        apply_chat_template=data.get("apply_chat_template", True),
    )
    key = write_answer_key(answers, root / "answers.json")
    return FaultAssets(root, model_dir, config, key, run)
