"""The gateway's CPU-host settings for vLLM's engine processes reach the processes vLLM forks or
spawns: idle, the worker wakes every 20 ms to re-check for work (vLLM's own: every 5 s), so a lost
wake-up costs at most that instead of a 5-second stall (`vllm_shm.py`); and `--cpu-affinity`
holds for every thread of every process of the engine (`affinity.py`)."""

from __future__ import annotations

import time
from pathlib import Path

from vllm_gateway_proc import VllmGatewayProc


def _process_group(pgid: int) -> list[int]:
    """Processes of a group (the gateway runs in a session of its own: its engine processes too)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                pgrp = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[2])
            except (OSError, ValueError, IndexError):
                continue
            if pgrp == pgid:
                out.append(int(entry.name))
    return out


def _wakeups(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    raise AssertionError(f"no voluntary_ctxt_switches for {pid}")


def test_an_idle_vllm_worker_rechecks_every_20_ms(vllm_gateways: list[VllmGatewayProc]) -> None:
    gw = vllm_gateways[0]  # the other one may have been killed by the outage test
    assert gw.proc.poll() is None, "gateway 0 is not running"
    workers = [
        p
        for p in _process_group(gw.proc.pid)
        if Path(f"/proc/{p}/comm").read_text().startswith("VLLM::Worker")
    ]
    assert len(workers) == 1, f"expected one vLLM worker under the gateway, found {workers}"
    time.sleep(1.5)  # past the spin after any earlier step (50 ms here, 1 s with vLLM's default)
    before = _wakeups(workers[0])
    time.sleep(2.0)
    woke = _wakeups(workers[0]) - before
    # ~100 in 2 s at a 20-ms re-check; vLLM's 5-s re-check gives 0-1
    assert woke >= 25, f"the idle worker woke {woke} times in 2 s: the shm re-check setting did not reach it"


def _allowed_cores(pid: int) -> dict[int, str]:
    """Each live thread of `pid` → the cores it may run on (`Cpus_allowed_list`)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        for line in status.splitlines():
            if line.startswith("Cpus_allowed_list:"):
                out[int(task.name)] = line.split()[1]
    return out


def test_cpu_affinity_holds_for_every_engine_process_and_thread(vllm_gateways: list[VllmGatewayProc]) -> None:
    gw = vllm_gateways[0]  # started with --cpu-affinity 0
    assert gw.proc.poll() is None, "gateway 0 is not running"
    pids = _process_group(gw.proc.pid)
    comms = {p: Path(f"/proc/{p}/comm").read_text().strip() for p in pids}
    assert any(c.startswith("VLLM::Worker") for c in comms.values()), f"no vLLM worker among {comms}"
    assert any(c.startswith("VLLM::EngineCor") for c in comms.values()), f"no engine core among {comms}"
    wrong = {
        f"{comms[p]}/{tid}": cores for p in pids for tid, cores in _allowed_cores(p).items() if cores != "0"
    }
    assert not wrong, f"threads of gateway 0 allowed on other cores than 0: {wrong}"
