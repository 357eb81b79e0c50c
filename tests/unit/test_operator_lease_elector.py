"""Operator replicas competing for the Lease through the real election loop (lease_elector.py)
against an in-process fake of the Lease API (tests/fake_lease_api.py), with the periods shortened
(lease 1 s, renew deadline 0.5 s, retry 0.05 s) so that nothing waits 15 s.

What a platform team would notice: exactly one replica does the operator's work at any time, a
standby takes over within the lease duration when the leader stops renewing, at once when it stops
gracefully, and a leader that cannot renew stops (the CLI exits) before anyone takes over."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from fake_lease_api import FakeLeaseStore
from prometheus_client import REGISTRY

from asyncdapo.services.operator.leader_election import RETRY_PERIOD_S, LeaseRef, Timing, Transition
from asyncdapo.services.operator.lease_elector import (
    KubeLeaseApi,
    LeaseConflict,
    LeaseElector,
    lead,
    record_transition,
    standby_health,
)
from asyncdapo.tools.local.ports import free_port

REF = LeaseRef("asyncdapo", "asyncdapo-operator")
FAST = Timing(lease_duration_s=1.0, renew_deadline_s=0.5, retry_period_s=0.05)
SLACK_S = 0.3  # scheduling noise of a busy test machine


class Replica:
    """One `asyncdapo operator run --leader-election` process: stands by, then works (kopf's part)
    while leading. Losing the Lease ends it at once, without a release, as the CLI's os._exit does."""

    def __init__(self, store: FakeLeaseStore, name: str, everyone: list[Replica], timing: Timing = FAST):
        self.name = name
        self.client = store.client(name)
        self.transitions: list[Transition] = []
        self.elector = LeaseElector(
            self.client, REF, name, timing=timing, on_transition=self.transitions.append
        )
        self.everyone = everyone
        everyone.append(self)
        self.working = False
        self.started_work_at: float | None = None
        self.exited: tuple[Transition, float] | None = None
        self.overlaps: list[str] = []
        self.stop_work = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._main())

    async def _main(self) -> None:
        await self.elector.acquire()
        await lead(self.elector, self._work, self._exit)

    async def _work(self) -> None:
        self.overlaps += [r.name for r in self.everyone if r.working]
        self.working = True
        self.started_work_at = asyncio.get_running_loop().time()
        try:
            await self.stop_work.wait()
        finally:
            self.working = False

    def _exit(self, transition: Transition) -> None:
        self.exited = (transition, asyncio.get_running_loop().time())
        self.working = False  # the process is gone: no handler runs any more
        assert self.task is not None
        self.task.cancel()

    def kill(self) -> None:
        """SIGKILL or a lost node: nothing more from this replica, not even a release."""
        self.client.cut = True
        self.working = False
        assert self.task is not None
        self.task.cancel()

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)


