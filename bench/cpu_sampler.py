"""CPU time of a local stack's services over a run, from /proc (Linux): what each service's process
group (the service and everything it spawned: vLLM's engine core, the verifier's pool) used, and
what the whole host used, sampled as the run goes so that a service that exits (the trainer after
its last step) keeps its last reading.

`make bench-simulator` calibrates the SIMULATOR's host-CPU contention model from these figures
(CPU seconds of the control plane per completion, of the trainer per step; the host's busy time
that was none of ours: other users' load). A count of CPU time, not a timing: it does not depend
on how many others share the cores (the per-unit CPU cost moves a little with cache pressure).
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

TICK = os.sysconf("SC_CLK_TCK")


def group_cpu_s(pgids: dict[str, int]) -> dict[str, float]:
    """CPU seconds (user + system, reaped children included) of every live process in each named
    process group."""
    return group_stats(pgids)[0]


ENGINE_THREAD = "VLLM::EngineCor"  # vLLM's engine-core process (its main thread runs the steps)


def group_stats(pgids: dict[str, int]) -> tuple[dict[str, float], dict[str, float]]:
    """Per named process group: (CPU seconds as `group_cpu_s`, run delay seconds: the time its
    live threads were runnable but waiting for a core, /proc/PID/task/TID/schedstat's second
    field). Also, under "NAME:engine", the CPU and run delay of a vLLM engine core's main thread
    (the thread that runs the engine's steps) where the group has one: its run delay over its
    CPU time is how much longer the engine's steps took than they would have with its core to
    itself — a direct measure of contention (a group's total is not: vLLM's idle helper threads
    pinned to one core wait on each other)."""
    want = {pg: name for name, pg in pgids.items()}
    cpu = dict.fromkeys(pgids, 0.0)
    delay = dict.fromkeys(pgids, 0.0)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            raw = Path(entry.path, "stat").read_text()
        except OSError:  # exited meanwhile
            continue
        # the command name (field 2) may hold spaces: split after its closing parenthesis
        f = raw[raw.rfind(")") + 2 :].split()
        name = want.get(int(f[2]))  # f[0] = state, f[1] = ppid, f[2] = pgrp
        if name is None:
            continue
        cpu[name] += sum(int(x) for x in f[11:15]) / TICK  # utime stime cutime cstime
        engine = raw[raw.find("(") + 1 : raw.rfind(")")].startswith(ENGINE_THREAD)
        try:
            for task in os.scandir(Path(entry.path, "task")):
                with contextlib.suppress(OSError, ValueError, IndexError):
                    run_ns, wait_ns = (int(x) for x in Path(task.path, "schedstat").read_text().split()[:2])
                    delay[name] += wait_ns / 1e9
                    if engine and task.name == entry.name:
                        cpu[f"{name}:engine"] = cpu.get(f"{name}:engine", 0.0) + run_ns / 1e9
                        delay[f"{name}:engine"] = delay.get(f"{name}:engine", 0.0) + wait_ns / 1e9
        except OSError:
            continue
    return cpu, delay


def host_cpu_s() -> tuple[float, float]:
    """(busy, total) CPU seconds of the host since boot, all cores (/proc/stat's `cpu` line)."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = f[3] + f[4]  # idle + iowait
    total = sum(f[:8])  # guest time is already in user
    return (total - idle) / TICK, total / TICK


class CpuSampler:
    """Samples `group_cpu_s` of the stack's services and the host's CPU every `every_s` (called from
    the bench's own polling loop: `maybe_sample`)."""

    def __init__(self, stack: Any, every_s: float = 0.5) -> None:
        self.stack = stack
        self.every_s = every_s
        self.samples: list[dict[str, Any]] = []
        self._last = 0.0

    def pgids(self) -> dict[str, int]:
        pg = {c.name: c.proc.pid for c in self.stack.sup.children}  # each child leads its own group
        redis = getattr(self.stack, "redis", None)
        if redis is not None and redis.proc is not None:
            pg["redis"] = redis.proc.pid
        return pg

    def sample(self) -> None:
        busy, total = host_cpu_s()
        cpu, delay = group_stats(self.pgids())
        if self.samples:  # a service that exited keeps its last reading
            prev = self.samples[-1]["cpu"]
            cpu = {k: max(v, prev.get(k, 0.0)) for k, v in {**prev, **cpu}.items()}

        own = os.times()
        self.samples.append(
            {
                "t": time.time(),
                "cpu": cpu,
                "delay": delay,  # raw: a thread's run delay leaves the sum when it exits
                "host_busy_s": busy,
                "host_total_s": total,
                "bench_s": own.user + own.system,
            }
        )
        self._last = time.monotonic()

    def maybe_sample(self) -> None:
        if time.monotonic() - self._last >= self.every_s:
            self.sample()
