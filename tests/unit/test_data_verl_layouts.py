"""The public math sets verl users train on, in the row shapes verl's preprocessing writes them, load
(parquet, JSON Lines, a JSON array), keep their own index and extra columns, and fit
`data.max_prompt_length` as `data.truncation` says. The rows are built here from the layouts' facts;
no third-party data is committed."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from asyncdapo.config import PromptTruncation, parse_run_config
from asyncdapo.data.prompting import PromptTooLong, fit_prompt
from asyncdapo.data.verl_format import Example, load_examples, write_examples
from asyncdapo.eval_request import eval_request


def _dapo_math_17k(i: int) -> dict[str, Any]:
    """BytedTsinghua-SIA/DAPO-Math-17k (also its AIME-2024): extra_info.index is a UUID string."""
    return {
        "data_source": "math_dapo",
        "prompt": [{"content": f"Solve {i} + 1. The last line of your response should be of the form "
                               "Answer: $Answer", "role": "user"}],
        "ability": "MATH",
        "reward_model": {"ground_truth": str(i + 1), "style": "rule-lighteval/MATH_v2"},
        "extra_info": {"index": str(uuid.UUID(int=i + 1))},
    }  # fmt: skip


def _math_lighteval(i: int) -> dict[str, Any]:
    """verl's examples/data_preprocess/math_dataset.py."""
    return {
        "data_source": "DigitalLearningGmbH/MATH-lighteval",
        "prompt": [{"role": "user", "content": f"What is 1/{i + 2}? Let's think step by step."}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": f"\\frac{{1}}{{{i + 2}}}"},
        "extra_info": {"split": "train", "index": i},
    }


def _gsm8k(i: int) -> dict[str, Any]:
    """verl's examples/data_preprocess/gsm8k.py."""
    return {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": f"Tom has {i} apples. Let's think step by step."}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(i)},
        "extra_info": {
            "split": "test",
            "index": i,
            "answer": f"He has {i}.\n#### {i}",
            "question": f"Tom {i}",
        },
    }


def _deepscaler(i: int, text_prompt: bool = False) -> dict[str, Any]:
    question = f"Find {i} squared."
    return {
        "data_source": "deepscaler",
        "prompt": question if text_prompt else [{"role": "user", "content": question}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": i * i},  # a number, not a string
        "extra_info": {"index": i, "solution": f"{i}^2 = {i * i}"},
    }


def _write(rows: list[dict[str, Any]], path: Path) -> Path:
    if path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    elif path.suffix == ".json":
        path.write_text(json.dumps(rows))
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl", ".json"])
@pytest.mark.parametrize(
    ("make", "source", "index_of"),
    [
        (_dapo_math_17k, "math_dapo", lambda i: str(uuid.UUID(int=i + 1))),
        (_math_lighteval, "DigitalLearningGmbH/MATH-lighteval", lambda i: i),
        (_gsm8k, "openai/gsm8k", lambda i: i),
        (_deepscaler, "deepscaler", lambda i: i),
        (lambda i: _deepscaler(i, text_prompt=True), "deepscaler", lambda i: i),
    ],
    ids=["dapo-math-17k", "math-lighteval", "gsm8k", "deepscaler", "deepscaler-text"],
)
def test_public_math_sets_load(tmp_path: Path, suffix: str, make: Any, source: str, index_of: Any) -> None:
    rows = [make(i) for i in range(5)]
    path = _write(rows, tmp_path / f"train{suffix}")
    examples = load_examples([path])
    assert len(examples) == 5
    for i, (e, row) in enumerate(zip(examples, rows, strict=True)):
        assert e.index == i and e.source_index == index_of(i) and e.data_source == source
        assert e.ground_truth == str(row["reward_model"]["ground_truth"])
        prompt = row["prompt"]
        assert e.prompt_text() == (prompt if isinstance(prompt, str) else prompt[0]["content"])
        assert e.columns == {"ability": row["ability"]}
        assert e.extra_info == {k: v for k, v in row["extra_info"].items() if k != "index"}
    # written back in verl's layout, the row's own index and columns survive
    again = load_examples([write_examples(examples, tmp_path / f"again{suffix}")])
    assert [(e.source_index, e.columns, e.extra_info, e.prompt) for e in again] == [
        (e.source_index, e.columns, e.extra_info, e.prompt) for e in examples
    ]


def test_nulls_and_mixed_files(tmp_path: Path) -> None:
    """extra_info null or without an index, messages with extra keys, files of different index types."""
    rows = [
        {**_gsm8k(0), "extra_info": None},
        {**_gsm8k(1), "extra_info": {"split": "test"}},
        {**_gsm8k(2), "prompt": [{"role": "user", "content": "q", "tool_calls": None}]},
    ]
    ints = _write(rows, tmp_path / "gsm8k.jsonl")
    uuids = _write([_dapo_math_17k(i) for i in range(2)], tmp_path / "dapo.parquet")
    examples = load_examples([ints, uuids])
    assert [e.index for e in examples] == [0, 1, 2, 3, 4]  # positions: unique across files
    assert [e.source_index for e in examples][:3] == [None, None, 2]
    assert examples[2].prompt == [{"role": "user", "content": "q"}]
    assert isinstance(examples[3].source_index, str)


def test_validation_ids_are_unique_when_files_reuse_an_index(tmp_path: Path) -> None:
    a = _write([_gsm8k(i) for i in range(3)], tmp_path / "a.jsonl")
    b = _write([_gsm8k(i) for i in range(3)], tmp_path / "b.jsonl")  # the same extra_info.index 0..2
    examples = load_examples([a, b])
    cfg = parse_run_config({"data": {"max_prompt_length": 64}})
    req = eval_request(cfg, examples, lambda e: ([1, 2, 3], e.prompt_text()))
    assert len({p.id for p in req.prompts}) == 6


def test_data_show_on_a_dapo_math_17k_parquet(tmp_path: Path) -> None:
    path = _write([_dapo_math_17k(i) for i in range(4)], tmp_path / "dapo-math-17k.parquet")
    proc = subprocess.run(
        [sys.executable, "-m", "asyncdapo.cli", "data", "show", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "4 examples; sources: {'math_dapo': 4}" in proc.stdout
    assert "extra_info.index: {'str': 4}; other columns: ['ability']" in proc.stdout


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        (PromptTruncation.DROP, None),
        (PromptTruncation.LEFT, [5, 6, 7, 8, 9]),
        (PromptTruncation.RIGHT, [0, 1, 2, 3, 4]),
        (PromptTruncation.MIDDLE, [0, 1, 2, 8, 9]),  # ceil(5/2) from the start, floor(5/2) from the end
    ],
)
def test_truncation_modes(mode: PromptTruncation, expected: list[int] | None) -> None:
    ids = list(range(10))
    assert fit_prompt(ids, 5, mode, "row 3") == expected
    assert fit_prompt(ids[:5], 5, mode, "row 3") == ids[:5]  # a prompt that fits is never touched


def test_truncation_error_names_the_row_and_its_length() -> None:
    with pytest.raises(PromptTooLong, match=r"row 3: prompt of 10 tokens given; data.max_prompt_length is 5"):
        fit_prompt(list(range(10)), 5, PromptTruncation.ERROR, "row 3")


def test_validation_prompts_are_fitted_like_training_ones() -> None:
    examples = [Example("x" * 8, "1", "s", 0), Example("y" * 2, "2", "s", 1)]
    encode = lambda e: ([ord(c) for c in e.prompt_text()], e.prompt_text())  # noqa: E731
    left = eval_request(
        parse_run_config({"data": {"max_prompt_length": 4, "truncation": "left"}}), examples, encode
    )
    assert [list(p.prompt_token_ids) for p in left.prompts] == [[ord("x")] * 4, [ord("y")] * 2]
    drop = eval_request(parse_run_config({"data": {"max_prompt_length": 4}}), examples, encode)
    assert [p.id for p in drop.prompts] == ["val-1"]
    with pytest.raises(PromptTooLong, match="validation example 0"):
        eval_request(
            parse_run_config({"data": {"max_prompt_length": 4, "truncation": "error"}}), examples, encode
        )