async def until(cond: Callable[[], bool], timeout_s: float) -> float:
    """Seconds until `cond` holds; fails after `timeout_s`."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while not cond():
        if loop.time() - start > timeout_s:
            raise AssertionError(f"not within {timeout_s}s")
        await asyncio.sleep(0.005)
    return loop.time() - start


@contextlib.asynccontextmanager
async def fleet() -> AsyncIterator[list[Replica]]:
    """The replicas a test starts: stopped afterwards, and none worked while another did."""
    everyone: list[Replica] = []
    try:
        yield everyone
    finally:
        for r in everyone:
            await r.stop()
    assert [r.overlaps for r in everyone] == [[] for _ in everyone], "two replicas worked at once"


async def two_with_a_leader(
    replicas: list[Replica], timing: Timing = FAST
) -> tuple[FakeLeaseStore, Replica, Replica]:
    store = FakeLeaseStore()
    a, b = Replica(store, "a", replicas, timing), Replica(store, "b", replicas, timing)
    a.start()
    b.start()
    await until(lambda: a.working or b.working, 2.0)
    leader, standby = (a, b) if a.working else (b, a)
    return store, leader, standby


async def test_of_two_replicas_exactly_one_leads_and_keeps_leading() -> None:
    async with fleet() as replicas:
        store, leader, standby = await two_with_a_leader(replicas)
        await asyncio.sleep(10 * FAST.retry_period_s)  # many renewals and standby retries
        assert leader.working and not standby.working
        assert leader.transitions == [Transition.ACQUIRED] and standby.transitions == []
        assert store.holder(REF) == leader.name
        assert store.leases[REF]["spec"]["leaseTransitions"] == 0


async def test_a_partitioned_leader_stops_before_the_standby_takes_over() -> None:
    async with fleet() as replicas:
        store, leader, standby = await two_with_a_leader(replicas)
        loop = asyncio.get_running_loop()
        cut_at = loop.time()
        leader.client.cut = True  # it still runs, but can renew no more
        took = await until(lambda: standby.working, FAST.lease_duration_s + 2 * FAST.retry_period_s + SLACK_S)
        assert leader.exited is not None
        reason, exited_at = leader.exited
        assert reason is Transition.RENEW_DEADLINE_PASSED
        assert exited_at - cut_at <= FAST.renew_deadline_s + FAST.retry_period_s + SLACK_S
        assert standby.started_work_at is not None and exited_at < standby.started_work_at
        assert took >= FAST.lease_duration_s - FAST.retry_period_s  # it waited for the Lease to expire
        assert standby.transitions == [Transition.TOOK_OVER_EXPIRED]
        assert leader.transitions == [Transition.ACQUIRED, Transition.RENEW_DEADLINE_PASSED]
        assert store.holder(REF) == standby.name and store.leases[REF]["spec"]["leaseTransitions"] == 1


async def test_a_killed_leader_is_replaced_within_the_lease_duration() -> None:
    async with fleet() as replicas:
        store, leader, standby = await two_with_a_leader(replicas)
        leader.kill()
        took = await until(lambda: standby.working, FAST.lease_duration_s + 2 * FAST.retry_period_s + SLACK_S)
        assert took >= FAST.lease_duration_s - FAST.retry_period_s
        assert standby.transitions == [Transition.TOOK_OVER_EXPIRED]
        assert store.holder(REF) == standby.name


async def test_a_graceful_stop_releases_the_lease_and_the_standby_takes_over_at_once() -> None:
    async with fleet() as replicas:
        slow = Timing(lease_duration_s=5.0, renew_deadline_s=3.0, retry_period_s=0.05)
        store, leader, standby = await two_with_a_leader(replicas, slow)
        leader.stop_work.set()  # kopf returned after SIGTERM
        took = await until(lambda: standby.working, 10 * slow.retry_period_s + SLACK_S)
        assert took < slow.lease_duration_s / 5
        assert leader.transitions == [Transition.ACQUIRED, Transition.RELEASED] and leader.exited is None
        assert standby.transitions == [Transition.TOOK_OVER_RELEASED]
        assert store.leases[REF]["spec"]["leaseTransitions"] == 1


async def test_a_leader_finding_another_holder_stops_at_its_next_renewal() -> None:
    async with fleet() as replicas:
        store = FakeLeaseStore()
        a = Replica(store, "a", replicas)
        a.start()
        await until(lambda: a.working, 2.0)
        lease = store.leases[REF]
        lease["spec"]["holderIdentity"] = "intruder"  # e.g. a replica of a release with the same Lease
        lease["metadata"]["resourceVersion"] += "0"
        await until(lambda: a.exited is not None, 2 * FAST.retry_period_s + SLACK_S)
        assert a.exited is not None and a.exited[0] is Transition.LEASE_LOST and not a.working


async def test_two_replicas_creating_the_lease_at_once_one_wins_the_other_gets_a_conflict() -> None:
    store = FakeLeaseStore()
    a = LeaseElector(store.client("a"), REF, "a", timing=FAST)
    b = LeaseElector(store.client("b"), REF, "b", timing=FAST)
    got = await asyncio.gather(a.attempt(), b.attempt())
    assert sorted(t for t in got if t is not None) == [Transition.ACQUIRED]
    assert [a.leading, b.leading].count(True) == 1 and store.conflicts == 1
    winner = "a" if a.leading else "b"
    assert store.holder(REF) == winner


async def test_a_standby_stops_waiting_on_sigterm() -> None:
    store = FakeLeaseStore()
    a = LeaseElector(store.client("a"), REF, "a", timing=FAST)
    assert await a.acquire()
    b = LeaseElector(store.client("b"), REF, "b", timing=FAST)
    stop = asyncio.Event()
    waiting = asyncio.create_task(b.acquire(stop))
    await asyncio.sleep(3 * FAST.retry_period_s)
    stop.set()
    assert await asyncio.wait_for(waiting, 1.0) is False and not b.leading
    assert store.holder(REF) == "a"


def test_transitions_set_the_leader_gauge_and_count_by_reason() -> None:
    def count(reason: Transition) -> float:
        return (
            REGISTRY.get_sample_value("asyncdapo_operator_leader_transitions_total", {"reason": reason})
            or 0.0
        )

    before = {t: count(t) for t in Transition}
    record_transition(Transition.TOOK_OVER_EXPIRED)
    assert REGISTRY.get_sample_value("asyncdapo_operator_is_leader") == 1.0
    record_transition(Transition.RENEW_DEADLINE_PASSED)
    assert REGISTRY.get_sample_value("asyncdapo_operator_is_leader") == 0.0
    after = {t: count(t) - before[t] for t in Transition}
    assert after == {t: 1.0 if t in (Transition.TOOK_OVER_EXPIRED, Transition.RENEW_DEADLINE_PASSED) else 0.0
                     for t in Transition}  # fmt: skip


async def test_a_standby_answers_its_liveness_probe() -> None:
    port = free_port()
    async with standby_health(port, host="127.0.0.1"), httpx.AsyncClient() as client:
        resp = await client.get(f"http://127.0.0.1:{port}/healthz")
    assert resp.status_code == 200
    with pytest.raises(httpx.ConnectError):  # the port is free again for kopf's liveness endpoint
        httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1.0)


async def test_the_kube_lease_api_maps_404_and_409() -> None:
    from kubernetes.client.exceptions import ApiException

    class Coordination:
        def __init__(self, status: int) -> None:
            self.status = status

        def _fail(self, *_: Any, **__: Any) -> Any:
            raise ApiException(status=self.status, reason="from the API server")

        read_namespaced_lease = create_namespaced_lease = replace_namespaced_lease = _fail

    api = KubeLeaseApi()
    api._api = Coordination(404)
    assert await api.read(REF) is None
    api._api = Coordination(409)
    with pytest.raises(LeaseConflict, match="already exists"):
        await api.create(REF, {})
    with pytest.raises(LeaseConflict, match="changed since it was read"):
        await api.replace(REF, {})
    api._api = Coordination(403)
    with pytest.raises(ApiException):  # RBAC and other errors: the elector logs them and retries
        await api.read(REF)


async def test_the_cli_stands_by_healthy_then_runs_kopf_and_releases_on_stop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`asyncdapo operator run --leader-election` (its async part, kopf replaced by `operate`):
    /healthz answers while another replica leads, kopf starts once the Lease is free, and the Lease
    is released when kopf stops."""
    import argparse
    import functools

    from asyncdapo.services.operator import cli, lease_elector

    store = FakeLeaseStore()
    other = LeaseElector(store.client("other"), REF, "other", timing=FAST)
    assert await other.acquire()
    monkeypatch.setenv("POD_NAME", "asyncdapo-operator-7d9f-x2x")
    monkeypatch.setattr(lease_elector, "KubeLeaseApi", lambda: store.client("cli"))
    local = functools.partial(lease_elector.standby_health, host="127.0.0.1")
    monkeypatch.setattr(lease_elector, "standby_health", local)
    port = free_port()
    args = argparse.Namespace(
        health_port=port, leader_election_namespace=REF.namespace, leader_election_lease_name=REF.name
    )
    started, finish = asyncio.Event(), asyncio.Event()

    async def operate() -> None:
        started.set()
        await finish.wait()

    run = asyncio.create_task(cli._run_elected(args, operate))
    async with httpx.AsyncClient() as client:

        async def healthy() -> bool:
            try:
                return (await client.get(f"http://127.0.0.1:{port}/healthz")).status_code == 200
            except httpx.ConnectError:
                return False

        for _ in range(200):
            if await healthy():
                break
            await asyncio.sleep(0.01)
        assert await healthy() and not started.is_set()  # a healthy standby
        await other.release()
        await asyncio.wait_for(started.wait(), RETRY_PERIOD_S + 1.0)  # its next retry
        holder = store.holder(REF)
        assert holder is not None and holder.startswith("asyncdapo-operator-7d9f-x2x_")
        assert not await healthy()  # the port is kopf's now (its liveness endpoint)
    finish.set()
    assert await asyncio.wait_for(run, 2.0) == 0
    assert store.holder(REF) is None  # released for the next standby


