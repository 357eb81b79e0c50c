"""Fault injection for crash-recovery tests (test-only; inert unless the env variable is set).

`ASYNCDAPO_TRAINER_CRASH=POINT@STEP` makes the trainer process exit abruptly (os._exit, no
cleanup, like SIGKILL) when it reaches `POINT` while finishing training step `STEP` (1-based: the
step that produces policy version STEP). `POINT@STEP:raise` raises `SimulatedCrash` instead, for
in-process tests: everything durable (Redis, files) is then exactly as after a real crash.
"""

from __future__ import annotations

import os
import sys
from enum import StrEnum

ENV = "ASYNCDAPO_TRAINER_CRASH"
EXIT_CODE = 86


class CrashPoint(StrEnum):
    AFTER_UPDATE = "after_update"  # weights changed in memory, nothing durable yet
    AFTER_CHECKPOINT = "after_checkpoint"  # checkpoint durable, weights not published, groups not acked
    AFTER_PUBLISH = "after_publish"  # published, groups not acked
    AFTER_ACK = "after_ack"  # everything of the step done


class SimulatedCrash(BaseException):
    """Raised instead of exiting in `:raise` mode; BaseException so no `except Exception` eats it."""


def maybe_crash(point: CrashPoint, step: int) -> None:
    spec = os.environ.get(ENV)
    if not spec:
        return
    where, _, mode = spec.partition(":")
    name, _, at = where.partition("@")
    if name == point.value and at and int(at) == step:
        if mode == "raise":
            raise SimulatedCrash(f"{point.value}@{step}")
        print(f"fault injection: crashing at {point.value}@{step}", file=sys.stderr, flush=True)
        os._exit(EXIT_CODE)
