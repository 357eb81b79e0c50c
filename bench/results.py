"""bench/results/<bench>.jsonl: one JSON line per benchmark run (date, commit, machine, command,
the RESULT line and its fields), appended, so figures can be compared across commits and hosts."""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def commit() -> str:
    """The checkout's HEAD commit, read from .git ('' outside a checkout)."""
    git = Path(__file__).resolve().parent.parent / ".git"
    try:
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head
        ref = head.removeprefix("ref: ")
        if (git / ref).is_file():
            return (git / ref).read_text().strip()
        for line in (git / "packed-refs").read_text().splitlines():
            sha, _, name = line.partition(" ")
            if name == ref:
                return sha
    except OSError:
        pass
    return ""


def machine() -> dict[str, Any]:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)
    return {
        "host": platform.node(),
        "cpu": cpu or platform.processor(),
        "cores": os.cpu_count(),
        "mem_gib": round(mem_gib, 1),
        "python": platform.python_version(),
    }


def append_result(bench: str, result_line: str, fields: dict[str, Any], **extra: Any) -> Path:
    """Append one run of `bench` to bench/results/<bench>.jsonl; returns the file's path."""
    RESULTS_DIR.mkdir(exist_ok=True)
    path = RESULTS_DIR / f"{bench}.jsonl"
    row = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": commit(),
        "machine": machine(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "result": result_line,
        "fields": fields,
        **extra,
    }
    with path.open("a") as f:
        f.write(json.dumps(row) + "\n")
    return path
