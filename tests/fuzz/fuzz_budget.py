"""How much the fuzz tier generates, the answer-time bound, and the tally `make fuzz` reports.

`FUZZ_EXAMPLES`: generated inputs per surface (default 40: the tier stays short in `make test`;
`make fuzz` raises it). A surface with several tests splits its share between them.
`FUZZ_BOUND_MS`: the longest any single input may take to be answered (default 10000 ms).
`FUZZ_REPORT`: a file the session writes its tally to (inputs and slowest answer per surface,
failed tests), which `fuzz_report.py` turns into the RESULT line.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hypothesis import HealthCheck, settings

SURFACES = ("verifier_http", "grpc", "scheduler_grpc", "trainingrun_spec", "dataset_loader")
PER_SURFACE = int(os.environ.get("FUZZ_EXAMPLES", "40"))
BOUND_MS = float(os.environ.get("FUZZ_BOUND_MS", "10000"))

_lock = threading.Lock()
_inputs: dict[str, int] = dict.fromkeys(SURFACES, 0)
_max_ms: dict[str, float] = dict.fromkeys(SURFACES, 0.0)
failures = 0


def examples(share: float = 1.0) -> int:
    """This test's example count: `share` of its surface's budget (at least 5)."""
    return max(5, round(PER_SURFACE * share))


def fuzz_settings(share: float = 1.0) -> settings:
    """Hypothesis settings of a fuzz test: its example count, no per-example deadline (the answer
    bound is checked explicitly, per input), no example database written into the checkout."""
    return settings(
        max_examples=examples(share),
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )


def record(surface: str, elapsed_ms: float) -> None:
    with _lock:
        _inputs[surface] += 1
        _max_ms[surface] = max(_max_ms[surface], elapsed_ms)


@contextmanager
def answered(surface: str, what: object) -> Iterator[None]:
    """Time one input's answer, count it, and fail when it took longer than the bound."""
    t0 = time.perf_counter()
    yield
    elapsed = (time.perf_counter() - t0) * 1000
    record(surface, elapsed)
    assert elapsed <= BOUND_MS, (
        f"{surface}: answered in {elapsed:.0f} ms, over the {BOUND_MS:.0f} ms bound: {what!r:.300}"
    )


def write_report(path: Path) -> None:
    with _lock:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            json.dumps(
                {"inputs": _inputs, "max_ms": _max_ms, "failures": failures, "bound_ms": BOUND_MS},
                indent=1,
            )
        )
