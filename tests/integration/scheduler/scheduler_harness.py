"""Harness of the scheduler's integration tests (imported by name: tests are not a package): in-process sim gateways (the gateway's own
server and its token-timing simulator), a scheduler `Rollout` on the real Redis, prompt loading,
and a labelled verifier stand-in for the sim-engine logic tests.

The helpers are async context managers used inside the tests (not async fixtures), so each test
owns its gateways and event-loop resources and stops them, whatever the loop scope.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
import redis.asyncio as aioredis

from asyncdapo.contracts.config import RunConfig
from asyncdapo.contracts.prompts import PromptRecord, queue_prompts
from asyncdapo.contracts.redis_keys import RunKeys
from asyncdapo.contracts.v1 import rollout_pb2, scheduler_pb2
from asyncdapo.services.scheduler.gateway_pool import GatewayPool, GatewaySpec
from asyncdapo.services.scheduler.metrics import SchedulerMetrics
from asyncdapo.services.scheduler.rollout import Rollout
from asyncdapo.services.scheduler.score_batcher import ItemScore

FAST_SIM = {
    "base_step_s": 0.002,
    "per_seq_step_s": 0.00002,
    "prefill_s_per_token": 0.0,
    "length_dist": "lognormal",
    "length_mean": 24.0,
    "length_sigma": 0.8,
    "reload_s": 0.02,
}


class RuleScorer:
    """TEST STAND-IN for the verifier, used only with the sim engine: the simulator emits random
    token ids, which the real verifier would score 0 every time, so no group could ever be valid.
    The ground truth names a rule instead: `mixed` (correct iff the response index is even: the
    group always has variance), `all1` / `all0` (every response right / wrong: filtered)."""

    def __init__(self) -> None:
        self.calls = 0

    async def score(self, items: Sequence[tuple[str, Sequence[int], str]]) -> list[ItemScore]:
        self.calls += 1
        out = []
        for item_id, _, rule in items:
            idx = int(item_id.split(":")[2])
            acc = {"mixed": float(idx % 2 == 0), "all1": 1.0, "all0": 0.0}[rule]
            out.append(ItemScore("ok", acc, acc, str(int(acc))))
        return out


@dataclass
class SimGateway:
    server: Any
    port: int

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


async def start_sim_gateway(
    name: str,
    capacity: int = 64,
    model_dir: str | None = None,
    port: int = 0,
    pool: str = "",
    token: str | None = None,
    tls: Any = None,
    weight_store: Path | None = None,
    **timing: Any,
) -> SimGateway:
    """`weight_store`: a directory the gateway receives stream:// versions into (and relays from)."""
    from prometheus_client import CollectorRegistry

    from asyncdapo.services.gateway.gateway_service import GatewayOptions
    from asyncdapo.services.gateway.metrics import GatewayMetrics
    from asyncdapo.services.gateway.server import GatewayServer, ServerSettings
    from asyncdapo.services.gateway.sim_engine import SimTiming, SimulatedEngine

    engine = SimulatedEngine(
        SimTiming(**{**FAST_SIM, **timing}), max_concurrency=capacity, model_dir=model_dir
    )
    weights = None
    if weight_store is not None:
        from asyncdapo.runtime.weight_stream.fetch import Fetcher
        from asyncdapo.runtime.weight_stream.store import WeightStore
        from asyncdapo.services.gateway.gateway_service import StreamWeights

        store = WeightStore(weight_store, name)
        weights = StreamWeights(store, Fetcher(store, token))
    server = GatewayServer(
        engine,
        GatewayOptions(gateway_id=name, capacity=capacity, pool=pool),
        ServerSettings(port=port, drain_timeout_s=0.0, token=token, tls=tls),
        GatewayMetrics(CollectorRegistry()),
        weights=weights,
    )
    return SimGateway(server, await server.start())


