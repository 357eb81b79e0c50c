"""A redis-server launched as a child process in a run directory (local stack and tests).

Only ever binds 127.0.0.1. AOF is on with `appendfsync always`, so a local run survives a Redis
restart — a SIGKILL included — like the cluster's Redis (AOF on a PVC) does: every write Redis
acknowledged is on disk before the reply leaves (what that costs is measured in bench/README.md).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from asyncdapo.errors import AsyncdapoError
from asyncdapo.local.ports import free_port, wait_until


class RedisServerError(AsyncdapoError):
    pass


class RedisServer:
    def __init__(
        self, workdir: Path, port: int | None = None, appendonly: bool = True, appendfsync: str = "always"
    ) -> None:
        # Absolute: redis-server resolves --logfile after moving into --dir.
        self.workdir = Path(workdir).resolve()
        self.port = port or free_port()
        self.appendonly = appendonly
        self.appendfsync = appendfsync
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self.workdir / "redis.log"

    def start(self, timeout_s: float = 15.0) -> RedisServer:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RedisServerError("redis-server not found on PATH (make install installs it with apt-get)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        args = [
            exe,
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--dir", str(self.workdir),
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", self.appendfsync,
            "--save", "",
            "--protected-mode", "yes",
            "--logfile", str(self.log_path),
        ]  # fmt: skip
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            wait_until(self._ping, timeout_s, f"redis-server on port {self.port}")
        except TimeoutError:
            self.stop()
            raise RedisServerError(f"redis-server did not start; see {self.log_path}") from None
        return self

    def _ping(self) -> bool:
        import redis

        if self.proc is not None and self.proc.poll() is not None:
            raise RedisServerError(f"redis-server exited with {self.proc.returncode}; see {self.log_path}")
        return bool(redis.Redis(port=self.port, socket_timeout=0.5).ping())

    def kill(self) -> None:
        """SIGKILL (a crash: no shutdown save); `start()` again restarts it from its AOF."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
