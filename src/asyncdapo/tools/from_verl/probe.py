"""What a conversion reads from the recipe's training data, when the files are on this machine:
the number of rows (verl counts steps from epochs) and the `data_source` values (verl picks the
reward function by them). The files are read as training reads them (`asyncdapo.contracts.verl_format`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from asyncdapo.contracts.verl_format import DatasetError, load_examples


@dataclass(frozen=True)
class DataProbe:
    rows: int | None = None  # None: the files could not be read here
    data_sources: frozenset[str] = field(default_factory=frozenset)
    why_unread: str = ""


def probe_files(paths: Sequence[str]) -> DataProbe:
    if not paths:
        return DataProbe(why_unread="the recipe sets no data.train_files")
    missing = [p for p in paths if not Path(p).expanduser().is_file()]
    if missing:
        return DataProbe(why_unread=f"{missing[0]} is not on this machine")
    try:
        examples = load_examples([Path(p).expanduser() for p in paths])
    except DatasetError as err:
        return DataProbe(why_unread=f"the train files could not be read: {err}")
    return DataProbe(rows=len(examples), data_sources=frozenset(e.data_source for e in examples))
