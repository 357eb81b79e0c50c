"""The worker pool on its own (real worker processes): crashes, kills, cancellation, shutdown."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest

from asyncdapo.contracts.verifier_api import ItemStatus
from asyncdapo.services.verifier.worker_pool import PoolClosed, RestartReason, WorkerPool
from asyncdapo.tools.local.ports import wait_until

NESTED_FRAC = "$\\boxed{" + "\\frac{1}{" * 3000 + "2" + "}" * 3000 + "}$"


@pytest.fixture()
def restarts() -> list[RestartReason]:
    return []


@pytest.fixture()
def pool(restarts: list[RestartReason]) -> Iterator[WorkerPool]:
    # No in-worker alarm: only the watchdog (or a test) ends a stuck item.
    with WorkerPool(2, timeout_s=2.0, soft_timeout_s=None, max_chunk=8, on_restart=restarts.append) as p:
        assert p.wait_ready(60)
        yield p


def test_killed_worker_item_is_timeout_and_rest_of_its_chunk_is_scored(
    pool: WorkerPool, restarts: list[RestartReason]
) -> None:
    # 2 idle workers and 8 items: chunks of 4; the stuck item heads the first chunk.
    pairs = [("2", NESTED_FRAC)] + [(str(k), f"A: {k}") for k in range(7)]
    t0 = time.monotonic()
    verdicts = pool.submit(pairs).result(timeout=30)
    assert time.monotonic() - t0 < 3.0
    assert verdicts[0].status is ItemStatus.TIMEOUT and "killed" in (verdicts[0].error or "")
    assert all(v.status is ItemStatus.OK and v.acc for v in verdicts[1:])
    assert restarts == [RestartReason.TIMEOUT]
    wait_until(lambda: pool.ready_workers == 2, 30, "replacement worker")


def test_crashed_worker_item_is_error_and_pool_keeps_serving(
    pool: WorkerPool, restarts: list[RestartReason]
) -> None:
    future = pool.submit([("2", NESTED_FRAC)])
    time.sleep(0.5)  # the stuck item is running in one of the workers
    busy = [pid for pid in pool.worker_pids() if pid is not None]
    for pid in busy:  # SIGKILL both: the idle one's death must cost nothing
        os.kill(pid, signal.SIGKILL)
    verdict = future.result(timeout=10)[0]
    assert verdict.status is ItemStatus.ERROR and "died" in (verdict.error or "")
    # the busy worker's item fails first; the idle worker's death may be noticed a moment later
    deadline = time.monotonic() + 10
    while len(restarts) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert restarts == [RestartReason.CRASH, RestartReason.CRASH]
    assert [v.acc for v in pool.submit([("1", "A: 1"), ("1", "A: 2")]).result(timeout=30)] == [True, False]


def test_cancelled_batches_are_not_scored(pool: WorkerPool) -> None:
    stuck = [pool.submit([("2", NESTED_FRAC)]) for _ in range(2)]  # both workers busy for 2 s
    time.sleep(0.2)
    waiting = pool.submit([("1", "A: 1")] * 50)
    assert waiting.cancel()
    assert pool.submit([("3", "A: 3")]).result(timeout=30)[0].acc is True
    assert all(f.result(timeout=10)[0].status is ItemStatus.TIMEOUT for f in stuck)
    assert pool.queued == 0


def test_close_fails_unfinished_work_and_refuses_new() -> None:
    pool = WorkerPool(1, timeout_s=5.0, soft_timeout_s=None).start()
    assert pool.wait_ready(60)
    future = pool.submit([("2", NESTED_FRAC), ("1", "A: 1")])
    time.sleep(0.2)
    pool.close(timeout_s=1.0)
    with pytest.raises(PoolClosed):
        future.result(timeout=10)
    with pytest.raises(PoolClosed):
        pool.submit([("1", "A: 1")])


@pytest.mark.parametrize("spares", [1, 0])
def test_a_spare_scores_new_requests_while_a_worker_is_stuck(spares: int) -> None:
    stalls: list[None] = []
    with WorkerPool(
        1,
        timeout_s=2.0,
        soft_timeout_s=None,
        spares=spares,
        stall_after_s=0.05,
        on_stall=lambda: stalls.append(None),
    ) as pool:
        assert pool.wait_ready(60)
        stuck = pool.submit([("2", NESTED_FRAC)])
        time.sleep(0.2)  # the stuck item is running: the one worker's place is free only with a spare
        t0 = time.monotonic()
        assert [v.acc for v in pool.submit([("1", "A: 1"), ("5", "A: 4")]).result(timeout=30)] == [
            True,
            False,
        ]
        waited = time.monotonic() - t0
        assert stuck.result(timeout=10)[0].status is ItemStatus.TIMEOUT
    if spares:
        assert waited < 1.0, f"a new request waited {waited:.2f} s behind a stuck item despite a spare"
        assert len(stalls) == 1
    else:  # the request waits for the watchdog to free the only process
        assert waited > 1.5
