from pathlib import Path

import pytest
import yaml

from asyncdapo.contracts.config import (
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
        parse_run_config({"data": {"max_response_length": 64}, "reward": {"overlong_buffer": {"len": 65}}})
    # equal is allowed, as verl asserts max_resp_len >= len: every token then counts toward the penalty
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


def test_reward_of_a_verdict_is_the_configured_score_plus_the_overlong_penalty() -> None:
    base = {"data": {"max_response_length": 100}, "reward": {"overlong_buffer": {"len": 20}}}
    dapo = parse_run_config(base)  # defaults: verl's DAPO reward, +1 / -1
    assert dapo.reward_of(True, 50) == (1.0, 0.0)
    assert dapo.reward_of(False, 50) == (-1.0, 0.0)
    score, pen = dapo.reward_of(True, 90)  # half-way into the buffer
    assert (score, pen) == (1.0, pytest.approx(-0.5)) and score + pen == pytest.approx(0.5)
    assert dapo.reward_of(False, 100) == (-1.0, pytest.approx(-1.0))
    # verl's GSM8K / MATH scorers: 1 / 0
    gsm8k = parse_run_config(
        {**base, "reward": {"incorrect_reward": 0.0, "overlong_buffer": {"enable": False}}}
    )
    assert gsm8k.reward_of(True, 100) == (1.0, 0.0) and gsm8k.reward_of(False, 100) == (0.0, 0.0)


def test_a_correct_answer_must_earn_more_than_a_wrong_one() -> None:
    for correct, incorrect in ((0.0, 0.0), (-1.0, 1.0)):
        with pytest.raises(ConfigError, match=r"correct_reward .* must be greater than incorrect_reward"):
            parse_run_config({"reward": {"correct_reward": correct, "incorrect_reward": incorrect}})
    with pytest.raises(ConfigError, match=r"reward\.correct_reward"):
        parse_run_config({"reward": {"correct_reward": 1000.0}})
    custom = parse_run_config({"reward": {"correct_reward": 5, "incorrect_reward": -0.5}})
    assert custom.reward_of(True, 1)[0] == 5 and custom.reward_of(False, 1)[0] == -0.5


def test_validation_sampling_has_its_own_top_p_and_top_k() -> None:
    ro = parse_run_config({}).rollout
    assert (ro.val_temperature, ro.val_top_p, ro.val_top_k) == (0.0, 1.0, -1)  # verl's val_kwargs
    for bad in ({"val_top_p": 0.0}, {"val_top_p": 1.5}, {"val_top_k": -2}):
        with pytest.raises(ConfigError, match=f"rollout.{next(iter(bad))}"):
            parse_run_config({"rollout": bad})


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


@pytest.mark.parametrize(
    ("s", "bounds", "window"),
    [(0, (10, 20), 0), (0.1, (11, 21), 1), (0.5, (15, 25), 1), (1, (20, 30), 1), (2, (30, 40), 2),
     (0.7, (17, 27), 1), (3.4, (44, 54), 4)],
)  # fmt: skip
def test_a_fractional_staleness_bound_and_window(s: float, bounds: tuple[int, int], window: int) -> None:
    """floor((v + 1 + s) * B) valid groups at version v; a group of version v trains by step v + ceil(s)."""
    cfg = RunConfig.model_validate({"data": {"train_batch_size": 10}, "trainer": {"ppo_mini_batch_size": 10},
                                    "rollout": {"max_staleness": s}})  # fmt: skip
    assert (cfg.valid_group_bound(0), cfg.valid_group_bound(1)) == bounds
    assert cfg.staleness_window == window
    # every group the bound admits at version v is trained by a step within the window
    for v in range(3):
        last_position = cfg.valid_group_bound(v) - 1
        assert last_position // 10 <= v + window


@pytest.mark.parametrize("b", [1, 3, 7, 16])
def test_every_group_the_bound_admits_trains_within_the_window(b: int) -> None:
    for tenths in range(0, 41):
        s = tenths / 10
        cfg = RunConfig.model_validate({"data": {"train_batch_size": b}, "trainer": {"ppo_mini_batch_size": b},
                                        "rollout": {"max_staleness": s}})  # fmt: skip
        for v in range(4):
            bound = cfg.valid_group_bound(v)
            assert (v + 1) * b <= bound <= (v + 1) * b + s * b  # at least the step's own B groups
            # the group at position k trains at step floor(k / B)
            assert (bound - 1) // b <= v + cfg.staleness_window, (s, v)


def test_a_fractional_staleness_round_trips_and_an_integral_one_prints_as_an_int() -> None:
    from asyncdapo.contracts.config import dump_run_config

    quarter = parse_run_config({"rollout": {"max_staleness": 0.25}})
    dumped = dump_run_config(quarter)
    assert "max_staleness: 0.25\n" in dumped
    assert parse_run_config(yaml.safe_load(dumped)) == quarter
    assert (quarter.staleness_window, quarter.valid_group_bound(0)) == (1, 10)  # B = 8: floor(1.25 * 8)
    for written in (1, 1.0):
        one = parse_run_config({"rollout": {"max_staleness": written}})
        assert "max_staleness: 1\n" in dump_run_config(one)
        assert one.model_dump_json().count('"max_staleness":1,') == 1
        assert type(one.rollout.max_staleness) is int
    assert "max_staleness: 0\n" in dump_run_config(parse_run_config({}))


def test_fractional_staleness_rules_use_the_exact_value() -> None:
    with pytest.raises(
        ConfigError, match=r"rollout\.max_staleness: 0\.25 given; must be 0 in rollout\.mode sync"
    ):
        parse_run_config({"rollout": {"mode": "sync", "max_staleness": 0.25}})
    # publish_every = 3 needs floor((v + 1 + s)·B) >= (v + 3)·B: s >= 2, a window of 2 is not enough
    with pytest.raises(ConfigError, match=r"needs rollout\.max_staleness >= 2 \(1\.5 given\)"):
        parse_run_config({"rollout": {"max_staleness": 1.5}, "trainer": {"publish_every": 3}})
    assert parse_run_config({"rollout": {"max_staleness": 2.5}, "trainer": {"publish_every": 3}})
    for bad in (-0.1, 64.5, float("nan")):
        with pytest.raises(ConfigError, match=r"rollout\.max_staleness"):
            parse_run_config({"rollout": {"max_staleness": bad}})
    prop = run_config_json_schema()["$defs"]["RolloutConfig"]["properties"]["max_staleness"]
    assert (prop["type"], prop["minimum"], prop["maximum"]) == ("number", 0, 64)
