"""Leader election of the operator's replicas on a `coordination.k8s.io/v1` Lease: the loop around
the pure decisions of leader_election.py, the Lease API it talks to, the standby's /healthz and the
election's metrics.

Only the leader runs kopf. A standby serves /metrics and a /healthz that answers 200 (a healthy
standby must not be restarted by its liveness probe) and retries every `retry_period_s`. The leader
renews in a background task; when it cannot (renew deadline passed, or the Lease names someone
else) `lead` calls `on_lost`, which ends the process: Kubernetes restarts it as a standby, and no
handler of the old leader can still be running when a standby takes over.

kubernetes' own `kubernetes.leaderelection` only has a ConfigMap lock and a thread that sleeps, so
this small elector is ours.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, Protocol

from prometheus_client import Counter, Gauge

from asyncdapo.services.operator.leader_election import (
    Candidate,
    Decision,
    LeaseRef,
    ObservedLease,
    Timing,
    Transition,
    WriteResult,
    after_write,
    decide,
    observe,
    release_body,
    renew_overdue,
    stepped_down,
)

log = logging.getLogger(__name__)

IS_LEADER = Gauge(
    "asyncdapo_operator_is_leader", "1 while this operator replica holds the Lease and runs kopf"
)
LEADER_TRANSITIONS = Counter(
    "asyncdapo_operator_leader_transitions_total",
    "This replica started or stopped leading",
    ["reason"],
)


def record_transition(transition: Transition) -> None:
    """The election's metrics (the hook `asyncdapo operator run` gives the elector)."""
    LEADER_TRANSITIONS.labels(transition.value).inc()
    IS_LEADER.set(1.0 if transition.leads else 0.0)


def replica_identity() -> str:
    """The pod's name (downward API, env POD_NAME) and a random suffix: a restarted container of
    the same pod is a new candidate, never mistaken for the leader it was."""
    pod = os.environ.get("POD_NAME") or socket.gethostname()
    return f"{pod}_{secrets.token_hex(4)}"


def _describe(err: BaseException) -> str:
    return str(err) or type(err).__name__  # a timeout's str() is empty


class LeaseConflict(Exception):
    """409: the Lease changed since it was read (or already exists when creating it)."""


class LeaseApi(Protocol):
    async def read(self, ref: LeaseRef) -> dict[str, Any] | None:
        """The Lease, or None when it does not exist."""

    async def create(self, ref: LeaseRef, body: dict[str, Any]) -> dict[str, Any]:
        """Create; LeaseConflict when it exists."""

    async def replace(self, ref: LeaseRef, body: dict[str, Any]) -> dict[str, Any]:
        """Replace (PUT with body's resourceVersion); LeaseConflict when it moved on."""


