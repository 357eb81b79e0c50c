"""The durability invariants of a run, checked from Redis and the trainer's ledger.

What must hold (DESIGN.md, "Durability"), and where the checker reads it:
- every claimed attempt has exactly one outcome: prompt state `prompt:{id}` (`attempt`, `o:{k}`),
  `prompts:claimed`; two outcomes show as an `o:{k}` that changed between polls, as counters that
  count more outcomes than the ledger holds, or (when the scheduler writes one) as two entries of
  the `outcomes` audit stream;
- no claim older than lease + 10 s whose owner is gone (it no longer holds the run's
  `scheduler:lease`: it died, or a successor took the run over);
- every committed group (an entry of the `groups` stream) is trained exactly once or still pending:
  the trainer's ledger `trained.jsonl` (one line per step: stream_ids, group_ids) lists it once,
  and acknowledged entries it does not list are at most the groups the trainer dropped
  (`trainer:dropped:*`); no prompt is trained twice in one epoch (prompt ids carry the epoch);
- the trained version history has no gap (ledger steps 1..N) and the published version never goes
  back;
- counters agree with the per-prompt ledger (admitted, outcome:*, valid_produced, the stream);
- Redis `used_memory` and AOF size are sampled on every poll (`memory_slope`).

The prompt state, claims, counters, queue and leases are read in one Lua script, i.e. one
atomic snapshot (no false alarm from a FINISH landing between two reads). The stream is read
incrementally after it, then the ledger file (the trainer writes its ledger line before it
acknowledges, so an acknowledged entry is always in the ledger read after it).

Use it continuously (`poll()` every few seconds, or `CheckerThread`) and at the end (`poll()`
then `report()`); a violation is reported once, with its context.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import redis

from asyncdapo.contracts.redis_keys import GROUP_FIELD, GROUPS_CONSUMER_GROUP, RunKeys, outcome_counts
from asyncdapo.tools.faults.snapshot import Snapshot, _s, _sid, read_snapshot

AUDIT_STREAM = (
    "outcomes"  # the scheduler's audit STREAM: {p: prompt id, a: attempt, o: label, e: epoch} per outcome
)
DEFAULT_LEASE_S = 15.0  # the scheduler's claim lease (scheduler/queue.py)
GONE_AFTER_MS = 10_000  # an owner seen without its lease this long in a row is gone


class Kind(StrEnum):
    ATTEMPT_WITHOUT_OUTCOME = "attempt_without_outcome"
    TWO_OUTCOMES = "two_outcomes"
    STRANDED_CLAIM = "stranded_claim"
    BAD_CLAIM = "bad_claim"  # a claim of an attempt that is not current or already has an outcome
    QUEUED_TWICE = "queued_twice"  # a prompt twice in the queue, or queued while claimed
    GROUP_TRAINED_TWICE = "group_trained_twice"
    GROUP_LOST = "group_lost"  # acknowledged, never trained, not counted as dropped
    PROMPT_COMMITTED_TWICE = "prompt_committed_twice"  # two valid groups of one prompt in one epoch
    PROMPT_TRAINED_TWICE = "prompt_trained_twice"
    PROMPT_LOST = "prompt_lost"  # requeued (or queued) but neither in the queue nor claimed any more
    VERSION_GAP = "version_gap"
    VERSION_REGRESSED = "version_regressed"
    COUNTER_MISMATCH = "counter_mismatch"


@dataclass(frozen=True)
class Violation:
    kind: Kind
    subject: str  # prompt id, stream id, step or counter name
    detail: str
    context: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        ctx = f" | {json.dumps(self.context, default=str, sort_keys=True)}" if self.context else ""
        return f"[{self.kind.value}] {self.subject}: {self.detail}{ctx}"


@dataclass(frozen=True)
class MemorySample:
    t: float  # unix seconds
    used_memory: int
    aof_bytes: int
    version: int  # newest trained step in the ledger
    stream_len: int  # XLEN of the groups stream (entries not trimmed yet)


class InvariantChecker:
    """Reads a run's durable state and reports invariant violations (see module docstring)."""

    def __init__(
        self,
        redis_url: str,
        run: str,
        trainer_dir: str | Path | None,
        *,
        lease_s: float = DEFAULT_LEASE_S,
        stranded_after_s: float | None = None,  # default: lease + 10 s
        gone_after_s: float = GONE_AFTER_MS / 1000,  # an owner absent this long in a row is gone
        max_claim_age_s: float | None = None,  # flag any claim older than this, even a live owner's
        prompt_state_compacted: bool = False,  # see _check_counters; also detected by itself
    ) -> None:
        import redis

        self.r = redis.Redis.from_url(redis_url, socket_timeout=10.0)
        self.keys = RunKeys(run)
        self.ledger_path = Path(trainer_dir) / "trained.jsonl" if trainer_dir else None
        self.stranded_after_ms = int(
            1000 * (stranded_after_s if stranded_after_s is not None else lease_s + 10)
        )
        self.max_claim_age_ms = int(1000 * max_claim_age_s) if max_claim_age_s is not None else None
        self.compacted = prompt_state_compacted
        self.attempts: dict[str, int] = {}  # pid -> the highest attempt ever seen
        self.violations: list[Violation] = []
        self._seen: set[tuple[Kind, str]] = set()
        self.outcomes: dict[tuple[str, int], str] = {}  # every (pid, attempt) outcome ever seen
        self.stream: dict[str, str] = {}  # stream id -> prompt id of every committed group seen
        self._stream_cursor = "-"
        self.audit: Counter[tuple[str, int]] = Counter()  # outcomes per attempt in the audit stream
        self._absent_since: dict[str, int] = {}  # owner -> Redis time first seen without a lease
        self.gone_after_ms = int(gone_after_s * 1000)
        self._audit_cursor = "-"
        # every audit entry, kept past the stream's cap: pid -> [(entry id, attempt, label, epoch)]
        self.audit_log: dict[str, list[tuple[str, int, str, str]]] = defaultdict(list)
        self._queued_unseen: set[str] = set()  # seen queued, never yet seen claimed or with state
        self.max_version = 0
        self.memory: list[MemorySample] = []
        self.last: Snapshot | None = None
        self.summary: dict[str, Any] = {}
        self.polls = 0

    # ------------------------------------------------------------------ reading

    def snapshot(self) -> Snapshot:
        return read_snapshot(self.r, self.keys)

    def _read_stream(self) -> tuple[set[str], str]:
        """New entries into `self.stream`; returns (pending ids, last delivered id)."""
        from asyncdapo.contracts.v1 import rollout_pb2

        g = self.keys.groups
        while True:
            start = self._stream_cursor if self._stream_cursor == "-" else "(" + self._stream_cursor
            batch = self.r.xrange(g, min=start, count=500)
            if not batch:
                break
            for eid, fields in batch:
                raw = (fields or {}).get(GROUP_FIELD.encode())  # bytes: this client does not decode
                pid = ""
                if raw is not None:
                    try:
                        pid = rollout_pb2.Group.FromString(
                            raw if isinstance(raw, bytes) else raw.encode()
                        ).prompt_id
                    except Exception:  # a malformed entry is the trainer's to drop; still a group
                        pid = "?"
                self.stream[_s(eid)] = pid
            self._stream_cursor = _s(batch[-1][0])
        pending: set[str] = set()
        last_delivered = "0-0"
        try:
            groups = self.r.xinfo_groups(g)
        except Exception:  # no stream yet
            return pending, last_delivered
        for info in groups:
            if _s(info["name"]) == GROUPS_CONSUMER_GROUP:
                last_delivered = _s(info["last-delivered-id"])
                if int(info["pending"]):
                    rows = self.r.xpending_range(g, GROUPS_CONSUMER_GROUP, "-", "+", int(info["pending"]))
                    pending = {_s(row["message_id"]) for row in rows}
        return pending, last_delivered

    def _read_ledger(self) -> list[dict[str, Any]]:
        if self.ledger_path is None or not self.ledger_path.exists():
            return []
        rows = []
        for line in self.ledger_path.read_text().splitlines():
            # a line torn by a crash mid-write is skipped: the trainer truncates it on resume
            with contextlib.suppress(json.JSONDecodeError):
                rows.append(json.loads(line))
        return rows

    def _read_audit(self) -> Counter[tuple[str, int]]:
        """Outcomes per attempt from the `outcomes` audit stream, read incrementally and counted
        over the whole run (empty while the scheduler writes no such stream). Entry fields: the
        prompt id (`p`), the attempt (`a`), the outcome label (`o`) and the scheduler epoch (`e`)."""
        key = self.keys.prefix + AUDIT_STREAM
        if self.r.type(key) != b"stream":
            return self.audit
        while True:
            start = "-" if self._audit_cursor == "-" else "(" + self._audit_cursor
            batch = self.r.xrange(key, min=start, count=1000)
            if not batch:
                return self.audit
            for eid, fields in batch:
                f = {_s(k): _s(v) for k, v in (fields or {}).items()}
                self.audit[(f["p"], int(f["a"]))] += 1
                self.audit_log[f["p"]].append((_s(eid), int(f["a"]), f["o"], f.get("e", "")))
            self._audit_cursor = _s(batch[-1][0])

    def memory_sample(self, version: int, stream_len: int) -> MemorySample:
        mem = self.r.info("memory")
        pers = self.r.info("persistence")
        aof = int(pers.get("aof_current_size", 0) or 0) if int(pers.get("aof_enabled", 0)) else 0
        return MemorySample(time.time(), int(mem["used_memory"]), aof, version, stream_len)

    # ------------------------------------------------------------------ checking

    def _flag(self, kind: Kind, subject: str, detail: str, **context: Any) -> None:
        if (kind, subject) in self._seen:
            return
        self._seen.add((kind, subject))
        self.violations.append(Violation(kind, subject, detail, context))

    def poll(self) -> list[Violation]:
        """Read everything once and check; returns the violations found for the first time."""
        before = len(self.violations)
        snap = self.snapshot()
        pending, last_delivered = self._read_stream()
        ledger = self._read_ledger()
        audit = self._read_audit()
        self._check_prompts(snap, audit)
        self._check_counters(snap)
        self._check_groups(snap, pending, last_delivered, ledger)
        version = max((int(r.get("step", 0)) for r in ledger), default=0)
        self.memory.append(self.memory_sample(version, int(self.r.xlen(self.keys.groups))))
        self.last = snap
        self.polls += 1
        return self.violations[before:]

    def _check_prompts(self, snap: Snapshot, audit: Counter[tuple[str, int]]) -> None:
        claims: dict[str, tuple[str, int, int]] = {}
        for pid, rec in snap.claimed.items():
            owner, attempt_s, ms_s = rec.split("|")
            claims[pid] = (owner, int(attempt_s), int(ms_s))
        for owner in {c[0] for c in claims.values()} | set(self._absent_since):
            if owner in snap.live_owners:
                self._absent_since.pop(owner, None)
            else:
                self._absent_since.setdefault(owner, snap.now_ms)
        for pid, st in snap.prompts.items():
            attempts = int(st.get("attempt", 0) or 0)
            for k in range(1, attempts + 1):
                label = st.get(f"o:{k}")
                if label is None:
                    claim = claims.get(pid)
                    if k < attempts:
                        self._flag(Kind.ATTEMPT_WITHOUT_OUTCOME, f"{pid}#{k}",
                                   f"attempt {k} has no outcome but attempt {attempts} was claimed",
                                   state=st)  # fmt: skip
                    elif claim is None or claim[1] != k:
                        self._flag(Kind.ATTEMPT_WITHOUT_OUTCOME, f"{pid}#{k}",
                                   "current attempt has no outcome and no claim (lost)",
                                   state=st, claim=claim)  # fmt: skip
                    continue
                prev = self.outcomes.setdefault((pid, k), label)
                if prev != label:
                    self._flag(Kind.TWO_OUTCOMES, f"{pid}#{k}", f"outcome changed from {prev!r} to {label!r}")
        for (pid, k), n in audit.items():
            if n > 1:
                self._flag(Kind.TWO_OUTCOMES, f"{pid}#{k}", f"{n} outcomes in the {AUDIT_STREAM} stream")
        for pid, (owner, attempt, ms) in claims.items():
            st = snap.prompts.get(pid, {})
            current = int(st.get("attempt", 0) or 0)
            if attempt != current or f"o:{attempt}" in st:
                self._flag(Kind.BAD_CLAIM, f"{pid}#{attempt}",
                           f"claimed attempt {attempt}, prompt is at attempt {current} "
                           f"(outcome {st.get(f'o:{attempt}')!r})", owner=owner)  # fmt: skip
            age_ms = snap.now_ms - ms
            # "gone" is judged on what this checker saw: an owner whose lease lapsed only because
            # Redis itself was away (a lease is a TTL, and it runs while Redis is down) renews it
            # within a second of Redis' return; it is gone once absent for GONE_AFTER_MS in a row
            absent_ms = snap.now_ms - self._absent_since.get(owner, snap.now_ms)
            if (
                age_ms > self.stranded_after_ms
                and owner not in snap.live_owners
                and absent_ms >= self.gone_after_ms
            ):
                self._flag(Kind.STRANDED_CLAIM, f"{pid}#{attempt}",
                           f"claimed {age_ms / 1000:.1f} s ago by {owner}, whose lease is gone",
                           owner=owner, live_owners=sorted(snap.live_owners))  # fmt: skip
            elif self.max_claim_age_ms is not None and age_ms > self.max_claim_age_ms:
                self._flag(Kind.STRANDED_CLAIM, f"{pid}#{attempt}",
                           f"claimed {age_ms / 1000:.1f} s ago by live owner {owner}", owner=owner)  # fmt: skip
        self._check_lost(snap, claims)
        dup = [pid for pid, n in Counter(snap.queue).items() if n > 1]
        both = sorted(set(snap.queue) & set(claims))
        for pid in dup:
            self._flag(Kind.QUEUED_TWICE, pid, "in the prompt queue more than once")
        for pid in both:
            self._flag(Kind.QUEUED_TWICE, pid, "in the prompt queue while claimed", claim=snap.claimed[pid])

    def _check_lost(self, snap: Snapshot, claims: dict[str, tuple[str, int, int]]) -> None:
        """A prompt is lost when nothing will ever give it another attempt: its newest attempt was
        requeued (FINISH pushes it back in the same script, so an atomic snapshot always finds it
        queued or claimed again), or it left the queue without a claim (CLAIM creates its state in
        the same script as the pop; the audit stream remembers it after its state expired)."""
        queued = set(snap.queue)
        for pid, st in snap.prompts.items():
            k = int(st.get("attempt", 0) or 0)
            if k and st.get(f"o:{k}") == "requeued" and pid not in queued and pid not in claims:
                self._flag(Kind.PROMPT_LOST, pid, f"attempt {k} was requeued, yet the prompt is neither "
                           "queued nor claimed", state=st)  # fmt: skip
        self._queued_unseen |= queued
        for pid in list(self._queued_unseen):
            if pid in queued and pid not in snap.prompts:
                continue
            self._queued_unseen.discard(pid)
            if (
                pid not in claims
                and pid not in snap.prompts
                and pid not in self.attempts
                and pid not in self.audit_log
            ):
                self._flag(Kind.PROMPT_LOST, pid, "left the queue without a claim or an outcome")

    def _check_counters(self, snap: Snapshot) -> None:
        """Counters against the per-prompt ledger. Exact while all prompt state is kept; once
        finished prompt state is deleted (compaction: seen by a prompt's state vanishing), the
        counters must be at least what every poll has seen, and `admitted - outcomes` must still
        equal the outstanding claims exactly (both are counters)."""
        c = snap.counters
        vanished = set(self.attempts) - set(snap.prompts)
        if vanished and not self.compacted:
            self.compacted = True  # not a violation: the memory fix deletes finished prompt state
        for pid, st in snap.prompts.items():
            self.attempts[pid] = max(self.attempts.get(pid, 0), int(st.get("attempt", 0) or 0))
        if self.compacted:
            attempts = sum(self.attempts.values())
            labels = Counter(self.outcomes.values())
        else:
            attempts = sum(int(st.get("attempt", 0) or 0) for st in snap.prompts.values())
            labels = Counter(v for st in snap.prompts.values() for k, v in st.items() if k.startswith("o:"))
        counted = outcome_counts(c)
        checks = [
            ("admitted", c.get("admitted", 0), attempts, "sum of prompt attempts", False),
            ("outcome:*", sum(counted.values()), sum(labels.values()), "outcomes in prompt state", False),
            ("valid_produced", c.get("valid_produced", 0), labels.get("valid", 0), "valid outcomes", False),
            ("valid_produced", c.get("valid_produced", 0), snap.entries_added, "groups stream entries-added", True),
            ("admitted - outcomes", c.get("admitted", 0) - sum(counted.values()), len(snap.claimed),
             "outstanding claims", True),
        ]  # fmt: skip
        for label in sorted(set(labels) | set(counted)):
            checks.append(
                (f"outcome:{label}", counted.get(label, 0), labels.get(label, 0), "prompt state", False)
            )
        for name, counter, ledger, what, exact in checks:
            ok = counter == ledger if exact or not self.compacted else counter >= ledger
            if not ok:
                self._flag(Kind.COUNTER_MISMATCH, f"{name}={counter}", f"{what} = {ledger}",
                           counters=c, compacted=self.compacted)  # fmt: skip

    def _check_groups(
        self, snap: Snapshot, pending: set[str], last_delivered: str, ledger: list[dict[str, Any]]
    ) -> None:
        steps = [int(r.get("step", 0)) for r in ledger]
        for step, n in Counter(steps).items():
            if n > 1:
                self._flag(Kind.VERSION_GAP, f"step {step}", f"step {step} appears {n} times in the ledger")
        if steps and sorted(set(steps)) != list(range(1, max(steps) + 1)):
            missing = sorted(set(range(1, max(steps) + 1)) - set(steps))
            self._flag(Kind.VERSION_GAP, f"steps {missing[:10]}", "trained versions missing from the ledger")
        top = max(steps, default=0)
        if snap.published_version is not None:
            if snap.published_version < self.max_version:
                self._flag(Kind.VERSION_REGRESSED, f"v{snap.published_version}",
                           f"published version went back from {self.max_version}")  # fmt: skip
            if snap.published_version > top and self.ledger_path is not None:
                self._flag(Kind.VERSION_GAP, f"v{snap.published_version}",
                           f"published, but the ledger ends at step {top}")  # fmt: skip
            self.max_version = max(self.max_version, snap.published_version)
        trained: dict[str, int] = {}
        pids: dict[str, int] = {}
        for row in ledger:
            for sid in row.get("stream_ids", []):
                if sid in trained:
                    self._flag(Kind.GROUP_TRAINED_TWICE, sid,
                               f"trained at steps {trained[sid]} and {row['step']}")  # fmt: skip
                trained[sid] = int(row["step"])
            for pid in row.get("group_ids", []):
                if pid in pids:
                    self._flag(Kind.PROMPT_TRAINED_TWICE, pid,
                               f"trained at steps {pids[pid]} and {row['step']}")  # fmt: skip
                pids[pid] = int(row["step"])
        by_pid: dict[str, list[str]] = defaultdict(list)
        for sid, pid in self.stream.items():
            by_pid[pid].append(sid)
        for pid, sids in by_pid.items():
            if len(sids) > 1 and pid not in ("", "?"):
                self._flag(Kind.PROMPT_COMMITTED_TWICE, pid, f"{len(sids)} valid groups committed",
                           stream_ids=sids)  # fmt: skip
        delivered = _sid(last_delivered)
        acked = [sid for sid in self.stream if _sid(sid) <= delivered and sid not in pending]
        untrained = [sid for sid in acked if sid not in trained]
        dropped = sum(v for k, v in snap.counters.items() if k.startswith("trainer:dropped:"))
        if len(untrained) > dropped and self.ledger_path is not None:
            self._flag(Kind.GROUP_LOST, "acknowledged-untrained",
                       f"{len(untrained)} acknowledged group(s) never trained, only {dropped} counted dropped",
                       stream_ids=untrained[:20])  # fmt: skip
        self.summary = {
            "prompts": len(snap.prompts),
            "attempts": sum(int(s.get("attempt", 0) or 0) for s in snap.prompts.values()),
            "claimed": len(snap.claimed),
            "queued": len(snap.queue),
            "groups_committed": len(self.stream),
            "groups_trained": len(trained),
            "groups_unacked": len([s for s in self.stream if s in pending or _sid(s) > delivered]),
            "groups_dropped": dropped,
            "steps": top,
            "prompt_state_compacted": self.compacted,
            "published_version": snap.published_version,
            "outcomes": {k: v for k, v in snap.counters.items() if k.startswith("outcome:")},
        }

    # ------------------------------------------------------------------ results

    def memory_slope(self) -> dict[str, float]:
        """Least-squares slopes of used_memory and AOF size per trained version and per second."""

        def slope(xs: list[float], ys: list[float]) -> float:
            n = len(xs)
            if n < 2:
                return 0.0
            mx, my = sum(xs) / n, sum(ys) / n
            var = sum((x - mx) ** 2 for x in xs)
            return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0

        m = self.memory
        ts = [s.t for s in m]
        vs = [float(s.version) for s in m]
        mem = [float(s.used_memory) for s in m]
        aof = [float(s.aof_bytes) for s in m]
        return {
            "mem_bytes_per_version": slope(vs, mem),
            "aof_bytes_per_version": slope(vs, aof),
            "mem_bytes_per_s": slope(ts, mem),
            "aof_bytes_per_s": slope(ts, aof),
            "mem_bytes_last": mem[-1] if mem else 0.0,
            "aof_bytes_last": aof[-1] if aof else 0.0,
        }

    def report(self) -> str:
        lines = [f"invariants after {self.polls} poll(s): {len(self.violations)} violation(s)"]
        lines += [f"  {v}" for v in self.violations]
        lines.append(f"  summary: {json.dumps(self.summary, default=str, sort_keys=True)}")
        lines.append(f"  memory: {json.dumps({k: round(v, 1) for k, v in self.memory_slope().items()})}")
        return "\n".join(lines)

    def close(self) -> None:
        self.r.close()


class CheckerThread:
    """Polls an `InvariantChecker` every `interval_s` in the background; polls that find Redis away
    are counted as `unreachable`, any other failure as `errors`; `stop()` ends it."""

    def __init__(self, checker: InvariantChecker, interval_s: float = 2.0) -> None:
        self.checker = checker
        self.interval_s = interval_s
        self.errors = 0
        self.last_error = ""
        self.unreachable = 0
        self.last_unreachable = ""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="invariant-checker", daemon=True)

    def start(self) -> CheckerThread:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                with self._lock:
                    self.checker.poll()
            except (redis.ConnectionError, redis.TimeoutError) as err:
                self.unreachable += 1  # Redis away (a fault under test): try again next time
                self.last_unreachable = repr(err)
            except Exception as err:  # a checker bug or an unreadable state: the test must see it
                self.errors += 1
                self.last_error = repr(err)

    def poll_now(self) -> list[Violation]:
        with self._lock:
            return self.checker.poll()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
