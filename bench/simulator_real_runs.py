"""bench_simulator's real side: the configs run on the real local stack (bench_e2e's stack, model,
data and config, with `--step-logs`), each run read back from its bench.json and step logs, and the
helpers that read cpu_sampler's per-service CPU samples (CPU time and run delay between two samples).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# bench/ is on sys.path: the script is run as `python bench/bench_simulator.py`
from bench_e2e import CACHE, bench_config, run_mode

from asyncdapo.contracts.config import RunConfig
from asyncdapo.tools.simulate.modes import mode_config
from asyncdapo.tools.simulate.profile import GATEWAY_MAX_NUM_SEQS

CONFIGS = ("sync", "async", "async-fifo", "fully-async", "pdsr")
# P-DSR's two gateway pools: gateway 0 `fast`, gateway 1 `heavy` (the simulator: heavy_fraction 0.5)
POOLS = {"pdsr": ["fast", "heavy"]}
KV_CAPACITY = 1 << 20  # 1 GiB / 1,024 B per token (see the docstring)
LR = 1e-5


@dataclass(frozen=True)
class Bench:
    """What the real runs and the simulator share: the model, its dataset, the run's shape, the
    gateways' capacity and the replay trace of the dataset (`--bench`)."""

    name: str
    model: Path
    train_file: Path
    max_response_length: int
    temperature: float
    batch: int  # train_batch_size (= ppo_mini_batch_size)
    max_concurrency: int  # each gateway's --max-concurrency: vLLM's max_num_seqs
    trace: Path  # real generations of train_file's problems (ensure_replay_trace)
    out: Path  # where the runs and the analysis go
    overlong_len: int = 32


BENCHES = {
    # bench_e2e's: the warm-started long-tail tiny model on the demo data, 160-token cap
    "demo": Bench(
        "demo", CACHE / "tiny-model-sft-longtail", CACHE / "data" / "train.parquet", 160, 1.0, 8,
        GATEWAY_MAX_NUM_SEQS, CACHE / "bench-simulator" / "replay-train.jsonl", Path("runs/bench-simulator"),
    ),
    # bench-longtail's valid-rate-0.3 dataset and 512-token model (its assets: `make bench-longtail`)
    "longtail-v0.3": Bench(
        "longtail-v0.3", CACHE / "tiny-model-sft-lt512", CACHE / "longtail" / "data" / "train-v0.3.parquet",
        512, 0.6, 4, 96, CACHE / "bench-simulator" / "replay-longtail-v0.3.jsonl",
        Path("runs/bench-simulator-longtail-v0.3"), overlong_len=64,
    ),
}  # fmt: skip


def real_config(mode: str, bench: Bench, steps: int) -> dict[str, Any]:
    """bench_e2e's config on `bench`'s model, data and shape, with the simulator's mode change
    (modes.py: the same function both sides use)."""
    raw = bench_config("async", bench.model, steps, bench.max_response_length, LR, "expected-valid")
    raw["data"].update(train_files=[str(bench.train_file)], train_batch_size=bench.batch)
    raw["rollout"]["temperature"] = bench.temperature
    raw["reward"]["overlong_buffer"]["len"] = bench.overlong_len
    raw["trainer"]["ppo_mini_batch_size"] = bench.batch
    return mode_config(RunConfig.model_validate(raw), mode).model_dump(mode="json")


# ------------------------------------------------------------------------- CPU samples
def cpu_delta(a: dict[str, Any], b: dict[str, Any], names: tuple[str, ...]) -> float:
    return sum(b["cpu"].get(n, 0.0) - a["cpu"].get(n, 0.0) for n in names)


def service_groups(sample: dict[str, Any]) -> tuple[str, ...]:
    """The process groups sampled (not the "NAME:engine" threads inside them)."""
    return tuple(n for n in sample["cpu"] if ":" not in n)


def gateway_groups(sample: dict[str, Any]) -> tuple[str, ...]:
    return tuple(sorted(n for n in service_groups(sample) if n.startswith("gateway-")))


def engine_threads(sample: dict[str, Any]) -> tuple[str, ...]:
    """The gateways' engine-core threads (cpu_sampler.group_stats)."""
    return tuple(f"{g}:engine" for g in gateway_groups(sample) if f"{g}:engine" in sample["cpu"])


