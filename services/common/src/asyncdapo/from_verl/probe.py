"""What a conversion reads from the recipe's training data, when the files are on this machine:
the number of rows (verl counts steps from epochs) and the `data_source` values (verl picks the
reward function by them). Reads only the `data_source` column; never the prompts."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class DataProbe:
    rows: int | None = None  # None: the files could not be read here
    data_sources: frozenset[str] = field(default_factory=frozenset)
    why_unread: str = ""


def _sources_of(path: Path) -> tuple[int, set[str]]:
    if path.suffix.lower() == ".parquet":
        import pyarrow.parquet as pq

        meta = pq.read_schema(path)
        if "data_source" not in meta.names:
            return pq.read_metadata(path).num_rows, {""}
        column = pq.read_table(path, columns=["data_source"]).column("data_source").to_pylist()
        return len(column), {str(s or "") for s in column}
    text = path.read_text()
    if path.suffix.lower() == ".json" and text.lstrip().startswith("["):
        rows = json.loads(text)
    else:
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    return len(rows), {str(r.get("data_source") or "") for r in rows if isinstance(r, dict)}


def probe_files(paths: Sequence[str]) -> DataProbe:
    if not paths:
        return DataProbe(why_unread="the recipe sets no data.train_files")
    rows, sources = 0, set()
    for p in paths:
        path = Path(p).expanduser()
        if not path.is_file():
            return DataProbe(why_unread=f"{p} is not on this machine")
        try:
            n, s = _sources_of(path)
        except (OSError, ValueError, ImportError) as err:
            return DataProbe(why_unread=f"{p} could not be read: {err}")
        rows += n
        sources |= s
    return DataProbe(rows=rows, data_sources=frozenset(sources))
