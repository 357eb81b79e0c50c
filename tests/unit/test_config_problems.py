"""Configuration mistakes read the same everywhere: `field.path: <given>; <allowed>[; <what to do>]`,
with a "did you mean" for a misspelt key, the asyncdapo key for a verl key, and impossible
combinations refused by the run config itself (so `config check`, `up` and the operator agree)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from asyncdapo.contracts.config import ConfigError, RunConfig, impossible_combinations, parse_run_config
from asyncdapo.contracts.config_problems import ProblemKind, did_you_mean
from asyncdapo.tools.config_cli import explain_verl_keys

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "examples" / "tiny-math.yaml"


def _lines(data: dict[str, Any], overrides: list[str] | None = None) -> list[str]:
    """The problem lines of a config that does not validate."""
    with pytest.raises(ConfigError) as exc:
        parse_run_config(data, "run.yaml", overrides or [])
    return [line.strip() for line in str(exc.value).splitlines()[1:]]


def test_each_problem_says_what_was_given_and_what_is_allowed() -> None:
    lines = _lines(
        {
            "rollout": {"n": 0, "top_p": 0, "seed": "x"},
            "model": {"dtype": "bf16"},
            "data": {"train_files": "a.parquet", "max_prompt_length": 1.5},
            "reward": {"filter_groups": "maybe"},
            "logging": {"backends": ["tb"]},
            "trainer": 3,
        }
    )
    assert set(lines) == {
        "rollout.n: 0 given; must be >= 1",
        "rollout.top_p: 0 given; must be > 0.0",
        "rollout.seed: 'x' given; must be an integer",
        "model.dtype: 'bf16' given; must be one of 'auto', 'float32' or 'bfloat16'",
        "data.train_files: 'a.parquet' given; must be a list",
        "data.max_prompt_length: 1.5 given; must be a whole number",
        "reward.filter_groups: 'maybe' given; must be true or false",
        "logging.backends[0]: 'tb' given; must be one of 'tensorboard', 'wandb', 'mlflow' or 'jsonl'",
        "trainer: 3 given; must be a section (a mapping of keys)",
    }


@pytest.mark.parametrize(
    ("key", "meant"),
    [
        ("rollout.temprature", "rollout.temperature"),  # a typo in a known section
        ("data.max_prompt_lenght", "data.max_prompt_length"),
        ("trainer.max_staleness", "rollout.max_staleness"),  # the right name in the wrong section
        ("rollot.n", "rollout.n"),  # a typo in the section
        ("seed", "data.seed or rollout.seed or trainer.seed"),  # a field of several sections
    ],
)
def test_a_misspelt_key_gets_did_you_mean_in_yaml_and_in_overrides(key: str, meant: str) -> None:
    section, _, leaf = key.rpartition(".")
    data: dict[str, Any] = {section: {leaf: 1}} if section else {leaf: 1}
    expected = f"{key}: unknown key; did you mean {meant}?"
    assert expected in _lines(data)
    assert f"{expected} (from override '{key}=1')" in _lines({}, [f"{key}=1"])


def test_a_key_nothing_is_close_to_says_so() -> None:
    assert _lines({"rollout": {"zzzzzz": 1}}) == ["rollout.zzzzzz: unknown key; rollout has no such field"]
    assert _lines({"zzzzzz": 1}) == ["zzzzzz: unknown key; no such section or field"]
    # a common field name under an unknown section is no reason to point at another section's
    assert did_you_mean("algorithm.filter_groups.enable", RunConfig) == []


def test_each_key_under_an_unknown_section_is_named_as_written() -> None:
    lines = _lines({"actor_rollout_ref": {"rollout": {"n": 16, "temperature": 0.7}}})
    assert lines == [
        "actor_rollout_ref.rollout.n: unknown key; did you mean rollout.n?",
        "actor_rollout_ref.rollout.temperature: unknown key; did you mean rollout.temperature?",
    ]


def test_a_verl_key_names_the_asyncdapo_key_and_from_verl() -> None:
    with pytest.raises(ConfigError) as exc:
        parse_run_config(
            {}, "run.yaml", ["actor_rollout_ref.rollout.n=16", "data.gen_batch_size=32", "trainer.lrr=1"]
        )
    lines = [line.strip() for line in str(explain_verl_keys(exc.value)).splitlines()[1:]]
    (n,) = [line for line in lines if line.startswith("actor_rollout_ref.rollout.n:")]
    assert "unknown key; verl's key for rollout.n" in n and "asyncdapo config from-verl" in n
    assert n.endswith("(from override 'actor_rollout_ref.rollout.n=16')")
    (gen,) = [line for line in lines if line.startswith("data.gen_batch_size:")]
    assert "verl's key for rollout.max_concurrent_prompts" in gen  # not "did you mean data.train_batch_size"
    # a typo in one of asyncdapo's own sections is no verl key, even where verl has a key family there
    assert "trainer.lrr: unknown key; did you mean trainer.lr? (from override 'trainer.lrr=1')" in lines


def test_n_1_with_dynamic_sampling_is_impossible_and_says_why() -> None:
    (line,) = _lines({"rollout": {"n": 1}})
    assert line.startswith("rollout.n: 1 given; must be >= 2 with reward.filter_groups")
    assert "zero variance" in line and "reward.filter_groups: false" in line
    assert parse_run_config({"rollout": {"n": 1}, "reward": {"filter_groups": False}}).rollout.n == 1


def test_sync_generation_batches_that_can_never_fill_a_step_are_impossible() -> None:
    sync = {"mode": "sync", "max_concurrent_prompts": 2}
    data = {"train_batch_size": 8}
    (line,) = _lines({"data": data, "rollout": {**sync, "max_num_gen_batches": 3}})
    assert line.startswith("rollout.max_num_gen_batches: 3 given;") and "= 6 groups" in line
    assert "set it to 4 or more, or 0 (no limit)" in line
    for fine in ({**sync, "max_num_gen_batches": 4}, {**sync, "max_num_gen_batches": 0}):
        parse_run_config({"data": data, "rollout": fine})
    parse_run_config({"data": data, "rollout": {"max_concurrent_prompts": 2, "max_num_gen_batches": 3}})


def test_every_impossible_combination_is_named_at_once() -> None:
    lines = _lines(
        {
            "data": {"train_batch_size": 6, "max_response_length": 64},
            "reward": {"overlong_buffer": {"len": 65}},
            "rollout": {"n": 1, "mode": "sync", "max_staleness": 1},
            "trainer": {"ppo_mini_batch_size": 4, "publish_every": 3, "workers": 9},
        }
    )
    assert [line.split(":")[0] for line in lines] == [
        "reward.overlong_buffer.len",
        "trainer.ppo_mini_batch_size",
        "rollout.max_staleness",
        "rollout.n",
        "trainer.publish_every",
        "trainer.workers",
    ]
    assert all(p.kind is ProblemKind.CONFLICT for p in _problems_of_raw())


def _problems_of_raw() -> list[Any]:
    with pytest.raises(ConfigError) as exc:
        parse_run_config({"rollout": {"n": 1}})
    return list(exc.value.problems)


def test_the_examples_have_no_impossible_combination() -> None:
    from asyncdapo.contracts.config import load_run_config

    for path in sorted((REPO / "examples").glob("*.yaml")):
        assert impossible_combinations(load_run_config(path)) == []


def _cli(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "asyncdapo.cli", *args], capture_output=True, text=True, timeout=60
    )
    return proc, time.monotonic() - start


def test_config_check_refuses_n_1_with_dynamic_sampling_in_under_2_s() -> None:
    proc, wall = _cli("config", "check", "--no-paths", str(TINY), "rollout.n=1")
    assert proc.returncode == 1
    assert "rollout.n: 1 given; must be >= 2 with reward.filter_groups" in proc.stderr
    assert wall < 2.0, wall


def test_config_check_names_rollout_n_for_a_verl_key_and_did_you_mean_for_a_typo() -> None:
    proc, _ = _cli("config", "check", "--no-paths", str(TINY), "actor_rollout_ref.rollout.n=16")
    assert proc.returncode == 1
    assert "actor_rollout_ref.rollout.n: unknown key; verl's key for rollout.n" in proc.stderr
    assert "asyncdapo config from-verl" in proc.stderr
    proc, _ = _cli("config", "check", "--no-paths", str(TINY), "rollout.temprature=0.5")
    assert "rollout.temprature: unknown key; did you mean rollout.temperature?" in proc.stderr
    # the services' --config reads the same (asyncdapo trainer/scheduler/up print through cli.main)
    proc, _ = _cli("config", "show", str(TINY), "actor_rollout_ref.rollout.n=16")
    assert proc.returncode == 2 and "verl's key for rollout.n" in proc.stderr
