"""The vLLM plugin that shortens the engine processes' shared-memory spin and re-check, loaded the
way vLLM loads it in every engine process (`load_general_plugins`), in a fresh interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from asyncdapo.services.gateway import vllm_shm

PROBE = """
import json, tempfile, zmq
from vllm.plugins import load_general_plugins
load_general_plugins()
from vllm.distributed.device_communicators import shm_broadcast as shm
ctx = zmq.Context()
addr = "ipc://" + tempfile.mktemp()
writer = shm.SpinCondition(False, ctx, addr)
reader = shm.SpinCondition(True, ctx, addr)
print(json.dumps({"recheck_ms": shm.SHM_READER_RECHECK_INTERVAL_MS, "reader_spin_s": reader.busy_loop_s,
                  "writer_spin_s": writer.busy_loop_s}))
"""


def _probe(env: dict[str, str]) -> dict[str, float]:
    clean = {k: v for k, v in os.environ.items() if k not in (vllm_shm.ENV_SPIN_S, vllm_shm.ENV_RECHECK_MS)}
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env={**clean, **env}, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_plugin_sets_what_the_gateway_asks_for_and_nothing_otherwise() -> None:
    asked = _probe({vllm_shm.ENV_SPIN_S: "0.05", vllm_shm.ENV_RECHECK_MS: "20"})
    assert asked == {"recheck_ms": 20, "reader_spin_s": 0.05, "writer_spin_s": 0}
    default = _probe({})
    assert default == {"recheck_ms": 5000, "reader_spin_s": 1, "writer_spin_s": 0}  # vLLM 0.32's own


def test_configure_sets_and_clears_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(vllm_shm.ENV_SPIN_S, raising=False)
    monkeypatch.delenv(vllm_shm.ENV_RECHECK_MS, raising=False)
    vllm_shm.configure(0.05, 20)
    assert os.environ[vllm_shm.ENV_SPIN_S] == "0.05" and os.environ[vllm_shm.ENV_RECHECK_MS] == "20"
    vllm_shm.configure(None, None)
    assert vllm_shm.ENV_SPIN_S not in os.environ and vllm_shm.ENV_RECHECK_MS not in os.environ
    with pytest.raises(ValueError, match="spin"):
        vllm_shm.configure(-1.0, None)
    with pytest.raises(ValueError, match="re-check"):
        vllm_shm.configure(None, 0)
