"""bench-longtail's runs: the configs per mode, one run on the local stack and its record (`Run`),
the runs saved under a rate's directory. Split out of bench/bench_longtail.py."""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import yaml

# bench/ is on sys.path: the script is run as `python bench/bench_longtail.py`
from bench_e2e import scrape_all
from rollout_timeline import GroupsWatcher, WeightsWatcher, generation_times

from asyncdapo.contracts.config import RunConfig
from asyncdapo.contracts.v1 import scheduler_pb2_grpc
from asyncdapo.tools.data import longtail
from asyncdapo.tools.local.report import read_metrics
from asyncdapo.tools.local.run import run_status
from asyncdapo.tools.local.stack import LocalStack

CACHE = Path("runs/cache")
DATA = CACHE / "longtail" / "data"
MODEL = CACHE / "tiny-model-sft-lt512"
B, N = 4, 8
PASS_N = 32  # responses per problem in each measurement over all problems (4 groups of n = 8)
MAX_RESPONSE_LENGTH = 512
# the workload's sampling temperature: the pass rates the datasets are mixed from are measured at it
# (ensure_assets; docs/workloads.md)
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
    return scrape_all(ports, labelled=True)


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
    from asyncdapo.contracts.v1 import gateway_pb2, gateway_pb2_grpc
    from asyncdapo.runtime.grpc_security import bearer_metadata

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
