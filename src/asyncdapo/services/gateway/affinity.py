"""Pin a gateway, and every process it starts, to a set of CPU cores (`--cpu-affinity`).

Why: on a small CPU host the local stack runs one vLLM engine per core. vLLM pins only its
worker's OpenMP threads (`VLLM_CPU_OMP_THREADS_BIND`); the gateway's frontend and the engine
core process float. An engine core spin-waits on its worker after every step, and where it lands
on the *other* engine's core it takes that core from a worker that is pinned there and cannot
move. Measured on the 2-core machine (bench-e2e, async): gaps of 0.15–0.65 s with requests running
and the starved engine's three processes idle, in about half of the rollout steps; a 7-token
response took 0.4–0.8 s instead of 0.1 s. With each gateway's whole process tree on its own
core there were none; rollout time per step went from 1.23 to 0.85–0.89 s (async) and from 1.45
to 1.10–1.42 s (sync) over three runs.

Affinity is a property of a thread on Linux and is inherited by the threads and processes it
creates; `pin` sets it on every thread that exists already, so nothing started later escapes.
"""

from __future__ import annotations

import contextlib
import os


def parse_cores(spec: str) -> set[int]:
    """`"1"`, `"0,2"`, `"0-3"` or a mix (`"0-1,4"`) → a set of core ids; ValueError says why not."""
    cores: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        try:
            first, last = (int(lo), int(hi)) if sep else (int(part), int(part))
        except ValueError:
            raise ValueError(f"{part!r} is not a core id or a range like 0-3") from None
        if first < 0 or last < first:
            raise ValueError(f"{part!r} is not a core id or a range like 0-3")
        cores.update(range(first, last + 1))
    return cores


def pin(spec: str) -> set[int]:
    """Restrict this process (all its threads, and so what it starts later) to the cores in
    `spec`, which must all be cores this process may use; returns them."""
    cores = parse_cores(spec)
    allowed = os.sched_getaffinity(0)
    outside = sorted(cores - allowed)
    if outside:
        raise ValueError(f"core(s) {outside} are not available here (allowed: {sorted(allowed)})")
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(tid), cores)
    return cores
