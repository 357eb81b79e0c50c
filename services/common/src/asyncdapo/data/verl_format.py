"""Datasets in verl's layout: one row per problem with `prompt`, `reward_model.ground_truth`,
`data_source` (plus optional `ability`, `extra_info`).

`prompt` is either a list of chat messages (`[{"role": "user", "content": …}]`, verl's usual form)
or a plain string. Files are parquet (`.parquet`) or JSON Lines (`.jsonl` / `.json`).
Invariant: every `Example` returned has a non-empty prompt and a non-empty ground truth; rows that
break it raise `DatasetError` naming the file, the row and the field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asyncdapo.errors import AsyncdapoError

Messages = list[dict[str, str]]


class DatasetError(AsyncdapoError, ValueError):
    pass


@dataclass(frozen=True)
class Example:
    prompt: Messages | str
    ground_truth: str
    data_source: str
    index: int
    extra_info: dict[str, Any] = field(default_factory=dict)

    @property
    def is_chat(self) -> bool:
        return isinstance(self.prompt, list)

    def prompt_text(self) -> str:
        """The prompt without any template: the chat messages' contents joined by newlines."""
        if isinstance(self.prompt, str):
            return self.prompt
        return "\n".join(m["content"] for m in self.prompt)

    def to_row(self) -> dict[str, Any]:
        return {
            "data_source": self.data_source,
            "prompt": self.prompt,
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": self.ground_truth},
            "extra_info": {"index": self.index, **self.extra_info},
        }


def _read_rows(path: Path) -> list[dict[str, Any]]:
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    if suffix in (".jsonl", ".json"):
        rows = []
        with path.open() as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise DatasetError(f"{path}:{lineno}: not valid JSON: {err.msg}") from None
        return rows
    raise DatasetError(f"{path}: unsupported dataset format {suffix!r} (use .parquet or .jsonl)")


def _parse_prompt(value: Any, where: str, prompt_key: str) -> Messages | str:
    if isinstance(value, str) and value.strip():
        return value
    if isinstance(value, Sequence) and value and not isinstance(value, str):
        messages = []
        for i, m in enumerate(value):
            if not isinstance(m, dict) or not isinstance(m.get("content"), str) or "role" not in m:
                raise DatasetError(f"{where}: {prompt_key}[{i}] must be a message {{role, content}}")
            messages.append({"role": str(m["role"]), "content": m["content"]})
        return messages
    raise DatasetError(f"{where}: {prompt_key} must be a non-empty string or list of chat messages")


def example_from_row(row: dict[str, Any], index: int, where: str, prompt_key: str = "prompt") -> Example:
    if prompt_key not in row:
        raise DatasetError(f"{where}: missing field {prompt_key!r}")
    prompt = _parse_prompt(row[prompt_key], where, prompt_key)
    reward_model = row.get("reward_model")
    if not isinstance(reward_model, dict) or "ground_truth" not in reward_model:
        raise DatasetError(f"{where}: missing field 'reward_model.ground_truth'")
    gt = reward_model["ground_truth"]
    if isinstance(gt, int | float):
        gt = str(gt)
    if not isinstance(gt, str) or not gt.strip():
        raise DatasetError(f"{where}: reward_model.ground_truth must be a non-empty string")
    extra = row.get("extra_info") or {}
    return Example(
        prompt=prompt,
        ground_truth=gt.strip(),
        data_source=str(row.get("data_source") or "unknown"),
        index=int(extra.get("index", index)) if isinstance(extra, dict) else index,
        extra_info={k: v for k, v in extra.items() if k != "index"} if isinstance(extra, dict) else {},
    )


def load_examples(paths: Iterable[str | Path], prompt_key: str = "prompt") -> list[Example]:
    """Load verl-layout files in order; indices are positions in the concatenation."""
    examples: list[Example] = []
    for p in paths:
        path = Path(p)
        if not path.exists():
            raise DatasetError(f"{path}: dataset file not found")
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

        pq.write_table(pa.Table.from_pylist(rows), path)
    elif path.suffix in (".jsonl", ".json"):
        with path.open("w") as f:
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
        if "question" not in row or "answer" not in row:
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
