"""The dataset loader on generated verl-layout files: rows near the layout (wrong types, missing
fields, nested junk, huge numbers) and raw junk text, as JSON Lines, a JSON array and parquet.
Every file loads into examples that keep the layout's invariants or raises DatasetError naming the
file (and, for a row, the row and field); nothing else escapes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fuzz_budget import answered, fuzz_settings
from hypothesis import assume, given
from hypothesis import strategies as st

from asyncdapo.contracts.verl_format import DatasetError, load_examples

SURFACE = "dataset_loader"
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(10**400), max_value=10**400)  # past a float's range
    | st.floats()
    | st.text(max_size=20)
)
JUNK = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", ""]) | JUNK, "content": st.text(max_size=30) | JUNK}
)
PROMPT = st.text(max_size=40) | st.lists(MESSAGE | JUNK, max_size=3) | JUNK
ROW_FIELDS: dict[str, Any] = {
    "data_source": st.text(max_size=10) | JUNK,
    "prompt": PROMPT,
    "ability": st.just("math") | JUNK,
    "reward_model": st.fixed_dictionaries(
        {"ground_truth": st.text(max_size=10) | st.integers() | st.floats() | JUNK},
        optional={"style": st.just("rule")},
    )
    | JUNK,
    "extra_info": st.fixed_dictionaries({}, optional={"index": JUNK, "split": JUNK}) | JUNK,
}


@st.composite
def rows(draw: st.DrawFn) -> Any:
    """A row with each layout field present or not, each near its allowed shape or junk."""
    if draw(st.integers(0, 9)) == 0:
        return draw(JUNK)  # not even a mapping
    row = {k: draw(v) for k, v in ROW_FIELDS.items() if draw(st.integers(0, 5)) > 0}
    row.update(draw(st.dictionaries(st.text(max_size=6), JUNK, max_size=2)))
    return row


def _load(path: Path) -> None:
    try:
        examples = load_examples([path])
    except DatasetError as err:
        assert str(path) in str(err), f"the error does not name the file: {err}"
        return
    for i, ex in enumerate(examples):
        assert ex.index == i
        assert ex.ground_truth.strip() and ex.ground_truth == ex.ground_truth.strip()
        assert ex.prompt_text() if isinstance(ex.prompt, str) else ex.prompt


def _json_text(value: Any) -> str:
    try:
        return json.dumps(value)
    except ValueError:  # an int past Python's str conversion limit: written as the digits themselves
        assume(False)
        raise


@fuzz_settings(0.5)
@given(batch=st.lists(rows(), min_size=1, max_size=4), as_array=st.booleans())
def test_json_rows_load_or_name_the_row(
    tmp_path_factory: pytest.TempPathFactory, batch: list[Any], as_array: bool
) -> None:
    path = tmp_path_factory.mktemp("rows") / ("data.json" if as_array else "data.jsonl")
    text = _json_text(batch) if as_array else "\n".join(_json_text(r) for r in batch)
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    with answered(SURFACE, batch):
        _load(path)


RAW_LINES = st.sampled_from(
    [
        "[" * 200_000,  # nested past the JSON parser's recursion limit
        '{"prompt": "x", "reward_model": {"ground_truth": ' + "9" * 5000 + "}}",  # an int of 5000 digits
        '{"prompt": "x", "reward_model": {"ground_truth": NaN}}',
        '{"prompt": "x", "reward_model": {"ground_truth": 1e999}}',
        '{"prompt": "x", "reward_model": {"ground_truth": -Infinity}}',
        '{"prompt": "x", "reward_model": {"ground_truth": "\\ud800"}}',
        "\ufeff",
        "null",
        "",
    ]
) | st.text(max_size=60)


@fuzz_settings(0.25)
@given(
    lines=st.lists(RAW_LINES, min_size=1, max_size=3),
    suffix=st.sampled_from([".jsonl", ".json"]),
    raw=st.binary(max_size=8),
)
def test_junk_text_is_a_dataset_error(
    tmp_path_factory: pytest.TempPathFactory, lines: list[str], suffix: str, raw: bytes
) -> None:
    path = tmp_path_factory.mktemp("junk") / f"data{suffix}"
    path.write_bytes("\n".join(lines).encode("utf-8", "surrogatepass") + raw)
    with answered(SURFACE, lines):
        _load(path)


@fuzz_settings(0.25)
@given(batch=st.lists(rows(), min_size=1, max_size=3))
def test_parquet_rows_load_or_name_the_row(
    tmp_path_factory: pytest.TempPathFactory, batch: list[Any]
) -> None:
    assume(all(isinstance(r, dict) and r for r in batch))
    try:
        table = pa.Table.from_pylist(batch)
    except (pa.ArrowException, OverflowError, ValueError, TypeError):
        assume(False)  # pyarrow cannot store these rows at all: nothing a dataset file can hold
        raise
    path = tmp_path_factory.mktemp("pq") / "data.parquet"
    try:
        pq.write_table(table, path)
    except (pa.ArrowException, OverflowError, ValueError, TypeError):
        assume(False)
        raise
    with answered(SURFACE, batch):
        _load(path)
