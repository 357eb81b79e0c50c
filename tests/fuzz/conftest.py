"""Fuzz tier hooks: count failed tests and write the tally (`FUZZ_REPORT`) when the session ends."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import fuzz_budget
import pytest

# the scheduler surface runs a scheduler with the scheduler integration tests' own harness
# (sim gateways, a Rollout on Redis, the outcome-ledger checks), imported by name as they do
sys.path.append(str(Path(__file__).parents[1] / "integration" / "scheduler"))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.failed:
        fuzz_budget.failures += 1


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if out := os.environ.get("FUZZ_REPORT"):
        fuzz_budget.write_report(Path(out))
