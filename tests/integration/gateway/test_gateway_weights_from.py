"""A gateway that starts from the trainer's weights (`--weights-from`), with no model volume: it
waits for the trainer's WeightStore, fetches the newest version it serves, checks it, serves it at
that version, and then loads later stream:// versions from the trainer (token-protected)."""

from __future__ import annotations

import asyncio
import hashlib
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from asyncdapo.contracts.v1 import weights_pb2, weights_pb2_grpc
from asyncdapo.services.gateway.gateway_client import GatewayClient
from asyncdapo.services.trainer.publish import TrainerWeightServer
from asyncdapo.tools.local.ports import free_port, port_open


async def test_gateway_starts_from_the_trainer_and_loads_its_next_version(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    token = "weights-token-123"
    (tmp_path / "token").write_text(token)
    listen = f"127.0.0.1:{free_port()}"
    (tmp_path / "gw").mkdir()
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "asyncdapo.cli", "gateway", "--engine", "sim", "--port", str(port),
         "--metrics-port", "0", "--token-file", str(tmp_path / "token"), "--weights-from", listen,
         "--weight-store-dir", str(tmp_path / "gw")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    (tmp_path / "trainer").mkdir()
    server = TrainerWeightServer(str(tmp_path / "trainer"), listen, token=token)
    try:
        deadline = time.monotonic() + 30
        while not port_open("127.0.0.1", port):  # the gateway is up first: port bound, waiting
            assert proc.poll() is None and time.monotonic() < deadline, "gateway did not bind its port"
            await asyncio.sleep(0.2)
        async with GatewayClient(f"127.0.0.1:{port}", token=token) as c:
            assert not await c.healthy(timeout_s=2)  # NOT_SERVING until it has the trainer's weights
        server.start()
        server.put_model_dir(tiny_model_dir, 0)
        async with GatewayClient(f"127.0.0.1:{port}", token=token) as c:
            deadline = time.monotonic() + 60
            while not await c.healthy(timeout_s=0.5):
                assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
                assert time.monotonic() < deadline, "gateway did not start from the trainer's weights"
                await asyncio.sleep(0.3)
            assert (await c.get_load()).weight_version == 0
            served = next((tmp_path / "gw").glob("asyncdapo-gw-*-v0"))
            assert sha(served / "model.safetensors") == sha(tiny_model_dir / "model.safetensors")

            model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.01)
            server.put(model, AutoTokenizer.from_pretrained(tiny_model_dir), 1, torch.float32, "t")
            out = await c.load_weights(1, server.uri)
            assert out.version == 1 and (await c.get_load()).weight_version == 1
            assert not list((tmp_path / "gw").glob("asyncdapo-gw-*-v0"))  # older versions dropped

        # the trainer's store refuses readers without the run's token
        async with grpc.aio.insecure_channel(listen) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await weights_pb2_grpc.WeightStoreStub(ch).GetManifest(
                    weights_pb2.GetManifestRequest(version=1)
                )
            assert err.value.code() is grpc.StatusCode.UNAUTHENTICATED
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        server.close()


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
