"""Datasets in verl's layout: one row per problem with `prompt`, `reward_model.ground_truth`,
`data_source` (plus optional `ability`, `extra_info` and any other column).

Every row shape verl's own loader accepts loads here:
- files: parquet (`.parquet`), JSON Lines (`.jsonl`), and `.json` holding JSON Lines or one array of rows
  (JSON in UTF-8);
- `prompt` (or `data.prompt_key`): a list of chat messages (`[{"role": "user", "content": …}]`, verl's
  usual form; other keys of a message, e.g. `tool_calls`, are ignored) or a plain string;
- `reward_model.ground_truth`: a string, an integer or a float (`style` and other keys ignored);
- `extra_info`: missing, null or a mapping; its `index` missing, null, a number or a string (the
  UUIDs of DAPO-Math-17k) — kept verbatim as `Example.source_index`;
- any other column (`ability`, `level`, `solution`, …): kept, and written back by `write_examples`.
Invariant: every `Example` returned has a non-empty prompt and a non-empty ground truth, and its
`index` is its position in the files as loaded (unique: ids are built from it); rows that break
the layout raise `DatasetError` naming the file, the row, the field, what it holds and what is allowed.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asyncdapo.contracts.errors import AsyncdapoError

Messages = list[dict[str, str]]
SourceIndex = str | int | float | None
_LAYOUT = ("data_source", "prompt", "reward_model", "extra_info")


class DatasetError(AsyncdapoError, ValueError):
    pass


@dataclass(frozen=True)
class Example:
    prompt: Messages | str
    ground_truth: str
    data_source: str
    index: int  # position in the loaded files (unique)
    extra_info: dict[str, Any] = field(default_factory=dict)  # without `index`
    source_index: SourceIndex = None  # the row's own extra_info.index, as written (int, UUID string, …)
    columns: dict[str, Any] = field(default_factory=dict)  # other top-level columns (ability, …)

    @property
    def is_chat(self) -> bool:
        return isinstance(self.prompt, list)

    def prompt_text(self) -> str:
        """The prompt without any template: the chat messages' contents joined by newlines."""
        if isinstance(self.prompt, str):
            return self.prompt
        return "\n".join(m["content"] for m in self.prompt)

    def to_row(self) -> dict[str, Any]:
        index = self.source_index if self.source_index is not None else self.index
        return {
            "data_source": self.data_source,
            "prompt": self.prompt,
            "ability": "math",
            **self.columns,
            "reward_model": {"style": "rule", "ground_truth": self.ground_truth},
            "extra_info": {"index": index, **self.extra_info},
        }


def _read_rows(path: Path) -> list[Any]:
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            return pq.read_table(path).to_pylist()
        except (pa.ArrowException, OSError) as err:
            raise DatasetError(f"{path}: not a readable parquet file: {err}") from None
    if suffix in (".jsonl", ".json"):
        try:
            text = path.read_text(encoding="utf-8-sig")  # a leading byte-order mark is tolerated
        except UnicodeDecodeError as err:
            raise DatasetError(
                f"{path}: not UTF-8 text (byte {err.start}); JSON datasets are UTF-8"
            ) from None
        if suffix == ".json" and text.lstrip().startswith("["):
            return list(_parse_json(text, f"{path}", whole_file=True))
        return [
            _parse_json(line, f"{path}:{lineno}")
            for lineno, line in enumerate(text.splitlines(), 1)
            if line.strip()
        ]
    raise DatasetError(
        f"{path}: unsupported dataset format {suffix or '(no suffix)'!r} given; "
        "use .parquet, .jsonl or .json (JSON Lines or an array)"
    )


