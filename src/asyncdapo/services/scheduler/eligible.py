"""Which gateways can take a request now, kept up to date as they change — so that placing a
prompt costs the same with 8 gateways as with 512.

`EligibleIndex` holds, per pool label asked for, the gateways that `dispatch.reject_reason` would
accept (up, not draining, not paused, in that pool, on current weights, under
`max_concurrent_per_gateway`), in an array with O(1) insert, remove and uniform sampling. Whoever
changes one of those inputs calls `update(gw)` (the pool's up/down and load reports through
`Gateway.refresh`, the dispatcher on every in-flight change); a new policy (a weight version, a
drain limit) rebuilds it — once per publish, never per request.

`candidates` turns the index into what `dispatch.pick` scores: every eligible gateway while there
are at most `exact_limit` of them (an exact least-loaded pick, as before), else a uniform sample of
`sample_size` of them plus the eligible gateways that already serve the prompt (prefix affinity):
"power of d choices", whose load imbalance stays within a small constant of the best one while the
work per placement no longer grows with the fleet.
"""

from __future__ import annotations

import random
from collections.abc import Iterable

from asyncdapo.services.scheduler.policy.dispatch import DispatchPolicy, DispatchView, reject_reason

EXACT_LIMIT = 32  # at most this many eligible gateways: score them all
SAMPLE_SIZE = 16  # beyond: score this many, drawn uniformly (plus the prompt's own gateways)


class _Slots:
    """An array of members with O(1) add, remove and random access."""

    def __init__(self) -> None:
        self.items: list[DispatchView] = []
        self.pos: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.items)

    def add(self, gw: DispatchView) -> None:
        i = self.pos.get(gw.address)
        if i is None:
            self.pos[gw.address] = len(self.items)
            self.items.append(gw)
        else:
            # a member updated with a new object (a `GatewayView` snapshot, as the simulator
            # passes): score the new one, not the first one ever added
            self.items[i] = gw

    def discard(self, gw: DispatchView) -> None:
        i = self.pos.pop(gw.address, None)
        if i is None:
            return
        last = self.items.pop()
        if i < len(self.items):
            self.items[i] = last
            self.pos[last.address] = i


class EligibleIndex:
    def __init__(self, policy: DispatchPolicy, seed: int | None = None) -> None:
        self.policy = policy
        self._labels: dict[str, tuple[DispatchPolicy, _Slots]] = {}
        self._members: dict[str, DispatchView] = {}
        self._order: dict[str, int] = {}  # first-seen order: ties go to the earlier gateway
        self._rng = random.Random(seed)
        self.exact_limit = EXACT_LIMIT  # benchmarks raise it to measure the exact scan as a baseline

    def _policy_for(self, label: str) -> DispatchPolicy:
        if not label:
            return self.policy
        p = self.policy
        return DispatchPolicy(
            max_in_flight=p.max_in_flight,
            pool=label,
            min_weight_version=p.min_weight_version,
            kv_weight=p.kv_weight,
            affinity_bonus=p.affinity_bonus,
        )

    def _slots(self, label: str) -> tuple[DispatchPolicy, _Slots]:
        entry = self._labels.get(label)
        if entry is None:  # a pool label asked for the first time: fill it once
            policy = self._policy_for(label)
            slots = _Slots()
            for gw in self._members.values():
                if reject_reason(gw, policy) is None:
                    slots.add(gw)
            entry = self._labels[label] = (policy, slots)
        return entry

    def set_policy(self, policy: DispatchPolicy) -> None:
        """A new policy (weight version, limits): every label is rebuilt from the members."""
        self.policy = policy
        self._labels.clear()

    def policy_for(self, label: str) -> DispatchPolicy:
        return self._slots(label)[0]

    def update(self, gw: DispatchView) -> None:
        """`gw` changed (up/down, flags, load, in-flight): re-check it under every label."""
        self._members[gw.address] = gw
        self._order.setdefault(gw.address, len(self._order))
        for policy, slots in self._labels.values():
            if reject_reason(gw, policy) is None:
                slots.add(gw)
            else:
                slots.discard(gw)

    def remove(self, gw: DispatchView) -> None:
        self._members.pop(gw.address, None)
        for _, slots in self._labels.values():
            slots.discard(gw)

    def count(self, label: str = "") -> int:
        return len(self._slots(label)[1])

    def candidates(
        self,
        label: str,
        affinity: Iterable[str] = (),
        exact_limit: int | None = None,
        sample_size: int = SAMPLE_SIZE,
    ) -> list[DispatchView]:
        """What `dispatch.pick` should score for one prompt (see the module docstring). The exact
        case keeps the gateways' first-seen order (ties go to the earlier one, as a scan of the
        pool would); a seeded index samples reproducibly, the prompt's own gateways after the
        sample in address order."""
        _, slots = self._slots(label)
        items = slots.items
        if len(items) <= (self.exact_limit if exact_limit is None else exact_limit):
            return sorted(items, key=lambda g: self._order[g.address])
        chosen = self._rng.sample(items, sample_size)
        seen = {g.address for g in chosen}
        # sorted: a prompt's gateways are a set of strings, which iterates in a per-process hash
        # order, and the order of the candidates breaks ties in `pick`
        for address in sorted(affinity):
            i = slots.pos.get(address)
            if i is not None and address not in seen:
                chosen.append(items[i])
                seen.add(address)
        return chosen
