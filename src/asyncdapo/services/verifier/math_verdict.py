"""One (ground truth, response) pair through math-verify, with its timeouts made visible.

Extraction is math-verify 0.9's default for both sides: LaTeX (with `\\boxed{}` at priority 50, i.e.
before everything but an explicit "final answer is …") + plain expressions, `fallback_mode =
first_match`, then `verify(gold, pred)` with its defaults (float_rounding 6, strict).

How math-verify 0.9 hides timeouts: its `timeout` decorator arms `signal.alarm` and raises
`math_verify.errors.TimeoutException`, a `BaseException`. With `raise_on_error=False` (the default)
`parse` catches it, logs a warning and returns `[]`, and `verify` catches it per (gold, pred) pair,
logs a warning and counts the pair as False — an unfinished computation looks exactly like "no
answer" or "wrong answer". Here math-verify's own alarms are off (timeouts `None`): the worker
arms one wall-clock alarm per item whose handler raises that same `TimeoutException`, and this
module calls math-verify with `raise_on_error=True` so the exception reaches the worker. Other
exceptions are mapped back to math-verify's defaults (`[]` for `parse`, False for a pair in
`verify`, pairs tried in the same order with the same short-circuit), so every finished item gets
exactly math-verify's verdict.

Ground truths are parsed once per worker (an LRU cache): a group's n responses share one, and its
parse is a third (GSM8K) to two thirds (short synthetic answers) of an item's time. `parse` is a
pure function of the text and its results (sympy objects, strings) are immutable, so a cached
parse gives the same verdict; a parse cut short by the alarm raises and is not cached.

`score_pair` must run in the main thread of its process and lets `TimeoutException` propagate.
"""

from __future__ import annotations

import functools
import logging
from itertools import product
from typing import Any

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
from math_verify.errors import TimeoutException

from asyncdapo.contracts.verifier_api import ItemStatus
from asyncdapo.services.verifier.protocol import Verdict

__all__ = ["MAX_PRED_CHARS", "TimeoutException", "Verdict", "score_pair"]

EXTRACTION = (LatexExtractionConfig(), ExprExtractionConfig())
MAX_PRED_CHARS = 256
GOLD_CACHE_SIZE = 8192  # ground truths per worker: a few MB of small sympy expressions

# math-verify only logs at WARNING level to announce a disabled or expired timeout; both are
# handled here (the worker's alarm, the `timeout` status), so its warnings would only be noise.
logging.getLogger("math_verify").setLevel(logging.ERROR)


def score_pair(ground_truth: str, response: str) -> Verdict:
    """math-verify's verdict on `response` against `ground_truth`; raises TimeoutException."""
    gold = _parse_gold(ground_truth)
    if not gold:
        # math-verify would call every answer wrong; that is a dataset bug, not a wrong answer.
        return Verdict(ItemStatus.ERROR, error="ground_truth holds no answer math-verify can parse")
    pred = _parse(response)
    return Verdict(ItemStatus.OK, acc=_verify(gold, pred), pred=_pred_text(pred))


def _parse(text: str) -> list[Any]:
    try:
        return parse(text, extraction_config=EXTRACTION, parsing_timeout=None, raise_on_error=True)
    except Exception:  # math-verify's default for a failed parse
        return []


@functools.lru_cache(maxsize=GOLD_CACHE_SIZE)
def _parse_gold(text: str) -> tuple[Any, ...]:
    return tuple(_parse(text))


def _verify(gold: tuple[Any, ...], pred: list[Any]) -> bool:
    for g, p in product(gold, pred):
        try:
            if verify(g, p, timeout_seconds=None, raise_on_error=True):
                return True
        except Exception:  # math-verify's default for a failed comparison
            continue
    return False


def _pred_text(pred: list[Any]) -> str:
    """The answer as written in the response (the string match) when math-verify kept it."""
    if not pred:
        return ""
    text = next((p for p in pred if isinstance(p, str)), None)
    if text is None:
        text = str(pred[0])  # may be slow for a huge expression: still under the item's alarm
    return text[:MAX_PRED_CHARS]
