import json
from pathlib import Path

import pytest

from asyncdapo.contracts.verl_format import (
    DatasetError,
    Example,
    gsm8k_examples,
    gsm8k_ground_truth,
    load_examples,
    write_examples,
)
from asyncdapo.tools.data.synth import SynthSpec, synth_splits


def test_synth_is_deterministic_and_held_out() -> None:
    train_a, val_a = synth_splits(300, 50, seed=3)
    train_b, val_b = synth_splits(300, 50, seed=3)
    assert train_a == train_b and val_a == val_b
    train_keys = {e.prompt_text() for e in train_a}
    assert not train_keys & {e.prompt_text() for e in val_a}
    assert len(train_keys) == 300
    assert synth_splits(300, 50, seed=4)[0] != train_a


def test_synth_ground_truth_is_the_result() -> None:
    train, _ = synth_splits(100, 0, seed=0, spec=SynthSpec(ops=("+", "-", "*"), max_operand=9))
    for e in train:
        a, op, b = e.extra_info["a"], e.extra_info["op"], e.extra_info["b"]
        assert int(e.ground_truth) == {"+": a + b, "-": a - b, "*": a * b}[op]
        assert e.extra_info["solution"] == f"\\boxed{{{e.ground_truth}}}"


def test_synth_rejects_impossible_requests() -> None:
    with pytest.raises(DatasetError, match="only 242"):
        synth_splits(300, 0, spec=SynthSpec(max_operand=10))
    with pytest.raises(ValueError, match="ops"):
        SynthSpec(ops=("^",))


@pytest.mark.parametrize("suffix", ["parquet", "jsonl"])
def test_roundtrip(tmp_path: Path, suffix: str) -> None:
    train, _ = synth_splits(20, 0, seed=1)
    path = write_examples(train, tmp_path / f"train.{suffix}")
    loaded = load_examples([path])
    assert [(e.prompt, e.ground_truth, e.data_source) for e in loaded] == [
        (e.prompt, e.ground_truth, e.data_source) for e in train
    ]


def test_text_prompts_and_numeric_ground_truth(tmp_path: Path) -> None:
    f = tmp_path / "d.jsonl"
    f.write_text(json.dumps({"prompt": "1+1=", "reward_model": {"ground_truth": 2}}) + "\n")
    (e,) = load_examples([f])
    assert e.prompt == "1+1=" and not e.is_chat and e.ground_truth == "2" and e.data_source == "unknown"


@pytest.mark.parametrize(
    ("row", "field"),
    [
        ({"reward_model": {"ground_truth": "1"}}, "'prompt'"),
        ({"prompt": "", "reward_model": {"ground_truth": "1"}}, "prompt: '' given; must be"),
        ({"prompt": [{"content": "x"}], "reward_model": {"ground_truth": "1"}}, r"prompt\[0\]"),
        ({"prompt": "q"}, "reward_model.ground_truth"),
        ({"prompt": "q", "reward_model": {"ground_truth": "  "}}, "ground_truth: an empty string given"),
        (
            {"prompt": "q", "reward_model": {"ground_truth": ["1", "2"]}},
            "ground_truth: list given; must be a string",
        ),
        ({"prompt": "q", "reward_model": {"ground_truth": True}}, "ground_truth: bool given"),
        ({"prompt": "q", "reward_model": {"ground_truth": "1"}, "extra_info": [1]}, "extra_info: list given"),
        (
            {"prompt": [{"role": "user", "content": None}], "reward_model": {"ground_truth": "1"}},
            r"prompt\[0\]: content null given",
        ),
        (
            {"prompt": [{"content": "q", "tool_calls": None}], "reward_model": {"ground_truth": "1"}},
            r"prompt\[0\]: role null given; a chat message is \{role, content\}",
        ),
        ({"prompt": ["q"], "reward_model": {"ground_truth": "1"}}, r"prompt\[0\]: str given"),
        (
            {"prompt": "q", "reward_model": {"ground_truth": "1"}, "extra_info": {"index": [1]}},
            "extra_info.index: list given; must be a string or a number",
        ),
        ({"prompt": "q", "reward_model": {"ground_truth": {"a": 1}}}, "ground_truth: dict given"),
    ],
)
def test_bad_rows_name_file_row_and_field(tmp_path: Path, row: dict, field: str) -> None:
    f = tmp_path / "bad.jsonl"
    f.write_text(
        json.dumps({"prompt": "ok", "reward_model": {"ground_truth": "1"}}) + "\n" + json.dumps(row) + "\n"
    )
    with pytest.raises(DatasetError, match=rf"bad\.jsonl row 1: .*{field}"):
        load_examples([f])


def test_missing_file_and_bad_format(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="not found"):
        load_examples([tmp_path / "nope.parquet"])
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(DatasetError, match="unsupported"):
        load_examples([tmp_path / "x.csv"])
    with pytest.raises(DatasetError, match="unsupported"):
        write_examples([Example("p", "1", "s", 0)], tmp_path / "x.csv")


def test_gsm8k_ground_truth() -> None:
    assert gsm8k_ground_truth("so she makes 9 * 2 = $<<9*2=18>>18\n#### 18") == "18"
    assert gsm8k_ground_truth("...\n#### 1,200") == "1200"
    assert gsm8k_ground_truth("#### -3.5") == "-3.5"
    with pytest.raises(DatasetError, match="####"):
        gsm8k_ground_truth("no final answer")


def test_gsm8k_real_data(shared_data: Path, tmp_path: Path) -> None:
    """The whole GSM8K test split converts, and every ground truth is a plain number."""
    examples = gsm8k_examples(shared_data / "gsm8k" / "test.jsonl")
    assert len(examples) == 1319
    for e in examples:
        float(e.ground_truth)
        assert e.prompt[0]["content"].endswith("\\boxed{}.")
    assert examples[0].ground_truth == "18"
    path = write_examples(examples, tmp_path / "gsm8k.parquet")
    assert [e.ground_truth for e in load_examples([path])] == [e.ground_truth for e in examples]
