"""SIMULATOR engine model (asyncdapo.tools.simulate.engine_model): step time, continuous batching, KV admission,
preemption and version runs across a reload — each against arithmetic done by hand."""

from __future__ import annotations

import math

import pytest

from asyncdapo.tools.simulate.clock import VirtualClock
from asyncdapo.tools.simulate.engine_model import Engine, Seq
from asyncdapo.tools.simulate.profile import EngineProfile

BASE, PER_SEQ, PER_KV, PREFILL = 0.010, 0.001, 1e-5, 1e-4


def profile(**over: float) -> EngineProfile:
    p = dict(base_s=BASE, per_seq_s=PER_SEQ, per_kv_token_s=PER_KV, prefill_per_token_s=PREFILL,
             kv_capacity_tokens=100_000, max_num_seqs=64, max_num_batched_tokens=8192)  # fmt: skip
    p.update(over)
    return EngineProfile(**p)  # type: ignore[arg-type]


class Rig:
    def __init__(self, prof: EngineProfile) -> None:
        self.clock = VirtualClock()
        self.done: dict[str, tuple[float, int]] = {}
        self.engine = Engine(self.clock, prof, self._finish)

    def _finish(self, s: Seq) -> None:
        self.done[s.owner] = (self.clock.now, s.gen)

    def submit(self, name: str, prompt: int, target: int) -> Seq:
        s = Seq(name, prompt, 0, target)
        self.engine.submit(s)
        return s

    def run(self) -> None:
        self.clock.run(lambda: False)


def alone(prompt: int, length: int) -> float:
    """One request on an idle engine: a prefill step (which samples the first token), then
    length - 1 decode steps, the j-th attending to prompt + 1 + j tokens."""
    t = BASE + PER_SEQ + PREFILL * prompt
    for j in range(length - 1):
        t += BASE + PER_SEQ + PER_KV * (prompt + 1 + j)
    return t


def test_step_time_is_the_linear_formula() -> None:
    p = profile()
    assert p.step_s(3, 1000, 50) == pytest.approx(BASE + 3 * PER_SEQ + 1000 * PER_KV + 50 * PREFILL)


def test_the_sequences_cost_is_piecewise_linear_with_knots() -> None:
    p = profile(seq_slopes=((4, 0.0005), (10, 0.0002)))  # type: ignore[arg-type]
    assert p.seq_s(3) == pytest.approx(3 * PER_SEQ)
    assert p.seq_s(4) == pytest.approx(4 * PER_SEQ)
    assert p.seq_s(7) == pytest.approx(4 * PER_SEQ + 3 * 0.0005)
    assert p.seq_s(25) == pytest.approx(4 * PER_SEQ + 6 * 0.0005 + 15 * 0.0002)
    assert p.step_s(7, 1000) == pytest.approx(BASE + p.seq_s(7) + 1000 * PER_KV)
    for bad in (((4, 0.1), (4, 0.2)), ((10, 0.1), (4, 0.2)), ((0, 0.1),), ((4, -0.1),)):
        with pytest.raises(ValueError, match="seq_slopes"):
            profile(seq_slopes=bad)  # type: ignore[arg-type]


def test_an_engine_steps_at_the_piecewise_cost() -> None:
    """Twenty equal requests decode together: every decode step costs the piecewise formula at 20
    sequences, not the linear one."""
    p = profile(per_kv_token_s=0.0, prefill_per_token_s=0.0, seq_slopes=((8, 0.0002),))  # type: ignore[arg-type]
    r = Rig(p)
    for i in range(20):
        r.submit(f"r{i}", 10, 50)
    r.run()
    step = BASE + 8 * PER_SEQ + 12 * 0.0002
    assert step < BASE + 20 * PER_SEQ  # the knot matters here
    assert [t for t, _ in r.done.values()] == [pytest.approx(50 * step, rel=1e-9)] * 20


def test_one_request_takes_its_prefill_and_decode_steps() -> None:
    r = Rig(profile())
    r.submit("a", 100, 500)
    r.run()
    t, gen = r.done["a"]
    assert gen == 500
    assert t == pytest.approx(alone(100, 500), rel=1e-9)
    assert r.engine.decode_tokens == 500 and r.engine.steps == 500


def test_continuous_batching_shares_steps() -> None:
    """Two requests decode in the same steps: each step costs 2 sequences and both contexts; the
    short one leaves and the long one goes on alone."""
    r = Rig(profile())
    r.submit("short", 10, 20)
    r.submit("long", 10, 40)
    r.run()
    t_short, t_long = r.done["short"][0], r.done["long"][0]
    # prefill of both (20 tokens) in one step, then 19 shared decode steps
    t = BASE + 2 * PER_SEQ + PREFILL * 20
    for j in range(19):
        t += BASE + 2 * PER_SEQ + PER_KV * 2 * (11 + j)
    assert t_short == pytest.approx(t, rel=1e-9)
    for j in range(19, 39):
        t += BASE + PER_SEQ + PER_KV * (11 + j)
    assert t_long == pytest.approx(t, rel=1e-9)
    assert t_long < alone(10, 20) + alone(10, 40)  # batching beats running them one after another


