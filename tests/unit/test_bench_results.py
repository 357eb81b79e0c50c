"""bench/results: every record is well-formed, and the committed SUMMARY.md is what the generator
makes of the records now (a record added without regenerating it fails here)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def _results_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_results", REPO / "bench" / "results.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


results = _results_module()
RECORD_FILES = sorted((REPO / "bench" / "results").glob("*.jsonl"))


def test_there_are_records_and_a_summary() -> None:
    assert RECORD_FILES, "bench/results/*.jsonl: no records"
    assert results.SUMMARY_PATH.is_file(), (
        "bench/results/SUMMARY.md is missing: run python bench/results.py summary"
    )


def test_the_committed_summary_is_what_the_generator_makes_now() -> None:
    assert results.SUMMARY_PATH.read_text() == results.summary(), (
        "bench/results/SUMMARY.md is stale: run `python bench/results.py summary` (make bench-summary)"
    )


@pytest.mark.parametrize("path", RECORD_FILES, ids=lambda p: p.name)
def test_every_record_has_the_required_keys(path: Path) -> None:
    for i, line in enumerate(path.read_text().splitlines(), 1):
        assert line.strip(), f"{path.name}:{i}: an empty line"
        record = json.loads(line)
        assert not results.problems(record), f"{path.name}:{i}: {results.problems(record)}"
        assert set(results.REQUIRED_KEYS) <= record.keys()
        assert len(record["commit"]) == 40, f"{path.name}:{i}: commit {record['commit']!r} is not a full hash"


@pytest.mark.parametrize("path", RECORD_FILES, ids=lambda p: p.name)
def test_every_records_fields_agree_with_its_result_line(path: Path) -> None:
    for i, record in enumerate(results.load(path), 1):
        parsed = results.parse_result(record["result"])
        for key, value in parsed.items():
            assert key in record["fields"], f"{path.name}:{i}: {key} is in the RESULT line but not in fields"
            expected = pytest.approx(value) if isinstance(value, float) else value
            assert record["fields"][key] == expected, f"{path.name}:{i}: {key}"


def test_every_bench_with_records_names_its_key_figures() -> None:
    missing = [p.stem for p in RECORD_FILES if p.stem not in results.KEY_FIELDS]
    assert not missing, f"add the key RESULT fields of {missing} to KEY_FIELDS in bench/results.py"


def test_parse_result_types_numbers_and_keeps_words_and_ranges() -> None:
    fields = results.parse_result("RESULT a=1 b=0.080 c=sync-1.5B d=0.92-1.09 … e=1.1e-06")
    assert fields == {"a": 1, "b": 0.08, "c": "sync-1.5B", "d": "0.92-1.09", "e": 1.1e-06}


def test_the_summary_shows_the_latest_run_of_each_command(tmp_path: Path) -> None:
    def record(date: str, command: str, line: str) -> str:
        row = {
            "date": date,
            "commit": "a" * 40,
            "machine": dict.fromkeys(results.MACHINE_KEYS),
            "command": command,
            "result": line,
            "fields": results.parse_result(line),
        }
        return json.dumps(row) + "\n"

    (tmp_path / "bench_e2e.jsonl").write_text(
        record("2026-01-01T00:00:00+00:00", "python bench/bench_e2e.py", "RESULT rollout_time_ratio=0.90")
        + record("2026-02-01T00:00:00+00:00", "python bench/bench_e2e.py", "RESULT rollout_time_ratio=0.80")
        + record(
            "2026-01-15T00:00:00+00:00", "python bench/bench_e2e.py --x", "RESULT rollout_time_ratio=0.70"
        )
    )
    rows = [line for line in results.summary(tmp_path).splitlines() if line.startswith("| bench_e2e")]
    assert len(rows) == 2
    assert "2026-02-01" in rows[0] and "rollout_time_ratio=0.80" in rows[0] and "| 2 |" in rows[0]
    assert "--x" in rows[1] and "rollout_time_ratio=0.70" in rows[1]


def test_a_bench_run_through_the_recorder_appends_its_result_and_refreshes_the_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = "print('warming up'); print('RESULT items_per_s=12.5 workers=2')"
    assert results.run_and_record("bench_verifier", [sys.executable, "-c", code], tmp_path) == 0
    assert "warming up" in capsys.readouterr().out  # the output passes through
    (record,) = results.load(tmp_path / "bench_verifier.jsonl")
    assert record["result"] == "RESULT items_per_s=12.5 workers=2"
    assert record["fields"] == {"items_per_s": 12.5, "workers": 2}
    assert record["command"].startswith("python") and len(record["load_avg_before_after"]) == 6
    assert results.problems(record) == []
    assert "12.5" in (tmp_path / "SUMMARY.md").read_text()


def test_a_failed_or_silent_bench_run_records_nothing(tmp_path: Path) -> None:
    assert (
        results.run_and_record(
            "bench_verifier", [sys.executable, "-c", "print('RESULT x=1'); raise SystemExit(3)"], tmp_path
        )
        == 3
    )
    assert (
        results.run_and_record("bench_verifier", [sys.executable, "-c", "print('no result')"], tmp_path) == 1
    )
    assert not (tmp_path / "bench_verifier.jsonl").exists()
