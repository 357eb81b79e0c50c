"""A pool of scoring processes with a hard per-item deadline enforced from outside the workers.

One manager thread owns all pool state; callers only touch a thread-safe inbox. The manager
- sends chunks of items to idle, warmed workers (`ceil(queued / idle workers)` items, at most
  `max_chunk`: small requests spread over all workers, large ones pay one round trip per chunk);
- collects one result per item as soon as a worker finishes it;
- is the watchdog: each worker publishes (item seq, start time) in shared memory, and an item still
  running `timeout_s` after it started gets its worker killed (SIGKILL) — the item comes back
  `timeout`, the unstarted rest of the chunk goes back to the front of the queue, a fresh worker
  takes the slot. A worker that dies on its own turns its current item into `error`.

Stalls: math-verify is ~1 ms per item, but a rare item takes 100× that. A worker whose current item
has run past `stall_after_s` is *stalled*: it stops counting against `workers` (the number of items
scored at once, normally one per core), and a spare process takes new work in its place. Without
spares, every request arriving during a slow item waits behind it for a core; with them, only the
slow item's own request does.

Invariants: every submitted item is resolved exactly once (a verdict, or the pool's failure for the
whole batch); a batch's future completes once all of its items are resolved, results in order.
"""

from __future__ import annotations

import contextlib
import logging
import math
import multiprocessing as mp
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from enum import StrEnum
from multiprocessing.connection import Connection
from multiprocessing.context import ForkContext, ForkServerContext, SpawnContext
from typing import Any, cast

from asyncdapo.contracts.verifier_api import ItemStatus
from asyncdapo.runtime.backoff import Backoff
from asyncdapo.services.verifier.protocol import IDLE, SEQ, START, Chunk, Verdict, decode
from asyncdapo.services.verifier.worker import worker_main

log = logging.getLogger("asyncdapo.services.verifier.worker_pool")

SLOW_ITEM_S = 1.0  # an item scored slower than this is logged with its input
_MAX_POLL_S = 0.25  # safety net: the manager re-checks deadlines at least this often while busy
# the wait before respawning a worker, by its streak of deaths before it was warm: none at streak 0,
# else 0.2 s at streak 1, doubled per streak, at most 10 s
RESPAWN_BACKOFF = Backoff(0.2, 10.0)


class RestartReason(StrEnum):
    TIMEOUT = "timeout"  # killed by the watchdog
    CRASH = "crash"  # exited on its own


class PoolClosed(RuntimeError):
    """The pool is shut down (or its manager failed); submitted work will not be scored."""


@dataclass
class _Batch:
    future: Future[list[Verdict]]
    results: list[Verdict | None]
    remaining: int


@dataclass
class _Item:
    seq: int
    batch: _Batch
    index: int
    ground_truth: str
    response: str


@dataclass
class _Worker:
    slot: int
    process: Any  # multiprocessing BaseProcess of the chosen context
    tasks: Connection
    results: Connection
    state: Any  # RawArray('d', 2): [SEQ, START]
    ready: bool = False
    assigned: dict[int, _Item] = field(default_factory=dict)  # in chunk order
    last_event: float = 0.0