def test_decoders_are_charged_kv_in_whole_blocks_on_average() -> None:
    """A profile fitted on vLLM's KV usage (whole blocks: `kv_block_tokens`) charges each decoder
    (block - 1) / 2 tokens beyond its context per step, the rounding's mean over its life; the
    prefill step, which no decoder attends in, is not charged."""
    r = Rig(profile(kv_block_tokens=128))  # type: ignore[arg-type]
    r.submit("short", 10, 20)
    r.submit("long", 10, 40)
    r.run()
    pad = 63.5
    t = BASE + 2 * PER_SEQ + PREFILL * 20
    for j in range(19):
        t += BASE + 2 * PER_SEQ + PER_KV * 2 * (11 + j + pad)
    assert r.done["short"][0] == pytest.approx(t, rel=1e-9)
    for j in range(19, 39):
        t += BASE + PER_SEQ + PER_KV * (11 + j + pad)
    assert r.done["long"][0] == pytest.approx(t, rel=1e-9)
    assert profile(kv_block_tokens=128).step_s(2, 100) == pytest.approx(
        BASE + 2 * PER_SEQ + PER_KV * (100 + 2 * pad)
    )  # type: ignore[arg-type]


def test_kv_admission_waits_for_room() -> None:
    """As vLLM: a request is admitted when its context (here its prompt) and one more token of
    every decoder fit. Room for two prompts of 100 growing to 120, not a third: it starts once
    the first two are done."""
    r = Rig(profile(kv_capacity_tokens=250))
    for name in ("a", "b", "c"):
        r.submit(name, 100, 20)
    r.run()
    assert r.engine.preemptions == 0
    ta, tb, tc = (r.done[x][0] for x in "abc")
    assert ta == pytest.approx(tb)
    assert tc == pytest.approx(ta + alone(100, 20), rel=1e-9)  # after a and b, alone
    assert all(r.done[x][1] == 20 for x in "abc")


def test_max_num_seqs_limits_concurrency() -> None:
    r = Rig(profile(max_num_seqs=1))
    r.submit("a", 10, 50)
    r.submit("b", 10, 50)
    r.run()
    assert r.done["b"][0] == pytest.approx(2 * alone(10, 50), rel=1e-9)


def test_preemption_takes_the_latest_admitted_and_recomputes_it() -> None:
    """Both fit at admission, not at full length: the later one is preempted when the cache fills,
    goes back to the head of the waiting queue, and is prefilled again (prompt + its tokens)."""
    r = Rig(profile(kv_capacity_tokens=1000))
    r.submit("first", 100, 600)
    r.submit("second", 100, 600)
    r.run()
    assert r.engine.preemptions >= 1
    assert r.done["first"][1] == 600 and r.done["second"][1] == 600
    assert r.done["first"][0] < r.done["second"][0]
    # the recompute is a prefill of more than the two prompts
    assert r.engine.prefill_tokens > 200
    assert r.engine.kv_used() == 0


def test_abort_returns_partial_tokens_and_frees_the_cache() -> None:
    r = Rig(profile())
    s = r.submit("a", 100, 10_000)
    got: list[int] = []
    r.clock.at(1.0, lambda _: got.append(r.engine.abort(s)))
    r.run()
    # aborted at the end of the step in progress at t = 1 s: every step that started before it
    t, tokens = BASE + PER_SEQ + PREFILL * 100, 1
    while t < 1.0:
        t += BASE + PER_SEQ + PER_KV * (100 + tokens)
        tokens += 1
    assert got == [tokens]
    assert "a" not in r.done and r.engine.kv_used() == 0 and r.engine.decode_tokens == got[0]


def test_keep_across_a_reload_splits_version_runs() -> None:
    r = Rig(profile())
    s = r.submit("a", 50, 400)
    r.clock.at(1.0, lambda _: r.engine.pause("keep"))
    r.clock.at(1.5, lambda _: r.engine.resume(1))
    r.run()
    _, gen = r.done["a"]
    assert gen == 400
    assert [v for v, _ in s.runs] == [0, 1] and sum(c for _, c in s.runs) == 400
    assert r.engine.prefill_tokens > 50  # the held context was recomputed with the new weights


def test_a_recompute_costs_the_held_context_not_whole_budgets() -> None:
    """After a reload a held request's context (prompt + tokens so far) is recomputed in chunks of
    at most max_num_batched_tokens: ceil(context / budget) steps costing that context's prefill,
    the last chunk what is left."""
    budget = 64
    r = Rig(profile(per_seq_s=0.0, per_kv_token_s=0.0, max_num_batched_tokens=budget))
    r.submit("a", 50, 400)
    r.clock.at(1.0, lambda _: r.engine.pause("keep"))
    r.clock.at(1.5, lambda _: r.engine.resume(1))
    r.run()
    t, gen = r.done["a"]
    # the prefill step (BASE + 50 PREFILL) samples token 1, each decode step (BASE) one more; the
    # step in progress at t = 1 ends: 100 tokens held
    held = math.ceil((1.0 - PREFILL * 50) / BASE)
    context = 50 + held
    assert context == 150 and r.engine.prefill_tokens == pytest.approx(50 + context)
    recompute_steps = math.ceil(context / budget)  # 3: 64 + 64 + 22 tokens, not 3 x 64
    assert gen == 400
    assert t == pytest.approx(1.5 + (recompute_steps + 400 - held) * BASE + PREFILL * context, rel=1e-9)
