"""How fast this machine runs the kind of Python the SIMULATOR runs, so that the simulator's own
cost can be stated apart from the machine it was measured on.

The simulator's cost is CPU seconds per event, and the same code costs 2–3× more CPU on one of our
2-core VMs than on another (runs of 2026-11-25 to 2026-11-27 used three of them: the speed guard's 128-engine run
went from 55–68 k events per CPU second to 24–25 k on a quiet machine, with nothing in the
simulator changed). A fixed reference workload, timed in the same process just before or after a
run, turns that into a machine-independent figure: the run's CPU per event in units of the
reference's CPU per operation (`cost_in_reference_ops`).

The reference is deliberately the simulator's own mix of interpreter work, not a simulator run (a
regression in the simulator must not slow its yardstick): a heap of (time, seq, callable, arg)
events popped in order, each calling a method that reads and writes attributes of a slotted object,
creates a small tuple, looks up and updates a dict, and pushes a follow-up event. It shares no
code with the simulator.
"""

from __future__ import annotations

import time
from heapq import heappop, heappush

REFERENCE_OPS = 200_000  # events of the reference loop per measurement (~0.2-0.6 CPU s)


class _Item:
    __slots__ = ("count", "key", "total")

    def __init__(self, key: int) -> None:
        self.key = key
        self.count = 0
        self.total = 0.0


class _Loop:
    """A heap-driven event loop over slotted objects and a dict: one reference operation is one
    event popped and handled."""

    __slots__ = ("heap", "items", "now", "seq")

    def __init__(self, width: int) -> None:
        self.heap: list[tuple[float, int, object, _Item]] = []
        self.items: dict[int, tuple[int, float]] = {}
        self.now = 0.0
        self.seq = 0
        for k in range(width):
            self.push(float(k % 97), _Item(k))

    def push(self, t: float, item: _Item) -> None:
        self.seq += 1
        heappush(self.heap, (t, self.seq, self.handle, item))

    def handle(self, item: _Item) -> None:
        item.count += 1
        item.total += self.now - item.total * 0.5
        prev = self.items.get(item.key)
        self.items[item.key] = (item.count, item.total) if prev is None else (prev[0] + 1, item.total)
        if item.count % 3 == 0:
            del self.items[item.key]
        self.push(self.now + 1.0 + (item.key * 7919 + item.count) % 61 / 10.0, item)

    def run(self, ops: int) -> None:
        heap = self.heap
        for _ in range(ops):
            t, _seq, fn, arg = heappop(heap)
            self.now = t
            fn(arg)  # type: ignore[operator]


def reference_cpu_s_per_op(ops: int = REFERENCE_OPS, repeats: int = 3) -> float:
    """CPU seconds per reference operation on this machine now: the fastest of `repeats`
    measurements (the least disturbed by other processes), each on a fresh loop of 4,096 items."""
    best = float("inf")
    for _ in range(repeats):
        loop = _Loop(4096)
        c0 = time.process_time()
        loop.run(ops)
        best = min(best, time.process_time() - c0)
    return best / ops


def cost_in_reference_ops(cpu_s: float, events: int, ref_s_per_op: float) -> float:
    """A run's CPU per event in reference operations: how many of the reference loop's events one
    simulator event costs on the machine that ran both."""
    if events <= 0 or ref_s_per_op <= 0:
        raise ValueError("a cost needs events > 0 and a reference time > 0")
    return cpu_s / events / ref_s_per_op
