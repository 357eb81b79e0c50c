"""A fake of the Kubernetes Lease API, in process (not an API server): one store of Leases that
enforces what leader election relies on — `resourceVersion` bumped on every write, 409 Conflict for
creating an existing Lease or replacing with a stale `resourceVersion` — and per-replica clients
whose connection a test can cut (a partitioned leader)."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from asyncdapo.services.operator.leader_election import LeaseRef
from asyncdapo.services.operator.lease_elector import LeaseConflict


class FakeLeaseStore:
    def __init__(self) -> None:
        self.leases: dict[LeaseRef, dict[str, Any]] = {}
        self.conflicts = 0
        self._version = 0

    def client(self, name: str) -> FakeLeaseClient:
        return FakeLeaseClient(self, name)

    def _stamp(self, body: dict[str, Any]) -> dict[str, Any]:
        self._version += 1
        out = copy.deepcopy(body)
        out["metadata"]["resourceVersion"] = str(self._version)
        return out

    def holder(self, ref: LeaseRef) -> str | None:
        lease = self.leases.get(ref)
        return None if lease is None else lease["spec"].get("holderIdentity")


class FakeLeaseClient:
    """One replica's connection to the fake store (`LeaseApi`); `cut` makes every call fail."""

    def __init__(self, store: FakeLeaseStore, name: str) -> None:
        self.store = store
        self.name = name
        self.cut = False

    async def _network(self) -> None:
        await asyncio.sleep(0)  # a round trip: other replicas may run in between
        if self.cut:
            raise ConnectionError(f"{self.name}: connection to the API server refused")

    async def read(self, ref: LeaseRef) -> dict[str, Any] | None:
        await self._network()
        lease = self.store.leases.get(ref)
        return copy.deepcopy(lease) if lease is not None else None

    async def create(self, ref: LeaseRef, body: dict[str, Any]) -> dict[str, Any]:
        await self._network()
        if ref in self.store.leases:
            self.store.conflicts += 1
            raise LeaseConflict(f"leases.coordination.k8s.io {ref.name!r} already exists")
        self.store.leases[ref] = self.store._stamp(body)
        return copy.deepcopy(self.store.leases[ref])

    async def replace(self, ref: LeaseRef, body: dict[str, Any]) -> dict[str, Any]:
        await self._network()
        current = self.store.leases.get(ref)
        if current is None:
            raise LookupError(f"leases.coordination.k8s.io {ref.name!r} not found")  # a 404
        if current["metadata"]["resourceVersion"] != body["metadata"].get("resourceVersion"):
            self.store.conflicts += 1
            raise LeaseConflict(
                "the object has been modified; please apply your changes to the latest version"
            )
        self.store.leases[ref] = self.store._stamp(body)
        return copy.deepcopy(self.store.leases[ref])
