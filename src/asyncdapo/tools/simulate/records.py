"""SIMULATOR: what one simulated run records and returns — the response the core reads, the trained
groups, a step's record, the run's counts (the core's observer) and the result. Split out of
`simulate.driver`, which fills them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from asyncdapo.contracts.v1 import common_pb2
from asyncdapo.services.scheduler.policy.long_tail import LongTailAction


class VersionRun:
    """A gateway's VersionRun: `num_tokens` generated under weights `version`. A slotted class, not
    a NamedTuple, whose `_make` is Python: one or more per response."""

    __slots__ = ("num_tokens", "version")

    def __init__(self, version: int, num_tokens: int) -> None:
        self.version = version
        self.num_tokens = num_tokens


class SimResponse:
    """A simulated gateway's response, as the scheduler reads one (`tasks.ResponseView`): the token
    ids' length (a `range`), the version runs, the finish reason; no logprobs, no gateway timing."""

    __slots__ = ("finish_reason", "generate_s", "logprobs", "queue_s", "token_ids", "version_runs")

    def __init__(
        self, length: int, runs: Sequence[Sequence[int]], finish_reason: common_pb2.FinishReason
    ) -> None:
        self.token_ids = range(length)
        self.logprobs: tuple[float, ...] = ()
        self.version_runs = [VersionRun(r[0], r[1]) for r in runs]
        self.finish_reason = finish_reason
        self.queue_s = 0.0
        self.generate_s = 0.0


@dataclass(slots=True)
class TrainedGroup:
    index: int  # prompt index in the workload
    attempt: int
    min_version: int
    lengths: list[int]
    prompt: int


@dataclass
class StepRecord:
    """One training step: the trainer's timeline and what it trained."""

    version: int  # the version this step produced
    t_free: float  # the trainer was ready for this step's batch
    t_data: float  # B groups were there
    t_trained: float
    t_published: float  # every engine serves `version`
    train_s: float
    sync_s: float
    tokens: int  # response tokens trained
    lengths_mean: float
    staleness: list[int]
    attempts: list[int]
    longest: int
    prompt_tokens: int = 0  # prompt tokens of the trained sequences (each group's prompt n times)


class Counts:
    """The core's observer: what Prometheus counts in the service."""

    def __init__(self) -> None:
        self.outcomes: Counter[str] = Counter()
        self.committed_staleness: Counter[int] = Counter()
        self.completed = 0
        self.completed_tokens = 0
        self.early_stops = 0
        self.long_tail_actions: Counter[str] = Counter()

    def outcome(self, outcome: str, reason: str, attempt: int) -> None:
        self.outcomes[f"{outcome}:{reason}" if reason else outcome] += 1

    def committed(self, staleness: int) -> None:
        self.committed_staleness[staleness] += 1

    def completions(self, count: int, tokens: int) -> None:
        self.completed += count
        self.completed_tokens += tokens

    def early_stop(self) -> None:
        self.early_stops += 1

    def long_tail(self, action: LongTailAction, tokens: int = 0) -> None:
        self.long_tail_actions[str(action)] += 1


@dataclass
class SimResult:
    steps: list[StepRecord]
    counts: Counts
    sim_s: float
    engines: int
    busy_s: float
    decode_tokens: int
    prefill_tokens: float
    aborted_tokens: int
    preemptions: int
    events: int
