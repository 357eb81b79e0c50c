"""`asyncdapo verifier` as a child process on a free loopback port: for tests, benchmarks, local stacks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import httpx

from asyncdapo.tools.local.ports import free_port, wait_until


class VerifierServer:
    def __init__(
        self,
        workers: int = 2,
        timeout_s: float = 5.0,
        extra_args: Sequence[str] = (),
        log_path: Path | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
    ) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.args = [
            sys.executable,
            "-m",
            "asyncdapo.cli",
            "verifier",
            f"--host={host}",
            f"--port={self.port}",
            f"--workers={workers}",
            f"--timeout-s={timeout_s}",
            "--log-level=warning",
            *extra_args,
        ]
        self.log_path = log_path
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        if self._process is None:
            raise RuntimeError("the verifier is not running")
        return self._process.pid

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, ready_timeout_s: float = 90.0) -> VerifierServer:
        log = open(self.log_path, "wb") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self._process = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT)
        if not isinstance(log, int):  # not DEVNULL
            log.close()  # the child holds its own descriptor

        def ready() -> bool:
            if process.poll() is not None:
                return True  # reported below, without waiting out the timeout
            return httpx.get(f"{self.url}/readyz", timeout=2.0).status_code == 200

        process = self._process
        try:
            wait_until(ready, ready_timeout_s, f"verifier at {self.url}", interval_s=0.1)
        except BaseException:
            self.stop()
            raise
        if process.poll() is not None:
            self._process = None
            raise RuntimeError(f"verifier exited with code {process.returncode}{self._log_tail()}")
        return self

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM (graceful: the pool closes its workers), then SIGKILL after `timeout_s`."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5.0)

    def kill(self) -> None:
        """SIGKILL, as a node loss or an OOM kill would (the workers notice and exit); `start()`
        brings the service back on the same port."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.kill()
        process.wait(5.0)

    def _log_tail(self) -> str:
        if self.log_path and self.log_path.exists():
            return ":\n" + self.log_path.read_text(errors="replace")[-2000:]
        return ""

    def __enter__(self) -> VerifierServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