class KubeLeaseApi:
    """`LeaseApi` on the real API server (the client's config must be loaded: `KubeCluster`)."""

    def __init__(self, request_timeout_s: float = 5.0) -> None:
        from kubernetes import client

        self._api = client.CoordinationV1Api()
        self._timeout = request_timeout_s

    def _call(self, method: Callable[..., Any], *args: Any) -> dict[str, Any]:
        # raw JSON: resourceVersion and the MicroTime strings exactly as the server wrote them
        resp = method(*args, _preload_content=False, _request_timeout=self._timeout)
        out: dict[str, Any] = json.loads(resp.data)
        return out

    async def read(self, ref: LeaseRef) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return await asyncio.to_thread(
                self._call, self._api.read_namespaced_lease, ref.name, ref.namespace
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    async def create(self, ref: LeaseRef, body: dict[str, Any]) -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException

        try:
            return await asyncio.to_thread(self._call, self._api.create_namespaced_lease, ref.namespace, body)
        except ApiException as err:
            if err.status == 409:
                raise LeaseConflict(f"Lease {ref.namespace}/{ref.name} already exists") from err
            raise

    async def replace(self, ref: LeaseRef, body: dict[str, Any]) -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException

        try:
            return await asyncio.to_thread(
                self._call, self._api.replace_namespaced_lease, ref.name, ref.namespace, body
            )
        except ApiException as err:
            if err.status == 409:
                raise LeaseConflict(f"Lease {ref.namespace}/{ref.name} changed since it was read") from err
            raise


class LeaseElector:
    """One replica's side of the election (see the module docstring)."""

    def __init__(
        self,
        api: LeaseApi,
        ref: LeaseRef,
        identity: str,
        *,
        timing: Timing | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
        on_transition: Callable[[Transition], None] = lambda _: None,
    ) -> None:
        self._api = api
        self._timing = timing or Timing()
        self._clock = clock
        self._wall = wall
        self._on_transition = on_transition
        self._me = Candidate(identity, ref)
        self._lease: ObservedLease | None = None  # as last read or written
        self._logged_holder: str | None = None

    @property
    def identity(self) -> str:
        return self._me.identity

    @property
    def leading(self) -> bool:
        return self._me.leading

    @property
    def timing(self) -> Timing:
        return self._timing

    def _timeout(self) -> float:
        """A call may take until the renew deadline (leader) or one deadline's length (standby)."""
        if self._me.renewed_at is None:
            return self._timing.renew_deadline_s
        return max(0.0, self._me.renewed_at + self._timing.renew_deadline_s - self._clock())

    def _transition(self, transition: Transition) -> None:
        ref = self._me.lease
        if transition.leads:
            log.info(
                "leading: Lease %s/%s now names %s (%s)", ref.namespace, ref.name, self.identity, transition
            )
        else:
            log.warning("no longer leading (%s): Lease %s/%s", transition, ref.namespace, ref.name)
        self._on_transition(transition)

    def _step_down(self, transition: Transition) -> Transition:
        self._me = stepped_down(self._me)
        self._transition(transition)
        return transition

    async def attempt(self) -> Transition | None:
        """Read the Lease once and act on it; the transition if leadership changed."""
        if renew_overdue(self._me, self._clock(), self._timing):
            return self._step_down(Transition.RENEW_DEADLINE_PASSED)
        try:
            async with asyncio.timeout(self._timeout()):
                raw = await self._api.read(self._me.lease)
        except Exception as err:  # a boundary: the API may be down; the deadline decides
            log.warning("cannot read Lease %s: %s", self._me.lease.name, _describe(err))
            return self._step_down_if_overdue()
        lease = ObservedLease.from_manifest(raw) if raw is not None else None
        self._lease = lease
        self._me = observe(self._me, lease, self._clock())
        step = decide(self._me, lease, self._clock(), self._wall(), self._timing)
        if step.decision is Decision.STEP_DOWN:
            return self._step_down(step.transition or Transition.LEASE_LOST)
        if step.body is None:  # STANDBY
            if lease is not None and lease.holder != self._logged_holder:
                log.info("standing by: Lease %s held by %s", self._me.lease.name, lease.holder)
                self._logged_holder = lease.holder
            return None
        started = self._clock()
        written: ObservedLease | None = None
        try:
            write = self._api.create if step.creates else self._api.replace
            async with asyncio.timeout(self._timeout()):
                out = await write(self._me.lease, step.body)
            written = ObservedLease.from_manifest(out)
            result = WriteResult.WRITTEN
        except LeaseConflict as err:
            log.info("%s: another replica wrote first (%s)", step.decision, err)
            result = WriteResult.CONFLICT
        except Exception as err:  # a boundary: the API may be down; the deadline decides
            log.warning("cannot write Lease %s: %s", self._me.lease.name, _describe(err))
            result = WriteResult.FAILED
        self._me, gained = after_write(self._me, step, result, started, written, self._clock())
        if written is not None:
            self._lease = written
        if gained is not None:
            self._logged_holder = None
            self._transition(gained)
            return gained
        return self._step_down_if_overdue()

    def _step_down_if_overdue(self) -> Transition | None:
        if renew_overdue(self._me, self._clock(), self._timing):
            return self._step_down(Transition.RENEW_DEADLINE_PASSED)
        return None

    async def acquire(self, stop: asyncio.Event | None = None) -> bool:
        """Stand by until this replica leads (True) or `stop` is set (False)."""
        stop = stop or asyncio.Event()
        while not stop.is_set():
            await self.attempt()
            if self.leading:
                return True
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._timing.retry_period_s):
                    await stop.wait()
        return False

    async def hold(self) -> Transition:
        """Renew every retry period while leading; return why leadership ended."""
        while self.leading:
            transition = await self.attempt()
            if transition is not None and not transition.leads:
                return transition
            await asyncio.sleep(self._timing.retry_period_s)
        return Transition.LEASE_LOST

    async def release(self) -> bool:
        """Graceful stop: clear the Lease's holder so a standby takes over at its next retry."""
        if not self.leading:
            return False
        body = release_body(self._me, self._lease, self._wall())
        released = False
        if body is not None:
            try:
                async with asyncio.timeout(self._timeout()):
                    await self._api.replace(self._me.lease, body)
                released = True
            except Exception as err:  # a boundary: it then expires after its duration instead
                log.warning(
                    "cannot release Lease %s (it expires instead): %s", self._me.lease.name, _describe(err)
                )
        self._step_down(Transition.RELEASED)
        return released


async def lead(
    elector: LeaseElector,
    work: Callable[[], Awaitable[None]],
    on_lost: Callable[[Transition], None],
) -> None:
    """Run `work` (kopf) while `elector` (already leading) keeps renewing in the background.

    When leadership is lost, `on_lost` is called at once; it must end the process (the CLI exits),
    because `work`'s handlers may be mid-way. When `work` returns (a graceful stop), the Lease is
    released. The renewal task is created before `work` starts, so kopf, which cancels the tasks
    created after its start when it stops, leaves it alone.
    """

    def lost(task: asyncio.Task[Transition]) -> None:
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            log.error("the Lease renewal loop failed: %r", error)
            on_lost(Transition.RENEW_DEADLINE_PASSED)
        else:
            on_lost(task.result())

    renewal = asyncio.create_task(elector.hold(), name="lease renewal")
    renewal.add_done_callback(lost)
    try:
        await work()
    finally:
        renewal.remove_done_callback(lost)
        renewal.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await renewal
        await elector.release()


@contextlib.asynccontextmanager
async def standby_health(port: int, host: str = "0.0.0.0") -> AsyncIterator[None]:
    """/healthz answering 200 while this replica stands by (kopf serves its own once it leads)."""
    from aiohttp import web

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="standing by for the operator Lease\n")

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    try:
        yield
    finally:
        await runner.cleanup()