def measured_stretch(a: dict[str, Any], b: dict[str, Any], names: tuple[str, ...]) -> float:
    """How much longer the groups' work took than with a core each, between two CPU samples:
    1 + run delay (runnable, waiting for a core) / CPU time (cpu_sampler.group_stats)."""
    cpu = cpu_delta(a, b, names)
    if "delay" not in a or cpu <= 0:
        return 1.0
    delay = sum(max(0.0, b["delay"].get(n, 0.0) - a["delay"].get(n, 0.0)) for n in names)
    return 1.0 + delay / cpu


BUSY_CORES = 0.25  # an engine whose core thread used at least this share of a core was stepping


def stepping_gateways(a: dict[str, Any], b: dict[str, Any]) -> int:
    """Gateways whose engine thread was busy between two samples (>= BUSY_CORES of a core)."""
    dt = b["t"] - a["t"]
    if dt <= 0:
        return 0
    gws = gateway_groups(b)
    return sum(
        1
        for g in gws
        if cpu_delta(a, b, (f"{g}:engine",) if f"{g}:engine" in b["cpu"] else (g,)) / dt >= BUSY_CORES
    )


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
    def window_completions(self) -> float:
        """Completions within `window()`: the run's, in proportion to the versions committed there."""
        return self.status["rollout/completions"] * self.window_versions() / max(len(self.ends), 1)

    @property
    def engine_stretch(self) -> float:
        """The engines' measured slow-down over the measured versions (1 + run delay / CPU)."""
        w = self.window()
        return measured_stretch(w[0], w[1], engine_threads(w[1])) if w is not None else float("nan")

    @property
    def trainer_times(self) -> list[float]:
        """B-th group (or the announcement, whichever is later) of v to the announcement of v + 1,
        less the fan-out: read, train, checkpoint, snapshot, publish's own overhead."""
        return [
            self.announced[v + 1] - max(self.ends[v], self.announced[v]) - self.fanout
            for v in self.versions()
            if v + 1 in self.announced
        ]

    @functools.cached_property
    def trainer_steps(self) -> list[tuple[float, float, float]]:
        """(start, tokens trained, `trainer_times` entry) per measured version: the step that
        publishes v + 1 starts at its B-th group or v's announcement, whichever is later, and
        trains its responses' prompt + response tokens (the trainer's metrics line `step` v + 1),
        which the simulator's trainer is priced on (`TrainerProfile.step_s`)."""
        rows = {}
        for line in (self.dir / "trainer" / "metrics.jsonl").read_text().splitlines():
            if line.strip():
                m = json.loads(line)
                rows[int(m["step"])] = m["batch/responses"] * (
                    m["response_length/mean"] + m["prompt_length/mean"]
                )
        vs = [v for v in self.versions() if v + 1 in self.announced]
        return [
            (max(self.ends[v], self.announced[v]), rows[v + 1], t)
            for v, t in zip(vs, self.trainer_times, strict=True)
            if v + 1 in rows
        ]

    @functools.cached_property
    def judged_times(self) -> list[float]:
        """When each response was judged (the response log's `judged` lines), sorted; [] without a
        log."""
        if not self.response_log.is_file():
            return []
        out = []
        for line in self.response_log.read_text().splitlines():
            if line.strip() and (x := json.loads(line))["event"] == "judged":
                out.append(float(x["t"]))
        return sorted(out)

    @property
    def response_log(self) -> Path:
        """The scheduler's --response-log of the run (older runs may have none)."""
        return self.dir / "logs" / "scheduler.responses.jsonl"

    @property
    def step_logs(self) -> list[Path]:
        return sorted((self.dir / "logs").glob("gateway-*.steps.jsonl"))

    def mean_of(self, hist: str) -> float:
        n = self.prom.get(hist + "_count", 0.0)
        return self.prom.get(hist + "_sum", 0.0) / n if n else float("nan")


def run_all(args: argparse.Namespace, bench: Bench) -> None:
    """Every config, rep by rep (interleaved). Rep r samples with rollout.seed r - 1: with one seed
    every rep drew the same generations (sync's tokens per version were identical across reps), so
    a config's three runs were one draw of the workload, and their median could sit anywhere in
    the spread of draws the simulator's realisations average over."""
    for rep in range(1, args.reps + 1):
        for mode in args.configs:
            cfg = real_config(mode, bench, args.steps)
            cfg["rollout"]["seed"] = rep - 1
            print(
                f"== rep {rep}/{args.reps} {mode}: {args.steps} steps, load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
            run_mode(mode, cfg, args.out / f"rep{rep}" / mode, args.warmup, args.timeout_s, step_logs=True,
                     pools=POOLS.get(mode), max_concurrency=bench.max_concurrency)  # fmt: skip