@contextlib.asynccontextmanager
async def sim_gateways(count: int, **kw: Any) -> AsyncIterator[list[SimGateway]]:
    gws = [await start_sim_gateway(f"sim-{i}", **kw) for i in range(count)]
    try:
        yield gws
    finally:
        for g in gws:
            async with _named_timeout(20, f"stopping sim gateway {g.address}"):
                await g.server.stop(0)


def run_config(**over: Any) -> RunConfig:
    base: dict[str, Any] = {
        "name": "t",
        "data": {"train_batch_size": 4, "max_response_length": 64, "max_prompt_length": 64},
        "reward": {"overlong_buffer": {"len": 16}, "verifier_batch_size": 16},
        "rollout": {"n": 4, "max_concurrent_prompts": 12, "seed": 7},
        "trainer": {"ppo_mini_batch_size": 4},
    }
    for section, values in over.items():
        if isinstance(values, dict):
            base.setdefault(section, {})
            for k, v in values.items():
                if isinstance(v, dict):
                    base[section].setdefault(k, {}).update(v)
                else:
                    base[section][k] = v
        else:
            base[section] = values
    return RunConfig.model_validate(base)


def load_prompts(redis_url: str, run: str, rules: Sequence[str], start: int = 0) -> list[str]:
    """Queue one prompt per rule (the rule is its ground truth); returns the ids in queue order."""
    r = redis.Redis.from_url(redis_url)
    recs = [
        PromptRecord(f"e0-{start + i}", [1 + (i % 7), 2, 3, 4], f"q{i}", rule, "test", 0, start + i)
        for i, rule in enumerate(rules)
    ]
    pipe = r.pipeline()
    queue_prompts(pipe, RunKeys(run), recs)
    pipe.execute()
    return [x.id for x in recs]


@contextlib.asynccontextmanager
async def scheduler(
    cfg: RunConfig,
    redis_url: str,
    addresses: Sequence[str],
    scorer: Any,
    token: str | None = None,
    tls: Any = None,
    **kw: Any,
) -> AsyncIterator[Rollout]:
    r = aioredis.from_url(redis_url)
    pool = GatewayPool(GatewaySpec(static=tuple(addresses)), token=token, watch_interval_ms=50, tls=tls)
    rollout = Rollout(cfg, r, pool, scorer, SchedulerMetrics(), queue_poll_s=0.01, **kw)
    await pool.start()
    await pool.wait_up(len(addresses), 10)
    await rollout.open()
    try:
        yield rollout
    finally:
        async with _named_timeout(20, "rollout.close()"):
            await rollout.close()
        async with _named_timeout(20, "pool.close()"):
            await pool.close()
        await r.aclose()


@contextlib.asynccontextmanager
async def _named_timeout(seconds: float, what: str) -> AsyncIterator[None]:
    """A teardown step that hangs fails the test and names itself, instead of hanging the suite."""
    try:
        async with asyncio.timeout(seconds):
            yield
    except TimeoutError:
        raise TimeoutError(f"teardown: {what} did not return within {seconds:.0f} s") from None


async def wait_for(cond: Any, timeout_s: float, what: str, state: Any = None) -> None:
    """Poll `cond` until it holds; on timeout the error carries `state()` (what the run looked
    like), so a failure on a slow CI machine explains itself."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not cond():
        if asyncio.get_running_loop().time() > deadline:
            detail = f"; state: {state()}" if state is not None else ""
            raise TimeoutError(f"{what} not reached after {timeout_s} s{detail}")
        await asyncio.sleep(0.01)


def rollout_state(ro: Rollout, redis_url: str, run: str) -> dict[str, Any]:
    """The scheduler's phase, counts, queue and gateways: what a stalled test needs to show."""
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    return {
        "phase": scheduler_pb2.RunPhase.Name(ro.phase),
        "version": ro.version,
        "valid_produced": ro.valid_produced,
        "bound": ro.bound,
        "tasks_in_flight": len(ro.tasks),
        "dispatch_queue": len(ro.dispatcher.pending),
        "prompt_queue": r.llen(RunKeys(run).prompts),
        "counters": counters(redis_url, run),
        "gateways": [
            (g.address, g.up, g.in_flight, g.weight_version, g.paused, g.last_error) for g in ro.pool.members
        ],
    }


