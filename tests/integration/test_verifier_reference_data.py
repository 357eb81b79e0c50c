"""The verifier against public reference data (../shared/data; skipped when absent).

- math-verify-cases/cases.json: 235 (gold, pred) pairs with math-verify 0.9's own verdict. The service
  must reproduce it exactly (measured: 235/235 = 100%).
- gsm8k/example_model_solutions.jsonl: 4 real model solutions for each of the 1,319 test questions
  (5,276), each with the upstream `is_correct` label; gold = the number after `####` in test.jsonl
  (identical to the `A:` line of the file's own `ground_truth`). Measured agreement: 5,276/5,276 =
  100% both for the whole solution as the response (what a policy sends) and for the text after
  its last `A:` marker (the answer line), so both are asserted exact.
"""

from __future__ import annotations

import importlib.metadata
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from asyncdapo.contracts.verifier_api import ItemResult, ItemStatus, ScoreItem
from asyncdapo.runtime.verifier_client import VerifierClient
from asyncdapo.tools.local.local_server import VerifierServer

SOLVERS = ("6b_finetuning", "6b_verification", "175b_finetuning", "175b_verification")


@pytest.fixture(scope="module")
def verifier(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VerifierServer]:
    log = Path(tmp_path_factory.mktemp("verifier-ref")) / "verifier.log"
    with VerifierServer(workers=2, timeout_s=5.0, log_path=log) as server:
        yield server


async def _score(verifier: VerifierServer, items: list[ScoreItem]) -> list[ItemResult]:
    async with VerifierClient(verifier.url, batch_size=256, max_concurrency=4) as client:
        return await client.score(items)


def _all_ok(results: list[ItemResult]) -> None:
    failed = [r for r in results if r.status is not ItemStatus.OK]
    assert not failed, f"{len(failed)} items not scored, e.g. {failed[:3]}"


async def test_reproduces_math_verify_verdicts_exactly(shared_data: Path, verifier: VerifierServer) -> None:
    # The recorded verdicts are math-verify 0.9's: the installed one must be that version.
    assert importlib.metadata.version("math-verify").startswith("0.9.")
    cases = json.loads((shared_data / "math-verify-cases" / "cases.json").read_text())
    items = [ScoreItem(id=str(k), response=c["pred"], ground_truth=c["gold"]) for k, c in enumerate(cases)]
    results = await _score(verifier, items)
    _all_ok(results)
    service = [int(bool(r.acc)) for r in results]
    recorded = [c["math_verify_0_9"] for c in cases]
    agree = sum(s == r for s, r in zip(service, recorded, strict=True))
    print(
        f"\nmath-verify cases: service agrees with math-verify 0.9 on {agree}/{len(cases)} "
        f"({agree / len(cases):.2%})"
    )
    mismatches = [
        (c["source"], c["gold"], c["pred"][:80])
        for c, s, r in zip(cases, service, recorded, strict=True)
        if s != r
    ]
    assert not mismatches, mismatches
    assert recorded == [c["expected"] for c in cases]


def _gsm8k(shared_data: Path) -> list[tuple[str, str, bool]]:
    """(gold, solution, is_correct) for all model solutions, gold from test.jsonl's `#### N`."""
    root = shared_data / "gsm8k"
    tests = [json.loads(line) for line in (root / "test.jsonl").read_text().splitlines()]
    rows = [json.loads(line) for line in (root / "example_model_solutions.jsonl").read_text().splitlines()]
    assert len(rows) == len(tests) == 1319
    out = []
    for row, test in zip(rows, tests, strict=True):
        assert row["question"] == test["question"]
        gold = test["answer"].rsplit("####", 1)[1].strip().replace(",", "")
        assert gold == row["ground_truth"].rsplit("A:", 1)[1].strip().replace(",", "")
        out += [(gold, row[s]["solution"], row[s]["is_correct"]) for s in SOLVERS]
    return out


def _answer_line(solution: str) -> str:
    """Text after the last `A:` marker (11 solutions have none: then the whole solution)."""
    return solution.rsplit("A:", 1)[-1]


@pytest.mark.parametrize("variant", ["whole solution", "after last A:"])
async def test_agrees_with_gsm8k_labels(shared_data: Path, verifier: VerifierServer, variant: str) -> None:
    data = _gsm8k(shared_data)
    assert len(data) == 5276
    prepare = (lambda s: s) if variant == "whole solution" else _answer_line
    items = [
        ScoreItem(id=str(k), response=prepare(sol), ground_truth=gold)
        for k, (gold, sol, _) in enumerate(data)
    ]
    t0 = time.monotonic()
    results = await _score(verifier, items)
    elapsed = time.monotonic() - t0
    _all_ok(results)
    agree = sum(r.acc == label for r, (_, _, label) in zip(results, data, strict=True))
    print(
        f"\nGSM8K ({variant}): {agree}/{len(data)} = {agree / len(data):.2%} agree with is_correct; "
        f"{len(data)} items in {elapsed:.1f} s ({len(data) / elapsed:.0f} items/s, 2 workers)"
    )
    disagreements = [
        (gold, sol[-80:], label)
        for r, (gold, sol, label) in zip(results, data, strict=True)
        if r.acc != label
    ]
    assert agree == len(data), disagreements[:10]
