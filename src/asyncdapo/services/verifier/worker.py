"""The scoring worker process: chunks in, one result per item out, its current item in shared memory.

Protocol (parent = `pool.WorkerPool`):
- after warming up, the worker sends `("ready", pid)` once;
- the parent sends a chunk `(soft_timeout_s, [(seq, ground_truth, response), …])` only to an idle
  worker; the worker scores the items in order and sends their results as lists of records (see
  protocol.py), at the end of the chunk or once the oldest unsent result is `FLUSH_AFTER_S` old;
- before starting item `seq` it writes `state[START] = time.monotonic()` and then `state[SEQ] = seq`
  (in this order, so a reader never pairs a new seq with an old start); after the item it writes
  `state[SEQ] = IDLE`. The parent's watchdog kills the worker when its current item is past its
  hard deadline; CLOCK_MONOTONIC is shared by all processes of the machine.
- EOF on the task pipe means shut down.

Inside the worker, a one-shot SIGALRM at `soft_timeout_s` (math-verify's own mechanism, see
math_verdict.py) ends interruptible stalls cheaply, without losing the process.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
from multiprocessing.connection import Connection
from types import ModuleType
from typing import Any

from asyncdapo.contracts.verifier_api import ItemStatus
from asyncdapo.services.verifier.protocol import IDLE, SEQ, START, Record, Verdict, encode

# Results are sent when the chunk ends or when the oldest unsent one is this old: one message per
# few items instead of one per item, at a latency cost of at most this much. A killed worker's
# unsent results are recomputed elsewhere (kills are rare).
FLUSH_AFTER_S = 0.02
_PR_SET_PDEATHSIG = 1

_WARMUP = (
    ("18", "She makes 9 * 2 = $18 every day.\nA: 18"),
    ("\\frac{1}{2}", "So the answer is $\\boxed{\\frac{2}{4}}$."),
    ("$[0,1)$", "The interval is $[0, 1)$"),
    ("x^2+1", "Final answer: (x+1)^2 - 2x"),
)


def _scoring() -> ModuleType:
    # sympy and math-verify load in workers (and the forkserver), never in the service process.
    from asyncdapo.services.verifier import math_verdict as scoring

    return scoring


class _Alarm:
    """One-shot SIGALRM raising math-verify's TimeoutException while armed (a late signal is ignored).

    `arm` installs the handler when another one is in place (and leaves it installed: restoring a
    default handler could let a late signal kill the process).
    """

    armed = False

    @staticmethod
    def handler(signum: int, frame: Any) -> None:
        if _Alarm.armed:
            _Alarm.armed = False
            raise _scoring().TimeoutException("item exceeded its time budget")

    @staticmethod
    def arm(seconds: float | None) -> None:
        if seconds is not None:
            if signal.getsignal(signal.SIGALRM) is not _Alarm.handler:
                signal.signal(signal.SIGALRM, _Alarm.handler)
            _Alarm.armed = True
            signal.setitimer(signal.ITIMER_REAL, seconds)

    @staticmethod
    def disarm() -> None:
        _Alarm.armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)


def score_guarded(ground_truth: str, response: str, soft_timeout_s: float | None) -> Verdict:
    """`score_pair` under the item's alarm; never raises for a bad item.

    The alarm is one-shot and its handler disarms before raising, so at most one TimeoutException
    exists per item, and wherever it lands (inside the scoring or in the inner `finally`) the outer
    handler turns it into the `timeout` verdict.
    """
    scoring = _scoring()
    try:
        _Alarm.arm(soft_timeout_s)
        try:
            return scoring.score_pair(ground_truth, response)
        finally:
            _Alarm.disarm()
    except scoring.TimeoutException:
        return Verdict(ItemStatus.TIMEOUT, error=f"scoring exceeded {soft_timeout_s:.2f} s (in-worker alarm)")
    except Exception as err:  # a bug outside math-verify's own error handling: report, keep serving
        return Verdict(ItemStatus.ERROR, error=f"{type(err).__name__}: {err}"[:500])


def _die_with_parent() -> None:
    # Not on Linux: EOF on the task pipe still ends an idle worker.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def worker_main(tasks: Connection, results: Connection, state: Any) -> None:
    # The parent owns shutdown (it closes the task pipe): a Ctrl-C or SIGTERM sent to the whole
    # process group must not kill workers mid-item and turn their items into crashes. Should the
    # parent (the service, or its forkserver) die without closing, the kernel kills the worker.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _die_with_parent()
    state[SEQ] = IDLE
    for gold, response in _WARMUP:
        score_guarded(gold, response, 30.0)
    results.send(("ready", os.getpid()))
    while True:
        try:
            soft_timeout_s, items = tasks.recv()
        except (EOFError, OSError):
            return
        unsent: list[Record] = []
        oldest = 0.0
        for k, (seq, gold, response) in enumerate(items):
            state[START] = time.monotonic()
            state[SEQ] = float(seq)
            t0 = time.perf_counter()
            verdict = score_guarded(gold, response, soft_timeout_s)
            state[SEQ] = IDLE
            now = time.perf_counter()
            if not unsent:
                oldest = now
            unsent.append(encode(seq, verdict, now - t0))
            if k == len(items) - 1 or now - oldest >= FLUSH_AFTER_S:
                results.send(unsent)
                unsent = []
