"""SIMULATOR — KV-cache admission and preemption of the token-timing simulator, as vLLM's v1
scheduler does them (FCFS policy, recompute preemption). Pure: no clock, no asyncio.

What vLLM does each engine step (vllm/v1/core/sched/scheduler.py, `Scheduler.schedule`):
- The KV cache is a pool of blocks of `block_tokens` tokens; a request holds
  ceil(context / block_tokens) blocks, context = prompt + generated tokens.
- Running requests are served first, oldest first. One that needs a new block for the token it
  computes this step and finds none free preempts the *newest* running request (the tail of the
  running list): its blocks are freed, its KV is dropped, and it goes back to the *front* of the
  waiting queue with its generated tokens kept (recompute mode). If the request itself is the
  newest, it is the one preempted.
- Only when no request was preempted in this step are waiting requests admitted, in order, while
  the running count is under `max_num_seqs` and the head's whole context (prompt, plus generated
  tokens for a preempted one: they are recomputed as prefill) and its next token fit in free blocks;
  the first that does not fit stops admission (FCFS: no skipping ahead).
So a batch of long responses first fills the cache, then preempts and recomputes: what caps a
pool's concurrency by response length, and what a length cap (P-DSR's fast pool) relieves.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol


class KvSeq(Protocol):
    held_blocks: int  # blocks it holds now (0 while waiting)

    @property
    def context_tokens(self) -> int: ...  # prompt + tokens generated so far


@dataclass(frozen=True)
class KvCache:
    capacity_tokens: int
    block_tokens: int = 16

    def __post_init__(self) -> None:
        if self.block_tokens < 1:
            raise ValueError(f"kv block size must be >= 1 token, got {self.block_tokens}")
        if self.capacity_tokens < self.block_tokens:
            raise ValueError(
                f"kv capacity ({self.capacity_tokens} tokens) must hold at least one block of {self.block_tokens}"
            )

    @property
    def capacity_blocks(self) -> int:
        return self.capacity_tokens // self.block_tokens

    def blocks(self, tokens: int) -> int:
        return math.ceil(tokens / self.block_tokens)


@dataclass
class StepPlan:
    admitted: list[KvSeq] = field(default_factory=list)  # moved from waiting to running
    preempted: list[KvSeq] = field(default_factory=list)  # moved from running to the waiting front
    prefill_tokens: int = 0  # context computed for the admitted requests (recompute included)


def used_blocks(running: Sequence[KvSeq]) -> int:
    return sum(s.held_blocks for s in running)


def schedule_step(
    kv: KvCache,
    running: list[KvSeq],
    waiting: list[KvSeq],
    max_running: int,
    admit: bool = True,
) -> StepPlan:
    """Plan one engine step in place: grow every running request by one token's slot (preempting
    the newest running requests when blocks run out), then admit from the waiting head while it
    fits (only when nothing was preempted and `admit`). `running` and `waiting` are updated."""
    plan = StepPlan()
    free = kv.capacity_blocks - used_blocks(running)
    i = 0
    while i < len(running):
        seq = running[i]
        need = kv.blocks(seq.context_tokens + 1) - seq.held_blocks
        while need > free:
            victim = running.pop()  # the newest running request
            free += victim.held_blocks
            victim.held_blocks = 0
            plan.preempted.append(victim)
            if victim is seq:
                break
        else:
            seq.held_blocks += need
            free -= need
            i += 1
    for victim in plan.preempted:
        waiting.insert(0, victim)
    if plan.preempted or not admit:
        return plan
    while waiting and len(running) < max_running:
        head = waiting[0]
        need = kv.blocks(head.context_tokens + 1)
        if need > free:
            break
        waiting.pop(0)
        head.held_blocks = need
        free -= need
        running.append(head)
        plan.admitted.append(head)
        plan.prefill_tokens += head.context_tokens
    return plan
