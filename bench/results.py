"""bench/results/<bench>.jsonl: one JSON line per benchmark run (date, commit, machine, command,
the RESULT line and its fields), appended, so figures can be compared across commits and hosts;
bench/results/SUMMARY.md, generated from them, shows the latest run of each bench and command.

Usage: python bench/results.py summary   (rewrite SUMMARY.md)
       python bench/results.py check     (every record well-formed, SUMMARY.md up to date)"""

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


def append_result(
    bench: str, result_line: str, fields: dict[str, Any], results_dir: Path | None = None, **extra: Any
) -> Path:
    """Append one run of `bench` to bench/results/<bench>.jsonl; returns the file's path."""
    results_dir = results_dir or RESULTS_DIR
    results_dir.mkdir(exist_ok=True)
    path = results_dir / f"{bench}.jsonl"
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
    write_summary(results_dir)  # SUMMARY.md follows the records it is made from
    return path


# --- reading the records back: parsing, checks and the summary table ---

REQUIRED_KEYS = ("date", "commit", "machine", "command", "result", "fields")
MACHINE_KEYS = ("host", "cpu", "cores", "mem_gib", "python")
SUMMARY_PATH = RESULTS_DIR / "SUMMARY.md"
IMPORTED = "imported from docs"  # `source` of a record converted from figures the docs stated

# The RESULT fields SUMMARY.md shows per bench (a record lacking one shows the others; a bench
# without an entry shows its first six fields).
_SIM_VALIDATION = ("max_rel_err", "ratio_abs_err", "goal_met", "paired_max_rel_err", "real_spread_max")
_CHAOS = ("seed", "faults", "prompts_lost", "groups_duplicated", "groups_lost", "stalls", "recovery_p99_s")
KEY_FIELDS: dict[str, tuple[str, ...]] = {
    "bench_sim_papers": ("papers", "within", "max_ratio_err", "raw_within", "seeds"),
    "simulate_whatif_published": ("rows", "batch", "versions", "cpu_s"),
    "fuzz": ("inputs", "surfaces", "failures", "max_answer_ms", "bound_ms"),
    "bench_verifier": ("items_per_s", "ratio_per_core", "p50_ms", "p99_ms", "workers"),
    "bench_gateway": ("tokens_per_s", "direct_tokens_per_s", "ratio", "abort_p99_ms", "reload_ms"),
    "bench_scheduler": (
        "completions_per_s",
        "cpu_us_per_completion",
        "cpu_us_per_completion_64",
        "cpu_us_per_completion_512",
        "marginal_us_per_completion_64",
        "marginal_us_per_completion_512",
        "abort_fanout_p99_ms_512",
        "gateways",
    ),
    "bench_trainer": ("packed_speedup", "packed_tok_per_cpu_s", "padded_tok_per_cpu_s", "loss_rel_diff"),
    "bench_e2e": ("rollout_time_ratio", "sync_rollout_s_per_step", "async_rollout_s_per_step"),
    "bench_longtail": (
        "valid_rate",
        "temperature",
        "sync_best",
        "fifo_ratio",
        "s1_ratio",
        "pdsr_ratio",
        "pdsr_vs_fifo",
        "efficiency_best",
    ),
    "bench_simulator": _SIM_VALIDATION,
    "bench_simulator_longtail": _SIM_VALIDATION,
    "bench_simulator_whatif": _SIM_VALIDATION,
    "bench_redis_fsync": ("always_completions_per_s", "everysec_completions_per_s", "ratio"),
    "bench_soak": (
        "versions",
        "redis_mem_slope_bytes_per_version",
        "aof_bytes_max",
        "stream_len_max",
        "violations",
    ),
    "bench_weights": ("model", "gateways", "stream_s", "snapshot_s", "trainer_copies"),
    "chaos": (*_CHAOS, "violations"),
    "chaos_vllm": _CHAOS,
    "demo": ("val_acc_before", "val_acc_after", "steps", "wall_s"),
    "simulate_speed": ("engines", "versions", "sync_cpu_s", "async_cpu_s", "fully_async_cpu_s", "pdsr_cpu_s"),
    "simulate_cluster": ("cluster", "engines", "valid_rate", "fifo_vs_sync", "s1_vs_sync", "pdsr_vs_sync"),
    "simulate_whatif_grid": ("rows", "engines", "batch", "versions", "cpu_s"),
}


def parse_result(line: str) -> dict[str, Any]:
    """The `key=value` fields of a RESULT line, numbers as int or float (`…` and bare words skipped)."""
    fields: dict[str, Any] = {}
    for token in line.removeprefix("RESULT").split():
        key, sep, raw = token.partition("=")
        if not sep or not key:
            continue
        value: Any = raw
        for kind in (int, float):
            try:
                value = kind(raw)
                break
            except ValueError:
                continue
        fields[key] = value
    return fields


