"""What an admitted attempt's outcome is and how it is written: the outcomes, their reasons, the
item FINISH takes and the result it answers. Pure records, apart from `group_state` (Redis, Lua)
because the rollout core decides outcomes without I/O (import-linter keeps it so)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Outcome(StrEnum):
    VALID = "valid"
    FILTERED = "filtered"
    REQUEUED = "requeued"
    DROPPED = "dropped"


class DropReason(StrEnum):
    VERIFIER_ERROR = "verifier_error"  # the verifier stayed down through every retry (finite retries only)
    UNSCORABLE = "unscorable"  # the verifier judged one response unscorable for good (invalid, timeout)
    BAD_PROMPT = "bad_prompt"  # the prompt's data is missing or malformed
    PROMPT_TOO_LONG = "prompt_too_long"  # longer than data.max_prompt_length
    GATEWAY_ERROR = "gateway_error"  # a request failed on every gateway it was tried on
    EARLY_STOP = "early_stop"  # aborted by early stop with requeue_aborted off
    SURPLUS = "surplus"  # sync mode: a valid group beyond B, consumed for the epoch (as verl does)


class RequeueReason(StrEnum):
    EARLY_STOP = "early_stop"  # aborted when the bound was reached
    OVER_BOUND = "over_bound"  # valid, but the bound was reached first (decided in Lua)
    SCHEDULER_RESTART = "scheduler_restart"  # claimed by a scheduler that was replaced (fenced)
    STOPPED = "stopped"  # StopRun aborted it
    STALE = "stale"  # valid, but the step that would consume it finds it stale (decided in Lua)
    SHUTDOWN = "shutdown"  # the scheduler shut down gracefully and released its claims
    ORPHANED = "orphaned"  # claimed by this scheduler but held by no task (a lost reply, a rollback)


@dataclass(frozen=True, slots=True)
class FinishItem:
    pid: str
    attempt: int
    outcome: Outcome
    reason: str = ""
    bound: int = -1  # valid only: the bound checked atomically (-1: none)
    group: bytes = b""  # valid only: the serialized rollout_pb2.Group
    min_version: int = 0  # valid only: the oldest token version of the group (staleness rule)


@dataclass(frozen=True, slots=True)
class FinishResult:
    # valid | filtered | requeued:<reason> | dropped:<reason>, or dup:<stored label> / stale / fenced
    label: str
    produced: int  # counters.valid_produced after this attempt (valid groups XADDed, all versions)
    credited: int  # counters.valid_credited: groups the trainer dropped, credited back to the bound

    @property
    def valid_produced(self) -> int:
        """Effective valid groups: what the bound applies to."""
        return self.produced - self.credited

    @property
    def outcome(self) -> str:
        return self.label.split(":", 1)[0]

    @property
    def fenced(self) -> bool:
        return self.label == "fenced"

    @property
    def recorded(self) -> tuple[str, str] | None:
        """(outcome, reason) this result says the attempt has, also for a repeat (`dup:`) whose
        first reply was lost; None when nothing is known (stale, fenced)."""
        label = self.label.removeprefix("dup:")
        if label in ("stale", "fenced"):
            return None
        outcome, _, reason = label.partition(":")
        return outcome, reason
