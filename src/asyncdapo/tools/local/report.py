"""The run report: `metrics.jsonl` (one JSON object per trainer step) → `report.md` + `report.png`.

Every key is optional per line, so a report can be drawn from a partial or interrupted run. Keys
read: the trainer's step record (`step`, `reward/mean`, `acc/mean`, `val/accuracy`,
`response_length/mean`, `timing/wait_s`, `timing/compute_s`, `timing/publish_s`) merged by
`asyncdapo up` with the scheduler's run status (`rollout/valid_group_ratio`,
`rollout/aborted_tokens`, `rollout/early_stops`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

PANELS: list[tuple[str, list[str]]] = [
    ("reward / accuracy", ["reward/mean", "acc/mean"]),
    ("validation accuracy", ["val/accuracy"]),
    ("response length", ["response_length/mean"]),
    ("valid-group ratio", ["rollout/valid_group_ratio"]),
    ("aborted tokens (cumulative)", ["rollout/aborted_tokens"]),
    ("time split (s)", ["timing/wait_s", "timing/compute_s", "timing/publish_s"]),
]
TABLE_COLUMNS = [
    "step", "reward/mean", "acc/mean", "val/accuracy", "response_length/mean",
    "rollout/valid_group_ratio", "rollout/aborted_tokens",
]  # fmt: skip


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    p = Path(path)
    if not p.exists():
        return rows
    for line in p.read_text().splitlines():
        line = line.strip()
        if line:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line being written when the run was interrupted
    return rows


def _series(rows: Iterable[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for i, r in enumerate(rows):
        v = r.get(key)
        if isinstance(v, int | float) and not (isinstance(v, float) and math.isnan(v)):
            xs.append(float(r.get("step", i)))
            ys.append(float(v))
    return xs, ys


def write_plot(rows: list[dict[str, Any]], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(14, 7))
    for ax, (title, keys) in zip(axes.flat, PANELS, strict=True):
        for key in keys:
            xs, ys = _series(rows, key)
            if xs:
                ax.plot(xs, ys, marker="o", markersize=3, label=key)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f}"
    return "—" if v is None else str(v)


def _link(key: str, value: Any) -> str:
    # the resolved config sits next to the report: link it, so the run can be reproduced from here
    return f"[{value}]({value})" if key == "config" and value else _fmt(value)


def write_report(run_dir: Path, summary: dict[str, Any], rows: list[dict[str, Any]] | None = None) -> Path:
    """Write report.md (summary table + per-step table) and report.png into `run_dir`."""
    run_dir = Path(run_dir)
    rows = rows if rows is not None else read_metrics(run_dir / "metrics.jsonl")
    try:
        png_name = write_plot(rows, run_dir / "report.png").name
        figure = f"![metrics]({png_name})"
    except ImportError:  # a service-only install; `asyncdapo up` installs come with the local extra
        figure = "(no plots: matplotlib is not installed, `pip install 'asyncdapo[local]'`)"
    lines = [f"# Run report: {summary.get('run', run_dir.name)}", "", "| figure | value |", "|---|---|"]
    lines += [f"| {k} | {_link(k, v)} |" for k, v in summary.items()]
    lines += ["", figure, "", "## Steps", ""]
    cols = TABLE_COLUMNS
    lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |" for r in rows]
    md = run_dir / "report.md"
    md.write_text("\n".join(lines) + "\n")
    return md