def test_a_leader_that_lost_the_lease_exits_non_zero_with_a_clear_log(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import os

    from asyncdapo.services.operator import cli

    exits: list[int] = []
    monkeypatch.setattr(os, "_exit", exits.append)
    cli._exit_on_lost_leadership(Transition.RENEW_DEADLINE_PASSED)
    assert exits == [cli.EXIT_LEADERSHIP_LOST] and cli.EXIT_LEADERSHIP_LOST != 0
    assert "lost the operator Lease (renew_deadline_passed)" in caplog.text
    assert "restarts this replica as a standby" in caplog.text


async def test_stopping_a_leader_always_ends_its_renewal_even_as_a_read_completes() -> None:
    """kopf stops (SIGTERM) at any moment of the renewal loop, including the loop turn in which a
    Lease read comes back. The renewal must end and the Lease be released every time: a cancelled
    call that swallowed the cancellation because its result was ready (asyncio.wait_for on Python
    3.11 does) left `hold` renewing forever, and the process never exited."""
    for turns in range(60):  # cancel at each loop turn of several renewals
        store = FakeLeaseStore()
        elector = LeaseElector(store.client("a"), REF, "a", timing=Timing(1.0, 0.5, 0.001))
        assert await elector.acquire()
        working = asyncio.Event()

        async def work(working: asyncio.Event = working) -> None:
            working.set()
            await asyncio.Event().wait()  # kopf, until it is stopped

        task = asyncio.create_task(lead(elector, work, lambda t: pytest.fail(f"lost: {t}")))
        await working.wait()
        for _ in range(turns):
            await asyncio.sleep(0)
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=2.0)
        assert done, f"stopped after {turns} loop turns, the renewal never ended"
        assert not elector.leading and store.holder(REF) is None
