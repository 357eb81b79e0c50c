"""The token-timing SIMULATOR (`--engine sim`): timing model, length distribution, engine contract."""

from __future__ import annotations

import asyncio
import random
import statistics
import time

import pytest

from asyncdapo.services.gateway.engine import EngineRequest, Finish, PauseMode, Sampling
from asyncdapo.services.gateway.sim_engine import SimTiming, SimulatedEngine


def test_step_time_grows_with_concurrency_and_prefill() -> None:
    t = SimTiming(base_step_s=0.01, per_seq_step_s=0.001, prefill_s_per_token=0.0001)
    assert t.step_seconds(1) < t.step_seconds(8) < t.step_seconds(64)
    assert t.step_seconds(8) == pytest.approx(0.018)
    assert t.step_seconds(1, prefill_tokens=100) == pytest.approx(0.021)


@pytest.mark.parametrize("dist", ["fixed", "uniform", "lognormal"])
def test_length_distributions_have_the_configured_mean(dist: str) -> None:
    t = SimTiming(length_dist=dist, length_mean=200, length_sigma=0.5)
    rng = random.Random(0)
    lengths = [t.natural_length(rng) for _ in range(4000)]
    assert min(lengths) >= 1
    assert statistics.mean(lengths) == pytest.approx(200, rel=0.05)
    if dist == "fixed":
        assert set(lengths) == {200}
    else:
        assert statistics.pstdev(lengths) > 20


def test_bad_settings_are_rejected() -> None:
    with pytest.raises(ValueError, match="length_dist"):
        SimTiming(length_dist="pareto")
    with pytest.raises(ValueError, match="length_mean"):
        SimTiming(length_mean=0)


def _req(rid: str, max_tokens: int, seed: int | None = None, ignore_eos: bool = True) -> EngineRequest:
    return EngineRequest(rid, [1, 2, 3], Sampling(max_tokens=max_tokens, seed=seed, ignore_eos=ignore_eos))


FAST = SimTiming(
    base_step_s=0.002, per_seq_step_s=0.001, prefill_s_per_token=0.0, length_dist="fixed", length_mean=50
)


async def test_per_token_latency_grows_with_concurrency() -> None:
    engine = SimulatedEngine(FAST, max_concurrency=64)
    try:
        t0 = time.monotonic()
        await engine.generate(_req("solo", 20))
        solo = (time.monotonic() - t0) / 20
        t0 = time.monotonic()
        await asyncio.gather(*(engine.generate(_req(f"r{i}", 20)) for i in range(32)))
        crowded = (time.monotonic() - t0) / 20
    finally:
        await engine.shutdown()
    # step = 2 ms + 1 ms x running: 3 ms alone, 34 ms with 32 running.
    assert crowded > 4 * solo


async def test_lengths_finish_reasons_and_seeded_determinism() -> None:
    engine = SimulatedEngine(FAST, max_concurrency=8)
    try:
        stop = await engine.generate(_req("a", 100, seed=1, ignore_eos=False))
        again = await engine.generate(_req("b", 100, seed=1, ignore_eos=False))
        capped = await engine.generate(_req("c", 10, ignore_eos=False))
    finally:
        await engine.shutdown()
    assert stop.finish is Finish.STOP and len(stop.token_ids) == 50 and stop.token_ids[-1] == 0  # EOS
    assert again.token_ids == stop.token_ids and again.logprobs == stop.logprobs
    assert capped.finish is Finish.LENGTH and len(capped.token_ids) == 10
    assert all(lp <= 0 for lp in stop.logprobs) and stop.version_runs == [(0, 50)]


async def test_capacity_bounds_running_requests() -> None:
    engine = SimulatedEngine(FAST, max_concurrency=2)
    try:
        tasks = [asyncio.create_task(engine.generate(_req(f"r{i}", 30))) for i in range(5)]
        await asyncio.sleep(0.05)
        load = engine.load()
        assert (load.running, load.waiting) == (2, 3)
        assert load.kv_cache_usage > 0
        await asyncio.gather(*tasks)
        assert engine.load().generated_tokens_total == 150
    finally:
        await engine.shutdown()


async def test_abort_returns_partial_tokens_promptly() -> None:
    engine = SimulatedEngine(FAST, max_concurrency=8)
    try:
        task = asyncio.create_task(engine.generate(_req("x", 10_000)))
        await asyncio.sleep(0.05)
        await engine.abort(["x", "unknown"])
        out = await asyncio.wait_for(task, 1.0)
    finally:
        await engine.shutdown()
    assert out.finish is Finish.ABORT and 0 < len(out.token_ids) < 10_000
    assert len(out.logprobs) == len(out.token_ids) == out.version_runs[0][1]


async def test_keep_pause_and_reload_split_versions() -> None:
    engine = SimulatedEngine(SimTiming(base_step_s=0.002, per_seq_step_s=0, reload_s=0.01), max_concurrency=8)
    try:
        task = asyncio.create_task(engine.generate(_req("x", 60)))
        await asyncio.sleep(0.03)
        await engine.pause(PauseMode.KEEP)
        frozen = engine.load().generated_tokens_total
        await asyncio.sleep(0.03)
        assert engine.load().generated_tokens_total == frozen  # nothing steps while paused
        await engine.load_weights("/unused", 1)
        await engine.resume()
        out = await task
    finally:
        await engine.shutdown()
    assert out.finish is Finish.LENGTH and len(out.token_ids) == 60
    assert [v for v, _ in out.version_runs] == [0, 1]
    assert out.version_runs[0][1] == frozen


async def test_abort_and_wait_pauses() -> None:
    engine = SimulatedEngine(FAST, max_concurrency=8)
    try:
        tasks = [asyncio.create_task(engine.generate(_req(f"r{i}", 10_000))) for i in range(3)]
        await asyncio.sleep(0.02)
        assert (await engine.pause(PauseMode.ABORT)).aborted == 3
        assert all(t.result().finish is Finish.ABORT for t in await asyncio.wait_for(_done(tasks), 1.0))
        queued = asyncio.create_task(engine.generate(_req("q", 5)))  # queued while paused
        await asyncio.sleep(0.02)
        assert not queued.done()
        await engine.resume()
        assert (await queued).finish is Finish.LENGTH

        short = asyncio.create_task(engine.generate(_req("s", 5)))
        await asyncio.sleep(0.005)
        assert (await engine.pause(PauseMode.WAIT)).aborted == 0  # waits for it to finish
        assert (await asyncio.wait_for(short, 0.1)).finish is Finish.LENGTH
        await engine.resume()

        long = asyncio.create_task(engine.generate(_req("l", 10_000)))
        await asyncio.sleep(0.01)
        assert (await engine.pause(PauseMode.WAIT, wait_timeout_s=0.05)).aborted == 1
        assert (await long).finish is Finish.ABORT
    finally:
        await engine.shutdown()


async def _done(tasks: list[asyncio.Task]) -> list[asyncio.Task]:
    await asyncio.gather(*tasks)
    return tasks
