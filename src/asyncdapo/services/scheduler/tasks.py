"""In-memory records of admitted prompts and their requests, and the Group record built from them.

A `PromptTask` is one attempt of one prompt (train) or one evaluation prompt; it owns `n`
`Request`s. A request is queued, in flight or finished (its response stored in the task). Request
ids carry the attempt and the dispatch try, so a late reply of an aborted attempt or of a
re-dispatched request can never be mistaken for a current one.

The records hold ids and data, never a handle on I/O: which gateway and stream a request runs on
is the dispatcher's (`Dispatcher.placed`, by request id), and what waits for an evaluation is the
driver's (`Rollout.evals`, eval_waiters.py) — the rollout core, which holds these records, does no I/O.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

from asyncdapo.contracts.v1 import common_pb2, gateway_pb2, rollout_pb2
from asyncdapo.services.scheduler.group_records import GroupProgress

TaskKey = tuple[str, int]  # (prompt id, attempt): one attempt of one prompt


class VersionRunView(Protocol):
    """A response's run of tokens generated under one weight version (`common_pb2.VersionRun`)."""

    @property
    def version(self) -> int: ...
    @property
    def num_tokens(self) -> int: ...


class ResponseView(Protocol):
    """What the scheduler reads of a finished generation: a gateway's `GenerateResponse`, or the
    simulator's `SimResponse`, which carries the length (a `range` for the token ids) and the
    version runs but no tokens."""

    @property
    def token_ids(self) -> Sequence[int]: ...
    @property
    def logprobs(self) -> Sequence[float]: ...
    @property
    def version_runs(self) -> Sequence[VersionRunView]: ...
    @property
    def finish_reason(self) -> common_pb2.FinishReason: ...
    @property
    def queue_s(self) -> float: ...
    @property
    def generate_s(self) -> float: ...


class Kind(Enum):
    TRAIN = 0
    EVAL = 1


@dataclass(slots=True, eq=False)
class Request:
    task: PromptTask
    idx: int
    tries: int = 0  # dispatches so far
    continuation: ResponseView | None = None  # partial tokens to continue from
    rid: str = ""  # of its latest dispatch (`make_rid`)
    t_ready: float = 0.0
    pool: str = ""  # gateway pool label to place it in ("" = any)
    max_tokens: int = 0  # overrides the task's sampling.max_tokens when > 0 (long-tail cap)

    # written out, as Score's: n per attempt (see tests/unit/test_record_inits.py)
    def __init__(
        self,
        task: PromptTask,
        idx: int,
        tries: int = 0,
        continuation: ResponseView | None = None,
        rid: str = "",
        t_ready: float = 0.0,
        pool: str = "",
        max_tokens: int = 0,
    ) -> None:
        self.task = task
        self.idx = idx
        self.tries = tries
        self.continuation = continuation
        self.rid = rid
        self.t_ready = t_ready
        self.pool = pool
        self.max_tokens = max_tokens

    def make_rid(self) -> str:
        t = self.task
        self.rid = f"{t.pid}:{t.attempt}:{self.idx}:{self.tries}"
        return self.rid


@dataclass(slots=True, eq=False)
class Score:
    score: float
    acc: float
    pred: str
    reward: float
    overlong_penalty: float

    # One per response: `__init__` written out, cheaper per object than the generated one
    # (tests/unit/test_record_inits.py says why, and keeps it equal to the dataclass's fields).
    def __init__(self, score: float, acc: float, pred: str, reward: float, overlong_penalty: float) -> None:
        self.score = score
        self.acc = acc
        self.pred = pred
        self.reward = reward
        self.overlong_penalty = overlong_penalty


