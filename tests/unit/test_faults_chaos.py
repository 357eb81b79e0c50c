"""The chaos soak's pure parts: the seeded schedule, the recovery statistics and the RESULT line."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from asyncdapo.tools.faults.chaos import (
    ChaosOptions,
    ChaosReport,
    FaultResult,
    lost_reply_predicate,
    percentile,
)
from asyncdapo.tools.faults.chaos_plan import STALENESS_S, FaultKind, PlannedFault, parse_kinds, plan


def test_a_seed_names_one_schedule_and_other_seeds_another() -> None:
    a, b = plan(7, 50, gateways=3), plan(7, 50, gateways=3)
    assert a == b
    assert plan(8, 50, gateways=3) != a
    assert [f.index for f in a] == list(range(1, 51))


def test_the_schedule_covers_every_kind_with_the_issue_s_parameters() -> None:
    faults = plan(0, 400, gateways=2)
    assert {f.kind for f in faults} == set(FaultKind)
    for f in faults:
        if f.kind.service == "gateway":
            assert f.target in ("gateway-0", "gateway-1")
        if f.kind is FaultKind.GATEWAY_STOP:
            # longer than the staleness of a gateway's load reports: the pool sees it down
            assert STALENESS_S < f.duration_s <= 10
        if f.kind in (FaultKind.REDIS_KILL, FaultKind.REDIS_TERM):
            assert 0 <= f.duration_s <= 3
        if f.kind is FaultKind.REDIS_CONN_CUT:
            assert f.target in ("scheduler", "trainer")
        if f.kind is FaultKind.REDIS_LOST_REPLY:
            assert f.target.split(":")[0] in ("scheduler", "trainer") and 1 <= f.nth <= 3
        if f.kind in (FaultKind.SCHEDULER_KILL, FaultKind.TRAINER_TERM, FaultKind.VERIFIER_KILL):
            assert f.duration_s == 0  # restarted at once
    cuts = [f for f in faults if f.kind.how == "cut"]
    assert any(f.duration_s == 0 for f in cuts) and any(f.duration_s > 0 for f in cuts)


def test_kinds_by_name_or_by_service() -> None:
    assert parse_kinds("all") == tuple(FaultKind)
    assert parse_kinds("scheduler:kill") == (FaultKind.SCHEDULER_KILL,)
    assert set(parse_kinds("redis")) == {
        FaultKind.REDIS_KILL,
        FaultKind.REDIS_TERM,
        FaultKind.REDIS_CONN_CUT,
        FaultKind.REDIS_LOST_REPLY,
    }
    assert set(parse_kinds("gateway")) == {
        FaultKind.GATEWAY_KILL,
        FaultKind.GATEWAY_TERM,
        FaultKind.GATEWAY_STOP,
        FaultKind.GATEWAY_CONN_CUT,
    }
    with pytest.raises(ValueError, match="unknown fault kind 'redis:explode'"):
        parse_kinds("redis:explode")
    assert {f.kind for f in plan(1, 30, 2, parse_kinds("trainer"))} <= {
        FaultKind.TRAINER_KILL,
        FaultKind.TRAINER_TERM,
    }


def test_lost_reply_targets_become_proxy_predicates() -> None:
    client, match = lost_reply_predicate("scheduler:finish")
    assert client == "scheduler" and match.__name__ == "evalsha(finish)"
    client, match = lost_reply_predicate("trainer:EVALSHA")
    assert client == "trainer" and match([b"EVAL", b"return 1", b"0"]) and match([b"evalsha", b"ab", b"0"])
    _, match = lost_reply_predicate("trainer:RPUSH")
    assert match([b"RPUSH", b"q", b"e0-1"]) and not match([b"LPUSH", b"q", b"e0-1"])


def test_nearest_rank_percentiles() -> None:
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile(list(map(float, range(1, 101))), 99) == 99.0
    assert percentile([5.0], 99) == 5.0
    assert math.isnan(percentile([], 50))


def _result(kind: FaultKind, recovery: float | None, stalled: bool = False) -> FaultResult:
    r = FaultResult(PlannedFault(1, kind, kind.service, 0.0, 0.0), t_fault=100.0, t_clear=100.5)
    r.full_loop_t = None if recovery is None else 100.5 + recovery
    r.first_step_t = r.full_loop_t
    r.stalled = stalled
    return r


def _report(results: list[FaultResult], **kw: object) -> ChaosReport:
    base: dict[str, object] = dict(
        opts=ChaosOptions(workdir=Path("/nonexistent"), seed=4),
        results=results,
        controls=[0.5, 0.7],
        violations=[],
        violation_kinds={},
        prompts_lost=0,
        groups_duplicated=0,
        groups_lost=0,
        groups={"committed": 10, "trained": 10},
        drops={},
        crashes=[],
        orphans=[],
        checker_errors=0,
        checker_last_error="",
        mem={
            "first": 2e6,
            "last": 2e6,
            "max": 2.1e6,
            "aof_last": 1e6,
            "slope_bytes_per_version": 400.0,
            "slope_without_audit": 12.0,
            "audit_last": 2e5,
        },
        summary={"steps": 40},
        wall_s=600.0,
        load=((1.0, 1.0, 1.0), (2.0, 2.0, 2.0)),
    )
    base.update(kw)
    return ChaosReport(**base)  # type: ignore[arg-type]


def test_the_table_and_the_result_line() -> None:
    results = [_result(FaultKind.SCHEDULER_KILL, 2.0), _result(FaultKind.SCHEDULER_KILL, 4.0)]
    results.append(_result(FaultKind.TRAINER_KILL, 31.0))
    skipped = _result(FaultKind.REDIS_LOST_REPLY, None)
    skipped.skipped = "no matching command"
    rep = _report([*results, skipped])
    table = rep.table()
    assert "none (baseline)" in table and "scheduler:kill" in table and "redis:lost-reply" not in table
    row = next(line for line in table.splitlines() if line.startswith("scheduler:kill"))
    assert row.split()[1:] == ["2", "0.5", "2.0", "2.0", "4.0", "4.0"]
    text = rep.render()
    assert text.splitlines()[-1] == rep.result_line()
    assert rep.result_line().startswith(
        "RESULT faults=3 prompts_lost=0 groups_duplicated=0 groups_lost=0 stalls=0 recovery_p99_s=31.0 "
        "redis_mem_slope=12 redis_mem_slope_with_audit=400 "
    )
    assert rep.ok and "OK: every invariant held" in text


def test_a_stall_or_a_loss_fails_the_run() -> None:
    stalled = _report([_result(FaultKind.REDIS_KILL, None, stalled=True)])
    assert not stalled.ok and "stalls=1" in stalled.result_line()
    assert "STALL after fault #1 redis:kill" in stalled.render()
    lost = _report([_result(FaultKind.REDIS_KILL, 1.0)], prompts_lost=2, drops={"dropped:gateway_error": 2})
    assert not lost.ok and "prompts_lost=2" in lost.result_line()