class WorkerPool:
    def __init__(
        self,
        workers: int,
        timeout_s: float,
        soft_timeout_s: float | None = None,
        max_chunk: int = 32,
        spares: int = 0,
        stall_after_s: float = 0.025,
        start_method: str = "forkserver",
        on_restart: Callable[[RestartReason], None] | None = None,
        on_item: Callable[[ItemStatus, float], None] | None = None,
        on_stall: Callable[[], None] | None = None,
    ) -> None:
        if workers < 1 or timeout_s <= 0 or max_chunk < 1 or spares < 0 or stall_after_s <= 0:
            raise ValueError(
                "workers >= 1, timeout_s > 0, max_chunk >= 1, spares >= 0 and stall_after_s > 0 are required"
            )
        self.concurrency = workers  # items scored at once, stalled ones not counted
        self.size = workers + spares  # processes
        self.stall_after_s = stall_after_s
        self.timeout_s = timeout_s
        self.soft_timeout_s = soft_timeout_s
        self.max_chunk = max_chunk
        ctx = mp.get_context(start_method)
        # every start method's context has Process (typeshed's BaseContext, get_context's type, has not)
        assert isinstance(ctx, ForkContext | ForkServerContext | SpawnContext), start_method
        self._ctx = ctx
        if start_method == "forkserver":
            # Replacement workers fork from a server that already imported sympy and math-verify.
            self._ctx.set_forkserver_preload(
                ["asyncdapo.services.verifier.worker", "asyncdapo.services.verifier.math_verdict"]
            )
        self._on_restart = on_restart or (lambda reason: None)
        self._on_item = on_item or (lambda status, seconds: None)
        self._on_stall = on_stall or (lambda: None)
        self._stalls_seen: dict[int, int] = {}  # slot -> seq of the item last counted as stalled
        self._lock = threading.Lock()
        self._inbox: deque[tuple[_Batch, Sequence[tuple[str, str]]]] = deque()
        self._queued = 0  # items submitted and not yet sent to a worker (under _lock)
        self._pending: deque[_Item] = deque()
        self._workers: list[_Worker | None] = [None] * self.size
        self._respawn_at: dict[int, float] = {}
        self._crash_streak: dict[int, int] = {}
        self._seq = 0
        self._closing = False
        self._failure: BaseException | None = None
        self._all_warm = threading.Event()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._thread = threading.Thread(target=self._run, name="verifier-pool", daemon=True)

    # --- caller side (any thread) ---

    def start(self) -> WorkerPool:
        for slot in range(self.size):
            self._workers[slot] = self._spawn(slot)
        self._thread.start()
        return self

    def wait_ready(self, timeout_s: float) -> bool:
        return self._all_warm.wait(timeout_s)

    @property
    def ready(self) -> bool:
        """Every worker warmed once at start, and at least one can take work now."""
        return (
            self._all_warm.is_set()
            and not self._closing
            and self._failure is None
            and any(w is not None and w.ready for w in self._workers)
        )

    @property
    def ready_workers(self) -> int:
        return sum(1 for w in self._workers if w is not None and w.ready)

    def worker_pids(self) -> list[int | None]:
        """Process id per worker slot (None while a slot waits for its replacement)."""
        return [w.process.pid if w is not None else None for w in self._workers]

    @property
    def queued(self) -> int:
        return self._queued

    def submit(self, pairs: Sequence[tuple[str, str]]) -> Future[list[Verdict]]:
        """Score (ground_truth, response) pairs; the future holds one Verdict per pair, in order."""
        future: Future[list[Verdict]] = Future()
        if not pairs:
            future.set_result([])
            return future
        batch = _Batch(future, [None] * len(pairs), len(pairs))
        with self._lock:
            if self._closing or self._failure is not None:
                raise PoolClosed("the verifier pool is shut down")
            self._queued += len(pairs)
            self._inbox.append((batch, pairs))
        self._wake()
        return future

    def close(self, timeout_s: float = 5.0) -> None:
        with self._lock:
            self._closing = True
        self._wake()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        for w in self._workers:
            if w is not None:
                self._stop_worker(w, timeout_s)
        self._fail_all(PoolClosed("the verifier pool was shut down"))
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()

    def __enter__(self) -> WorkerPool:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # BlockingIOError: already signalled (buffer full)
            self._wake_w.send(b"\0")

    # --- manager thread ---

    def _run(self) -> None:
        try:
            while not self._closing:
                self._step()
        except BaseException as err:  # a bug here must fail requests loudly, not hang them
            log.exception("verifier pool manager failed")
            self._failure = err
            self._fail_all(PoolClosed(f"the verifier pool manager failed: {err!r}"))

    def _step(self) -> None:
        for key, _ in self._selector.select(self._poll_timeout()):
            if key.data is None:
                self._drain_wake()
                continue
            w, kind = key.data
            if w is not self._workers[w.slot]:  # retired earlier in this round
                continue
            if kind == "results":
                self._collect(w)
            else:  # exited: _replace still applies the results it sent before dying
                self._replace(w, RestartReason.CRASH)
        self._admit()
        self._enforce_deadlines()
        self._respawn_due()
        self._dispatch()
        if not self._all_warm.is_set() and all(w is not None and w.ready for w in self._workers):
            self._all_warm.set()

    def _poll_timeout(self) -> float | None:
        now = time.monotonic()
        deadlines = []
        for w in self._workers:
            if w is not None and w.assigned:
                seq, start = w.state[SEQ], w.state[START]
                begun = start if int(seq) in w.assigned else w.last_event
                deadlines.append(begun + self.timeout_s)
        deadlines += self._respawn_at.values()
        if self._pending:  # a worker crossing the stall line frees a place for them
            for w in self._workers:
                if w is not None and int(w.state[SEQ]) in w.assigned:
                    at = w.state[START] + self.stall_after_s
                    if at > now:
                        deadlines.append(at)
        if not deadlines:
            return None
        return min(max(min(deadlines) - now, 0.002), _MAX_POLL_S)

    def _drain_wake(self) -> None:
        with contextlib.suppress(BlockingIOError):
            self._wake_r.recv(4096)

    def _admit(self) -> None:
        with self._lock:
            arrived = list(self._inbox)
            self._inbox.clear()
        for batch, pairs in arrived:
            for index, (ground_truth, response) in enumerate(pairs):
                self._seq += 1
                self._pending.append(_Item(self._seq, batch, index, ground_truth, response))

    def _collect(self, w: _Worker) -> None:
        """Apply one message from `w` (epoll is level-triggered: more come in the next round); a
        closed pipe means the worker is gone. `Connection.poll` is avoided: it builds a selector."""
        try:
            self._apply(w, w.results.recv())
        except (EOFError, OSError):
            self._replace(w, RestartReason.CRASH)

    def _apply(self, w: _Worker, msg: Any) -> None:
        w.last_event = time.monotonic()
        if isinstance(msg, list):
            for record in msg:
                seq, verdict, seconds = decode(record)
                item = w.assigned.pop(seq, None)
                if item is not None:
                    self._resolve(item, verdict)
                    self._on_item(verdict.status, seconds)
                    if seconds > SLOW_ITEM_S:  # items take ms: name the input that did not
                        log.warning(
                            "an item took %.2f s to score (%s; response of %d chars: %.80r)",
                            seconds, verdict.status, len(item.response), item.response,
                        )  # fmt: skip
        elif msg[0] == "ready":
            w.ready = True
            self._crash_streak.pop(w.slot, None)

    def _enforce_deadlines(self) -> None:
        now = time.monotonic()
        for w in self._workers:
            if w is None or not w.assigned:
                continue
            seq = int(w.state[SEQ])  # read before START: see worker.py
            start = w.state[START]
            if seq in w.assigned and now - start > self.timeout_s:
                self._replace(w, RestartReason.TIMEOUT)

    def _stalled(self, w: _Worker, now: float) -> bool:
        seq = int(w.state[SEQ])  # read before START: see worker.py
        return seq in w.assigned and now - w.state[START] > self.stall_after_s

    def _dispatch(self) -> None:
        if not self._pending:
            return
        now = time.monotonic()
        busy = 0
        for w in self._workers:
            if w is None or not w.assigned:
                continue
            if not self._stalled(w, now):
                busy += 1
            elif self._stalls_seen.get(w.slot) != int(w.state[SEQ]):
                self._stalls_seen[w.slot] = int(w.state[SEQ])
                self._on_stall()
        places = self.concurrency - busy
        idle = [w for w in self._workers if w is not None and w.ready and not w.assigned]
        del idle[max(places, 0) :]
        while idle and self._pending:
            n = min(self.max_chunk, math.ceil(len(self._pending) / len(idle)))
            w = idle.pop()
            chunk: list[_Item] = []
            while self._pending and len(chunk) < n:
                item = self._pending.popleft()
                with self._lock:
                    self._queued -= 1
                if not item.batch.future.cancelled():
                    chunk.append(item)
            if not chunk:
                continue
            w.assigned = {item.seq: item for item in chunk}
            w.last_event = time.monotonic()
            task: Chunk = (self.soft_timeout_s, [(i.seq, i.ground_truth, i.response) for i in chunk])
            try:
                w.tasks.send(task)
            except OSError:  # died since its last message: its items go back to the queue
                self._replace(w, RestartReason.CRASH)

    def _replace(self, w: _Worker, reason: RestartReason) -> None:
        """Retire `w` (killing it if needed), settle its items, and schedule a fresh worker."""
        current = int(w.state[SEQ])
        if w.process.is_alive():
            w.process.kill()
        w.process.join(2.0)
        self._selector.unregister(w.results)
        self._selector.unregister(w.process.sentinel)
        try:  # results it finished before dying are still in the pipe
            while w.results.poll():
                self._apply(w, w.results.recv())
        except (EOFError, OSError):
            pass
        w.tasks.close()
        w.results.close()
        requeue: list[_Item] = []
        for seq, item in w.assigned.items():
            if seq != current:
                requeue.append(item)
            elif reason is RestartReason.TIMEOUT:
                why = f"hard timeout: still running after {self.timeout_s:.2f} s; worker process killed"
                self._resolve(item, Verdict(ItemStatus.TIMEOUT, error=why))
                self._on_item(ItemStatus.TIMEOUT, self.timeout_s)
            else:
                why = f"worker process died (exit code {w.process.exitcode}) while scoring this item"
                self._resolve(item, Verdict(ItemStatus.ERROR, error=why))
                self._on_item(ItemStatus.ERROR, 0.0)
        w.assigned = {}
        with self._lock:
            self._queued += len(requeue)
        self._pending.extendleft(reversed(requeue))
        log.warning(
            "verifier worker %d (pid %s) retired: %s; %d item(s) requeued",
            w.slot,
            w.process.pid,
            reason.value,
            len(requeue),
        )
        self._on_restart(reason)
        self._workers[w.slot] = None
        streak = self._crash_streak.get(w.slot, 0) if w.ready else self._crash_streak.get(w.slot, 0) + 1
        self._crash_streak[w.slot] = streak
        # A worker that keeps dying before it is even warm must not become a fork bomb.
        delay = 0.0 if streak == 0 else RESPAWN_BACKOFF.delay(streak - 1)
        self._respawn_at[w.slot] = time.monotonic() + delay

    def _respawn_due(self) -> None:
        now = time.monotonic()
        for slot, at in list(self._respawn_at.items()):
            if at <= now and not self._closing:
                try:
                    self._workers[slot] = self._spawn(slot)
                except OSError:  # out of processes or descriptors: keep serving with the others
                    log.exception("could not start verifier worker %d; retrying in 1 s", slot)
                    self._respawn_at[slot] = now + 1.0
                else:
                    del self._respawn_at[slot]

    def _spawn(self, slot: int) -> _Worker:
        tasks_r, tasks_w = self._ctx.Pipe(duplex=False)
        results_r, results_w = self._ctx.Pipe(duplex=False)
        state = self._ctx.RawArray("d", [IDLE, 0.0])
        process = self._ctx.Process(
            target=worker_main,
            args=(tasks_r, results_w, state),
            name=f"verifier-worker-{slot}",
            daemon=True,
        )
        process.start()
        # Only the child may hold these ends, so its death shows up as EOF here.
        tasks_r.close()
        results_w.close()
        w = _Worker(slot, process, tasks_w, results_r, state, last_event=time.monotonic())
        self._selector.register(results_r, selectors.EVENT_READ, (w, "results"))
        self._selector.register(process.sentinel, selectors.EVENT_READ, (w, "sentinel"))
        return w

    def _resolve(self, item: _Item, verdict: Verdict) -> None:
        batch = item.batch
        if batch.results[item.index] is not None:
            return
        batch.results[item.index] = verdict
        batch.remaining -= 1
        if batch.remaining == 0 and not batch.future.done():
            with contextlib.suppress(InvalidStateError):  # cancelled by the caller meanwhile
                batch.future.set_result(cast("list[Verdict]", batch.results))  # remaining == 0: all set

    def _fail_all(self, err: BaseException) -> None:
        with self._lock:
            arrived = list(self._inbox)
            self._inbox.clear()
            self._queued = 0
        batches = {id(b): b for b, _ in arrived}
        batches.update({id(i.batch): i.batch for i in self._pending})
        for w in self._workers:
            if w is not None:
                batches.update({id(i.batch): i.batch for i in w.assigned.values()})
        self._pending.clear()
        for batch in batches.values():
            if not batch.future.done():
                with contextlib.suppress(InvalidStateError):
                    batch.future.set_exception(err)

    def _stop_worker(self, w: _Worker, timeout_s: float) -> None:
        w.tasks.close()  # EOF: the worker exits after its current item
        w.process.join(timeout_s)
        if w.process.is_alive():
            w.process.kill()
            w.process.join(2.0)
        w.results.close()
