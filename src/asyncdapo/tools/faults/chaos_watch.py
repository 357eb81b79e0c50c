"""What the chaos soak watches while faults hit the stack: progress and the invariants.

- `ProgressMonitor` tails the trainer's ledger (`trained.jsonl`, one line per step: stream ids,
  prompt ids) and notes when each step first appeared and the Redis time its groups were
  committed (a stream id is `<ms>-<seq>` of the Redis clock, the host's clock here). From that:
  the first new step after a moment, and the first step made only of groups committed after it
  (the whole loop — admission, generation, scoring, commit, training, publish — ran after it).
- `account_groups` at the end: every group the stream ever took is trained, dropped or pending.
- `Watch` polls an `InvariantChecker` every `interval_s`, timestamps each new violation, and keeps
  a per-prompt history from the successive atomic snapshots (queued, claimed by whom, released,
  each attempt's outcome) next to the checker's copy of the capped `outcomes` audit stream; a
  violation is printed with that history and the faults around it (`describe_violation`).
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from asyncdapo.contracts.redis_keys import RunKeys
from asyncdapo.tools.faults.invariants import InvariantChecker, Violation
from asyncdapo.tools.faults.procs import FaultEvent
from asyncdapo.tools.faults.snapshot import Snapshot, _s, _sid


def _ms(stream_id: str) -> int:
    return int(stream_id.partition("-")[0])


@dataclass(frozen=True)
class StepSeen:
    step: int
    stream_ids: tuple[str, ...]
    group_ids: tuple[str, ...]
    seen_t: float  # unix time the monitor first read this line (with these stream ids)

    @property
    def oldest_group_ms(self) -> int:
        return min((_ms(s) for s in self.stream_ids), default=0)


class ProgressMonitor:
    """Reads the ledger every `interval_s` in a thread; a line rewritten after a trainer restart
    (the ledger is truncated back to the checkpoint and the step redone) counts from its rewrite."""

    def __init__(self, ledger: Path, interval_s: float = 0.2) -> None:
        self.ledger = ledger
        self.interval_s = interval_s
        self.steps: dict[int, StepSeen] = {}
        self.history: list[StepSeen] = []  # every (re)write seen, in order
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-progress", daemon=True)

    def start(self) -> ProgressMonitor:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.read_once()

    def read_once(self) -> None:
        if not self.ledger.exists():
            return
        now = time.time()
        current: dict[int, StepSeen] = {}
        for line in self.ledger.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError, KeyError, TypeError, ValueError):
                row = json.loads(line)
                step = int(row["step"])
                ids = tuple(str(s) for s in row.get("stream_ids", []))
                current[step] = StepSeen(step, ids, tuple(str(p) for p in row.get("group_ids", [])), now)
        with self._lock:
            for step, seen in current.items():
                old = self.steps.get(step)
                if old is None or old.stream_ids != seen.stream_ids:
                    self.steps[step] = seen
                    self.history.append(seen)

    def max_step(self) -> int:
        with self._lock:
            return max(self.steps, default=0)

    def first_step_after(self, step0: int, t: float) -> StepSeen | None:
        """The first step numbered above `step0` that appeared at or after `t`."""
        with self._lock:
            cands = [s for s in self.history if s.step > step0 and s.seen_t >= t]
        return min(cands, key=lambda s: s.seen_t, default=None)

    def full_loop_after(self, t: float) -> StepSeen | None:
        """The first step whose every group was committed at or after `t` (unix seconds)."""
        ms = int(t * 1000)
        with self._lock:
            cands = [s for s in self.history if s.stream_ids and s.oldest_group_ms >= ms]
        return min(cands, key=lambda s: s.seen_t, default=None)


@dataclass(frozen=True)
class SeenViolation:
    t: float  # unix time of the poll that found it
    violation: Violation


class Watch:
    """Polls the checker in a thread and records what each prompt went through (see module doc)."""

    def __init__(self, checker: InvariantChecker, interval_s: float = 2.0) -> None:
        self.checker = checker
        self.interval_s = interval_s
        self.found: list[SeenViolation] = []
        self.events: dict[str, list[tuple[float, str]]] = defaultdict(list)  # pid -> (t, what)
        self.errors = 0
        self.last_error = ""
        self.unreachable = 0
        # MEMORY USAGE of the capped outcomes audit stream, by the time of the checker's memory
        # sample taken in the same poll: a bounded window that fills over the first ~600 versions
        self.audit_bytes: dict[float, int] = {}
        self._prev: Snapshot | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-watch", daemon=True)

    def start(self) -> Watch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.poll_now()
            except (redis.ConnectionError, redis.TimeoutError):
                self.unreachable += 1  # Redis away (a fault under test): the next poll catches up

    def poll_now(self) -> list[Violation]:
        """One poll; raises redis.ConnectionError / TimeoutError while Redis is away, counts any
        other failure (a checker bug, an unreadable state) in `errors`: the run reports them."""
        with self._lock:
            try:
                new = self.checker.poll()
            except (redis.ConnectionError, redis.TimeoutError):
                raise
            except Exception as err:
                self.errors += 1
                self.last_error = repr(err)
                return []
            t = time.time()
            if self.checker.memory:
                usage = self.checker.r.memory_usage(self.checker.keys.outcomes, samples=0)
                self.audit_bytes[self.checker.memory[-1].t] = int(usage or 0)
            if self.checker.last is not None:
                self._observe(self.checker.last, t)
            self.found += [SeenViolation(t, v) for v in new]
            return new

    def _observe(self, snap: Snapshot, t: float) -> None:
        prev = self._prev
        old_claims = prev.claimed if prev else {}
        for pid, rec in snap.claimed.items():
            if old_claims.get(pid) != rec:
                owner, attempt, _ = rec.split("|")
                self.events[pid].append((t, f"claimed: attempt {attempt} by {owner}"))
        for pid in set(old_claims) - set(snap.claimed):
            self.events[pid].append((t, "claim released"))
        old_queue = set(prev.queue) if prev else set()
        for pid in set(snap.queue) - old_queue:
            self.events[pid].append((t, "queued"))
        old_prompts = prev.prompts if prev else {}
        for pid, st in snap.prompts.items():
            before = old_prompts.get(pid, {})
            for k, v in st.items():
                if k.startswith("o:") and before.get(k) != v:
                    self.events[pid].append((t, f"outcome of attempt {k[2:]}: {v}"))
        self._prev = snap

    # ------------------------------------------------------------------ reporting

    def prompts_of(self, v: Violation) -> list[str]:
        """The prompt ids a violation is about (its subject, or the groups it names)."""
        subject = v.subject.split("#")[0]
        if subject in self.checker.attempts or subject in self.events or subject in self.checker.audit_log:
            return [subject]
        sids = list(v.context.get("stream_ids", [])) + re.findall(r"\d{10,}-\d+", v.subject)
        return sorted({self.checker.stream.get(s, "") for s in sids} - {"", "?"})


def account_groups(r: redis.Redis, keys: RunKeys, ledger: list[dict[str, Any]]) -> dict[str, int]:
    """Every group ever committed, accounted for: trained (the ledger's stream ids), dropped by the
    trainer (the ledger's drops; a drop whose ledger line a crash prevented is only in the
    `trainer:dropped:*` counters), or still in the stream. The trainer trims the stream only once
    a ledger line lists what it trims, so an entry in none of these was lost.

    The stream's `entries-added`, its remaining entries and the counters are read in one MULTI;
    the ledger after it, counting only ids up to the stream's last id at that moment."""
    with r.pipeline(transaction=True) as pipe:
        pipe.xinfo_stream(keys.groups)
        pipe.xrange(keys.groups, "-", "+")
        pipe.hgetall(keys.counters)
        info, entries, counters = pipe.execute()
    last = _sid(_s(info["last-generated-id"]))
    added = int(info["entries-added"])
    in_stream = {_s(eid) for eid, _ in entries}
    trained = {sid for row in ledger for sid in row.get("stream_ids", []) if _sid(sid) <= last}
    dropped = {sid for row in ledger for sid, _ in row.get("dropped", []) if _sid(sid) <= last}
    counted = sum(int(v) for k, v in counters.items() if _s(k).startswith("trainer:dropped:"))
    unaccounted = added - len(trained | dropped | in_stream)
    return {
        "committed": added,
        "trained": len(trained),
        "dropped_in_ledger": len(dropped),
        "dropped_counted": counted,
        "in_stream": len(in_stream - trained - dropped),
        "lost": max(0, unaccounted - max(0, counted - len(dropped))),
    }


def describe_violation(
    seen: SeenViolation,
    watch: Watch,
    faults: list[FaultEvent],
    ledger: list[dict[str, Any]],
    window_s: float = 60.0,
    max_prompts: int = 3,
) -> str:
    """The violation, the history of the prompts it names (snapshots, audit stream, ledger) and
    every fault event from `window_s` before the prompt's first trace until it was found."""
    v = seen.violation
    out = [f"VIOLATION {v}", f"  found at {_clock(seen.t)}"]
    pids = watch.prompts_of(v)[:max_prompts]
    t_from = seen.t - window_s
    for pid in pids:
        trace = watch.events.get(pid, [])
        if trace:
            t_from = min(t_from, trace[0][0] - window_s)
        out.append(f"  prompt {pid}:")
        out += [f"    {_clock(t)} {what}" for t, what in trace]
        for eid, attempt, label, epoch in watch.checker.audit_log.get(pid, []):
            out.append(
                f"    audit {eid} ({_clock(_ms(eid) / 1000)}): attempt {attempt} -> {label} (scheduler epoch {epoch})"
            )
        for row in ledger:
            if pid in row.get("group_ids", []):
                out.append(f"    trained at step {row['step']} (stream ids {row.get('stream_ids')})")
    out.append(f"  faults from {_clock(t_from)}:")
    out += [
        f"    {_clock(e.t)} {e.service} {e.action} {e.detail}".rstrip()
        for e in faults
        if t_from <= e.t <= seen.t
    ]
    return "\n".join(out)


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) + f".{int((t % 1) * 1000):03d}"
