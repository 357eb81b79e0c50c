"""The whole loop against a Redis at `maxmemory`, at default settings (leases, retries, timeouts):
real redis-server capped with `maxmemory-policy noeviction` (as `asyncdapo up --redis-maxmemory`,
the chart and the operator's managed Redis run it), the real verifier, scheduler and trainer, two
SIMULATOR gateways in answer-key mode.

The run alone stays well under its cap. Mid-run the test lowers the cap below what Redis holds, so
that Redis refuses every write that may grow memory (OOM) for longer than the scheduler's lease:
the services stay up and say so (`asyncdapo_scheduler_redis_full` 1, GetRun `redis_available`
false, a warning naming maxmemory), and the run stalls instead of dropping anything. Once the cap
is raised again the run trains to its last step and the invariant checker finds one outcome per
attempt, every group trained once, nothing lost.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from asyncdapo.contracts.redis_keys import RunKeys, text
from asyncdapo.tools.faults.assets import FaultAssets, build_fault_assets
from asyncdapo.tools.faults.invariants import DEFAULT_LEASE_S, CheckerThread, InvariantChecker
from asyncdapo.tools.faults.procs import FaultStack, FaultStackOptions, marked_processes
from asyncdapo.tools.local.ports import wait_until

pytestmark = pytest.mark.slow

TARGET_STEPS = 6  # the run's trainer.total_steps: the trainer exits 0 after it
FULL_AT_STEP = 2  # Redis turns full once the trainer reached this step
MAXMEMORY = "8mb"  # ~4x what the run holds at its end: the run alone never reaches it
# Full past the scheduler's lease (its refresh is a write, refused too), yet short of the checker's
# stranded-claim age (lease + 10 s): the scheduler's claims stay in flight the whole time.
FULL_FOR_S = DEFAULT_LEASE_S + 2


@pytest.fixture(scope="module")
def full_assets(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> FaultAssets:
    return build_fault_assets(
        tmp_path_factory.mktemp("full-assets"), tiny_model_dir, run="full", total_steps=TARGET_STEPS
    )


def tighten(r: redis.Redis) -> int:
    """Lower Redis' maxmemory to half of what it holds now (as a data set grown past its cap looks
    to Redis): every write that may grow memory is refused (OOM) until the cap is raised, and no
    trim or expiry of the run frees enough to let one through. Returns the cap set."""
    cap = int(r.info("memory")["used_memory"]) // 2
    r.config_set("maxmemory", cap)
    return cap


def _wait(stack: FaultStack, r: redis.Redis, check: Callable[[], bool], timeout_s: float, what: str) -> None:
    try:
        wait_until(check, timeout_s, what, interval_s=0.5)
    except TimeoutError as err:
        mem = r.info("memory")
        pytest.fail(
            f"{err}; Redis used_memory {mem['used_memory']} of {mem['maxmemory']}, trainer at step "
            f"{stack.trained_steps()}\n{stack.describe(tail_lines=30)}"
        )


def _counter(r: redis.Redis, run: str, field: str) -> int:
    return int(r.hget(RunKeys(run).counters, field) or 0)


def test_a_full_redis_stalls_the_run_and_loses_nothing(full_assets: FaultAssets, tmp_path: Path) -> None:
    stack = FaultStack(
        FaultStackOptions(
            run_dir=tmp_path / "stack",
            config=full_assets.config,
            answer_key=full_assets.answer_key,
            redis_maxmemory=MAXMEMORY,
            trainer_metrics=True,
        )
    )
    r = redis.Redis.from_url(stack.redis_url, socket_timeout=10.0)
    sched_full = lambda: stack.scheduler_metric("asyncdapo_scheduler_redis_full")  # noqa: E731
    trainer_full = lambda: stack.trainer_metric("asyncdapo_trainer_redis_full")  # noqa: E731
    sched_log = stack.logs / "scheduler.log"
    try:
        stack.start()
        checker = InvariantChecker(stack.redis_url, stack.run, stack.trainer_dir)
        watch = CheckerThread(checker, interval_s=1.0).start()
        try:
            stack.wait_for_step(FULL_AT_STEP, timeout_s=120)
            conf = r.config_get("maxmemory*")
            assert conf["maxmemory-policy"] == "noeviction" and conf["maxmemory"] == str(8 * 2**20)
            assert sched_full() == 0.0 and trainer_full() == 0.0  # the run alone is under its cap

            tight = tighten(r)
            t_full = time.monotonic()
            at_full = stack.trained_steps()
            _wait(stack, r, lambda: sched_full() == 1.0, 30, "the scheduler's redis_full gauge at 1")
            produced_full = _counter(r, stack.run, "valid_produced")
            time.sleep(max(0.0, t_full + FULL_FOR_S - time.monotonic()))

            # still full: every service up and answering, the scheduler saying why it waits
            assert sched_full() == 1.0
            assert stack.scheduler_metric("asyncdapo_scheduler_redis_up") == 0.0
            status = stack.scheduler_status()
            assert status.run == stack.run and not status.redis_available  # type: ignore[attr-defined]
            assert "is full (maxmemory reached" in sched_log.read_text()
            # the trainer waits on the scheduler (its publish): its own reads, acks, trims and
            # lease renewals are not refused at maxmemory, so it reports full only if one of its
            # growing writes (a prompt refill) was; it is up and serving its metrics either way
            assert trainer_full() in (0.0, 1.0)
            down = [name for name, svc in stack.services.items() if not svc.running()]
            assert down == [] and stack.unplanned_restarts() == [], stack.describe()
            # the run stalled: at most the step whose groups were committed before Redis turned
            # full (unstalled, it trains a step in under a second here), nothing produced since
            stalled_at = stack.trained_steps()
            assert stalled_at <= at_full + 1, f"trained {at_full} -> {stalled_at} while Redis was full"
            assert _counter(r, stack.run, "valid_produced") == produced_full

            # memory frees (the cap raised back): the run resumes and trains to its last step
            r.config_set("maxmemory", MAXMEMORY)
            t_freed = time.monotonic()
            _wait(stack, r, lambda: sched_full() == 0.0, 30, "the scheduler's redis_full gauge at 0")
            _wait(
                stack, r, lambda: stack.service("trainer").exited() == 0, 120, "the trainer finishing the run"
            )
            resumed_s = time.monotonic() - t_freed
        finally:
            watch.stop()
        checker.poll()
        print(
            f"maxmemory lowered to {tight / 2**20:.2f} MiB at step {at_full} for {t_freed - t_full:.0f} s "
            f"(stalled at step {stalled_at}); the run's last step {resumed_s:.1f} s after it was raised\n"
            f"{checker.report()}"
        )
        assert "is back after" in sched_log.read_text()
        assert checker.violations == [], checker.report()
        assert watch.errors == 0, watch.last_error
        s = checker.summary
        assert s["steps"] == TARGET_STEPS and s["published_version"] == TARGET_STEPS
        assert s["groups_trained"] == TARGET_STEPS * stack.cfg.data.train_batch_size
        # one outcome per attempt: every attempt admitted has its outcome, or is still claimed
        assert sum(s["outcomes"].values()) + s["claimed"] == s["attempts"]
        c = {text(k): int(v) for k, v in r.hgetall(RunKeys(stack.run).counters).items()}
        assert not [k for k in c if k.startswith(("outcome:dropped", "trainer:dropped:"))], c
        assert stack.unplanned_restarts() == [], stack.describe()
    finally:
        r.close()
        strays = stack.stop()
        assert strays == [], f"processes outlived FaultStack.stop(): {strays}"
        assert marked_processes(stack.marker) == []
