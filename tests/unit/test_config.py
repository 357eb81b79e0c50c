from pathlib import Path

import pytest
import yaml

from asyncdapo.config import (
    ConfigError,
    FilterMetric,
    LossAggMode,
    RunConfig,
    load_run_config,
    parse_run_config,
    run_config_json_schema,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("path", sorted((REPO / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_parses(path: Path) -> None:
    cfg = load_run_config(path)
    assert cfg.name


def test_defaults_follow_verl_dapo() -> None:
    cfg = RunConfig()
    a = cfg.algorithm
    assert (a.clip_ratio_low, a.clip_ratio_high, a.clip_ratio_c) == (0.2, 0.28, 10.0)
    assert a.loss_agg_mode is LossAggMode.TOKEN_MEAN
    assert cfg.reward.filter_metric is FilterMetric.ACC
    assert cfg.rollout.max_staleness == 0
    assert cfg.rollout.long_tail.offload_fraction == 0.2
    assert cfg.rollout.long_tail.cap_factor == 1.5


def test_error_names_the_field(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(
        yaml.safe_dump({"rollout": {"n": 0, "temperature": "hot"}, "algorithm": {"clip_ratio_c": 0.5}})
    )
    with pytest.raises(ConfigError) as exc:
        load_run_config(f)
    msg = str(exc.value)
    assert str(f) in msg
    assert "rollout.n" in msg and "rollout.temperature" in msg and "algorithm.clip_ratio_c" in msg


def test_unknown_key_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"rollout\.max_stalenes"):
        parse_run_config({"rollout": {"max_stalenes": 1}})


def test_cross_field_invariants() -> None:
    with pytest.raises(ConfigError, match=r"overlong_buffer\.len"):
        parse_run_config({"data": {"max_response_length": 64}, "reward": {"overlong_buffer": {"len": 64}}})
    with pytest.raises(ConfigError, match="ppo_mini_batch_size"):
        parse_run_config({"data": {"train_batch_size": 8}, "trainer": {"ppo_mini_batch_size": 3}})
    with pytest.raises(ConfigError, match="max_staleness"):
        parse_run_config({"rollout": {"mode": "sync", "max_staleness": 1}})
    with pytest.raises(ConfigError, match="name"):
        parse_run_config({"name": "Not_A_Label"})


def test_bad_yaml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_run_config(tmp_path / "nope.yaml")
    f = tmp_path / "broken.yaml"
    f.write_text("rollout: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_run_config(f)
    f.write_text("- a list")
    with pytest.raises(ConfigError, match="mapping"):
        load_run_config(f)


def test_staleness_bound_and_overlong_penalty() -> None:
    cfg = parse_run_config(
        {
            "data": {"train_batch_size": 4, "max_response_length": 100},
            "rollout": {"max_staleness": 2},
            "trainer": {"ppo_mini_batch_size": 4},
            "reward": {"overlong_buffer": {"len": 20, "penalty_factor": 2.0}},
        }
    )
    assert cfg.valid_group_bound(0) == 12
    assert cfg.valid_group_bound(3) == 24
    assert cfg.overlong_penalty(80) == 0.0
    assert cfg.overlong_penalty(90) == pytest.approx(-1.0)
    assert cfg.overlong_penalty(100) == pytest.approx(-2.0)
    assert cfg.overlong_penalty(500) == pytest.approx(-2.0)


def test_json_schema_carries_descriptions_and_bounds() -> None:
    schema = run_config_json_schema()
    defs = schema["$defs"]
    n = defs["RolloutConfig"]["properties"]["n"]
    assert n["minimum"] == 1 and n["description"]
    assert defs["AlgorithmConfig"]["properties"]["loss_agg_mode"]
    assert schema["additionalProperties"] is False


@pytest.mark.parametrize(
    ("override", "field", "allowed"),
    [
        ({"model": {"dtype": "bf16"}}, "model.dtype", ["auto", "float32", "bfloat16"]),
        ({"algorithm": {"adv_estimator": "gae"}}, "algorithm.adv_estimator", ["grpo"]),
        (
            {"rollout": {"admission": {"policy": "eager"}}},
            "rollout.admission.policy",
            ["expected-valid", "greedy"],
        ),
    ],
)
def test_enum_fields_refuse_other_values_naming_the_allowed_ones(
    override: dict[str, object], field: str, allowed: list[str]
) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_run_config(override)
    msg = str(exc.value)
    assert field in msg
    assert all(f"'{v}'" in msg for v in allowed), msg
    schema = run_config_json_schema()
    assert "enum" in yaml.safe_dump(schema) and all(v in yaml.safe_dump(schema) for v in allowed)