def _parse_json(text: str, where: str, whole_file: bool = False) -> Any:
    """One JSON document; what Python's parser refuses beyond syntax (nesting deeper than its
    recursion limit, an integer of more than 4300 digits) is a DatasetError as well."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        line = f" (line {err.lineno})" if whole_file else ""
        raise DatasetError(f"{where}: not valid JSON: {err.msg}{line}") from None
    except RecursionError:
        raise DatasetError(
            f"{where}: JSON nested too deeply to read; a row is a flat mapping of columns"
        ) from None
    except ValueError as err:  # int digits over sys.get_int_max_str_digits()
        raise DatasetError(f"{where}: not readable JSON: {err}") from None


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _message_problem(m: Any) -> str:
    """What is wrong with one chat message ("" when nothing); keys other than role/content are allowed."""
    if not isinstance(m, dict):
        return _kind(m)
    if not isinstance(m.get("role"), str) or not m["role"]:
        return f"role {_kind(m.get('role')) if m.get('role') != '' else repr('')}"
    if not isinstance(m.get("content"), str):
        return f"content {_kind(m.get('content'))}"
    return ""


def _parse_prompt(value: Any, where: str, prompt_key: str) -> Messages | str:
    if isinstance(value, str) and value.strip():
        return value
    if isinstance(value, Sequence) and value and not isinstance(value, str):
        messages = []
        for i, m in enumerate(value):
            problem = _message_problem(m)
            if problem:
                raise DatasetError(
                    f"{where}: {prompt_key}[{i}]: {problem} given; "
                    "a chat message is {role, content} with string role and content"
                )
            messages.append({"role": m["role"], "content": m["content"]})
        return messages
    raise DatasetError(
        f"{where}: {prompt_key}: {_kind(value) if value not in ('', []) else repr(value)} given; "
        "must be a non-empty string or a list of chat messages"
    )


def _ground_truth(value: Any, where: str) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise DatasetError(
            f"{where}: reward_model.ground_truth: {_kind(value)} given; must be a string or a number "
            "(one reference answer)"
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise DatasetError(
            f"{where}: reward_model.ground_truth: {value} given; must be a finite number or a string"
        )
    # an int as written (a float() of it may overflow); a float without a fractional part as an int
    if isinstance(value, str | int):
        text = str(value)
    else:
        text = str(int(value)) if value.is_integer() else str(value)
    if not text.strip():
        raise DatasetError(f"{where}: reward_model.ground_truth: an empty string given; must hold the answer")
    return text.strip()


def example_from_row(row: Any, index: int, where: str, prompt_key: str = "prompt") -> Example:
    if not isinstance(row, dict):
        raise DatasetError(f"{where}: {_kind(row)} given; a row is a mapping of columns")
    if prompt_key not in row:
        raise DatasetError(f"{where}: no {prompt_key!r} column (data.prompt_key); columns: {sorted(row)}")
    prompt = _parse_prompt(row[prompt_key], where, prompt_key)
    reward_model = row.get("reward_model")
    if not isinstance(reward_model, dict):
        raise DatasetError(
            f"{where}: reward_model.ground_truth: missing (reward_model is {_kind(reward_model)}); "
            "reward_model must be a mapping with a ground_truth"
        )
    if "ground_truth" not in reward_model:
        raise DatasetError(f"{where}: reward_model.ground_truth: missing; it holds the reference answer")
    extra = row.get("extra_info")
    if extra is None:
        extra = {}
    if not isinstance(extra, dict):
        raise DatasetError(f"{where}: extra_info: {_kind(extra)} given; must be a mapping or null")
    source_index = extra.get("index")
    if source_index is not None and (
        isinstance(source_index, bool) or not isinstance(source_index, str | int | float)
    ):
        raise DatasetError(
            f"{where}: extra_info.index: {_kind(source_index)} given; must be a string or a number"
        )
    return Example(
        prompt=prompt,
        ground_truth=_ground_truth(reward_model["ground_truth"], where),
        data_source=str(row.get("data_source") or "unknown"),
        index=index,
        extra_info={k: v for k, v in extra.items() if k != "index"},
        source_index=source_index,
        columns={k: v for k, v in row.items() if k not in (*_LAYOUT, prompt_key)},
    )


def load_examples(paths: Iterable[str | Path], prompt_key: str = "prompt") -> list[Example]:
    """Load verl-layout files in order; indices are positions in the concatenation."""
    examples: list[Example] = []
    for p in paths:
        path = Path(p)
        if not path.exists():
            raise DatasetError(f"{path}: dataset file not found")
        if not path.is_file():
            raise DatasetError(f"{path}: a directory given; list the dataset's files")
        for i, row in enumerate(_read_rows(path)):
            examples.append(example_from_row(row, len(examples), f"{path} row {i}", prompt_key))
    return examples


def write_examples(examples: Sequence[Example], path: str | Path) -> Path:
    """Write examples in verl's layout; the format follows the suffix (.parquet or .jsonl)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [e.to_row() for e in examples]
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            table = pa.Table.from_pylist(rows)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
            # a parquet column has one type: e.g. UUID-string and integer extra_info.index together
            raise DatasetError(
                f"{path}: the rows' columns differ in type ({err}); parquet holds one type per column: "
                "write these examples to .jsonl, or to one parquet file per source"
            ) from None
        pq.write_table(table, path)
    elif path.suffix in (".jsonl", ".json"):
        with path.open("w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    else:
        raise DatasetError(f"{path}: unsupported dataset format {path.suffix!r} (use .parquet or .jsonl)")
    return path


_GSM8K_ANSWER = re.compile(r"####\s*(-?[0-9][0-9,]*(?:\.[0-9]+)?)\s*$")

GSM8K_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."


def gsm8k_ground_truth(answer: str) -> str:
    """The number after `####` in a GSM8K answer, thousands separators removed."""
    m = _GSM8K_ANSWER.search(answer.strip())
    if m is None:
        raise DatasetError(f"GSM8K answer has no final '#### N' line: {answer[-80:]!r}")
    return m.group(1).replace(",", "")


def gsm8k_examples(path: str | Path, instruction: str = GSM8K_INSTRUCTION) -> list[Example]:
    """Convert GSM8K's original JSONL (`question`, `answer`) to verl-layout examples."""
    path = Path(path)
    examples = []
    for i, row in enumerate(_read_rows(path)):
        where = f"{path} row {i}"
        if not isinstance(row, dict) or "question" not in row or "answer" not in row:
            raise DatasetError(f"{where}: GSM8K rows need 'question' and 'answer'")
        try:
            gt = gsm8k_ground_truth(row["answer"])
        except DatasetError as err:
            raise DatasetError(f"{where}: {err}") from None
        examples.append(
            Example(
                prompt=[{"role": "user", "content": f"{row['question']} {instruction}"}],
                ground_truth=gt,
                data_source="openai/gsm8k",
                index=i,
                extra_info={"question": row["question"]},
            )
        )
    return examples