def groups(redis_url: str, run: str) -> list[rollout_pb2.Group]:
    r = redis.Redis.from_url(redis_url)
    return [rollout_pb2.Group.FromString(f[b"g"]) for _, f in r.xrange(RunKeys(run).groups)]


def outcome_ledger(redis_url: str, run: str) -> dict[str, list[str]]:
    """prompt id -> the outcome of each of its attempts, in attempt order ('' = none yet), from the
    scheduler's `outcomes` audit stream (finished prompt state expires after a minute; the audit
    stream keeps every outcome of a test's run), completed with the attempts of prompt state still
    present (an attempt claimed and not finished yet shows as '')."""
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    keys = RunKeys(run)
    seen: dict[str, dict[int, list[str]]] = {}
    for _, f in r.xrange(keys.outcomes):
        label = f["o"]
        # the stored label: a requeue's reason is in the audit entry only
        stored = "requeued" if label.startswith("requeued") else label
        seen.setdefault(f["p"], {}).setdefault(int(f["a"]), []).append(stored)
    attempts = {pid: max(by_attempt) for pid, by_attempt in seen.items()}
    for key in r.scan_iter(match=keys.prompt("*")):
        if key.endswith(":data"):
            continue
        pid = key[len(keys.prompt("")) :]
        attempts[pid] = max(attempts.get(pid, 0), int(r.hget(key, "attempt") or 0))
    out = {}
    for pid, n in attempts.items():
        by_attempt = seen.get(pid, {})
        for a, labels in by_attempt.items():
            assert len(labels) == 1, f"{pid} attempt {a}: {len(labels)} outcomes {labels}"
        out[pid] = [by_attempt.get(a, [""])[0] for a in range(1, n + 1)]
    return out


def counters(redis_url: str, run: str) -> dict[str, int]:
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    return {k: int(v) for k, v in r.hgetall(RunKeys(run).counters).items()}


def write_fake_snapshot(path: Path) -> str:
    """A directory with one tiny safetensors file: what a sim gateway's LoadWeights accepts."""
    import numpy as np
    from safetensors.numpy import save_file

    path.mkdir(parents=True, exist_ok=True)
    save_file({"w": np.zeros(2, dtype=np.float32)}, str(path / "model.safetensors"))
    return str(path)


def check_one_outcome_per_attempt(redis_url: str, run: str, all_ids: list[str]) -> dict[str, list[str]]:
    """Every admitted attempt has exactly one outcome; every prompt is either queued or accounted."""
    led = outcome_ledger(redis_url, run)
    c = counters(redis_url, run)
    assert sum(len(v) for v in led.values()) == c["admitted"]
    for pid, outs in led.items():
        assert all(outs), f"{pid}: an attempt without outcome: {outs}"
        assert all(o.startswith("requeued") for o in outs[:-1]), f"{pid}: {outs}"
    by_outcome = Counter(o for outs in led.values() for o in outs)
    assert {f"outcome:{k}": v for k, v in by_outcome.items()} == {
        k: v for k, v in c.items() if k.startswith("outcome:")
    }
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    keys = RunKeys(run)
    queued = r.lrange(keys.prompts, 0, -1)
    assert r.hlen(keys.prompts_claimed) == 0
    assert len(queued) == len(set(queued))
    # a prompt is lost when it is neither queued nor finished with a final outcome
    for pid in all_ids:
        outs = led.get(pid, [])
        assert pid in queued or (outs and not outs[-1].startswith("requeued")), f"{pid} lost: {outs}"
    return led
