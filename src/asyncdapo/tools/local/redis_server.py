"""A redis-server launched as a child process in a run directory (local stack and tests).

Only ever binds 127.0.0.1. AOF is on with `appendfsync always`, so a local run survives a Redis
restart — a SIGKILL included — like the cluster's Redis (AOF on a PVC) does: every write Redis
acknowledged is on disk before the reply leaves (what that costs: `make bench-redis-fsync`). With a
password, clients must AUTH (`requirepass`): the password goes to redis-server in a config file only
its owner can read (mode 0600), never on its command line (which every local user can read in
/proc). `maxmemory` (a Redis size: "2gb", "512mb", bytes) caps its data set with `maxmemory-policy
noeviction`: past it Redis refuses writes (OOM), which every service waits out (nothing is evicted
or lost); unset (the default) there is no cap, as a dev machine has no container limit to stay
under. It runs in a process group of its own, so a Ctrl-C at the terminal reaches only `asyncdapo
up`, which then stops it last, after the services that use it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from asyncdapo.contracts.errors import AsyncdapoError
from asyncdapo.runtime.secret_files import write_private
from asyncdapo.tools.local.ports import free_port, wait_until


class RedisServerError(AsyncdapoError):
    pass


# A size redis-server accepts for maxmemory: bytes, or a number with k/kb/m/mb/g/gb (any case).
MAXMEMORY_RE = re.compile(r"[1-9][0-9]*([kKmMgG][bB]?)?")


def maxmemory_args(size: str | None) -> list[str]:
    """redis-server's flags capping its data set at `size` (None: no cap), with `noeviction`: past
    it Redis refuses writes instead of dropping keys. RedisServerError for a size it would refuse."""
    if size is None:
        return []
    if not MAXMEMORY_RE.fullmatch(size):
        raise RedisServerError(
            f"Redis maxmemory {size!r} is not a size; give bytes or a number with kb, mb or gb "
            "(e.g. 2gb, 512mb)"
        )
    return ["--maxmemory", size, "--maxmemory-policy", "noeviction"]


class RedisServer:
    def __init__(
        self,
        workdir: Path,
        port: int | None = None,
        appendonly: bool = True,
        password: str | None = None,
        env: dict[str, str] | None = None,
        appendfsync: str = "always",
        maxmemory: str | None = None,
    ) -> None:
        # Absolute: redis-server resolves --logfile after moving into --dir.
        self.workdir = Path(workdir).resolve()
        self.port = port or free_port()
        self.appendonly = appendonly
        self.appendfsync = appendfsync
        self.password = password
        self._maxmemory_args = maxmemory_args(maxmemory)  # a bad size fails here, before any start
        self.maxmemory = maxmemory
        self.env = env or {}
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
        args = [exe]
        if self.password is not None:
            args.append(str(self._write_auth_config()))
        args += [
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--dir", str(self.workdir),
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", self.appendfsync,
            # a dev machine's Redis: rewrite the AOF once it reaches 8 MB (and doubled), so its size
            # follows the (bounded) data set instead of the run's length
            "--auto-aof-rewrite-min-size", "8mb",
            "--save", "",
            "--protected-mode", "yes",
            "--logfile", str(self.log_path),
        ]  # fmt: skip
        args += self._maxmemory_args
        self.proc = subprocess.Popen(
            args,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env={**os.environ, **self.env},
            start_new_session=True,
        )
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
        client = redis.Redis(port=self.port, password=self.password, socket_timeout=0.5)
        try:
            return bool(client.ping())
        finally:
            client.close()

    def _write_auth_config(self) -> Path:
        """A config file holding `requirepass`, readable by its owner only."""
        assert self.password is not None
        if any(c.isspace() or c in "\"'\\" for c in self.password):
            raise RedisServerError("the Redis password must not contain whitespace, quotes or backslashes")
        path = self.workdir / "auth.conf"
        write_private(path, f"requirepass {self.password}\n")
        return path

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