def load(path: Path) -> list[dict[str, Any]]:
    """The records of one bench/results/<bench>.jsonl, in file order."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def problems(record: dict[str, Any]) -> list[str]:
    """What is missing or malformed in one record (empty: well-formed)."""
    out = [f"no {key!r}" for key in REQUIRED_KEYS if key not in record]
    machine_ = record.get("machine")
    if not isinstance(machine_, dict):
        out.append("'machine' is not an object")
    else:
        out += [f"no 'machine.{key}'" for key in MACHINE_KEYS if key not in machine_]
    if not str(record.get("result", "")).startswith("RESULT "):
        out.append("'result' is not a RESULT line")
    if not isinstance(record.get("fields"), dict):
        out.append("'fields' is not an object")
    try:
        datetime.datetime.fromisoformat(str(record.get("date")))
    except ValueError:
        out.append(f"'date' {record.get('date')!r} is not an ISO 8601 date")
    return out


def _figures(bench: str, record: dict[str, Any]) -> str:
    """The bench's key fields of one record, as the RESULT line wrote them (0.080 stays 0.080)."""
    raw = {k: v for k, _, v in (t.partition("=") for t in record["result"].split()[1:])}
    fields = {**{k: str(v) for k, v in record["fields"].items()}, **raw}
    keys = KEY_FIELDS.get(bench) or tuple(fields)[:6]
    return " ".join(f"{k}={fields[k]}" for k in keys if k in fields)


def summary(results_dir: Path = RESULTS_DIR) -> str:
    """SUMMARY.md: per bench and command, the latest run (every record of its latest date) with
    its key figures, newest command first within a bench."""
    lines = [
        "# Benchmark results: the latest run of each bench and command",
        "",
        "Generated by `python bench/results.py summary` (`make bench-summary`) from the records in",
        "this folder, one JSON line per run (bench/README.md says what each bench measures and how to",
        "read its fields). † marks records imported from figures the docs stated, whose RESULT line may",
        "hold only the fields quoted there. Do not edit by hand.",
        "",
        "| bench | command | latest | commit | key figures | runs | data |",
        "|---|---|---|---|---|---|---|",
    ]
    for path in sorted(results_dir.glob("*.jsonl")):
        bench = path.stem
        by_command: dict[str, list[dict[str, Any]]] = {}
        for record in load(path):
            by_command.setdefault(record["command"], []).append(record)
        latest_first = sorted(by_command.items(), key=lambda kv: max(r["date"] for r in kv[1]), reverse=True)
        for command, records in latest_first:
            newest = max(r["date"] for r in records)
            latest = [r for r in records if r["date"] == newest]
            figures = " · ".join(
                _figures(bench, r) + (" †" if r.get("source") == IMPORTED else "") for r in latest
            )
            commits = ", ".join(dict.fromkeys(r["commit"][:7] for r in latest))
            cells = [
                bench,
                f"`{command}`",
                newest[:10],
                commits,
                figures,
                str(len(records)),
                f"[{path.name}]({path.name})",
            ]
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def write_summary(results_dir: Path = RESULTS_DIR) -> Path:
    path = results_dir / SUMMARY_PATH.name
    path.write_text(summary(results_dir))
    return path


def run_and_record(bench: str, cmd: list[str], results_dir: Path | None = None) -> int:
    """Run a benchmark command, its output passed through as it comes, and append its last
    `RESULT` line to bench/results/<bench>.jsonl (with the load average before and after). A run
    that fails or prints no RESULT line records nothing and keeps its exit code."""
    import subprocess

    load_before = os.getloadavg()
    result = ""
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, bufsize=1) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            if line.startswith("RESULT "):
                result = line.strip()
    if proc.returncode != 0:
        return proc.returncode
    if not result:
        print(f"{bench}: no RESULT line: nothing recorded", file=sys.stderr)
        return 1
    load = [round(x, 2) for x in (*load_before, *os.getloadavg())]
    command = " ".join([Path(cmd[0]).name, *cmd[1:]])
    path = append_result(
        bench, result, parse_result(result), results_dir, command=command, load_avg_before_after=load
    )
    print(f"recorded in {path}")
    return 0


def main(argv: list[str]) -> int:
    if len(argv) > 3 and argv[1] == "run" and argv[3] == "--":
        return run_and_record(argv[2], argv[4:])
    if argv[1:] == ["summary"]:
        print(f"wrote {write_summary()}")
        return 0
    if argv[1:] == ["check"]:
        bad = [
            f"{path.name}:{i}: {p}"
            for path in sorted(RESULTS_DIR.glob("*.jsonl"))
            for i, record in enumerate(load(path), 1)
            for p in problems(record)
        ]
        if SUMMARY_PATH.read_text() != summary():
            bad.append(f"{SUMMARY_PATH.name} is stale: run python bench/results.py summary")
        print("\n".join(bad) or "ok")
        return 1 if bad else 0
    print("usage: python bench/results.py summary|check|run BENCH -- COMMAND…", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
