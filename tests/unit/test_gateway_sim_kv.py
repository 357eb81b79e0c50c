"""KV-cache admission and recompute preemption of the token-timing SIMULATOR, as vLLM's v1
scheduler does them (`gateway/sim_kv.py`), alone and inside the simulated engine."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from asyncdapo.services.gateway.engine import EngineError, EngineRequest, Finish, Sampling
from asyncdapo.services.gateway.sim_engine import SimTiming, SimulatedEngine
from asyncdapo.services.gateway.sim_kv import KvCache, schedule_step, used_blocks


@dataclass(eq=False)
class Seq:
    prompt: int
    generated: int = 0
    held_blocks: int = 0

    @property
    def context_tokens(self) -> int:
        return self.prompt + self.generated


def step(kv: KvCache, running: list[Seq], waiting: list[Seq], max_running: int = 64, admit: bool = True):
    """One planned step, then every running sequence emits its token (as the engine does)."""
    plan = schedule_step(kv, running, waiting, max_running, admit)  # type: ignore[arg-type]
    for s in running:
        s.generated += 1
    return plan


def test_blocks_round_up_and_a_cache_holds_at_least_one() -> None:
    kv = KvCache(capacity_tokens=100, block_tokens=16)
    assert kv.capacity_blocks == 6
    assert [kv.blocks(t) for t in (1, 16, 17, 32, 33)] == [1, 1, 2, 2, 3]
    with pytest.raises(ValueError, match="at least one block"):
        KvCache(capacity_tokens=8, block_tokens=16)


def test_admission_stops_at_the_first_request_that_does_not_fit() -> None:
    kv = KvCache(capacity_tokens=160, block_tokens=16)  # 10 blocks
    a, big, small = Seq(60), Seq(100), Seq(10)  # 4 blocks (60 + next token), 7, 1
    running: list[Seq] = []
    waiting = [a, big, small]
    plan = schedule_step(kv, running, waiting, max_running=64)  # type: ignore[arg-type]
    # `big` needs 7 blocks and only 6 are left: it waits, and `small` behind it waits too (FCFS)
    assert running == [a] and waiting == [big, small]
    assert plan.admitted == [a] and plan.prefill_tokens == 60 and a.held_blocks == 4


def test_admission_respects_max_running_and_the_pause() -> None:
    kv = KvCache(capacity_tokens=16 * 100)
    waiting = [Seq(5) for _ in range(5)]
    running: list[Seq] = []
    schedule_step(kv, running, waiting, max_running=3)  # type: ignore[arg-type]
    assert len(running) == 3 and len(waiting) == 2
    schedule_step(kv, running, waiting, max_running=10, admit=False)  # type: ignore[arg-type]
    assert len(running) == 3 and len(waiting) == 2


def test_running_requests_grow_one_block_per_block_tokens() -> None:
    kv = KvCache(capacity_tokens=16 * 100, block_tokens=16)
    s = Seq(15)
    running, waiting = [], [s]
    step(kv, running, waiting)  # context 15 + next token = 16: one block
    assert s.held_blocks == 1 and s.generated == 1
    step(kv, running, waiting)  # context 16 + 1 = 17 tokens: a second block
    assert s.held_blocks == 2
    for _ in range(15):
        step(kv, running, waiting)
    assert s.context_tokens == 32 and s.held_blocks == 2 == used_blocks(running)  # type: ignore[arg-type]


def test_a_full_cache_preempts_the_newest_request_and_recomputes_it() -> None:
    kv = KvCache(capacity_tokens=16 * 8, block_tokens=16)  # 8 blocks
    old, new = Seq(47), Seq(47)  # 3 blocks each with the token they compute
    running: list[Seq] = []
    waiting = [old, new]
    step(kv, running, waiting)
    assert running == [old, new] and used_blocks(running) == 6  # type: ignore[arg-type]
    plan = step(kv, running, waiting)  # context 48 + 1: a 4th block each, the cache is full
    assert plan.preempted == [] and used_blocks(running) == 8  # type: ignore[arg-type]
    for _ in range(15):  # context 49..63 fits in 4 blocks
        assert step(kv, running, waiting).preempted == []
    # context 64 + 1 needs a 5th block: none free, so the newest is preempted (recompute)
    plan = step(kv, running, waiting)
    assert plan.preempted == [new] and running == [old] and waiting == [new]
    assert new.held_blocks == 0 and new.generated == 17  # its tokens are kept, its KV is dropped
    assert old.held_blocks == 5 and old.generated == 18
    # it comes back only once its whole context (64 tokens + 1: 5 blocks) fits again, recomputed
    while waiting:
        plan = step(kv, running, waiting)
        if old in running and old.generated >= 40:  # the old request finishes
            running.remove(old)
    assert running == [new] and plan.admitted == [new] and plan.prefill_tokens == 64


def test_the_newest_request_preempts_itself_and_waiting_keeps_priority_order() -> None:
    kv = KvCache(capacity_tokens=16 * 5, block_tokens=16)  # 5 blocks
    a, b, c = Seq(40), Seq(31), Seq(5)  # 3 + 2 blocks fill the cache; c waits
    running: list[Seq] = []
    waiting = [a, b, c]
    plan = step(kv, running, waiting)
    assert running == [a, b] and waiting == [c] and plan.admitted == [a, b]
    # a fits its next token in its 3 blocks; b (context 32 + 1) needs a 3rd block, none is free, and
    # b is the newest running request: it preempts itself and goes back ahead of c
    plan = step(kv, running, waiting)
    assert plan.preempted == [b] and running == [a] and waiting == [b, c]
    assert plan.admitted == []  # nothing is admitted in a step that preempted
    plan = step(kv, running, waiting)  # 2 blocks free, b needs 3 (context 32 + 1): FCFS, c waits too
    assert plan.admitted == [] and waiting == [b, c]


async def test_engine_admits_only_what_the_kv_cache_holds() -> None:
    # 256 blocks; a 1000-token prompt needs 63 of them: 4 run at once although 64 slots are free
    timing = SimTiming(
        base_step_s=0.002, per_seq_step_s=0.0, prefill_s_per_token=0.0, kv_capacity_tokens=4096
    )
    engine = SimulatedEngine(timing, max_concurrency=64)
    try:
        req = [EngineRequest(f"r{i}", [1] * 1000, Sampling(max_tokens=20, ignore_eos=True)) for i in range(6)]
        tasks = [asyncio.create_task(engine.generate(r)) for r in req]
        await asyncio.sleep(0.02)
        load = engine.load()
        assert (load.running, load.waiting) == (4, 2)
        assert 0.9 < load.kv_cache_usage <= 1.0
        outs = await asyncio.wait_for(asyncio.gather(*tasks), 5.0)
    finally:
        await engine.shutdown()
    assert all(o.finish is Finish.LENGTH and len(o.token_ids) == 20 for o in outs)
    assert engine.preemptions == 0


async def test_engine_preempts_and_recomputes_when_decoding_would_overflow() -> None:
    # two 1900-token prompts take 238 of 256 blocks; each then grows by 400 tokens, which only one
    # of them has room for: the newer one is preempted, waits, and is recomputed once the older ends
    timing = SimTiming(
        base_step_s=0.0005, per_seq_step_s=0.0, prefill_s_per_token=0.0, kv_capacity_tokens=4096
    )
    engine = SimulatedEngine(timing, max_concurrency=8)
    try:
        done: list[str] = []

        async def gen(rid: str):
            out = await engine.generate(
                EngineRequest(rid, [1] * 1900, Sampling(max_tokens=400, ignore_eos=True))
            )
            done.append(rid)
            return out

        first = asyncio.create_task(gen("old"))
        await asyncio.sleep(0.005)
        second = asyncio.create_task(gen("new"))
        old, new = await asyncio.wait_for(asyncio.gather(first, second), 10.0)
    finally:
        await engine.shutdown()
    assert engine.preemptions >= 1
    assert done == ["old", "new"]
    # recompute keeps the response whole: every token, its log-prob and its version
    for out in (old, new):
        assert out.finish is Finish.LENGTH and len(out.token_ids) == 400 == len(out.logprobs)
        assert out.version_runs == [(0, 400)]


def test_engine_refuses_a_cache_smaller_than_one_sequence() -> None:
    with pytest.raises(ValueError, match="max_model_len 4096"):
        SimulatedEngine(SimTiming(kv_capacity_tokens=2048), max_concurrency=4)


async def test_engine_refuses_a_request_that_can_never_fit() -> None:
    engine = SimulatedEngine(SimTiming(kv_capacity_tokens=4096), max_concurrency=4)
    try:
        with pytest.raises(EngineError, match="may need 5000 KV tokens"):
            await engine.generate(EngineRequest("x", [1] * 1000, Sampling(max_tokens=4000)))
    finally:
        await engine.shutdown()
