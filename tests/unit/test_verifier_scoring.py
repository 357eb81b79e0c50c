"""math-verify wrapped so that its silent timeouts surface as `timeout` (runs in the main thread)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from asyncdapo.contracts.verifier_api import ItemStatus
from asyncdapo.services.verifier.math_verdict import score_pair
from asyncdapo.services.verifier.worker import score_guarded

NESTED_FRAC = "$\\boxed{" + "\\frac{1}{" * 3000 + "2" + "}" * 3000 + "}$"


@pytest.mark.parametrize(
    ("gold", "response", "acc", "pred"),
    [
        ("18", "She makes 9 * 2 = $<<9*2=18>>18 every day.\nA: 18", True, "18"),
        ("18", "A: 26", False, "26"),
        ("0.5", "Thus the answer is $\\boxed{\\frac{1}{2}}$.", True, "\\frac{1}{2}"),
        ("1000", "The total is 1,000 dollars.", True, "1000"),
        ("3", "I don't know", False, ""),  # nothing to extract: a finished parse, a wrong answer
    ],
)
def test_verdicts(gold: str, response: str, acc: bool, pred: str) -> None:
    verdict = score_pair(gold, response)
    assert (verdict.status, verdict.acc, verdict.pred) == (ItemStatus.OK, acc, pred)


def test_unparsable_ground_truth_is_an_error_not_a_wrong_answer() -> None:
    verdict = score_pair("no answer here", "A: 3")
    assert verdict.status is ItemStatus.ERROR and verdict.acc is None
    assert "ground_truth" in (verdict.error or "")


def test_math_verify_hides_its_own_timeout_as_an_empty_parse() -> None:
    """The hazard this service exists to avoid: with its defaults, a timed-out parse looks like no answer.

    Run in a fresh interpreter: math-verify's timeout is a process-global SIGALRM, and the state other
    tests leave behind in this process (signal handlers, recursion limit) changes what it does."""
    code = f"from math_verify import parse\nprint(repr(parse({NESTED_FRAC!r}, parsing_timeout=1)))\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


@pytest.fixture()
def own_sigalrm() -> Iterator[None]:
    """score_guarded takes SIGALRM over (as in a worker process); give pytest-timeout's back."""
    previous = signal.getsignal(signal.SIGALRM)
    yield
    signal.signal(signal.SIGALRM, previous)


def test_in_worker_alarm_turns_a_stall_into_timeout(own_sigalrm: None) -> None:
    t0 = time.monotonic()
    verdict = score_guarded("2", NESTED_FRAC, soft_timeout_s=0.5)
    elapsed = time.monotonic() - t0
    assert verdict.status is ItemStatus.TIMEOUT and verdict.acc is None
    assert elapsed < 3.0
    # The alarm is disarmed afterwards: a normal item right after is scored normally.
    assert score_guarded("18", "A: 18", soft_timeout_s=0.5).acc is True


def test_a_ground_truth_is_parsed_once_and_gives_the_same_verdicts(monkeypatch: pytest.MonkeyPatch) -> None:
    from asyncdapo.services.verifier import math_verdict as scoring

    scoring._parse_gold.cache_clear()
    parsed: list[str] = []
    real = scoring._parse
    monkeypatch.setattr(scoring, "_parse", lambda text: parsed.append(text) or real(text))
    right = scoring.score_pair("\\frac{1}{2}", "so $\\boxed{0.5}$")
    wrong = scoring.score_pair("\\frac{1}{2}", "so $\\boxed{2}$")
    assert parsed.count("\\frac{1}{2}") == 1  # the second item reused the first one's parse
    assert (right.acc, wrong.acc) == (True, False)
    scoring._parse_gold.cache_clear()
    assert scoring.score_pair("\\frac{1}{2}", "so $\\boxed{0.5}$") == right
