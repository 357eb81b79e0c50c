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

from asyncdapo.contracts.config import PromptTruncation, parse_run_config
from asyncdapo.contracts.prompting import PromptTooLong, fit_prompt
from asyncdapo.contracts.verl_format import DatasetError, Example, load_examples, write_examples
from asyncdapo.services.trainer.eval_request import eval_request


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


def _aime_2024(source: str) -> Any:
    """BytedTsinghua-SIA/AIME-2024: DAPO-Math-17k's shape, data_source `math_dapo` or `aime`."""
    return lambda i: {**_dapo_math_17k(i), "data_source": source}


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
        (_aime_2024("math_dapo"), "math_dapo", lambda i: str(uuid.UUID(int=i + 1))),
        (_aime_2024("aime"), "aime", lambda i: str(uuid.UUID(int=i + 1))),
        (_math_lighteval, "DigitalLearningGmbH/MATH-lighteval", lambda i: i),
        (_gsm8k, "openai/gsm8k", lambda i: i),
        (_deepscaler, "deepscaler", lambda i: i),
        (lambda i: _deepscaler(i, text_prompt=True), "deepscaler", lambda i: i),
    ],
    ids=[
        "dapo-math-17k",
        "aime-2024-math_dapo",
        "aime-2024-aime",
        "math-lighteval",
        "gsm8k",
        "deepscaler",
        "deepscaler-text",
    ],
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


def test_parquet_with_nulls_and_each_index_type(tmp_path: Path) -> None:
    """Parquet holds one type per column: an int index with nulls (and rows whose extra_info is null
    or lacks the key), a float index (pandas' int-with-NaN), a UUID-string index, each in its file."""
    ints = _write(
        [
            {**_math_lighteval(0), "extra_info": None},
            {**_math_lighteval(1), "extra_info": {"split": "train", "index": None}},
            {**_math_lighteval(2), "extra_info": {"split": "train"}},  # parquet fills the missing index
            _math_lighteval(3),
        ],
        tmp_path / "math.parquet",
    )
    floats = _write(
        [{**_gsm8k(i), "extra_info": {"index": float(i)}} for i in range(2)], tmp_path / "f.parquet"
    )
    uuids = _write([_dapo_math_17k(i) for i in range(2)], tmp_path / "dapo.parquet")
    examples = load_examples([ints, floats, uuids])
    assert [e.index for e in examples] == list(range(8))
    assert [e.source_index for e in examples] == [
        None, None, None, 3, 0.0, 1.0, str(uuid.UUID(int=1)), str(uuid.UUID(int=2))
    ]  # fmt: skip
    assert examples[0].extra_info == {}
    assert examples[2].extra_info == {"split": "train"}
    assert [e.ground_truth for e in examples[:4]] == [f"\\frac{{1}}{{{i + 2}}}" for i in range(4)]


def test_extra_columns_round_trip(tmp_path: Path) -> None:
    """Columns a preprocessing script adds (level, type, solution, …) are kept and written back."""
    rows = [
        {**_math_lighteval(i), "level": f"Level {i + 1}", "type": "Algebra", "solution": f"x = {i}"}
        for i in range(3)
    ]
    for suffix in (".parquet", ".jsonl"):
        examples = load_examples([_write(rows, tmp_path / f"math{suffix}")])
        assert examples[1].columns == {
            "ability": "math",
            "level": "Level 2",
            "type": "Algebra",
            "solution": "x = 1",
        }
        written = write_examples(examples, tmp_path / f"again{suffix}")
        assert [e.columns for e in load_examples([written])] == [e.columns for e in examples]


