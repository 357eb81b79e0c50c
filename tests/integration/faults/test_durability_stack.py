"""Durability of the whole loop, at default settings, on real processes: redis-server
(AOF, fsync always), the real verifier, scheduler and trainer, two SIMULATOR gateways in
answer-key mode. Faults hit real processes (SIGKILL, SIGTERM, SIGSTOP) or a RESP proxy that loses
replies; the invariant checker reads Redis, the groups stream, the audit stream and the trainer's
record of what it trained (every attempt one outcome, no stranded claim, every group trained once,
no version gap, counters equal the per-prompt ledger), and every test asks that the run progresses
again afterwards.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from asyncdapo.contracts.redis_keys import RunKeys
from asyncdapo.contracts.v1 import scheduler_pb2
from asyncdapo.tools.faults.assets import FaultAssets, build_fault_assets
from asyncdapo.tools.faults.invariants import CheckerThread, InvariantChecker
from asyncdapo.tools.faults.procs import FaultStack, FaultStackOptions
from asyncdapo.tools.faults.proxy import evalsha
from asyncdapo.tools.local.ports import wait_until

pytestmark = pytest.mark.slow

MakeStack = Callable[..., FaultStack]


def _run_with_checker(stack: FaultStack) -> tuple[InvariantChecker, CheckerThread]:
    checker = InvariantChecker(stack.redis_url, stack.run, stack.trainer_dir)
    return checker, CheckerThread(checker, interval_s=1.0).start()


def _finish(stack: FaultStack, checker: InvariantChecker, watch: CheckerThread, what: str) -> None:
    watch.stop()
    checker.poll()
    print(f"{what}\n{checker.report()}")
    assert checker.violations == [], checker.report()
    assert watch.errors == 0, watch.last_error


def _counters(stack: FaultStack) -> dict[str, int]:
    r = redis.Redis.from_url(stack.redis_url, decode_responses=True)
    return {k: int(v) for k, v in r.hgetall(RunKeys(stack.run).counters).items()}


def test_redis_terminated_for_5s_and_killed_for_120s_mid_run(fault_stack: MakeStack) -> None:
    """Redis goes away twice while prompts are in flight: SIGTERM (restart after 5 s) and SIGKILL
    (back after 120 s, from its AOF). Nothing is lost, nothing trained twice, admission is alive
    afterwards, and the scheduler said NOT_SERVING (redis_available false) while it waited."""
    stack = fault_stack().start()
    checker, watch = _run_with_checker(stack)
    try:
        stack.wait_for_step(2, timeout_s=180)
        stack.restart("redis", how="term", down_s=5.0)
        after_term = stack.trained_steps()
        stack.wait_for_step(after_term + 2, timeout_s=120)
        stack.kill("redis")
        time.sleep(10)
        status = stack.scheduler_status()
        assert not status.redis_available  # type: ignore[attr-defined]
        assert stack.scheduler_metric("asyncdapo_scheduler_redis_up") == 0.0
        time.sleep(110)
        stack.start_service("redis")
        t_back = time.monotonic()
        step = stack.trained_steps()
        stack.wait_for_step(step + 3, timeout_s=180)
        recovery_s = time.monotonic() - t_back
        assert stack.scheduler_status().redis_available  # type: ignore[attr-defined]
    finally:
        _finish(stack, checker, watch, "redis SIGTERM 5 s + SIGKILL 120 s")
    c = _counters(stack)
    assert not any(k.startswith("outcome:dropped") for k in c), c
    assert stack.unplanned_restarts() == [], stack.describe()
    print(f"progress resumed {recovery_s:.1f} s after Redis came back")


def _max_staleness(stack: FaultStack) -> int:
    """The largest version − min_version of any group the trainer trained (its step records)."""
    rows = [json.loads(line) for line in (stack.trainer_dir / "metrics.jsonl").read_text().splitlines()]
    return max(
        (int(k.split("/")[1]) for row in rows for k, v in row.items() if k.startswith("staleness/") and v),
        default=0,
    )


def _lose_nth(script: str, nth: int) -> Callable[[list[bytes]], bool]:
    is_script = evalsha(script)
    seen = 0

    def match(cmd: list[bytes]) -> bool:
        nonlocal seen
        if not is_script(cmd):
            return False
        seen += 1
        return seen == nth

    return match


@pytest.mark.parametrize("script", ["claim", "record"])
def test_a_lost_reply_of_claim_or_record_keeps_counters_exact_and_memory_equal_to_redis(
    fault_stack: MakeStack, script: str
) -> None:
    """Redis executes the call, the reply never arrives (the proxy drops the connection instead):
    the scheduler's retry is answered from the first call's effect (CLAIM's client token, RECORD's
    response markers), so no claim is stranded, no response is counted twice, and what the
    scheduler keeps in memory (its counters' mirrors) equals Redis."""
    stack = fault_stack(redis_proxy_for=("scheduler",)).start(trainer=False)
    rule = stack.redis_proxy("scheduler").lose_reply(_lose_nth(script, 3))
    checker, watch = _run_with_checker(stack)
    try:
        stack.start_trainer()
        if not rule.wait(120):
            pytest.fail(f"no {script.upper()} reply lost\n{stack.describe()}")
        stack.wait_for_step(3, timeout_s=180)
        stack.pause("trainer")  # the scheduler settles at the bound: memory and Redis comparable

        def settled() -> bool:
            st = stack.scheduler_status()
            return st.phase == scheduler_pb2.RUN_PHASE_BOUND and st.in_flight_prompts == 0  # type: ignore[attr-defined]

        wait_until(settled, 60, "the scheduler idle at the bound", interval_s=0.2)
        time.sleep(1.5)  # the counters it batches are flushed every second
        c = _counters(stack)
        for metric, field in (
            ("asyncdapo_scheduler_completions_total", "completions"),
            ("asyncdapo_scheduler_generated_tokens_total", "generated_tokens"),
            ("asyncdapo_scheduler_valid_groups_produced_total", "valid_produced"),
        ):
            assert stack.scheduler_metric(metric) == c[field], (metric, c)
        # each response counted once: the groups carry n responses each and every recorded
        # response belongs to exactly one attempt
        assert c["completions"] >= c["outcome:valid"] * stack.cfg.rollout.n
        stack.resume("trainer")
        step = stack.trained_steps()
        stack.wait_for_step(step + 2, timeout_s=120)
    finally:
        _finish(stack, checker, watch, f"lost {script.upper()} reply")


def test_verifier_killed_for_10s_and_60s_drops_nothing(fault_stack: MakeStack) -> None:
    stack = fault_stack().start()
    checker, watch = _run_with_checker(stack)
    try:
        stack.wait_for_step(2, timeout_s=180)
        for down_s in (10.0, 60.0):
            stack.restart("verifier", how="kill", down_s=down_s)
            step = stack.trained_steps()
            stack.wait_for_step(step + 2, timeout_s=120)
    finally:
        _finish(stack, checker, watch, "verifier SIGKILL 10 s and 60 s")
    c = _counters(stack)
    assert not any(k.startswith("outcome:dropped") for k in c), c


def test_a_hung_gateway_never_stalls_a_publish_and_is_resynced_before_it_serves(
    fault_stack: MakeStack,
) -> None:
    """gateway-0 is SIGSTOPped (it answers nothing, its load reports stop): publishes go on with
    gateway-1 well within the update timeout; after SIGCONT gateway-0 loads the current weights in
    the background before it gets work again, and every group stays on-policy (s = 0)."""
    stack = fault_stack().start()
    checker, watch = _run_with_checker(stack)
    try:
        stack.wait_for_step(2, timeout_s=180)
        stack.pause("gateway-0")
        step = stack.trained_steps()
        took = stack.wait_for_step(step + 3, timeout_s=120)
        # a publish never waits out the update timeout (60 s) on the stopped gateway: its update
        # fails as soon as the pool sees it down (its load reports stop: ~3 s)
        assert took < 45, f"3 steps took {took:.0f} s with gateway-0 stopped"
        stack.resume("gateway-0")
        step = stack.trained_steps()
        stack.wait_for_step(step + 3, timeout_s=120)
        r = redis.Redis.from_url(stack.redis_url)
        version = int(r.hget(RunKeys(stack.run).weights, "version") or 0)
        status = stack.list_gateways()
        by_addr = {g.address: g for g in status}
        g0 = by_addr[f"127.0.0.1:{stack.gateway_ports[0]}"]
        assert g0.load.weight_version >= version - 1, status
        assert stack.scheduler_metric('asyncdapo_scheduler_gateway_weight_syncs_total{result="ok"}')
    finally:
        _finish(stack, checker, watch, "gateway-0 SIGSTOPped through 3 publishes")
    print(f"3 steps with gateway-0 stopped took {took:.1f} s")
    # on-policy: every group trained at step t holds tokens of version t only
    assert _max_staleness(stack) == 0


@pytest.fixture(scope="module")
def async_assets(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> FaultAssets:
    """Fully async: s = 1, weights updated with `keep` (responses in flight span versions)."""
    return build_fault_assets(
        tmp_path_factory.mktemp("fa-assets"),
        tiny_model_dir,
        run="fa",
        total_steps=1000,
        overrides={"rollout": {"max_staleness": 1, "weight_update_mode": "keep"}},
    )


def test_fully_async_s1_keep_runs_50_versions_without_a_stall(
    async_assets: FaultAssets, tmp_path: Path
) -> None:
    """The trainer at rollout pace for 50 versions: groups committed right after a publish are
    judged against the step that will consume them, so the trainer finds them trainable; whatever
    it does drop is credited back, so the bound can never lock the run."""
    stack = FaultStack(
        FaultStackOptions(
            run_dir=tmp_path / "stack", config=async_assets.config, answer_key=async_assets.answer_key
        )
    )
    try:
        stack.start()
        checker, watch = _run_with_checker(stack)
        try:
            took = stack.wait_for_step(50, timeout_s=600)
        finally:
            _finish(stack, checker, watch, "fully async s = 1, 50 versions")
        c = _counters(stack)
        rows = [json.loads(line) for line in (stack.trainer_dir / "metrics.jsonl").read_text().splitlines()]
        stale_dropped = rows[-1].get("dropped/stale", 0)
        credited = c.get("valid_credited", 0)
        print(
            f"50 versions in {took:.0f} s; requeued as stale by FINISH: {c.get('requeued:stale', 0)}, "
            f"dropped as stale by the trainer: {stale_dropped}, credited back: {credited}"
        )
        # every drop of the trainer is credited back (and FINISH keeps stale ones out)
        assert stale_dropped == 0 and credited == sum(
            v for k, v in c.items() if k.startswith("trainer:dropped:")
        )
        assert _max_staleness(stack) <= 1
        assert stack.unplanned_restarts() == [], stack.describe()
    finally:
        strays = stack.stop()
        assert strays == []
