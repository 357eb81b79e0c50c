"""The rollout core's vocabulary: its phases, the commands it answers with, the observer it reports
to and the counts it keeps.

Apart from `asyncdapo.services.scheduler.core` so that both halves of the core — admission and responses
(`core`) and outcomes (`core_outcomes`) — and their drivers (`rollout`, the simulator) name the
same types without importing each other; `core` re-exports every name here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol

from asyncdapo.contracts.v1 import scheduler_pb2
from asyncdapo.services.scheduler.outcome_records import DropReason, RequeueReason
from asyncdapo.services.scheduler.policy.long_tail import LongTailAction
from asyncdapo.services.scheduler.tasks import LengthStats, PromptTask, Request

# why an attempt left the rollout without a committed group (the outcome's label)
Reason = DropReason | RequeueReason


class Phase:
    IDLE: Final = scheduler_pb2.RUN_PHASE_IDLE
    ROLLING: Final = scheduler_pb2.RUN_PHASE_ROLLING
    BOUND: Final = scheduler_pb2.RUN_PHASE_BOUND
    STOPPING: Final = scheduler_pb2.RUN_PHASE_STOPPING
    STOPPED: Final = scheduler_pb2.RUN_PHASE_STOPPED


# --------------------------------------------------------------------------- commands
@dataclass(frozen=True, slots=True)
class Dispatch:
    """Place these new requests (tail of the dispatch queue)."""

    requests: list[Request]


@dataclass(frozen=True, slots=True)
class Redispatch:
    """Place this request again at the head (a capped response continuing on the heavy pool)."""

    request: Request


@dataclass(frozen=True, slots=True)
class Abort:
    """Abort whatever these (already cancelled) tasks still run on gateways."""

    tasks: list[PromptTask]


@dataclass(slots=True)
class ScoreResponse:
    """Send one finished response to the verifier. Read-only by convention, `__init__` written out:
    one per response (see tests/unit/test_record_inits.py)."""

    request_id: str
    token_ids: Sequence[int]
    ground_truth: str
    task: PromptTask
    idx: int

    def __init__(
        self, request_id: str, token_ids: Sequence[int], ground_truth: str, task: PromptTask, idx: int
    ) -> None:
        self.request_id = request_id
        self.token_ids = token_ids
        self.ground_truth = ground_truth
        self.task = task
        self.idx = idx


Command = Dispatch | Redispatch | Abort | ScoreResponse


class CoreObserver(Protocol):
    """What the core reports as it goes (metrics live outside it: Prometheus in the service,
    counters in the simulator)."""

    def outcome(self, outcome: str, reason: str, attempt: int) -> None: ...
    def committed(self, staleness: int) -> None: ...
    def completions(self, count: int, tokens: int) -> None: ...
    def early_stop(self) -> None: ...
    def long_tail(self, action: LongTailAction, tokens: int = 0) -> None: ...


class NullObserver:
    def outcome(self, outcome: str, reason: str, attempt: int) -> None:
        pass

    def committed(self, staleness: int) -> None:
        pass

    def completions(self, count: int, tokens: int) -> None:
        pass

    def early_stop(self) -> None:
        pass

    def long_tail(self, action: LongTailAction, tokens: int = 0) -> None:
        pass


@dataclass
class RunCounts:
    """Complete groups judged so far (for the running valid rate) and the sync batch."""

    seq: int = 0  # admission order of the next attempt
    finished_groups: int = 0
    valid_groups: int = 0
    batch_admitted: int = 0  # sync mode: prompts in the current generation batch
    early_stops: int = 0
    gen_batches: int = 0  # sync mode: generation batches of the current step (max_num_gen_batches)
    # pdsr: final responses, those that hit the fast pool's cap and continued on the heavy pool,
    # the groups with at least one, and the partial tokens the heavy pool prefilled again
    long_tail_responses: int = 0
    capped_responses: int = 0
    capped_groups: int = 0
    continued_tokens: int = 0
    lengths: LengthStats = field(default_factory=LengthStats)