def test_mixed_index_types(tmp_path: Path) -> None:
    """UUID-string and integer indexes together: JSON Lines keeps both; parquet, one type per
    column, cannot, and says what to do instead of failing inside pyarrow."""
    mixed = _write([_dapo_math_17k(0), _gsm8k(1)], tmp_path / "mixed.jsonl")
    examples = load_examples([mixed])
    assert [e.source_index for e in examples] == [str(uuid.UUID(int=1)), 1]
    again = load_examples([write_examples(examples, tmp_path / "again.jsonl")])
    assert [e.source_index for e in again] == [str(uuid.UUID(int=1)), 1]
    with pytest.raises(
        DatasetError,
        match=r"again\.parquet: the rows' columns differ in type .* write these examples to \.jsonl",
    ):
        write_examples(examples, tmp_path / "again.parquet")


def test_json_lines_in_a_json_file_and_unicode(tmp_path: Path) -> None:
    rows = [{**_math_lighteval(0), "prompt": [{"role": "user", "content": "Find π·r² for r = 2; x ≤ 3."}]}]
    path = tmp_path / "math.json"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    (e,) = load_examples([path])
    assert e.prompt_text() == "Find π·r² for r = 2; x ≤ 3." and e.source_index == 0


def test_unreadable_files_are_errors_not_tracebacks(tmp_path: Path) -> None:
    (tmp_path / "latin1.jsonl").write_bytes(b'{"prompt": "caf\xe9"}\n')
    with pytest.raises(DatasetError, match=r"latin1\.jsonl: not UTF-8"):
        load_examples([tmp_path / "latin1.jsonl"])
    (tmp_path / "dir.parquet").mkdir()
    with pytest.raises(DatasetError, match=r"dir\.parquet: a directory given"):
        load_examples([tmp_path / "dir.parquet"])
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    with pytest.raises(DatasetError, match=r"bad\.parquet: not a readable parquet file"):
        load_examples([tmp_path / "bad.parquet"])


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
    ("mode", "limit", "expected"),
    [
        (PromptTruncation.DROP, 5, None),
        (PromptTruncation.LEFT, 5, [5, 6, 7, 8, 9]),
        (PromptTruncation.RIGHT, 5, [0, 1, 2, 3, 4]),
        (PromptTruncation.MIDDLE, 5, [0, 1, 7, 8, 9]),  # floor(5/2) from the start, ceil(5/2) from the end
        (PromptTruncation.MIDDLE, 4, [0, 1, 8, 9]),
        (PromptTruncation.MIDDLE, 1, [9]),
    ],
)
def test_truncation_modes(mode: PromptTruncation, limit: int, expected: list[int] | None) -> None:
    ids = list(range(10))
    assert fit_prompt(ids, limit, mode, "row 3") == expected
    assert fit_prompt(ids[:limit], limit, mode, "row 3") == ids[:limit]  # a prompt that fits is untouched


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


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("[" * 100_000, "nested too deeply"),  # past the JSON parser's recursion limit
        ('{"prompt": "x", "reward_model": {"ground_truth": ' + "9" * 5000 + "}}", "digits"),
        (
            '{"prompt": "x", "reward_model": {"ground_truth": NaN}}',
            "ground_truth: nan given; must be a finite",
        ),
        ('{"prompt": "x", "reward_model": {"ground_truth": -Infinity}}', "ground_truth: -inf given"),
    ],
)
def test_unreadable_json_and_non_finite_answers_are_dataset_errors(
    tmp_path: Path, line: str, problem: str
) -> None:
    """Found by tests/fuzz: these escaped as RecursionError / ValueError or loaded a `nan` answer."""
    path = tmp_path / "junk.jsonl"
    path.write_text(f"{json.dumps(_gsm8k(0))}\n{line}\n")
    with pytest.raises(DatasetError, match=f"{path}(:2| row 1): .*{problem}"):
        load_examples([path])


def test_an_integer_answer_past_a_floats_range_is_kept_as_written(tmp_path: Path) -> None:
    """Found by tests/fuzz: float() of it overflowed."""
    path = _write([{**_gsm8k(0), "reward_model": {"ground_truth": 10**400}}], tmp_path / "big.jsonl")
    assert load_examples([path])[0].ground_truth == "1" + "0" * 400