@dataclass(slots=True, eq=False)
class PromptTask:
    kind: Kind
    pid: str
    attempt: int
    seq: int
    n: int
    prompt_token_ids: Sequence[int]
    ground_truth: str
    data_source: str = ""
    prompt_text: str = ""
    sampling: common_pb2.SamplingParams = field(default_factory=common_pb2.SamplingParams)
    version_admitted: int = 0
    responses: list[ResponseView | None] = field(default_factory=list)
    response_gateway: list[str] = field(default_factory=list)
    scores: list[Score | None] = field(default_factory=list)
    live: dict[int, Request] = field(default_factory=dict)  # queued or in flight
    gateways: set[str] = field(default_factory=set)  # where its requests went (prefix affinity)
    cancelled: bool = False  # aborted (early stop, stop): replies are only counted
    closed: bool = False  # an outcome is being or has been recorded
    group_complete: bool = False
    routed: bool = False  # pdsr: a response of this group continues on the heavy pool
    recorded: set[int] = field(default_factory=set)  # responses counted into the group state
    recording: set[int] = field(default_factory=set)  # responses whose RECORD is unanswered
    progress: GroupProgress | None = None  # of the completing response
    admitted_at: float = field(default_factory=time.monotonic)
    base_msg: gateway_pb2.GenerateRequest | None = None  # what every request of this task starts from

    def __post_init__(self) -> None:
        self.responses = [None] * self.n
        self.response_gateway = [""] * self.n
        self.scores = [None] * self.n

    @property
    def key(self) -> TaskKey:
        return (self.pid, self.attempt)

    def make_requests(self) -> list[Request]:
        """The task's n requests, registered as live."""
        reqs = [Request(self, i) for i in range(self.n)]
        self.live = {r.idx: r for r in reqs}
        return reqs

    def base_request(self) -> gateway_pb2.GenerateRequest:
        if self.prompt_token_ids:
            return gateway_pb2.GenerateRequest(prompt_token_ids=self.prompt_token_ids, sampling=self.sampling)
        return gateway_pb2.GenerateRequest(prompt=self.prompt_text, sampling=self.sampling)


def request_seed(base: int | None, pid: str, idx: int, attempt: int = 1) -> int | None:
    """A reproducible per-response sampling seed when the run sets `rollout.seed`. It depends on the
    attempt: a prompt aborted for being long and requeued draws new samples, instead of the same
    long ones again (a re-dispatch of the same attempt keeps its seed)."""
    if base is None:
        return None
    key = f"{base}:{pid}:{idx}" if attempt <= 1 else f"{base}:{pid}:{idx}:{attempt}"
    return zlib.crc32(key.encode()) & 0x7FFFFFFF


def version_range(resp: ResponseView, default: int) -> tuple[int, int]:
    """(oldest, newest) weight version that generated tokens of `resp`; `default` for both when
    none did. One pass, no list: this runs per response."""
    lo = hi = default
    found = False
    for r in resp.version_runs:
        if r.num_tokens > 0:
            v = r.version
            if not found:
                lo = hi = v
                found = True
            elif v < lo:
                lo = v
            elif v > hi:
                hi = v
    return lo, hi


def version_run_messages(resp: ResponseView) -> list[common_pb2.VersionRun]:
    """`resp`'s version runs as messages (a gateway's response holds them as such already)."""
    return [common_pb2.VersionRun(version=r.version, num_tokens=r.num_tokens) for r in resp.version_runs]


def build_group(run: str, task: PromptTask) -> rollout_pb2.Group:
    """The whole group as the trainer reads it from the stream (field `g`)."""
    p = task.progress
    assert p is not None, "a complete group has the progress of its completing response"
    g = rollout_pb2.Group(
        run=run,
        prompt_id=task.pid,
        prompt_token_ids=task.prompt_token_ids,
        ground_truth=task.ground_truth,
        data_source=task.data_source,
        min_version=p.min_version,
        max_version=p.max_version,
        reward_mean=p.reward_mean,
        reward_std=p.metric_std,
        created_unix_ms=int(time.time() * 1000),
    )
    for resp, gw, sc in zip(task.responses, task.response_gateway, task.scores, strict=True):
        assert resp is not None and sc is not None, "a complete group has every response scored"
        g.responses.append(
            rollout_pb2.Response(
                token_ids=resp.token_ids,
                logprobs=resp.logprobs,
                version_runs=version_run_messages(resp),
                finish_reason=resp.finish_reason,
                reward=sc.reward,
                score=sc.score,
                acc=sc.acc,
                overlong_penalty=sc.overlong_penalty,
                pred=sc.pred,
                gateway=gw,
            )
        )
    return g


@dataclass
class LengthStats:
    """Response lengths of everything completed vs. of the groups committed for training (the
    length bias of early stop)."""

    completed_tokens: int = 0
    completed: int = 0
    committed_tokens: int = 0
    committed: int = 0

    @property
    def completed_mean(self) -> float:
        return self.completed_tokens / max(self.completed, 1)

    @property
    def committed_mean(self) -> float:
        return self.committed_tokens / max(self.committed, 1)
