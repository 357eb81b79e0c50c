"""The scheduler benchmarks' SIMULATOR gateway fleet and the helpers their workloads share.

`SimFleet` serves `count` gateways running the gateway's token-timing SIMULATOR from child
processes of this file (`python bench/scheduler_fleet.py --serve-sims …`, an internal entry point),
so the scheduler under test keeps its own core. Used by `bench_scheduler.py` and by its
cost-at-scale phase (`scheduler_scale.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
from typing import Any

MAX_TOKENS = 96  # the workloads' max_response_length (the cost-at-scale phase sets its own)


async def _serve_sims(
    count: int, capacity: int, timing: dict[str, float], first_seed: int = 0, answers: str = ""
) -> None:
    from prometheus_client import CollectorRegistry

    from asyncdapo.services.gateway.gateway_service import GatewayOptions
    from asyncdapo.services.gateway.metrics import GatewayMetrics
    from asyncdapo.services.gateway.server import GatewayServer, ServerSettings
    from asyncdapo.services.gateway.sim_engine import SimTiming, SimulatedEngine

    servers = []
    key, model = None, None
    if answers:  # answer-key mode: realistic text ending in a boxed answer the verifier can judge
        from asyncdapo.services.gateway.sim_answers import load_answer_key

        spec = json.loads(answers)
        key, model = load_answer_key(spec["key"]), spec["model"]
    for i in range(first_seed, first_seed + count):
        engine = SimulatedEngine(
            SimTiming(**timing), max_concurrency=capacity, seed=i, model_dir=model, answer_key=key
        )
        s = GatewayServer(
            engine,
            GatewayOptions(gateway_id=f"sim-{i}", capacity=capacity),
            ServerSettings(port=0, drain_timeout_s=0.0),
            GatewayMetrics(CollectorRegistry()),
        )
        await s.start()
        servers.append(s)
    print(json.dumps([s.port for s in servers]), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the parent closes it
    for s in servers:
        await s.stop(0)


class SimFleet:
    """`count` SIMULATOR gateways spread over `processes` child processes (seeds stay distinct).

    One Python process serving every gateway is a queue of its own: an Abort to any gateway waits
    behind the whole fleet's ready work, which the abort fan-out p99 would then measure."""

    def __init__(
        self, count: int, capacity: int, timing: dict[str, float], processes: int = 1, answers: str = ""
    ) -> None:
        processes = max(1, min(processes, count))
        self.procs: list[subprocess.Popen[str]] = []
        self.addresses: list[str] = []
        try:
            for k in range(processes):
                share = count // processes + (k < count % processes)
                first = sum(count // processes + (j < count % processes) for j in range(k))
                cmd = [sys.executable, __file__, "--serve-sims", str(share), "--first-seed", str(first),
                       "--capacity", str(capacity), "--timing", json.dumps(timing), "--answers", answers]  # fmt: skip
                pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.DEVNULL}
                self.procs.append(subprocess.Popen(cmd, text=True, **pipes))
            for proc in self.procs:
                line = proc.stdout.readline() if proc.stdout else ""
                if not line:
                    raise RuntimeError("the simulator fleet did not start")
                self.addresses += [f"127.0.0.1:{p}" for p in json.loads(line)]
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for proc in self.procs:
            if proc.stdin:
                proc.stdin.close()
        for proc in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def bench_cfg(name: str, **rollout: Any) -> Any:
    """One workload's RunConfig: `rollout` overrides the rollout section (and `train_batch_size`)."""
    from asyncdapo.contracts.config import RunConfig

    b = rollout.pop("train_batch_size", 64)
    return RunConfig.model_validate(
        {
            "name": name,
            "data": {"train_batch_size": b, "max_response_length": MAX_TOKENS, "max_prompt_length": 64},
            "reward": {"overlong_buffer": {"len": 32}, "verifier_batch_size": 64, "verifier_concurrency": 8},
            # no per-response seed: a requeued prompt draws new lengths, so lengths are independent
            "rollout": {"n": 8, "seed": None, **rollout},
            "trainer": {"ppo_mini_batch_size": b},
        }
    )


async def close_rollout(ro: Any) -> None:
    """Stop a benchmark's `Rollout` and everything it opened (pool, Redis client)."""
    ro.stop_run(abort_in_flight=True)
    with contextlib.suppress(TimeoutError):
        await ro.wait_idle(30)
    await ro.close()
    await ro.pool.close()
    await ro.redis.aclose()


def main() -> None:
    """The fleet's child process: serve the gateways, print their ports, stop when stdin closes."""
    ap = argparse.ArgumentParser(description="internal: serve SIMULATOR gateways for SimFleet")
    ap.add_argument("--serve-sims", type=int, required=True)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--capacity", type=int, default=64)
    ap.add_argument("--timing", default="{}")
    ap.add_argument("--answers", default="")
    args = ap.parse_args()
    asyncio.run(
        _serve_sims(args.serve_sims, args.capacity, json.loads(args.timing), args.first_seed, args.answers)
    )


if __name__ == "__main__":
    main()
