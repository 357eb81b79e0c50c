"""Commit order and early stop, pure: which complete valid groups go to the trainer, and when
the rollout must stop and abort.

Entries are prompt attempts in admission order. A complete group is either filtered (its outcome
is final at once) or valid and *ready*. `plan(remaining)` then says which ready groups to commit
now, which to requeue (valid, but past the bound) and which pending prompts to abort.

- order `any` (the seeds): ready groups commit in completion order; the first `remaining` win.
- order `fifo` (MiMo): a ready group commits only once every prompt admitted before it has an
  outcome, so the batch is the first valid groups *in admission order* and long responses are not
  systematically cut. As soon as ready groups cover the remaining bound at some admission
  position, prompts admitted after it are aborted (`abort`) and their ready groups requeued;
  prompts before it keep running. If one of those later turns out filtered, fewer are covered
  and admission resumes (requeued prompts are at the queue head).

Invariants: at most `remaining` keys are committed per plan; a key is in at most one list of one
plan and never reappears after it left (commit/requeue/abort/finish remove it).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from enum import Enum
from typing import Generic, TypeVar

from asyncdapo.contracts.config import EarlyStopOrder

K = TypeVar("K", bound=Hashable)  # an entry's key: the core uses (prompt id, attempt)


class _State(Enum):
    PENDING = 0
    READY = 1


@dataclass
class Plan(Generic[K]):
    commit: list[K] = field(default_factory=list)
    requeue: list[K] = field(default_factory=list)  # ready valid groups beyond the bound
    abort: list[K] = field(default_factory=list)  # pending prompts beyond the cutoff
    covered: bool = False  # committed + ready-in-range reach `remaining`: stop admitting


class CommitLedger(Generic[K]):
    def __init__(self, order: EarlyStopOrder, abort_beyond_cutoff: bool = True) -> None:
        self.order = order
        # sync mode keeps every prompt of a batch running: nothing is aborted, surplus requeued.
        self.abort_beyond_cutoff = abort_beyond_cutoff
        self._entries: dict[K, _State] = {}  # insertion order = admission order
        self._ready_order: list[K] = []  # completion order of ready entries

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    @property
    def ready(self) -> int:
        return len(self._ready_order)

    def admit(self, key: K) -> None:
        if key in self._entries:
            raise KeyError(f"{key!r} admitted twice")
        self._entries[key] = _State.PENDING

    def set_ready(self, key: K) -> None:
        """The group of `key` is complete and valid; it waits in the ledger for `plan`."""
        if self._entries.get(key) is not _State.PENDING:
            raise KeyError(f"{key!r} is not pending")
        self._entries[key] = _State.READY
        self._ready_order.append(key)

    def finish(self, key: K) -> None:
        """`key` got an outcome outside the ledger (filtered, dropped, aborted); forget it."""
        if self._entries.pop(key, None) is _State.READY:
            self._ready_order.remove(key)

    def plan(self, remaining: int) -> Plan[K]:
        p: Plan[K] = Plan()
        if self.order is EarlyStopOrder.ANY:
            for key in self._ready_order:
                (p.commit if len(p.commit) < remaining else p.requeue).append(key)
            p.covered = len(p.commit) >= remaining
            if p.covered and self.abort_beyond_cutoff:
                p.abort = [k for k, s in self._entries.items() if s is _State.PENDING]
        else:
            blocked = False  # a prompt admitted earlier is still pending
            counted = 0
            p.covered = remaining <= 0
            for key, state in self._entries.items():
                if p.covered:
                    if state is _State.READY:
                        p.requeue.append(key)
                    elif self.abort_beyond_cutoff:
                        p.abort.append(key)
                    continue
                if state is _State.PENDING:
                    blocked = True
                    continue
                if not blocked:
                    p.commit.append(key)
                counted += 1
                p.covered = counted >= remaining
        for key in (*p.commit, *p.requeue, *p.abort):
            self.finish(key)
        return p
