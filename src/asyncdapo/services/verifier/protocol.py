"""What travels between the pool and its worker processes, and how a verdict becomes a wire result.

Light on purpose (no sympy, no math-verify): the service process imports it; only workers import
`math_verdict`. Messages are plain tuples of builtins: pickling a NamedTuple or an enum costs ~20 µs,
a sizeable share of a ~1 ms item.

- parent → worker: `Chunk = (soft_timeout_s, [(seq, ground_truth, response), …])`;
- worker → parent: `("ready", pid)` once, then lists of `Record = (seq, status, acc, pred, error,
  seconds)` — a list holds every result since the previous one (see worker.py for when it flushes).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from asyncdapo.contracts.verifier_api import ItemStatus

# Slots of a worker's shared state array: the item it is on (IDLE between items) and when it began.
SEQ, START = 0, 1
IDLE = -1.0

Chunk = tuple[float | None, list[tuple[int, str, str]]]
Record = tuple[int, str, bool | None, str | None, str | None, float]


class Verdict(NamedTuple):
    status: ItemStatus
    acc: bool | None = None
    pred: str | None = None
    error: str | None = None


def encode(seq: int, verdict: Verdict, seconds: float) -> Record:
    return (seq, verdict.status.value, verdict.acc, verdict.pred, verdict.error, seconds)


def decode(record: Record) -> tuple[int, Verdict, float]:
    seq, status, acc, pred, error, seconds = record
    return seq, Verdict(ItemStatus(status), acc, pred, error), seconds


def result_fields(item_id: str, verdict: Verdict) -> dict[str, Any]:
    """The wire result (an `ItemResult` as a dict); only an `ok` verdict carries a score, so a
    failure never reads as 0."""
    if verdict.status is ItemStatus.OK:
        if verdict.acc is None:
            raise ValueError(f"an ok verdict for {item_id!r} must carry acc")
        return {
            "id": item_id,
            "status": "ok",
            "score": 1.0 if verdict.acc else 0.0,
            "acc": verdict.acc,
            "pred": verdict.pred if verdict.pred is not None else "",
            "error": None,
        }
    return {
        "id": item_id,
        "status": verdict.status.value,
        "score": None,
        "acc": None,
        "pred": None,
        "error": verdict.error or verdict.status.value,
    }
