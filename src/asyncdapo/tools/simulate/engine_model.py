"""SIMULATOR: one vLLM engine as an event-driven model — it jumps from event to event, never
token by token.

What it models (vLLM V1's scheduler, FCFS):
- continuous batching: every engine step emits one token for every decoding sequence; the step
  takes `EngineProfile.step_s(sequences, kv_tokens, prefill_tokens)`;
- admission: a waiting request starts when fewer than `max_num_seqs` run and its context (prompt
  plus tokens it already has: a continuation, or a preempted request's) fits in the free KV cache;
  FCFS stops at the first that does not fit;
- chunked prefill: admitted contexts are prefilled `max_num_batched_tokens − decoders` tokens per
  step, beside the decodes; a request's first token comes with the end of its prefill;
- preemption: when the decoders' next tokens do not fit in the KV cache, the latest admitted
  decoder is preempted (recompute mode: its cache freed, it goes back to the head of the waiting
  queue and is prefilled again, prompt and generated tokens, when it is re-admitted);
- pause `keep` (nothing steps; after a reload every held context is recomputed, chunked, before
  decoding goes on, as the gateway makes vLLM do), `abort` (everything returns with its partial
  tokens), `wait` (no admissions until the running requests finished); `resume`.

Between two events the decoders are fixed, so k steps take
    T(k) = k (A + C K0) + C N k (k − 1) / 2
(A: the step's fixed part, C: cost per KV token, K0: the decoders' KV at the start — block rounding
included, `EngineProfile.kv_block_tokens` — N: decoders,
whose KV grows by N per step), and the next event is the nearest of: a decoder reaching its
target length, the prefill ending, or the KV cache filling up. A change from outside (a request
arrives or is aborted, a pause) takes effect at the end of the step in progress, as in vLLM.

On a CPU profile with host contention (`profile.HostCpuContention`), A and C are multiplied by
the driver's stretch factor at the time the segment is planned (the other processes' CPU demand
then; a segment ends at the engine's next event, so the factor follows the load event by event).

Version runs: the engine remembers the step counter at each weight change, and each sequence the
counter when it started decoding here, so a response held across a reload reports
[(v, a), (v + 1, b)] without any per-token bookkeeping.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable
from heapq import heapify, heappop, heappush
from typing import Any

from asyncdapo.tools.simulate.clock import VirtualClock
from asyncdapo.tools.simulate.profile import EngineProfile

WAITING, PREFILL, DECODE, DONE = 0, 1, 2, 3
RUNNING, PAUSED_NEW, PAUSED_ALL = 0, 1, 2
INF = 1 << 62


class Seq:
    """One request on an engine. `gen` counts every token the response has (a continuation's
    included); `target` is where it stops (its natural length or its max_tokens)."""

    __slots__ = (
        "gen",
        "join",
        "need",
        "order",
        "owner",
        "piece_d",
        "piece_v",
        "prompt",
        "runs",
        "state",
        "target",
    )

    def __init__(
        self, owner: Any, prompt: int, gen: int, target: int, runs: list[list[int]] | None = None
    ) -> None:
        self.owner = owner
        self.prompt = prompt
        self.gen = gen
        self.target = target
        self.state = WAITING
        self.join = 0  # decode counter when it (re)started decoding
        self.order = 0  # admission order (preemption takes the latest)
        self.need = 0  # tokens being prefilled
        self.runs: list[list[int]] = runs if runs is not None else []  # [version, tokens] runs
        self.piece_d = 0
        self.piece_v = 0


def seq_cost_table(profile: EngineProfile) -> list[float]:
    """`profile.seq_s(k)` for k = 0..max_num_seqs."""
    return [profile.seq_s(k) for k in range(profile.max_num_seqs + 1)]


class Engine:
    """One engine on the virtual clock. `on_finish(seq)` is called for every sequence that reached
    its target (after the engine's own state is settled: it may call back into the engine);
    `on_drained(engine)` when a `wait` pause has no request left running."""

    def __init__(
        self,
        clock: VirtualClock,
        profile: EngineProfile,
        on_finish: Callable[[Seq], None],
        on_drained: Callable[[Engine], None] | None = None,
        name: str = "",
        seq_costs: list[float] | None = None,
    ) -> None:
        self.clock = clock
        self.p = profile
        # profile.seq_s(k) for k = 0..max_num_seqs, read per planned segment (the piecewise slope
        # is a Python loop over the knots); engines of one profile can share one list
        self._seq_costs = seq_costs if seq_costs is not None else seq_cost_table(profile)
        self.name = name
        self.on_finish = on_finish
        self.on_drained = on_drained
        # CPU profiles with host contention (profile.HostCpuContention): the factor on the step
        # time of the segment being planned, read once per segment; None on GPU profiles
        self.stretch: Callable[[], float] | None = None
        self._a, self._c, self._d = (
            profile.base_s,
            profile.per_kv_token_s,
            profile.prefill_per_token_s,
        )
        # the KV measure per_kv_token_s was fitted on counts whole blocks: each decoder is charged
        # its context plus this much (profile.EngineProfile.kv_block_tokens)
        self._pad = profile.kv_pad_tokens
        self.cap = profile.kv_capacity_tokens
        self.max_seqs = profile.max_num_seqs
        self.budget = profile.max_num_batched_tokens
        self.D = 0  # decode steps so far (tokens each decoder got)
        self.heap: list[tuple[int, int, Seq]] = []  # (finish step, order, seq), lazy deletion
        # (order, seq) of decoders in admission order, lazy deletion: sequences start decoding in
        # the order they were admitted, so the list stays sorted and the latest is at its end
        self.victims: list[tuple[int, Seq]] = []
        self.n_dec = 0
        self.kv_const = 0  # decoders' KV = kv_const + n_dec * D
        self.prefilling: list[Seq] = []
        self.n_pf = 0
        self.pf_left = 0.0
        self.pf_total = 0
        self.kv_pf = 0
        self.recompute_left = 0.0
        self.waiting: deque[Seq] = deque()
        self.n_wait = 0
        self.state = RUNNING
        self.version = 0
        self.mark_d: list[int] = []  # decode step of each weight change
        self.mark_v: list[int] = []  # the version loaded then
        self._order = 0
        # the segment in progress: (t0, k, A, C, K0, N, advances, chunk, recompute)
        self.seg: tuple[float, int, float, float, float, int, bool, float, bool] | None = None
        self.t_b = 0.0  # time of the engine's last step boundary
        self.stamp = 0
        self.event_at: float | None = None
        self._on_event_cb = self._on_event  # one bound method, not one per scheduled event
        self._finished: list[Seq] = []
        # statistics
        self.busy_s = 0.0
        self.decode_tokens = 0
        self.prefill_tokens = 0.0
        self.steps = 0
        self.preemptions = 0

    # ------------------------------------------------------------------ queries
    @property
    def running(self) -> int:
        return self.n_dec + self.n_pf

    def kv_used(self) -> int:
        return self.kv_const + self.n_dec * self.D + self.kv_pf

    def kv_usage(self) -> float:
        return min(1.0, self.kv_used() / self.cap)

    def tokens_of(self, s: Seq) -> int:
        """Tokens `s` has at the engine's current boundary."""
        if s.state == DECODE:
            return s.gen + self.D - s.join
        return s.gen

    # ------------------------------------------------------------------ segment arithmetic
    @staticmethod
    def _t(k: int, A: float, C: float, K0: float, N: int) -> float:
        return k * (A + C * K0) + C * N * k * (k - 1) / 2

    def _steps_by(self, elapsed: float, k: int, A: float, C: float, K0: float, N: int) -> int:
        """The first step boundary at or after `elapsed` (0 … k)."""
        if elapsed <= 0:
            return 0
        alpha = C * N / 2
        beta = A + C * K0 - alpha
        if alpha > 0:
            x = (-beta + math.sqrt(beta * beta + 4 * alpha * elapsed)) / (2 * alpha)
        elif beta > 0:
            x = elapsed / beta
        else:
            return k
        j = max(0, math.ceil(x - 1e-9))
        while j > 0 and self._t(j - 1, A, C, K0, N) >= elapsed:  # float guard
            j -= 1
        while j < k and self._t(j, A, C, K0, N) < elapsed - 1e-12:
            j += 1
        return min(j, k)

    def _apply(self, j: int) -> None:
        """Advance the current segment's state by j steps."""
        assert self.seg is not None
        if j <= 0:
            return
        _t0, _k, A, C, K0, N, adv, chunk, recompute = self.seg
        self.busy_s += self._t(j, A, C, K0, N)
        self.steps += j
        if adv:
            self.D += j
            self.decode_tokens += N * j
        if chunk:
            done = chunk * j
            if recompute:
                self.recompute_left = max(0.0, self.recompute_left - done)
            else:
                self.pf_left = max(0.0, self.pf_left - done)
            self.prefill_tokens += done

    def _schedule(self, t: float) -> None:
        self.stamp += 1
        self.event_at = t
        self.clock.at(t, self._on_event_cb, self.stamp)

    def _interrupt(self) -> None:
        """Bring the engine to the end of the step in progress; the change being made applies from
        there, and an event there settles and re-plans."""
        seg = self.seg
        if seg is None:
            if self.event_at is None:
                self._schedule(max(self.t_b, self.clock.now))
            return
        t0 = seg[0]
        if self.clock.now == t0:  # a change at the boundary the segment starts from: no step ran
            self.t_b = t0
        else:
            k, A, C, K0, N = seg[1], seg[2], seg[3], seg[4], seg[5]
            j = self._steps_by(self.clock.now - t0, k, A, C, K0, N)
            self._apply(j)
            self.t_b = t0 + self._t(j, A, C, K0, N)
        self.seg = None
        self._schedule(self.t_b)

    # ------------------------------------------------------------------ events
    def _on_event(self, stamp: int) -> None:
        if stamp != self.stamp:
            return
        self.event_at = None
        seg = self.seg
        if seg is not None:
            self._apply(seg[1])
            self.seg = None
        self.t_b = self.clock.now
        # settle: the transitions at this boundary (prefill done, targets reached, KV overflow)
        if self.n_pf and self.pf_left <= 0 and self.recompute_left <= 0:
            self._activate_prefilled()
        heap = self.heap
        D = self.D
        if heap and heap[0][0] <= D:
            finished = self._finished
            leave = self._leave_decode
            while heap and heap[0][0] <= D:
                _, order, s = heappop(heap)
                if s.state == DECODE and s.order == order:
                    leave(s)
                    s.gen = s.target
                    s.state = DONE
                    finished.append(s)
        if self.n_dec:
            cap = self.cap
            while self.n_dec and self.kv_const + self.n_dec * (D + 1) + self.kv_pf > cap:  # kv_used() + n_dec
                self._preempt()
        self._plan()
        if self._finished:
            done, self._finished = self._finished, []
            on_finish = self.on_finish
            for s in done:
                on_finish(s)
        if self.state == PAUSED_NEW and not self.n_dec + self.n_pf and self.on_drained is not None:
            self.on_drained(self)

    def _activate_prefilled(self) -> None:
        D = self.D
        version = self.version
        heap, victims = self.heap, self.victims
        kv_pf, n_dec, kv_const, started = self.kv_pf, self.n_dec, self.kv_const, 0
        for s in self.prefilling:
            if s.state != PREFILL:
                continue
            kv_pf -= s.need
            if s.gen >= s.target:  # nothing left to generate (a continuation at its end)
                s.state = DONE
                self._finished.append(s)
                continue
            gen = s.gen = s.gen + 1  # the first token comes with the prefill's last step
            started += 1
            s.piece_d, s.piece_v = D - 1, version
            s.state = DECODE
            s.join = D
            n_dec += 1
            kv_const += s.prompt + gen - D
            heappush(heap, (D + s.target - gen, s.order, s))
            victims.append((s.order, s))
        self.kv_pf, self.n_dec, self.kv_const = kv_pf, n_dec, kv_const
        self.decode_tokens += started
        self.prefilling = []
        self.n_pf = 0
        self.pf_left = 0.0
        self.pf_total = 0
        self._prune()

    def _prune(self) -> None:
        """Drop the heaps' entries of sequences that left decoding (finished early, aborted,
        preempted) once they outnumber the decoders: lazy deletion must not keep every sequence
        an engine ever ran alive."""
        limit = 2 * self.n_dec + 64
        if len(self.heap) > limit:
            self.heap = [e for e in self.heap if e[2].state == DECODE and e[2].order == e[1]]
            heapify(self.heap)
        if len(self.victims) > limit:  # stays sorted
            self.victims = [e for e in self.victims if e[1].state == DECODE and e[1].order == e[0]]

    def _leave_decode(self, s: Seq) -> None:
        """`s` stops decoding at the current boundary: its tokens and version runs."""
        gen = s.gen + self.D - s.join
        self.n_dec -= 1
        self.kv_const -= s.prompt + s.gen - s.join
        self._close_piece(s, gen)
        s.gen = gen

    def _close_piece(self, s: Seq, gen: int) -> None:
        """Version runs of the tokens `s` decoded here since it started decoding (one step before
        its first token, `piece_d`), split where the weights changed."""
        count = gen - (s.gen - 1)
        if count <= 0:
            return
        d0 = s.piece_d
        marks = self.mark_d
        if not marks or marks[-1] <= d0:  # no weight change since it started: one run
            runs = s.runs
            if runs and runs[-1][0] == s.piece_v:
                runs[-1][1] += count
            else:
                runs.append([s.piece_v, count])
            return
        d1 = d0 + count
        v, cur = s.piece_v, d0
        i = bisect.bisect_right(marks, d0)
        while i < len(marks) and marks[i] < d1:
            _add_run(s.runs, v, marks[i] - cur)
            cur, v = marks[i], self.mark_v[i]
            i += 1
        _add_run(s.runs, v, d1 - cur)

    def _preempt(self) -> None:
        victims = self.victims
        while victims:
            order, s = victims.pop()
            if s.state == DECODE and s.order == order:
                break
        else:
            return
        self._leave_decode(s)
        s.state = WAITING
        self.waiting.appendleft(s)
        self.n_wait += 1
        self.preemptions += 1

    def _admit(self) -> None:
        w = self.waiting
        n_dec, cap, max_seqs = self.n_dec, self.cap, self.max_seqs
        dec_kv = self.kv_const + n_dec * self.D
        while w:
            s = w[0]
            if s.state != WAITING:
                w.popleft()
                continue
            if n_dec + self.n_pf >= max_seqs:
                return
            need = s.prompt + s.gen
            # its context, and one more step of every decoder (vLLM would preempt it at once)
            if dec_kv + self.kv_pf + need + n_dec + 1 > cap:  # kv_used() + …
                return
            w.popleft()
            self.n_wait -= 1
            self._order += 1
            s.order = self._order
            s.state = PREFILL
            s.need = need
            self.prefilling.append(s)
            self.n_pf += 1
            self.pf_left += need
            self.pf_total += need
            self.kv_pf += need

    def _plan(self) -> None:
        """Admit, then schedule the end of the next segment (or nothing: idle or paused)."""
        if self.state == PAUSED_ALL:
            return
        if self.state == RUNNING and self.recompute_left <= 0:
            self._admit()
        N = self.n_dec
        A: float
        if self.recompute_left > 0:
            # k steps of at most the budget, the context split evenly over them: the last chunk of
            # a recompute is what is left, not a whole budget
            k = max(1, math.ceil(self.recompute_left / self.budget))
            chunk = self.recompute_left / k
            A = self._a + self._d * chunk
            C, K0, adv, recompute, N = self._c, self.kv_used() + self._pad * self.n_dec, False, True, 0
        else:
            if not N and not self.n_pf:
                return
            recompute, adv = False, True
            if self.n_pf:
                chunk = float(max(1, min(self.pf_left, self.budget - N)))
                k_p = max(1, math.ceil(self.pf_left / chunk))
            else:
                chunk, k_p = 0.0, INF
            k_f = k_o = INF
            D = self.D
            if N:
                heap = self.heap
                while True:
                    top = heap[0]
                    s = top[2]
                    if s.state == DECODE and s.order == top[1]:
                        break
                    heappop(heap)
                k_f = top[0] - D
                # >= 1: settling preempted until one more step fits, admission left that room
                k_o = max(1, (self.cap - (self.kv_const + N * D + self.kv_pf)) // N)  # kv_used()
            k = max(1, min(k_p, k_f, k_o))
            seqs = N + self.n_pf
            costs = self._seq_costs
            A = self._a + (costs[seqs] if seqs < len(costs) else self.p.seq_s(seqs)) + self._d * chunk
            C, K0 = self._c, self.kv_const + N * (D + self._pad)
        if self.stretch is not None:
            f = self.stretch()
            A, C = A * f, C * f
        self.seg = (self.t_b, k, A, C, K0, N, adv, chunk, recompute)
        self._schedule(self.t_b + self._t(k, A, C, K0, N))

    # ------------------------------------------------------------------ from the driver
    def submit(self, s: Seq) -> None:
        s.state = WAITING
        self._interrupt()
        self.waiting.append(s)
        self.n_wait += 1

    def abort(self, s: Seq) -> int:
        """Abort `s` (at the end of the step in progress); returns the tokens it has."""
        if s.state == DONE:
            return s.gen
        self._interrupt()
        st = s.state
        if st == DECODE:
            self._leave_decode(s)
        elif st == PREFILL:
            self.n_pf -= 1
            self.kv_pf -= s.need
            if self.pf_total > 0:
                self.pf_left = max(0.0, self.pf_left - s.need * self.pf_left / self.pf_total)
            self.pf_total -= s.need
            self.prefilling = [x for x in self.prefilling if x is not s]
        elif st == WAITING:
            self.n_wait -= 1
        s.state = DONE
        return s.gen

    def pause(self, mode: str) -> list[Seq]:
        """`keep`: freeze; `abort`: abort everything (returned, with their tokens in `gen`);
        `wait`: admit nothing until the running requests finished (then `on_drained`)."""
        self._interrupt()
        if mode == "keep":
            self.state = PAUSED_ALL
            return []
        self.state = PAUSED_NEW
        if mode == "abort":
            victims = [x for x in self.prefilling if x.state == PREFILL]
            victims += [x for _, _, x in self.heap if x.state == DECODE]
            victims += [x for x in self.waiting if x.state == WAITING]
            seen: set[int] = set()
            out = []
            for x in victims:
                if id(x) not in seen:
                    seen.add(id(x))
                    self.abort(x)
                    out.append(x)
            self.waiting.clear()
            return out
        return []

    def resume(self, version: int) -> None:
        """Resume after a pause; a new `version` is the reloaded weights."""
        self._interrupt()
        reloaded = version != self.version
        if reloaded:
            self.version = version
            self.mark_d.append(self.D)
            self.mark_v.append(version)
            if self.p.keep_recompute:
                self.recompute_left += self.kv_const + self.n_dec * self.D
                if self.n_pf:
                    self.pf_left = float(self.pf_total)
        self.state = RUNNING


def _add_run(runs: list[list[int]], version: int, count: int) -> None:
    if count <= 0:
        return
    if runs and runs[-1][0] == version:
        runs[-1][1] += count
    else:
        runs.append([version, count])
