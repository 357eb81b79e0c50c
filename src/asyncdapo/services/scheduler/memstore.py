"""The run's store in memory, with the semantics of the Lua scripts (lua.py) — for the simulator and
for tests that need the store's rules without a redis-server.

`MemoryRun` holds what Redis holds for one run (queue, claims, prompt state, counters, the groups
stream as a list, the audit trail, the fencing epoch); `MemoryQueue` and `MemoryGroupStore` expose
the same methods as `queue.PromptQueue` and `group_state.GroupStore` (synchronous: nothing waits),
so the rollout core is driven the same way on both. tests/integration/scheduler/
test_scheduler_store_equivalence.py runs one suite of scenarios against Redis and against this, and
every answer must match.

Differences that do not change an answer: no TTLs (finished prompt state is compacted at once,
never expires; CLAIM replies are kept), the audit trail is not capped, stream ids are counters.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from asyncdapo.contracts import redis_keys as rk
from asyncdapo.contracts.prompts import PromptRecord, PromptRecordError
from asyncdapo.services.scheduler.claim_records import Claim, ClaimBatch, ClaimRecord, Fenced
from asyncdapo.services.scheduler.group_records import GroupProgress, RecordStatus, ResponseScore
from asyncdapo.services.scheduler.outcome_records import FinishItem, FinishResult, Outcome, RequeueReason


@dataclass(slots=True)
class PromptState:
    attempt: int = 0
    n: int = 0
    done: int = 0
    mean: float = 0.0
    m2: float = 0.0
    rmean: float = 0.0
    rm2: float = 0.0
    vmin: int | None = None
    vmax: int | None = None
    counted: set[tuple[int, int]] = field(default_factory=set)  # (attempt, idx) markers
    outcomes: dict[int, str] = field(default_factory=dict)  # attempt -> stored label
    live: bool = True  # False once compacted (a final outcome)


@dataclass
class MemoryRun:
    """Everything the store keeps for one run."""

    queue: deque[str] = field(default_factory=deque)  # head = next
    data: dict[str, PromptRecord] = field(default_factory=dict)
    claimed: dict[str, ClaimRecord] = field(default_factory=dict)
    prompts: dict[str, PromptState] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)
    groups: list[tuple[int, bytes]] = field(default_factory=list)  # (stream id, Group bytes)
    outcomes: list[tuple[str, int, str, int]] = field(default_factory=list)  # audit: pid, a, label, epoch
    epoch: int = 0
    lease: str = ""
    claim_replies: dict[str, ClaimBatch] = field(default_factory=dict)
    next_stream_id: int = 1
    weights: dict[str, str] = field(default_factory=dict)

    def incr(self, name: str, by: int = 1) -> int:
        self.counters[name] = self.counters.get(name, 0) + by
        return self.counters[name]

    def push(self, records: Sequence[PromptRecord]) -> None:
        """What the trainer's feed does: data, then the ids at the queue's tail."""
        for r in records:
            self.data[r.id] = r
            self.queue.append(r.id)


class MemoryQueue:
    """`queue.PromptQueue` in memory (same methods, synchronous)."""

    def __init__(self, run: MemoryRun, owner: str, clock_ms: Callable[[], int] = lambda: 0) -> None:
        self.run = run
        self.owner = owner
        self.epoch = 0
        self.clock_ms = clock_ms
        self._tokens = 0
        self.store: MemoryGroupStore | None = None

    def take_over(self) -> int:
        self.run.epoch += 1
        self.epoch = self.run.epoch
        if self.store is not None:
            self.store.epoch = self.epoch
        self.run.lease = f"{self.owner}|{self.epoch}"
        return self.epoch

    def refresh_lease(self) -> int:
        if self.run.epoch == 0:
            return -1
        if self.run.epoch != self.epoch:
            return 0
        self.run.lease = f"{self.owner}|{self.epoch}"
        return 1

    def release_lease(self) -> None:
        if self.run.lease == f"{self.owner}|{self.epoch}":
            self.run.lease = ""

    def new_token(self) -> str:
        self._tokens += 1
        return f"{self.owner}:{self._tokens}"

    def claim(self, max_count: int, n: int, token: str | None = None) -> ClaimBatch:
        if max_count <= 0:
            return ClaimBatch([], -1)
        run = self.run
        if run.epoch != self.epoch:
            raise Fenced(f"claim refused: another scheduler took the run over (we hold epoch {self.epoch})")
        tok = token or self.new_token()
        if tok in run.claim_replies:
            return run.claim_replies[tok]
        claims: list[Claim] = []
        now = self.clock_ms()
        for _ in range(max_count):
            if not run.queue:
                break
            pid = run.queue.popleft()
            st = run.prompts.get(pid)
            if st is None:
                st = run.prompts[pid] = PromptState()
            st.attempt += 1
            st.n, st.done, st.mean, st.m2, st.rmean, st.rm2 = n, 0, 0.0, 0.0, 0.0, 0.0
            st.vmin = st.vmax = None
            st.live = True
            run.claimed[pid] = ClaimRecord(self.owner, st.attempt, now)
            claims.append(Claim(pid, st.attempt))
        batch = ClaimBatch(claims, run.incr("admitted", len(claims)))
        run.claim_replies[tok] = batch
        return batch

    def load(self, pids: Sequence[str]) -> list[PromptRecord | PromptRecordError]:
        out: list[PromptRecord | PromptRecordError] = []
        for pid in pids:
            rec = self.run.data.get(pid)
            out.append(rec if rec is not None else PromptRecordError(f"prompt {pid!r}: no data"))
        return out

    def depth(self) -> int:
        return len(self.run.queue)

    def claims(self) -> dict[str, ClaimRecord]:
        return dict(self.run.claimed)

    def requeue(self, claims: Sequence[tuple[str, ClaimRecord]], reason: RequeueReason) -> list[FinishResult]:
        assert self.store is not None
        order = sorted(claims, key=lambda c: (c[1].unix_ms, c[0]), reverse=True)
        return self.store.finish_many(
            [self.store.finish_call(pid, c.attempt, Outcome.REQUEUED, reason) for pid, c in order]
        )

    def recover(self) -> list[FinishResult]:
        theirs = [(pid, c) for pid, c in self.run.claimed.items() if c.owner != self.owner]
        return self.requeue(theirs, RequeueReason.SCHEDULER_RESTART)

    def orphans(self, held: set[tuple[str, int]]) -> list[tuple[str, ClaimRecord]]:
        return [
            (pid, c)
            for pid, c in self.run.claimed.items()
            if c.owner == self.owner and (pid, c.attempt) not in held
        ]


# GroupProgress is immutable: the answers that carry no statistics are shared, not rebuilt per score
_STALE = GroupProgress(RecordStatus.STALE)
_OK: dict[tuple[int, int], GroupProgress] = {}


def _ok(done: int, n: int) -> GroupProgress:
    p = _OK.get((done, n))
    if p is None:
        p = _OK[(done, n)] = GroupProgress(RecordStatus.OK, done=done, n=n)
    return p


class MemoryGroupStore:
    """`group_state.GroupStore` in memory (same methods, synchronous)."""

    def __init__(self, run: MemoryRun, train_batch_size: int = 1, staleness_window: int = 0) -> None:
        self.run = run
        self.epoch = 0
        self.version = 0
        self.train_batch_size = train_batch_size
        self.staleness_window = staleness_window  # ceil(s), as `GroupStore`

    def record(self, scores: Sequence[ResponseScore]) -> list[GroupProgress]:
        run = self.run
        if run.epoch != self.epoch:
            return [GroupProgress(RecordStatus.FENCED) for _ in scores]
        out: list[GroupProgress] = []
        prompts, counters = run.prompts, run.counters
        for s in scores:
            st = prompts.get(s.pid)
            if st is None or st.attempt != s.attempt or s.attempt in st.outcomes:
                out.append(_STALE)
                continue
            status = RecordStatus.OK
            marker = (s.attempt, s.idx)
            if marker in st.counted:
                status = RecordStatus.DUP
            else:
                st.counted.add(marker)
                counters[rk.COMPLETIONS] = counters.get(rk.COMPLETIONS, 0) + 1  # run.incr, inlined
                counters[rk.GENERATED_TOKENS] = counters.get(rk.GENERATED_TOKENS, 0) + s.length
                st.done += 1
                d = s.metric - st.mean
                st.mean += d / st.done
                st.m2 += d * (s.metric - st.mean)
                dr = s.reward - st.rmean
                st.rmean += dr / st.done
                st.rm2 += dr * (s.reward - st.rmean)
                st.vmin = s.min_version if st.vmin is None else min(st.vmin, s.min_version)
                st.vmax = s.max_version if st.vmax is None else max(st.vmax, s.max_version)
                if st.done >= st.n:
                    status = RecordStatus.COMPLETE
            if status is RecordStatus.OK:
                out.append(_ok(st.done, st.n))
                continue
            done = max(st.done, 1)
            out.append(
                GroupProgress(
                    status,
                    done=st.done,
                    n=st.n,
                    metric_mean=st.mean,
                    metric_std=math.sqrt(max(st.m2 / done, 0.0)),
                    reward_mean=st.rmean,
                    reward_std=math.sqrt(max(st.rm2 / done, 0.0)),
                    min_version=st.vmin or 0,
                    max_version=st.vmax or 0,
                )
            )
        return out

    def finish_call(
        self,
        pid: str,
        attempt: int,
        outcome: Outcome,
        reason: str = "",
        bound: int = -1,
        group: bytes = b"",
        min_version: int = 0,
    ) -> FinishItem:
        return FinishItem(pid, attempt, outcome, str(reason), bound, group, min_version)

    def finish_many(self, items: Sequence[FinishItem]) -> list[FinishResult]:
        run = self.run
        produced = run.counters.get(rk.VALID_PRODUCED, 0)
        credited = run.counters.get(rk.VALID_CREDITED, 0)
        if run.epoch != self.epoch:
            return [FinishResult("fenced", produced, credited) for _ in items]
        b, s = self.train_batch_size, self.staleness_window
        out: list[FinishResult] = []
        for it in items:
            st = run.prompts.get(it.pid)
            if st is None or st.attempt != it.attempt:
                out.append(FinishResult("stale", produced, credited))
                continue
            prev = st.outcomes.get(it.attempt)
            if prev is not None:
                out.append(FinishResult(f"dup:{prev}", produced, credited))
                continue
            outcome, reason = it.outcome.value, it.reason
            if outcome == "valid":
                eff = produced - credited
                if it.bound >= 0 and eff >= it.bound:
                    outcome, reason = "requeued", "over_bound"
                elif it.min_version < max(math.floor(eff / b), self.version) - s:
                    outcome, reason = "requeued", "stale"
                else:
                    run.groups.append((run.next_stream_id, it.group))
                    run.next_stream_id += 1
                    produced = run.incr(rk.VALID_PRODUCED)
            label = f"dropped:{reason}" if outcome == "dropped" else outcome
            full = label
            if outcome == "requeued":
                full = f"requeued:{reason}"
                run.incr(f"requeued:{reason}")
                run.queue.appendleft(it.pid)
            run.incr(rk.OUTCOME_PREFIX + label)
            st.outcomes[it.attempt] = label
            run.claimed.pop(it.pid, None)
            st.counted = {c for c in st.counted if c[0] != it.attempt}
            if outcome != "requeued":
                run.data.pop(it.pid, None)
                st.live = False
            run.outcomes.append((it.pid, it.attempt, full, self.epoch))
            out.append(FinishResult(full, produced, credited))
        return out
