"""Admission policies and the commit ledger (early-stop order any / fifo)."""

from __future__ import annotations

import pytest

from asyncdapo.contracts.config import ConfigError, EarlyStopOrder, RunConfig, parse_run_config
from asyncdapo.services.scheduler.policy.admission import (
    AdmissionState,
    AdmitReason,
    ExpectedValidPolicy,
    GreedyPolicy,
    SyncBatchPolicy,
    make_policy,
    valid_rate,
)
from asyncdapo.services.scheduler.policy.commit_order import CommitLedger


def st(**kw: int) -> AdmissionState:
    base = {"valid_produced": 0, "bound": 8, "in_flight_prompts": 0, "max_in_flight": 32}
    base.update(kw)
    return AdmissionState(**base)


def test_bound_is_v_plus_s_plus_one_times_b() -> None:
    cfg = RunConfig.model_validate({"data": {"train_batch_size": 8}, "rollout": {"max_staleness": 2}})
    assert [cfg.valid_group_bound(v) for v in (0, 1, 5)] == [24, 32, 64]


def test_greedy_fills_slots_until_the_bound() -> None:
    p = GreedyPolicy()
    assert p.decide(st(in_flight_prompts=31)).ok
    assert p.decide(st(in_flight_prompts=32)).reason is AdmitReason.SLOTS
    assert p.decide(st(valid_produced=8)).reason is AdmitReason.BOUND
    # ready valid groups waiting for their commit turn count against the bound
    assert p.decide(st(valid_produced=6, ready_valid=2)).reason is AdmitReason.BOUND


def test_expected_valid_trims_over_provisioning_with_the_running_rate() -> None:
    p = ExpectedValidPolicy(margin=1.2, min_valid_rate=0.05)
    # no data yet: prior rate 0.5; 8 remaining * 1.2 = 9.6 → admits up to 19 in flight
    assert p.decide(st(in_flight_prompts=19)).ok
    assert p.decide(st(in_flight_prompts=20)).reason is AdmitReason.EXPECTED
    # a low observed rate (1 valid of 38 finished: (1+1)/(38+2) = 0.05) admits far more
    assert p.decide(st(in_flight_prompts=31, finished_groups=38, valid_groups=1)).ok
    # a high one admits few: (9+1)/(9+2) ≈ 0.91 with 2 remaining → stop at 3 in flight
    s = st(valid_produced=6, in_flight_prompts=3, finished_groups=9, valid_groups=9)
    assert p.decide(s).reason is AdmitReason.EXPECTED
    assert p.decide(st(valid_produced=6, in_flight_prompts=2, finished_groups=9, valid_groups=9)).ok


def test_valid_rate_prior_and_floor() -> None:
    assert valid_rate(0, 0, 0.05) == 0.5
    assert valid_rate(0, 1000, 0.05) == 0.05
    assert valid_rate(10, 10, 0.05) == pytest.approx(11 / 12)


def test_sync_batch_policy_admits_one_generation_batch_at_a_time() -> None:
    p = SyncBatchPolicy(batch_size=4)
    assert p.decide(st(batch_admitted=3)).ok
    assert p.decide(st(batch_admitted=4)).reason is AdmitReason.BATCH
    assert p.decide(st(valid_produced=8)).reason is AdmitReason.BOUND


def test_an_unknown_policy_is_refused_with_the_config_naming_the_field() -> None:
    with pytest.raises(ConfigError, match=r"rollout\.admission\.policy"):
        parse_run_config({"rollout": {"admission": {"policy": "yolo"}}})
    assert make_policy(parse_run_config({"rollout": {"admission": {"policy": "greedy"}}})).name == "greedy"
    assert make_policy(RunConfig.model_validate({"rollout": {"mode": "sync"}})).name == "sync-batch"
    assert make_policy(RunConfig()).name == "expected-valid"


def _ledger(order: EarlyStopOrder, n: int = 6) -> CommitLedger:
    led = CommitLedger(order)
    for k in range(n):
        led.admit(k)
    return led


def test_any_order_commits_in_completion_order_and_aborts_the_rest_at_the_bound() -> None:
    led = _ledger(EarlyStopOrder.ANY)
    led.set_ready(4)
    p = led.plan(remaining=2)
    assert (p.commit, p.abort, p.covered) == ([4], [], False)
    led.set_ready(2)
    led.set_ready(5)
    p = led.plan(remaining=1)
    assert p.commit == [2] and p.requeue == [5] and p.abort == [0, 1, 3] and p.covered
    assert len(led) == 0


def test_fifo_order_waits_for_earlier_prompts_and_cuts_after_the_bth() -> None:
    led = _ledger(EarlyStopOrder.FIFO)
    led.set_ready(1)
    led.set_ready(2)
    # 0 is still running: nothing commits yet, but 1 and 2 cover remaining=2 → 3, 4, 5 aborted
    p = led.plan(remaining=2)
    assert (p.commit, p.requeue, p.abort, p.covered) == ([], [], [3, 4, 5], True)
    # 0 turns out valid too: it commits with 1; 2 is now beyond the bound
    led.set_ready(0)
    p = led.plan(remaining=2)
    assert (p.commit, p.requeue) == ([0, 1], [2])


def test_fifo_filtered_earlier_prompt_releases_the_later_ones() -> None:
    led = _ledger(EarlyStopOrder.FIFO, 3)
    led.set_ready(1)
    assert led.plan(remaining=1).abort == [2]
    led.finish(0)  # filtered
    p = led.plan(remaining=1)
    assert p.commit == [1] and p.covered


def test_sync_ledger_never_aborts_and_requeues_the_surplus() -> None:
    led = CommitLedger(EarlyStopOrder.FIFO, abort_beyond_cutoff=False)
    for k in range(3):
        led.admit(k)
    led.set_ready(0)
    p = led.plan(remaining=1)
    assert (p.commit, p.abort) == ([0], [])
    led.set_ready(2)
    led.finish(1)
    assert led.plan(remaining=0).requeue == [2]


def test_ledger_rejects_misuse() -> None:
    led = _ledger(EarlyStopOrder.ANY, 1)
    with pytest.raises(KeyError):
        led.admit(0)
    with pytest.raises(KeyError):
        led.set_ready(7)
