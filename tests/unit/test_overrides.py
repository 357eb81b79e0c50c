"""`key=value` overrides: applied to the YAML's mapping before validation, with the same errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncdapo.cli import build_parser, parse_args
from asyncdapo.contracts.config import ConfigError, dump_run_config, load_run_config, parse_run_config
from asyncdapo.contracts.overrides import merge_sections

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "examples" / "tiny-math.yaml"


def test_overrides_change_the_run_and_keep_types() -> None:
    cfg = load_run_config(
        TINY,
        ["trainer.lr=3e-6", "rollout.n=16", "name=0123", "data.train_files=a.parquet",
         "trainer.betas=[0.9, 0.95]", "rollout.seed=null", "logging.backends=[tensorboard,jsonl]"],
    )  # fmt: skip
    assert cfg.trainer.lr == 3e-6 and cfg.rollout.n == 16
    assert cfg.name == "0123"  # a string field stays a string
    assert cfg.data.train_files == ["a.parquet"]  # one value given to a list field
    assert cfg.trainer.betas == (0.9, 0.95) and cfg.rollout.seed is None
    assert [b.value for b in cfg.logging.backends] == ["tensorboard", "jsonl"]
    # the rest is the file's
    assert cfg.data.max_response_length == 16


def test_later_override_wins_and_sections_are_created() -> None:
    cfg = parse_run_config({}, overrides=["rollout.long_tail.policy=pdsr", "rollout.n=2", "rollout.n=4"])
    assert cfg.rollout.n == 4 and cfg.rollout.long_tail.policy.value == "pdsr"


def test_errors_name_the_field_and_the_override() -> None:
    with pytest.raises(ConfigError) as exc:
        load_run_config(TINY, ["trainer.lrr=1", "rollout.n=0"])
    msg = str(exc.value)
    assert str(TINY) in msg and "with 2 override(s)" in msg
    assert "  trainer.lrr: unknown key; did you mean trainer.lr? (from override 'trainer.lrr=1')" in msg
    assert "  rollout.n: 0 given; must be >= 1 (from override 'rollout.n=0')" in msg
    with pytest.raises(
        ConfigError, match=r"trainer\.lr\.x: trainer\.lr is a value \(0\.00015\), not a section"
    ):
        load_run_config(TINY, ["trainer.lr.x=3"])
    with pytest.raises(ConfigError, match=r"override 'trainer\.\.lr=3': expected dotted\.key=value"):
        load_run_config(TINY, ["trainer..lr=3"])
    # cross-field invariants see the overridden values
    with pytest.raises(ConfigError, match="ppo_mini_batch_size"):
        load_run_config(TINY, ["trainer.ppo_mini_batch_size=3"])


def test_resolved_config_round_trips() -> None:
    cfg = load_run_config(TINY, ["trainer.lr=3e-6"])
    assert parse_run_config(__import__("yaml").safe_load(dump_run_config(cfg))) == cfg


# fmt: off
ARGVS = [
    ["up", "RUN.yaml", "trainer.lr=3e-6", "--fresh", "rollout.n=16"],
    ["trainer", "--config", "RUN.yaml", "--redis", "redis://x", "trainer.lr=3e-6", "rollout.n=16"],
    ["scheduler", "--config", "RUN.yaml", "--redis", "r", "--verifier", "v", "--gateways", "g",
     "trainer.lr=3e-6", "rollout.n=16"],
    ["config", "show", "RUN.yaml", "trainer.lr=3e-6", "rollout.n=16"],
]
# fmt: on


@pytest.mark.parametrize("argv", ARGVS, ids=lambda a: a[0])
def test_every_subcommand_with_a_run_config_takes_overrides(argv: list[str]) -> None:
    args = parse_args(build_parser(), argv)
    assert args.overrides == ["trainer.lr=3e-6", "rollout.n=16"]


def test_an_unknown_option_is_still_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(build_parser(), ["up", "RUN.yaml", "--bogus"])
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


def test_a_partial_config_merges_section_by_section_and_leaves_the_base_alone() -> None:
    base = {"name": "r", "rollout": {"n": 8, "admission": {"margin": 1.2}}, "data": {"train_files": ["a"]}}
    merged = merge_sections(base, {"rollout": {"admission": {"margin": 1.5}}, "data": {"train_files": ["b"]}})
    assert merged == {
        "name": "r",
        "rollout": {"n": 8, "admission": {"margin": 1.5}},
        "data": {"train_files": ["b"]},
    }
    assert base["rollout"] == {"n": 8, "admission": {"margin": 1.2}}  # a copy: the base is unchanged
    assert parse_run_config(merged).rollout.admission.margin == 1.5
